-- Shared helpers: the server's clock, and the holder of a lock whose key holds its holder's
-- token. Every deadline a script computes comes from the server's clock (`TIME`), never from
-- a client's. Needs errors.lua.
local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end
-- The token in the lock key (false when free), or nil and the error to reply with when the
-- key holds another type or the GET was refused.
local function holder_of(lock)
  local holder = redis.pcall('GET', lock)
  if type(holder) == 'table' and holder['err'] then
    if is_type_error(holder) then
      return nil, redis.error_reply('WRONGTYPE key ' .. lock .. ' exists but is not a lock')
    end
    return nil, holder
  end
  return holder
end
