-- Shared helpers of a fair semaphore's scripts. Besides the keys of every semaphore
-- (permits.lua), with `S` for `P:semaphore:{N}`, a fair semaphore keeps `S:queue`, a list of
-- waiter tokens in arrival order; `S:timeouts`, a sorted set of the same tokens scored by
-- when each waiter counts as dead (server time in ms, pushed on by its client's heartbeat);
-- and `S:wants`, a hash of how many permits each waiter asks for. A waiter's channel is
-- `S:ch:<client id>`, and the message is its token. Needs errors.lua, holder.lua,
-- permits.lua and announce.lua.
-- The live waiters in arrival order, and how many permits each asks for; drops the dead
-- ones. Or nil, nil and an error when a key of the queue has the wrong type (then nothing
-- was changed).
local function live_waiters(queue, timeouts, wants, now)
  local tokens = redis.pcall('LRANGE', queue, 0, -1)
  if tokens['err'] then
    return nil, nil, wrong_type(queue, 'a queue of waiters')
  end
  local live, asks, dead = {}, {}, {}
  local i = 1
  while i <= #tokens do
    local last = math.min(i + 499, #tokens)
    local expiries = redis.pcall('ZMSCORE', timeouts, unpack(tokens, i, last))
    if expiries['err'] then
      return nil, nil, wrong_type(timeouts, 'a set of waiter timeouts')
    end
    local wanted = redis.pcall('HMGET', wants, unpack(tokens, i, last))
    if wanted['err'] then
      return nil, nil, wrong_type(wants, 'a hash of wanted permits')
    end
    for j = i, last do
      local expiry = expiries[j - i + 1]
      if expiry and tonumber(expiry) > now then
        live[#live + 1] = tokens[j]
        asks[#asks + 1] = tonumber(wanted[j - i + 1]) or 1
      else
        dead[#dead + 1] = tokens[j]
      end
    end
    i = last + 1
  end
  for _, token in ipairs(dead) do
    redis.call('LREM', queue, 0, token)
    redis.call('ZREM', timeouts, token)
    redis.call('HDEL', wants, token)
  end
  return live, asks
end
-- Takes a waiter out of the queue; returns 1 when it was queued.
local function leave_queue(queue, timeouts, wants, token)
  local removed = redis.call('LREM', queue, 0, token)
  redis.call('ZREM', timeouts, token)
  redis.call('HDEL', wants, token)
  return math.min(removed, 1)
end
-- Wakes, in arrival order, the live waiters whose permits fit in `free`, and stops at the
-- first that does not fit: nobody overtakes it. Removes the queue's keys when nobody waits.
local function wake_fitting(queue, timeouts, wants, prefix, free, live, asks)
  if #live == 0 then
    redis.call('DEL', queue, timeouts, wants)
    return
  end
  local sum = 0
  for i, token in ipairs(live) do
    sum = sum + asks[i]
    if sum > free then
      return
    end
    wake_waiter(prefix, token)
  end
end
-- After permits were given back (or added): wakes the waiters they let in. `permits_key` may
-- hold no count (a forced release removed it): then every waiter in turn is told, and their
-- attempts store the count again.
local function hand_on(permits_key, holders, held, queue, timeouts, wants, prefix, now)
  local live, asks, bad = live_waiters(queue, timeouts, wants, now)
  if bad then return bad end
  local used, wrong = in_use(holders, held, now)
  if wrong then return wrong end
  local permits = stored_permits(permits_key) or math.huge
  wake_fitting(queue, timeouts, wants, prefix, permits - used, live, asks)
end
