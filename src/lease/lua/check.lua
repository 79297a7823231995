-- Whether the lock still holds our token, and for how long.
--
-- KEYS[1]: the lock key.
-- ARGV[1]: the token.
-- Reply: the remaining lease in milliseconds when it does, -1 when it does not.
if redis.pcall('GET', KEYS[1]) == ARGV[1] then
  return redis.call('PTTL', KEYS[1])
end
return -1
