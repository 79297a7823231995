-- Read or change a semaphore's permits.
--
-- KEYS[1]: the permit count; KEYS[2]: the holders; KEYS[3]: the held permits.
-- ARGV[1]: `available` or `set`; ARGV[2]: the permit count (stored when none is, for
-- `available`; the new count, for `set`); ARGV[3]: the release channel.
-- Reply: the permits free now (never below zero). Errors with `WRONGTYPE` when a key has the
-- wrong type. Needs holder.lua, permits.lua and announce.lua.
local now = now_ms()
if ARGV[1] == 'set' then
  local stored = redis.pcall('GET', KEYS[1])
  if type(stored) == 'table' then
    return wrong_type(KEYS[1], 'a permit count')
  end
  redis.call('SET', KEYS[1], ARGV[2])
  -- More permits may let waiters in: tell them.
  announce(ARGV[3], ARGV[2])
end
local permits, bad = permits_of(KEYS[1], ARGV[2])
if bad then return bad end
local used, wrong = in_use(KEYS[2], KEYS[3], now)
if wrong then return wrong end
return math.max(permits - used, 0)
