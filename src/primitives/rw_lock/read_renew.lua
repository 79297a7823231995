-- Renew a read hold to at least the lease given; never re-creates one that is gone.
--
-- KEYS[1]: the readers.
-- ARGV[1]: the token; ARGV[2]: the lease in milliseconds.
-- Reply: 1 while the hold is there, else 0, never an error. Needs errors.lua, holder.lua and rw.lua.
local now = now_ms()
local expiry = redis.pcall('ZSCORE', KEYS[1], ARGV[1])
if type(expiry) ~= 'string' or tonumber(expiry) <= now then
  return 0
end
local wanted = now + tonumber(ARGV[2])
if tonumber(expiry) < wanted then
  redis.call('ZADD', KEYS[1], 'XX', wanted, ARGV[1])
  expire_readers(KEYS[1], now)
end
return 1
