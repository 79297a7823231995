-- Take `n` permits when that many are free.
--
-- KEYS[1]: the permit count; KEYS[2]: the holders; KEYS[3]: the held permits;
-- KEYS[4]: the waiters flag.
-- ARGV[1]: the token; ARGV[2]: the lease in milliseconds; ARGV[3]: n; ARGV[4]: the permit
-- count to store when none is stored yet.
-- Reply: `{1, 0}` when taken (also when this token holds them already: the same attempt sent
-- again after its reply was lost), `{0, ms}` when not, with how long until the first holder's
-- lease ends at the latest. Errors with `INVALIDARG` when n is more than the permits that
-- exist, `WRONGTYPE` when a key has the wrong type. Needs errors.lua, holder.lua and
-- permits.lua.
local now = now_ms()
local n = tonumber(ARGV[3])
local permits, used, bad = room_for(KEYS[1], KEYS[2], KEYS[3], ARGV[4], n, now)
if bad then return bad end
local mine = redis.call('HEXISTS', KEYS[3], ARGV[1]) == 1
if not mine and used + n > permits then
  used = held_by_holders(KEYS[2], KEYS[3], used)
end
if mine or used + n <= permits then
  redis.call('HSET', KEYS[3], ARGV[1], n)
  redis.call('ZADD', KEYS[2], now + tonumber(ARGV[2]), ARGV[1])
  keep_holders(KEYS[2], KEYS[3], now)
  return {1, 0}
end
local first = redis.call('ZRANGE', KEYS[2], 0, 0, 'WITHSCORES')
local wait = math.max(tonumber(first[2]) - now, 1)
redis.call('SET', KEYS[4], '1', 'PX', wait + tonumber(ARGV[2]))
return {0, wait}
