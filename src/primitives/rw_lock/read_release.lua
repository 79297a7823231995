-- Give back a read hold; the last reader out announces the release when someone waits.
--
-- KEYS[1]: the readers; KEYS[2]: the waiters flag.
-- ARGV[1]: the token; ARGV[2]: the release channel.
-- Reply: 1 when the hold was there, 0 when it was gone. Needs errors.lua, holder.lua,
-- rw.lua and announce.lua.
local now = now_ms()
local removed = redis.pcall('ZREM', KEYS[1], ARGV[1])
if type(removed) ~= 'number' or removed == 0 then
  return 0
end
local count = live_readers(KEYS[1], now)
if count == 0 then
  redis.call('DEL', KEYS[1])
  if redis.call('DEL', KEYS[2]) == 1 then
    announce(ARGV[2], 'released')
  end
else
  expire_readers(KEYS[1], now)
end
return 1
