-- Record that the holder's thread panicked, if the lock still holds its token (the release
-- follows). The record stays until a holder clears it.
--
-- KEYS[1]: the lock key; KEYS[2]: the poison record.
-- ARGV[1]: the token; ARGV[2]: the record.
-- Reply: 1 when recorded, 0 when the lock no longer held the token.
if redis.pcall('GET', KEYS[1]) == ARGV[1] then
  redis.call('SET', KEYS[2], ARGV[2])
  return 1
end
return 0
