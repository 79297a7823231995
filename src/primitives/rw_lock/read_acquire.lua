-- Take a read hold: granted when no writer holds the lock (or the writer is this thread: a
-- downgrade) and no writer waits.
--
-- KEYS[1]: the writer's key; KEYS[2]: the readers; KEYS[3]: the waiting writer;
-- KEYS[4]: the waiters flag.
-- ARGV[1]: the token; ARGV[2]: the lease in milliseconds.
-- Reply: `{1, 0}` when held (readers get no fencing token), `{0, ms}` when not, with how long
-- the writer (or the waiting writer's claim) lasts at most. Needs errors.lua, holder.lua and rw.lua.
local now = now_ms()
local writer, refused = holder_of(KEYS[1])
if refused then return refused end
local count, wrong = live_readers(KEYS[2], now)
if wrong then return wrong end
local mine = same_thread(writer, ARGV[1])
if (not writer or mine) and (mine or redis.call('EXISTS', KEYS[3]) == 0
    or redis.call('ZSCORE', KEYS[2], ARGV[1])) then
  redis.call('ZADD', KEYS[2], now + tonumber(ARGV[2]), ARGV[1])
  expire_readers(KEYS[2], now)
  return {1, 0}
end
local ttl = writer and redis.call('PTTL', KEYS[1]) or redis.call('PTTL', KEYS[3])
someone_waits(KEYS[4], ttl, ARGV[2])
return {0, math.max(ttl, 1)}
