-- Write the value and release the lock, in one step, if the lock still holds our token: a
-- holder whose lease ran out writes nothing. The release is announced when someone waits, as
-- for a `Mutex`.
--
-- KEYS[1]: the lock; KEYS[2]: the waiters flag; KEYS[3]: the value.
-- ARGV[1]: the token; ARGV[2]: the release channel; ARGV[3]: the value's new bytes (empty:
-- remove the value; an encoded value is never empty, it starts with its codec's tag).
-- Reply: 1 when written (or removed) and released, 0 when the lock held another token or none (nothing
-- written). Needs announce.lua.
if redis.call('GET', KEYS[1]) ~= ARGV[1] then
  return 0
end
if ARGV[3] == '' then
  redis.call('DEL', KEYS[3])
else
  redis.call('SET', KEYS[3], ARGV[3])
end
if redis.call('DEL', KEYS[1], KEYS[2]) > 1 then
  announce(ARGV[2], 'released')
end
return 1
