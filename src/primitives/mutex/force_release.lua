-- Delete the lock whoever holds it, and announce the release.
--
-- KEYS[1]: the lock key; KEYS[2]: the waiters flag.
-- ARGV[1]: the release channel.
-- Reply: 1 when a lock was deleted, 0 when there was none.
local t = redis.call('TYPE', KEYS[1])['ok']
if t == 'none' then
  return 0
end
if t ~= 'string' then
  return redis.error_reply('WRONGTYPE key ' .. KEYS[1] .. ' exists but is not a lock')
end
redis.call('DEL', KEYS[1], KEYS[2])
announce(ARGV[1], 'released')
return 1
