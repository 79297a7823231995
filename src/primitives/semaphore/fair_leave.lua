-- Leave a fair semaphore for good (a waiter that gave up, or the clean-up of an attempt whose
-- reply was lost): drop our place in the queue and give back any permits we hold; then wake
-- the waiters that were behind us, if they fit now.
--
-- KEYS: as for fair_release.lua. ARGV[1]: the token; ARGV[2]: the waiter channel prefix.
-- Reply: 1 when the waiter was queued or held permits, else 0. Needs errors.lua, holder.lua,
-- permits.lua, announce.lua and fair_queue.lua.
local now = now_ms()
local removed = leave_queue(KEYS[4], KEYS[5], KEYS[6], ARGV[1])
if give_back(KEYS[2], KEYS[3], ARGV[1], now) > 0 then
  removed = 1
end
local bad = hand_on(KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6], ARGV[2], now)
if bad then return bad end
return removed
