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
-- with the clients. A flag of an earlier version is announced on the lock's channel itself,
-- where its waiters listen.
--
-- Given the fencing counter `fence` and a claim of `claim_ms` (a `Mutex`'s release on one
-- deployment), the release hands the lock `lock` to the client it names: the lock holds the
-- claim `<client>:h:<fencing token>` (a new token) for `claim_ms`, and the message carries
-- the token and when the claim ends by the server's clock (`<client> <token> <end ms>`). The
-- client's leading waiter takes the lock by that note without a round trip (the note goes to
-- one thread of the client, and no attempt takes a claim: to the client's own attempts it is
-- held by the client, take.lua), and renews the claim to its lease; nobody else takes it
-- meanwhile, so a client named is never beaten to the lock (`Fix::HandedOver` of the model,
-- tests/wait_model/model.rs). Needs fence.lua for that.
--
-- The note is also left, alone, in a list of the client's (`waiting` plus `:` and its id), for
-- the claim's length: the client's leading waiter, the only thread of it waiting in Redis for
-- the lock, pops it with a blocking pop and is woken by its own connection rather than by
-- the subscriber thread (a hint, as the announcement: a refusal does not fail the script).
-- When a pop of the client's waits for it (recorded by the attempt it came behind, as
-- `<list>:pop`: acquire.lua), the note goes to that pop alone, unannounced: the pop's thread
-- delivers it as an announcement would (`Fix::PoppedNote` of the model).
--
-- Without them (a shared value's release, one over several instances, a forced one), the
-- client named attempts; a client owed its turn (take.lua) gets the lock `lock` held for it
-- (no lock given: it is told only).
--
-- Returns true when it wrote `lock` (a claim or a turn), which replaces whatever it held.
local function name_next(waiting, channel, lock, fence, claim_ms)
  local next = redis.pcall('ZPOPMIN', waiting)
  if next['err'] then
    redis.call('DEL', waiting)
    announce(channel, 'released')
  elseif next[1] then
    local client = next[1]
    if lock and fence and claim_ms then
      local token = next_fence(lock, fence)
      if token then
        local text = fence_text(token)
        redis.call('SET', lock, client .. ':h:' .. text, 'PX', claim_ms)
        local now = redis.call('TIME')
        local ends = tonumber(now[1]) * 1000 + math.floor(tonumber(now[2]) / 1000) + tonumber(claim_ms)
        local note = text .. ' ' .. string.format('%.0f', ends)
        local notes = waiting .. ':' .. client
        redis.pcall('DEL', notes)
        local pushed = type(redis.pcall('RPUSH', notes, note)) == 'number'
        if pushed then
          redis.call('PEXPIRE', notes, claim_ms)
        end
        -- A pop of the client's waits for the note (acquire.lua's record): it takes it, and
        -- nothing is announced.
        if not (pushed and redis.pcall('DEL', notes .. ':pop') == 1) then
          announce(channel .. ':' .. client, client .. ' ' .. note)
        end
        return true
      end
    end
    local turn = lock and tonumber(next[2]) < 0
    if turn then
      redis.call('SET', lock, client .. ':turn', 'PX', TURN_MS)
    end
    announce(channel .. ':' .. client, client)
    return turn
  end
  return false
end
