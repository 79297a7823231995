-- Takes a lock if it is free: the body of `mutex/acquire.lua` (see there), as a function that
-- scripts taking several locks call for each. Returns the script's reply (an error reply is a
-- table with `err`). `waits` says what the caller does if the lock is held: '' gives up,
-- 'wait' waits (a failure adds its client to the lock's waiting clients), 'more' waits and
-- other threads of its client wait too (a take also keeps the client among the waiting,
-- behind every client that began to wait before this hold); either with ' overdue' after it
-- ('wait overdue', 'more overdue'): the attempt follows a long wait of the client's, so a
-- client no longer among the waiting was named by a release (waiters.lua), and if the lock was
-- taken meanwhile it is owed the next turn. Either may end with ' recheck' ('wait recheck',
-- 'more overdue recheck'): the attempt is a waiter's re-check after a silent wait, and a
-- failed one also tells how many waiting clients a release names before the caller's.
-- A lock that holds the caller's client's turn (waiters.lua) is the caller's to take. A lock
-- handed to the caller's client (a claim, waiters.lua) is taken only by the attempt that names
-- its fencing token, `claim` (the thread that took the note of it out, when it could not rely
-- on the note alone); to every other attempt of the client it is held by the client, which
-- keeps two threads of the client from both taking it.
-- A key of the wrong type where the lock should be is an error that leaves nothing behind: a
-- fencing counter that only attempts without a script counted is deleted with it.
-- Needs errors.lua, fence.lua, announce.lua and waiters.lua.

-- A redmutex client's token starts with its client id, 32 hex digits, and a colon.
local REDMUTEX_TOKEN = '^%x%x%x%x%x%x%x%x%x%x%x%x%x%x%x%x%x%x%x%x%x%x%x%x%x%x%x%x%x%x%x%x:'

-- How long a client that gave the lock up waits, at most, before it tries again.
local YIELD_WAIT_MS = 5

local function take_lock(lock, fence, waiting, token, lease, waits, claim)
  local client = string.match(token, '^[^:]+')
  -- The suffixes, on the longer forms only ('', 'wait', 'more' and 'after' have none).
  local recheck, overdue = false, false
  if #waits > 5 then
    recheck = string.sub(waits, -8) == ' recheck'
    if recheck then
      waits = string.sub(waits, 1, -9)
    end
    overdue = string.sub(waits, -8) == ' overdue'
    if overdue then
      waits = string.sub(waits, 1, -9)
    end
  end
  if waits == 'after' then
    -- The client just gave the lock up to the clients waiting for it: while it stands free
    -- (the client named by the release is on its way), it is not taken; the client waits
    -- behind every client waiting now, and tries again after a moment (in case nobody was
    -- named).
    if redis.call('EXISTS', lock) == 0 then
      local now = redis.pcall('GET', fence)
      if type(redis.pcall('ZADD', waiting, tonumber(type(now) == 'string' and now or '0') or 0,
          client)) == 'number' then
        redis.call('PEXPIRE', waiting, 2 * tonumber(lease))
      end
      return {0, YIELD_WAIT_MS}
    end
    waits = 'wait'
  end
  -- `SET NX PX GET`: the holder before (false: the lock was free and is now the token's), or
  -- an error reply. Redis before 7.0 refuses `NX` with `GET` (and has no
  -- `redis.REDIS_VERSION_NUM`): there a `GET`, then a `SET` when free, which the script runs
  -- as one step.
  local previous
  if redis.REDIS_VERSION_NUM then
    previous = redis.pcall('SET', lock, token, 'NX', 'PX', lease, 'GET')
  else
    previous = redis.pcall('GET', lock)
    if not previous then
      local set = redis.pcall('SET', lock, token, 'PX', lease)
      if type(set) == 'table' and set['err'] then
        previous = set
      end
    end
  end
  if type(previous) == 'table' and previous['err'] then
    if is_type_error(previous) then
      forget_unseeded_fence(fence)
      return redis.error_reply('WRONGTYPE key ' .. lock .. ' exists but is not a lock')
    end
    if error_code(previous) == 'OOM' then
      -- Out of memory refuses even a SET NX that would not write: a held lock is still held
      -- (its waiters flag cannot be set, so waiters recheck rather than hear the release).
      local held_ttl = redis.pcall('PTTL', lock)
      if type(held_ttl) == 'number' and held_ttl > 0 then
        return {0, held_ttl}
      end
    end
    return previous
  end
  if previous == client .. ':turn' or (claim and previous == client .. ':h:' .. claim) then
    -- The client's turn, or the lock handed to it whose note the caller took: the lock is
    -- now the token's.
    redis.call('SET', lock, token, 'PX', lease)
    previous = false
  end
  if not previous or previous == token then
    if previous then
      -- Sent again after its reply was lost, and the first one took it: it is ours.
      redis.call('PEXPIRE', lock, lease)
    end
    local taken, bad = take_fence(lock, fence)
    if bad then return bad end
    if waits == 'more' then
      -- Behind every client that began to wait before this hold: a place the client had from
      -- before (one it was owed, too) is given up, or the release of a hold passed on from
      -- this one would take it for a place from before its own hold, and remove it.
      register_waiter(waiting, token, taken, 2 * tonumber(lease), true)
    elseif overdue then
      -- A place the client may have been owed is not wanted any more (its release would give
      -- up any other place it took before this hold).
      redis.pcall('ZREM', waiting, client)
    end
    return {1, taken}
  end
  local ttl = redis.call('PTTL', lock)
  if ttl < 0 then
    forget_unseeded_fence(fence)
    return redis.error_reply('WRONGTYPE key ' .. lock .. ' has no expiry; it is not a lock')
  end
  local placed
  if waits ~= '' then
    -- Waiting since the current hold (whose fencing token is the counter's value). When the
    -- holder is of the caller's own client, a place the client has is from before that hold,
    -- and that hold's release gives such a place up (mutex/release_held.lua): the place
    -- counts from a new tick of the counter instead, later than the hold and than any place
    -- taken before, and the caller is told it, so that its own release, should a sibling pass
    -- it the lock, gives this place up and no later one.
    local own = string.sub(previous, 1, #client + 1) == client .. ':'
    local since
    if own then
      since = redis.pcall('INCR', fence)
      placed = type(since) == 'number' and since or nil
    end
    if not placed then
      since = redis.pcall('GET', fence)
      since = tonumber(type(since) == 'string' and since or '0') or 0
    end
    local added = register_waiter(waiting, token, since, ttl + tonumber(lease), own)
    if added and overdue and not own then
      -- Named, and beaten to the lock (by another client): first in line, and the next
      -- release hands it over.
      redis.call('ZADD', waiting, OWED, client)
    end
  end
  if not string.match(previous, REDMUTEX_TOKEN) then
    -- Not a redmutex client's token (redis-py's `Lock` on a bare key, a hand-written
    -- `SET NX PX`): nobody will announce its release. The time left goes back negative,
    -- which tells the waiter to re-check with its backoff.
    return {0, -ttl}
  end
  if waits == '' then
    return {0, ttl}
  end
  -- A waiter is told the server's clock (ms), by which it reads when the claim of a lock
  -- handed to its client ends (waiters.lua).
  local time = redis.call('TIME')
  local now = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
  if recheck then
    -- How many clients a release names before this one (ZRANK: the order of ZPOPMIN); the
    -- waiter re-checks the less often the further back it is. Not among them (named, or its
    -- place gone): 0, so that it re-checks soon.
    local ahead = redis.pcall('ZRANK', waiting, client)
    return {0, ttl, now, false, placed or false, type(ahead) == 'number' and ahead or 0}
  end
  return {0, ttl, now, false, placed or false}
end
