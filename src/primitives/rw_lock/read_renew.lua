-- Renew a read hold to at least the lease given; never re-creates one that is gone.
--
-- KEYS[1]: the readers.
-- ARGV[1]: the token; ARGV[2]: the lease in milliseconds.
-- Reply: 1 while the hold is there, else 0, never an error. Needs errors.lua, holder.lua,
-- member_lease.lua and rw.lua.
local now = now_ms()
local held, moved = renew_member(KEYS[1], ARGV[1], ARGV[2], now)
if moved then
  expire_readers(KEYS[1], now)
end
return held
