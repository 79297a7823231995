-- Renew a holder's lease to at least the lease given; never gives back permits that expired.
--
-- KEYS[1]: the holders; KEYS[2]: the held permits.
-- ARGV[1]: the token; ARGV[2]: the lease in milliseconds.
-- Reply: 1 while the token holds its permits, else 0, never an error. Needs holder.lua and
-- permits.lua.
local now = now_ms()
local expiry = redis.pcall('ZSCORE', KEYS[1], ARGV[1])
if type(expiry) ~= 'string' or tonumber(expiry) <= now then
  return 0
end
local wanted = now + tonumber(ARGV[2])
if tonumber(expiry) < wanted then
  redis.call('ZADD', KEYS[1], 'XX', wanted, ARGV[1])
  keep_holders(KEYS[1], KEYS[2], now)
end
return 1
