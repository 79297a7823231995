-- Delete the lock whoever holds it, and name the client that has waited longest.
--
-- KEYS[1]: the lock key; KEYS[2]: the waiting clients.
-- ARGV[1]: the release channel.
-- Reply: 1 when a lock was deleted, 0 when there was none. Needs announce.lua and waiters.lua.
local t = redis.call('TYPE', KEYS[1])['ok']
if t == 'none' then
  return 0
end
if t ~= 'string' then
  return redis.error_reply('WRONGTYPE key ' .. KEYS[1] .. ' exists but is not a lock')
end
redis.call('DEL', KEYS[1])
name_next(KEYS[2], ARGV[1])
return 1
