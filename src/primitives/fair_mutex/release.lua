-- Release a fair lock (if it holds our token, or whoever holds it when forced) and hand it to
-- the next live waiter; when nobody waits, remove every key of the lock.
--
-- KEYS[1]: lock; KEYS[2]: fencing counter; KEYS[3]: queue; KEYS[4]: timeouts.
-- ARGV[1]: token; ARGV[2]: the waiter channel prefix; ARGV[3]: `force` to release whoever
-- holds it; ARGV[4]: the claim of a handed-over lock, ms.
-- Reply: 1 when released, 0 when the lock held another token (or none).
-- Needs errors.lua, fence.lua and queue.lua.
local holder, refused = holder_of(KEYS[1])
if refused then return refused end
if not holder or (holder ~= ARGV[1] and ARGV[3] ~= 'force') then
  return 0
end
hand_on(KEYS[1], KEYS[3], KEYS[4], KEYS[2], ARGV[2], ARGV[4])
return 1
