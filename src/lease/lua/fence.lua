-- Shared helper: the next fencing token of a lock just taken. `INCR` of the counter, which
-- starts at the server's clock in microseconds when missing (first use, or Redis lost its
-- data), so that tokens never go backwards across a restart. When the counter is not an
-- integer, the lock is given back and `nil` returned; on any other error the lock is given
-- back and the error raised. Needs `is_type_error` (errors.lua).
local function next_fence(lock, counter)
  local fence = redis.pcall('INCR', counter)
  if type(fence) == 'table' then
    redis.call('DEL', lock)
    if not is_type_error(fence) then
      error(fence)
    end
    return nil
  end
  if fence == 1 then
    local now = redis.call('TIME')
    fence = tonumber(now[1]) * 1000000 + tonumber(now[2])
    redis.call('SET', counter, string.format('%.0f', fence))
  end
  return fence
end
-- `next_fence`, or nil and the error to reply with when the counter is not an integer.
local function take_fence(lock, counter)
  local fence = next_fence(lock, counter)
  if not fence then
    return nil, redis.error_reply('WRONGTYPE fencing counter ' .. counter .. ' is not an integer')
  end
  return fence
end
