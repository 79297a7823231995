-- Shared helper: the next fencing token of a lock just taken. `INCR` of the counter, which
-- starts at the server's clock in microseconds when it has not started from it yet (first
-- use, or Redis lost its data), so that tokens never go backwards across a restart. A counter
-- below 2^40 never started from a clock (whose microseconds are past 10^15): it holds only
-- counts of attempts that found their lock held (a `Mutex` attempt without a script also
-- counts then), and no token was ever taken from it. When the counter is not an integer, the
-- lock is given back and `nil` returned; on any other error the lock is given back and the
-- error raised. Needs `is_type_error` and `raise` (errors.lua).
--
-- A token is a Lua number below 2^53, and the counter's own text from there on: Lua's
-- numbers are doubles, exact only below 2^53, while a Redis counter goes to 2^63 - 1 (and one
-- migrated from another system may be anywhere). Redis replies with the text as it is, and
-- the client reads both as integers; a counter at 2^63 - 1 cannot grow, and `INCR`'s error
-- says so.
local UNSEEDED_FENCE = 1099511627776
local EXACT_BELOW = 9007199254740992
local function next_fence(lock, counter)
  local fence = redis.pcall('INCR', counter)
  if type(fence) == 'table' then
    redis.call('DEL', lock)
    if not is_type_error(fence) then
      raise(fence)
    end
    return nil
  end
  if fence < UNSEEDED_FENCE then
    local now = redis.call('TIME')
    fence = tonumber(now[1]) * 1000000 + tonumber(now[2])
    redis.call('SET', counter, string.format('%.0f', fence))
  end
  if fence >= EXACT_BELOW then
    return redis.call('GET', counter)
  end
  return fence
end
-- A token from `next_fence` as text, exactly.
local function fence_text(token)
  if type(token) == 'string' then
    return token
  end
  return string.format('%.0f', token)
end
-- `next_fence`, or nil and the error to reply with when the counter is not an integer.
local function take_fence(lock, counter)
  local fence = next_fence(lock, counter)
  if not fence then
    return nil, redis.error_reply('WRONGTYPE fencing counter ' .. counter .. ' is not an integer')
  end
  return fence
end
-- Deletes a counter that never started from a clock (it holds only counts of attempts that
-- found a key of the wrong type where the lock should be): an error leaves nothing behind.
local function forget_unseeded_fence(counter)
  local count = redis.pcall('GET', counter)
  if type(count) == 'string' and (tonumber(count) or UNSEEDED_FENCE) < UNSEEDED_FENCE then
    redis.call('DEL', counter)
  end
end
