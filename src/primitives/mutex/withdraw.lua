-- A client's last waiter gave up: take the client out of the waiting clients, give up its
-- turn if a release handed it one (waiters.lua), and when the lock is free (it may have been
-- named just before), name the next one instead.
--
-- KEYS[1]: the lock key; KEYS[2]: the waiting clients.
-- ARGV[1]: the waiter's token (its client id comes first); ARGV[2]: the release channel.
-- Reply: 1. Needs announce.lua and waiters.lua.
local client = string.match(ARGV[1], '^[^:]+')
redis.pcall('ZREM', KEYS[2], client)
if redis.pcall('GET', KEYS[1]) == client .. ':turn' then
  redis.call('DEL', KEYS[1])
end
if redis.call('EXISTS', KEYS[1]) == 0 then
  name_next(KEYS[2], ARGV[2], KEYS[1])
end
return 1
