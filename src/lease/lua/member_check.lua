-- How long a hold that is a member of a sorted set (a reader, a semaphore holder) has left.
--
-- KEYS[1]: the set.
-- ARGV[1]: the token.
-- Reply: the remaining lease in milliseconds, or -1 when the token no longer holds. Needs
-- holder.lua and member_lease.lua.
return member_left(KEYS[1], ARGV[1], now_ms())
