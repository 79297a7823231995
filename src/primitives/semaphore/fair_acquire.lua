-- Take `n` permits of a fair semaphore when that many are free beyond those the live waiters
-- ahead of us ask for (nobody overtakes a waiter, even one that asks for more than is free);
-- else, in `wait` mode, join the queue (or keep our place).
--
-- KEYS[1]: the permit count; KEYS[2]: the holders; KEYS[3]: the held permits; KEYS[4]: the
-- queue; KEYS[5]: the waiters' timeouts; KEYS[6]: the permits each waiter wants.
-- ARGV[1]: the token (also the waiter's id); ARGV[2]: the lease in ms; ARGV[3]: n; ARGV[4]:
-- the permit count to store when none is stored yet; ARGV[5]: the waiter timeout in ms;
-- ARGV[6]: `wait` to queue, `try` not to; ARGV[7]: the waiter channel prefix.
-- Reply: `{1, 0}` when taken (also when this token holds them already: the same attempt sent
-- again after its reply was lost), `{0, ms}` when not, with how long until a holder's lease
-- or a waiter ahead runs out at the latest. Errors with `INVALIDARG` when n is more than the
-- permits that exist, `WRONGTYPE` when a key has the wrong type. Needs errors.lua,
-- holder.lua, permits.lua, announce.lua and fair_queue.lua.
local now = now_ms()
local live, asks, bad = live_waiters(KEYS[4], KEYS[5], KEYS[6], now)
if bad then return bad end
local n = tonumber(ARGV[3])
local permits, used, bad = room_for(KEYS[1], KEYS[2], KEYS[3], ARGV[4], n, now)
if bad then return bad end
local lease = tonumber(ARGV[2])
if redis.call('HEXISTS', KEYS[3], ARGV[1]) == 1 then
  redis.call('ZADD', KEYS[2], now + lease, ARGV[1])
  keep_holders(KEYS[2], KEYS[3], now)
  return {1, 0}
end
-- The permits the live waiters ahead of us ask for (all of them, when we are not queued).
local ahead = 0
for i, token in ipairs(live) do
  if token == ARGV[1] then
    break
  end
  ahead = ahead + asks[i]
end
if used + ahead + n > permits then
  used = held_by_holders(KEYS[2], KEYS[3], used)
end
if used + ahead + n <= permits then
  redis.call('HSET', KEYS[3], ARGV[1], n)
  redis.call('ZADD', KEYS[2], now + lease, ARGV[1])
  keep_holders(KEYS[2], KEYS[3], now)
  if leave_queue(KEYS[4], KEYS[5], KEYS[6], ARGV[1]) == 1 and #live == 1 then
    redis.call('DEL', KEYS[4], KEYS[5], KEYS[6])
  end
  return {1, 0}
end
if ARGV[6] == 'wait' then
  local ttl = tonumber(ARGV[5])
  if not redis.call('ZSCORE', KEYS[5], ARGV[1]) then
    redis.call('RPUSH', KEYS[4], ARGV[1])
  end
  redis.call('HSET', KEYS[6], ARGV[1], n)
  redis.call('ZADD', KEYS[5], now + ttl, ARGV[1])
  -- All end at one instant: a script's `PEXPIRE` counts from when each call runs.
  for i = 4, 6 do
    redis.call('PEXPIREAT', KEYS[i], now + ttl)
  end
end
-- Tell the waiters ahead that fit (again), in case a dead one was just dropped from ahead of
-- them or their announcement went astray.
if #live > 0 then
  wake_fitting(KEYS[4], KEYS[5], KEYS[6], ARGV[7], permits - used, live, asks)
end
-- Permits come back when a holder's lease ends; a waiter ahead that died leaves when its
-- timeout passes.
local wait = math.huge
local first = redis.call('ZRANGE', KEYS[2], 0, 0, 'WITHSCORES')
if first[2] then
  wait = tonumber(first[2]) - now
end
if live[1] and live[1] ~= ARGV[1] then
  wait = math.min(wait, tonumber(redis.call('ZSCORE', KEYS[5], live[1])) - now)
end
if wait == math.huge then
  wait = lease
end
return {0, math.max(wait, 1)}
