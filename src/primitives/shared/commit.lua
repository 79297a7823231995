-- Write the value while keeping the lock, if the lock still holds our token; the write moves
-- the value's version (the fencing counter).
--
-- KEYS[1]: the lock; KEYS[2]: the value; KEYS[3]: the fencing counter; KEYS[4]: who wrote the
-- value.
-- ARGV[1]: the token; ARGV[2]: the value's new bytes; ARGV[3]: the holder's fencing token.
-- Reply: 1 when written, 0 when the lock held another token or none (nothing written).
-- Needs shared/version.lua.
if redis.call('GET', KEYS[1]) ~= ARGV[1] then
  return 0
end
redis.call('SET', KEYS[2], ARGV[2])
redis.call('SET', KEYS[4], ARGV[3])
move_version(KEYS[3])
return 1
