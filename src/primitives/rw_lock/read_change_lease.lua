-- Change the lease of a read hold that is still there: add to what remains (`add`) or replace
-- it (`set`). Never re-creates a hold that is gone.
--
-- KEYS[1]: the readers.
-- ARGV[1]: the token; ARGV[2]: milliseconds; ARGV[3]: `add` or `set`.
-- Reply: the remaining lease in milliseconds afterwards, or -1. Needs errors.lua, holder.lua,
-- member_lease.lua and rw.lua.
local now = now_ms()
local left = change_member(KEYS[1], ARGV[1], ARGV[2], ARGV[3], now)
if left >= 0 then
  expire_readers(KEYS[1], now)
end
return left
