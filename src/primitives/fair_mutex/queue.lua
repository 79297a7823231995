-- Shared helpers of the fair lock's scripts. Besides the lock and the fencing counter, a fair
-- lock keeps `P:{N}:queue`, a list of waiter tokens in arrival order, and `P:{N}:timeouts`, a
-- sorted set of the same tokens scored by when each waiter counts as dead (server time in
-- ms). A waiter's channel is `P:{N}:ch:<client id>`, and the message is its token, so that a
-- release wakes the next waiter only. Needs errors.lua, holder.lua and announce.lua.
-- Drops dead waiters from the head of the queue; returns the live head (or nil).
local function live_head(queue, timeouts, now)
  local head = redis.call('LINDEX', queue, 0)
  while head do
    local expiry = redis.call('ZSCORE', timeouts, head)
    if expiry and tonumber(expiry) > now then
      return head, tonumber(expiry)
    end
    redis.call('LPOP', queue)
    redis.call('ZREM', timeouts, head)
    head = redis.call('LINDEX', queue, 0)
  end
  return nil
end
-- The lock is free: wake the next live waiter, or remove every key when nobody is left.
local function hand_on(queue, timeouts, fence, prefix)
  local head = live_head(queue, timeouts, now_ms())
  if head then
    wake_waiter(prefix, head)
  elseif redis.call('LLEN', queue) == 0 then
    redis.call('DEL', queue, timeouts, fence)
  end
end
