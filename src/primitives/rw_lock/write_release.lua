-- Release the write lock if it still holds our token, and wake every waiter (readers and
-- writers alike) when someone waits (the waiters flag exists).
--
-- KEYS[1]: the writer's key; KEYS[2]: the waiters flag.
-- ARGV[1]: the token; ARGV[2]: the release channel.
-- Reply: 1 when deleted, 0 when the key held another token or was gone. Needs announce.lua.
if redis.call('GET', KEYS[1]) == ARGV[1] then
  if redis.call('DEL', KEYS[1], KEYS[2]) > 1 then
    announce(ARGV[2], 'released')
  end
  return 1
end
return 0
