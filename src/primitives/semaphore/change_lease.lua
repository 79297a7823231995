-- Change the lease of a permit holder that still holds: add to what remains (`add`) or
-- replace it (`set`). Never gives back permits that expired.
--
-- KEYS[1]: the holders; KEYS[2]: the held permits.
-- ARGV[1]: the token; ARGV[2]: milliseconds; ARGV[3]: `add` or `set`.
-- Reply: the remaining lease in milliseconds afterwards, or -1. Needs holder.lua,
-- member_lease.lua and permits.lua.
local now = now_ms()
local left = change_member(KEYS[1], ARGV[1], ARGV[2], ARGV[3], now)
if left >= 0 then
  keep_holders(KEYS[1], KEYS[2], now)
end
return left
