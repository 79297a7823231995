-- Write the value while keeping the lock, if the lock still holds our token.
--
-- KEYS[1]: the lock; KEYS[2]: the value.
-- ARGV[1]: the token; ARGV[2]: the value's new bytes.
-- Reply: 1 when written, 0 when the lock held another token or none (nothing written).
if redis.call('GET', KEYS[1]) ~= ARGV[1] then
  return 0
end
redis.call('SET', KEYS[2], ARGV[2])
return 1
