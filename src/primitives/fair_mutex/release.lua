-- Release a fair lock (if it holds our token, or whoever holds it when forced) and hand it to
-- the next live waiter; when nobody waits, remove every key of the lock.
--
-- This is the script's start (after idle_fence.lua, a constant): the helpers (errors.lua,
-- fence.lua, holder.lua, announce.lua, queue.lua) and `release_handing_on.lua` follow it.
-- The release of our own hold looks at the queue by popping its first waiter: when nobody is
-- queued it ends here, before the helpers' functions are made (Lua makes each anew at every
-- call), doing what `hand_on` does when nobody waits; else the popped waiter goes on to
-- `hand_on`, which would pop it first anyway (one command fewer than a look, then a pop).
--
-- KEYS[1]: lock; KEYS[2]: fencing counter; KEYS[3]: queue; KEYS[4]: timeouts.
-- ARGV[1]: token; ARGV[2]: the waiter channel prefix; ARGV[3]: `force` to release whoever
-- holds it; ARGV[4]: the claim of a handed-over lock, ms.
-- Reply: 1 when released, 0 when the lock held another token (or none).
local popped
if ARGV[3] ~= 'force' and redis.pcall('GET', KEYS[1]) == ARGV[1] then
  popped = redis.call('LPOP', KEYS[3])
  if not popped then
    redis.call('DEL', KEYS[1], KEYS[4])
    redis.call('PEXPIRE', KEYS[2], IDLE_FENCE_MS)
    return 1
  end
end
