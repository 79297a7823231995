-- Release the lock if it still holds our token, and announce the release when someone waits
-- (the waiters flag exists): an uncontended release costs no more than a plain
-- compare-and-delete.
--
-- KEYS[1]: the lock key; KEYS[2]: the waiters flag.
-- ARGV[1]: the token; ARGV[2]: the release channel.
-- Reply: 1 when deleted, 0 when the key held another token or was gone.
if redis.call('GET', KEYS[1]) == ARGV[1] then
  if redis.call('DEL', KEYS[1], KEYS[2]) > 1 then
    announce(ARGV[2], 'released')
  end
  return 1
end
return 0
