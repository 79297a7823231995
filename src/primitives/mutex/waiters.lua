-- Shared helpers: the clients waiting for a lock. `waiting` is a sorted set of client ids
-- (the part of a token before its first `:`), scored by the fencing token of the hold during
-- which each began to wait, so that a release names a client of the earliest hold (clients
-- that began during the same hold are named in no particular order); it expires a lease after
-- the holder's, as a crashed client's place must. Earlier versions kept a string there (a
-- waiters flag, set by a failed acquire): both helpers replace one, and a release that finds
-- one wakes every waiter, as those versions did, so that a fleet can be upgraded one process
-- at a time. Needs announce.lua.
-- Adds the client of `token` (unless it waits already) with `score`, and keeps the set for
-- `ms` from now.
local function register_waiter(waiting, token, score, ms)
  local client = string.match(token, '^[^:]+')
  if type(redis.pcall('ZADD', waiting, 'NX', score, client)) == 'table' then
    redis.call('DEL', waiting)
    redis.call('ZADD', waiting, score, client)
  end
  redis.call('PEXPIRE', waiting, ms)
end
-- The lock is free: tells the client that has waited longest, on the lock's channel (the
-- message is its id: that client's leading waiter attempts, the others wait on).
local function name_next(waiting, channel)
  local next = redis.pcall('ZPOPMIN', waiting)
  if next['err'] then
    redis.call('DEL', waiting)
    announce(channel, 'released')
  elseif next[1] then
    announce(channel, next[1])
  end
end
