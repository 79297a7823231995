-- Change the lease of a lock that still holds our token: add to what remains (`add`) or
-- replace it (`set`, which may shorten it). Never re-creates a lock that is gone.
--
-- KEYS[1]: the lock key.
-- ARGV[1]: the token; ARGV[2]: milliseconds; ARGV[3]: `add` or `set`.
-- Reply: the remaining lease in milliseconds afterwards, or -1 when the lock does not hold
-- the token.
if redis.pcall('GET', KEYS[1]) ~= ARGV[1] then
  return -1
end
local ms = tonumber(ARGV[2])
if ARGV[3] == 'add' then
  ms = ms + math.max(redis.call('PTTL', KEYS[1]), 0)
end
redis.call('PEXPIRE', KEYS[1], ms)
return ms
