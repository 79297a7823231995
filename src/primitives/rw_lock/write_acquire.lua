-- Take the write hold: granted when no writer and no live reader holds the lock; else this
-- writer's claim (`writer-waiting`) keeps new readers out until it is granted.
--
-- KEYS[1]: the writer's key; KEYS[2]: the fencing counter; KEYS[3]: the readers;
-- KEYS[4]: the waiting writer; KEYS[5]: the waiters flag.
-- ARGV[1]: the token; ARGV[2]: the lease in milliseconds; ARGV[3]: `claim` when the writer
-- will wait (it then claims the next turn), `try` when not.
-- Reply: `{1, fencing_token}` when held, `{0, ms}` when not. Needs errors.lua, fence.lua,
-- holder.lua and rw.lua.
local now = now_ms()
local writer, refused = holder_of(KEYS[1])
if refused then return refused end
local count, wrong = live_readers(KEYS[3], now)
if wrong then return wrong end
if (not writer or writer == ARGV[1]) and count == 0 then
  redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
  if redis.call('GET', KEYS[4]) == ARGV[1] then
    redis.call('DEL', KEYS[4])
  end
  local fence, bad = take_fence(KEYS[1], KEYS[2])
  if bad then return bad end
  return {1, fence}
end
-- Held: a writer that waits claims the next turn, unless another writer claimed it already.
if ARGV[3] == 'claim' then
  local claimed = redis.call('GET', KEYS[4])
  if not claimed or claimed == ARGV[1] then
    redis.call('SET', KEYS[4], ARGV[1], 'PX', ARGV[2])
  end
end
local ttl
if writer then
  ttl = redis.call('PTTL', KEYS[1])
else
  local last = redis.call('ZRANGE', KEYS[3], -1, -1, 'WITHSCORES')
  ttl = tonumber(last[2]) - now
end
someone_waits(KEYS[5], ttl, ARGV[2])
return {0, math.max(ttl, 1)}
