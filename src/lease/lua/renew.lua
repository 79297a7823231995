-- Renew the lease of a lock that still holds our token: its remaining lease becomes at least
-- the lease given, never less (an extension beyond it is kept). Never re-creates a lock that
-- is gone.
--
-- KEYS[1]: the lock key.
-- ARGV[1]: the token; ARGV[2]: the lease in milliseconds.
-- Reply: 1 when the lock holds the token, 0 when the key held another token, was gone or was
-- not a string (no error, so that one bad key cannot fail a pipelined batch).
local value = redis.pcall('GET', KEYS[1])
if value == ARGV[1] then
  if redis.call('PTTL', KEYS[1]) < tonumber(ARGV[2]) then
    redis.call('PEXPIRE', KEYS[1], ARGV[2])
  end
  return 1
end
return 0
