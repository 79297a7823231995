-- Leave a fair lock for good (a waiter that gave up, or the clean-up of an attempt whose reply
-- was lost): drop our place in the queue and, if the lock holds our token (taken, or handed
-- over by a release), the lock; then hand the lock to the next waiter when it is free, and
-- remove every key of the lock when nobody is left.
--
-- KEYS[1]: lock; KEYS[2]: fencing counter; KEYS[3]: queue; KEYS[4]: timeouts.
-- ARGV[1]: token; ARGV[2]: the waiter channel prefix; ARGV[3]: the claim of a handed-over lock,
-- ms.
-- Reply: 1 when the waiter was queued or held the lock, else 0.
-- Needs errors.lua, fence.lua and queue.lua.
local removed = redis.call('LREM', KEYS[3], 0, ARGV[1])
redis.call('ZREM', KEYS[4], ARGV[1])
local holder, refused = holder_of(KEYS[1])
if refused then return refused end
if holder == ARGV[1] then
  removed = 1
  holder = false
end
if not holder then
  hand_on(KEYS[1], KEYS[3], KEYS[4], KEYS[2], ARGV[2], ARGV[3])
end
return math.min(removed, 1)
