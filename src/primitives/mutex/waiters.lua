-- Shared helpers: the clients waiting for a lock. `waiting` is a sorted set of client ids
-- (the part of a token before its first `:`), scored by the fencing token of the hold during
-- which each began to wait, so that a release names a client of the earliest hold (clients
-- that began during the same hold are named in no particular order); it expires a lease after
-- the holder's, as a crashed client's place must. Earlier versions kept a string there (a
-- waiters flag, set by a failed acquire): both helpers replace one, and a release that finds
-- one wakes every waiter of those versions on the lock's channel, as they did. Needs
-- announce.lua.
--
-- A client that has waited long (take.lua), was named, attempted, and found the lock taken
-- meanwhile (a thread of another client took it while the named one was on its way) is owed
-- its turn: it waits first, with the score `OWED`, and the next release hands the lock to it:
-- the lock holds the client's turn (its id and `:turn`) for `TURN_MS`, which no other attempt
-- takes, and which the client's next attempt takes whatever its token (take.lua). Barging
-- keeps its throughput while waits are short, and no client is beaten to the lock for long,
-- as parking_lot's fair unlock bounds barging in a process.
local OWED = -1
local TURN_MS = 20
-- Adds the client of `token` (unless it waits already, or with `replace`, in any case) with
-- `score`, and keeps the set for `ms` from now. Returns whether it was added.
local function register_waiter(waiting, token, score, ms, replace)
  local client = string.match(token, '^[^:]+')
  local added
  if replace then
    added = redis.pcall('ZADD', waiting, score, client)
  else
    added = redis.pcall('ZADD', waiting, 'NX', score, client)
  end
  if type(added) == 'table' then
    redis.call('DEL', waiting)
    added = redis.call('ZADD', waiting, score, client)
  end
  redis.call('PEXPIRE', waiting, ms)
  return added == 1
end
-- The lock is free: tells the client that has waited longest, on its own channel, the lock's
-- channel `channel` plus `:` and its id (the message is its id: that client's leading waiter
-- attempts, the others wait on). Only that client hears it: a channel that every waiting
-- client listened on would wake a thread in each of them at every hand-off, work that grows
-- with the clients. A client owed its turn gets the lock `lock` held for it (no lock given:
-- it is told only). A flag of an earlier version is announced on the lock's channel itself,
-- where its waiters listen.
local function name_next(waiting, channel, lock)
  local next = redis.pcall('ZPOPMIN', waiting)
  if next['err'] then
    redis.call('DEL', waiting)
    announce(channel, 'released')
  elseif next[1] then
    if lock and tonumber(next[2]) < 0 then
      redis.call('SET', lock, next[1] .. ':turn', 'PX', TURN_MS)
    end
    announce(channel .. ':' .. next[1], next[1])
  end
end
