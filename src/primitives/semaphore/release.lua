-- Give back the permits of a token, and announce it when someone waits (with the number of
-- permits freed).
--
-- KEYS[1]: the holders; KEYS[2]: the held permits; KEYS[3]: the waiters flag.
-- ARGV[1]: the token (empty with `force`); ARGV[2]: the release channel; ARGV[3]: `force` to
-- give back every holder's permits.
-- Reply: 1 when permits were given back, 0 when the token held none. Needs holder.lua,
-- permits.lua and announce.lua.
local now = now_ms()
local freed = 0
if ARGV[3] == 'force' then
  for _, n in ipairs(redis.call('HVALS', KEYS[2])) do
    freed = freed + tonumber(n)
  end
  redis.call('DEL', KEYS[1], KEYS[2])
else
  local n = redis.call('HGET', KEYS[2], ARGV[1])
  if not n then
    return 0
  end
  redis.call('HDEL', KEYS[2], ARGV[1])
  redis.call('ZREM', KEYS[1], ARGV[1])
  keep_holders(KEYS[1], KEYS[2], now)
  freed = tonumber(n)
end
if freed > 0 and redis.call('DEL', KEYS[3]) == 1 then
  announce(ARGV[2], tostring(freed))
end
if freed > 0 then
  return 1
end
return 0
