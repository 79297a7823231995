-- Release the lock if it still holds our token, and name the client that has waited longest
-- (if any) on the lock's channel: an uncontended release costs one command more than a plain
-- compare-and-delete (the look at the waiting clients).
--
-- This is the script's start: the helpers (errors.lua, fence.lua, announce.lua, waiters.lua)
-- and `release_to_named.lua` follow it. A release that finds no client waiting ends here, before
-- the helpers' functions are made (Lua makes each `local function` anew at every call, and
-- the set's `ZPOPMIN` makes a table even when it is empty).
--
-- KEYS[1]: the lock key; KEYS[2]: the waiting clients; KEYS[3] (with ARGV[3]): the fencing
-- counter.
-- ARGV[1]: the token; ARGV[2]: the release channel; ARGV[3], when given: the claim of a lock
-- handed to the client named, ms (waiters.lua; without it, the client named attempts).
-- Reply: 1 when deleted, 0 when the key held another token or was gone.
if redis.call('GET', KEYS[1]) ~= ARGV[1] then
  return 0
end
redis.call('DEL', KEYS[1])
if redis.call('EXISTS', KEYS[2]) == 0 then
  return 1
end
