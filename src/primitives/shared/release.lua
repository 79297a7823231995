-- Write the value and release the lock, in one step, if the lock still holds our token: a
-- holder whose lease ran out writes nothing. A write moves the value's version (the fencing
-- counter), so that an update that read the value before it is refused. The release names the
-- client that has waited longest, as a `Mutex`'s does.
--
-- KEYS[1]: the lock; KEYS[2]: the waiting clients; KEYS[3]: the value; KEYS[4]: the fencing
-- counter; KEYS[5]: who wrote the value.
-- ARGV[1]: the token; ARGV[2]: the release channel; ARGV[3]: the value's new bytes (empty:
-- remove the value; an encoded value is never empty, it starts with its codec's tag);
-- ARGV[4]: the holder's fencing token, kept as who wrote (or removed) the value.
-- Reply: 1 when written (or removed) and released, 0 when the lock held another token or none
-- (nothing written). Needs shared/version.lua; as `mutex/release.lua`, it is the script's
-- start, which returns when no client waits, and announce.lua, mutex/waiters.lua and
-- mutex/release_to_waiting.lua follow it.
if redis.call('GET', KEYS[1]) ~= ARGV[1] then
  return 0
end
if ARGV[3] == '' then
  redis.call('DEL', KEYS[3])
else
  redis.call('SET', KEYS[3], ARGV[3])
end
redis.call('SET', KEYS[5], ARGV[4])
move_version(KEYS[4])
redis.call('DEL', KEYS[1])
if redis.call('EXISTS', KEYS[2]) == 0 then
  return 1
end
