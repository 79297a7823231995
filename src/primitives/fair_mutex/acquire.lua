-- Take a fair lock when it is free and it is our turn (the queue is empty or we are its live
-- head); else, in `wait` mode, join the queue (or keep our place) until told.
--
-- KEYS[1]: lock; KEYS[2]: fencing counter; KEYS[3]: queue; KEYS[4]: timeouts.
-- ARGV[1]: token (also the waiter's id); ARGV[2]: lease ms; ARGV[3]: waiter timeout ms;
-- ARGV[4]: `wait` to queue, `try` not to; ARGV[5]: the waiter channel prefix.
-- Reply: `{1, fencing_token}` when taken (also when the lock holds this very token: the same
-- attempt sent again after its reply was lost, or a lock a release handed to this waiter);
-- `{0, ms, now}` when not, where `ms` is how long the caller may wait before checking again
-- (the lock's remaining lease, or the time until the waiter ahead counts as dead) and `now`
-- the server's clock (ms) when the attempt ran, against which the waiter reads the claim of a
-- lock handed to it later. When the lock is free and another live waiter is next, that
-- waiter is told again.
-- Errors with `WRONGTYPE` when a key holds the wrong type (nothing is changed).
-- Needs errors.lua, fence.lua and queue.lua.
local first = redis.call('LINDEX', KEYS[3], 0)
local holder, refused
if not first and redis.REDIS_VERSION_NUM then
  -- Nobody queued: a free lock is taken in one command (`SET NX PX GET`, Redis 7), which
  -- gives the holder of a held one. A refusal other than the key's type (out of memory
  -- refuses even a SET NX that would not write) is read again with a GET.
  holder = redis.pcall('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2], 'GET')
  if type(holder) == 'table' and holder['err'] then
    if is_type_error(holder) then
      return redis.error_reply('WRONGTYPE key ' .. KEYS[1] .. ' exists but is not a lock')
    end
    holder, refused = holder_of(KEYS[1])
    if refused then return refused end
  elseif not holder then
    local fence, bad = take_fence(KEYS[1], KEYS[2])
    if bad then return bad end
    return {1, fence}
  end
else
  holder, refused = holder_of(KEYS[1])
  if refused then return refused end
end
if holder == ARGV[1] then
  -- Sent again after its reply was lost, and the first one took it, or a release handed it
  -- over: it is ours.
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  local fence, bad = take_fence(KEYS[1], KEYS[2])
  if bad then return bad end
  return {1, fence}
end
-- The server's clock only when someone holds or queues.
local now = (first or holder) and now_ms()
-- Who is next matters only while the lock is free: while it is held, a dead waiter at the
-- head stays until the release (or a later attempt on a free lock) drops it.
local head, head_expiry
if first and not holder then
  head, head_expiry = live_head(KEYS[3], KEYS[4], now, first)
end
if not holder and (not head or head == ARGV[1]) then
  redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
  if head then
    redis.call('LPOP', KEYS[3])
    redis.call('ZREM', KEYS[4], ARGV[1])
  end
  -- (A queue emptied here is gone: Redis deletes an empty list or sorted set.)
  local fence, bad = take_fence(KEYS[1], KEYS[2])
  if bad then return bad end
  return {1, fence}
end
local wait = 0
if holder then
  wait = redis.call('PTTL', KEYS[1])
  if wait < 0 then
    return redis.error_reply('WRONGTYPE key ' .. KEYS[1] .. ' has no expiry; it is not a lock')
  end
elseif head then
  wait = math.max(head_expiry - now, 1)
  -- The lock is free and another live waiter is next: tell it (again), in case a dead one
  -- was just dropped from ahead of it or its announcement went astray.
  wake_waiter(ARGV[5], head)
end
if ARGV[4] == 'wait' then
  local ttl = tonumber(ARGV[3])
  -- A waiter new to the deadlines is new to the queue.
  if redis.call('ZADD', KEYS[4], now + ttl, ARGV[1]) == 1 then
    redis.call('RPUSH', KEYS[3], ARGV[1])
  end
  -- Both end at one instant: a script's `PEXPIRE` counts from when each call runs.
  redis.call('PEXPIREAT', KEYS[3], now + ttl)
  redis.call('PEXPIREAT', KEYS[4], now + ttl)
end
return {0, wait, now}
