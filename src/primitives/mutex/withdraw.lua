-- A client's last waiter gave up: take the client out of the waiting clients, give up its
-- turn or the lock handed to it if a release named it (waiters.lua), and when the lock is free
-- (it may have been named just before), name the next one instead.
--
-- KEYS[1]: the lock key; KEYS[2]: the waiting clients; KEYS[3] (with ARGV[3]): the fencing
-- counter.
-- ARGV[1]: the waiter's token (its client id comes first); ARGV[2]: the release channel;
-- ARGV[3], when given: the claim of a lock handed to the client named next, ms.
-- Reply: 1. Needs errors.lua, fence.lua, announce.lua and waiters.lua.
local client = string.match(ARGV[1], '^[^:]+')
redis.pcall('ZREM', KEYS[2], client)
local held = redis.pcall('GET', KEYS[1])
if held == client .. ':turn'
    or (type(held) == 'string' and string.sub(held, 1, #client + 3) == client .. ':h:') then
  redis.call('DEL', KEYS[1])
end
if redis.call('EXISTS', KEYS[1]) == 0 then
  name_next(KEYS[2], ARGV[2], KEYS[1], KEYS[3], ARGV[3])
end
return 1
