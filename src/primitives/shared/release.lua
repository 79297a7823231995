-- Write the value and release the lock, in one step, if the lock still holds our token: a
-- holder whose lease ran out writes nothing. The write records its version as who wrote the
-- value, so that an update that read the value before it is refused. The release names the
-- client that has waited longest, as a `Mutex`'s does.
--
-- KEYS[1]: the lock; KEYS[2]: the waiting clients; KEYS[3]: the value; KEYS[4]: who wrote the
-- value.
-- ARGV[1]: the token; ARGV[2]: the release channel; ARGV[3]: the value's new bytes (empty:
-- remove the value; an encoded value is never empty, it starts with its codec's tag);
-- ARGV[4]: this write's version (the holder's fencing token and its count of writes), kept as
-- who wrote (or removed) the value.
-- Reply: 1 when written (or removed) and released, or when this very write was already made (a
-- release sent again after its connection dropped finds the first one's version as who wrote);
-- 0 when the lock held another token or none and this write was not the last made (it was not
-- made now; an earlier send may have made it and another holder written since). As
-- `mutex/release.lua`, it is the script's start, which returns when no client waits, and
-- announce.lua, mutex/waiters.lua and mutex/release_to_waiting.lua follow it.
if redis.call('GET', KEYS[1]) ~= ARGV[1] then
  if redis.call('GET', KEYS[4]) == ARGV[4] then
    return 1
  end
  return 0
end
if ARGV[3] == '' then
  redis.call('DEL', KEYS[3])
  redis.call('SET', KEYS[4], ARGV[4])
else
  -- One command for the two keys (they share a slot): each call from a script costs as much
  -- as the rest of the release.
  redis.call('MSET', KEYS[3], ARGV[3], KEYS[4], ARGV[4])
end
redis.call('DEL', KEYS[1])
if redis.call('EXISTS', KEYS[2]) == 0 then
  return 1
end
