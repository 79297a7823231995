-- Write the value while keeping the lock, if the lock still holds our token; the write records
-- its version as who wrote the value.
--
-- KEYS[1]: the lock; KEYS[2]: the value; KEYS[3]: who wrote the value.
-- ARGV[1]: the token; ARGV[2]: the value's new bytes; ARGV[3]: this write's version.
-- Reply: 1 when written, 0 when the lock held another token or none (nothing written).
if redis.call('GET', KEYS[1]) ~= ARGV[1] then
  return 0
end
redis.call('MSET', KEYS[2], ARGV[2], KEYS[3], ARGV[3])
return 1
