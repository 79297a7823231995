-- Release the lock if it still holds our token, and name the client that has waited longest
-- (if any) on the lock's channel: an uncontended release costs one command more than a plain
-- compare-and-delete (the look at the waiting clients).
--
-- KEYS[1]: the lock key; KEYS[2]: the waiting clients.
-- ARGV[1]: the token; ARGV[2]: the release channel.
-- Reply: 1 when deleted, 0 when the key held another token or was gone.
-- Needs announce.lua and waiters.lua.
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('DEL', KEYS[1])
  name_next(KEYS[2], ARGV[2], KEYS[1])
  return 1
end
return 0
