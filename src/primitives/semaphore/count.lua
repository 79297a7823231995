-- Read or change a semaphore's permits.
--
-- KEYS[1]: the permit count; KEYS[2]: the holders; KEYS[3]: the held permits; KEYS[4..6]: a
-- fair semaphore's queue, waiters' timeouts and wanted permits (absent for another).
-- ARGV[1]: `available` or `set`; ARGV[2]: the permit count (stored when none is, for
-- `available`; the new count, for `set`); ARGV[3]: the release channel; ARGV[4]: the waiter
-- channel prefix.
-- Reply: the permits free now (never below zero). Errors with `WRONGTYPE` when a key has the
-- wrong type. Needs errors.lua, holder.lua, permits.lua, announce.lua and fair_queue.lua.
local now = now_ms()
if ARGV[1] == 'set' then
  local stored = redis.pcall('GET', KEYS[1])
  if type(stored) == 'table' then
    return wrong_type(KEYS[1], 'a permit count')
  end
  redis.call('SET', KEYS[1], ARGV[2])
  -- More permits may let waiters in: tell them, those who contend and those in the queue.
  announce(ARGV[3], ARGV[2])
  if redis.call('EXISTS', KEYS[4]) == 1 then
    local bad = hand_on(KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6], ARGV[4], now)
    if bad then return bad end
  end
end
local permits, bad = permits_of(KEYS[1], ARGV[2])
if bad then return bad end
local used, wrong = in_use(KEYS[2], KEYS[3], now)
if wrong then return wrong end
return math.max(permits - used, 0)
