-- Remove the writer and every reader, whoever they are, and announce the release.
--
-- KEYS[1]: the writer's key; KEYS[2]: the readers; KEYS[3]: the waiting writer;
-- KEYS[4]: the waiters flag.
-- ARGV[1]: the release channel.
-- Reply: 1 when anyone held the lock, 0 when nobody did. Needs announce.lua.
local held = redis.call('DEL', KEYS[1], KEYS[2])
redis.call('DEL', KEYS[3], KEYS[4])
if held > 0 then
  announce(ARGV[1], 'released')
  return 1
end
return 0
