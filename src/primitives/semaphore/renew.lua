-- Renew a holder's lease to at least the lease given; never gives back permits that expired.
--
-- KEYS[1]: the holders; KEYS[2]: the held permits.
-- ARGV[1]: the token; ARGV[2]: the lease in milliseconds.
-- Reply: 1 while the token holds its permits, else 0, never an error. Needs holder.lua,
-- member_lease.lua and permits.lua.
local now = now_ms()
local held, moved = renew_member(KEYS[1], ARGV[1], ARGV[2], now)
if moved then
  keep_holders(KEYS[1], KEYS[2], now)
end
return held
