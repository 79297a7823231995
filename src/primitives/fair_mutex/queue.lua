-- Shared helpers of the fair lock's scripts. Besides the lock and the fencing counter, a fair
-- lock keeps `P:{N}:queue`, a list of waiter tokens in arrival order, and `P:{N}:timeouts`, a
-- sorted set of the same tokens scored by when each waiter counts as dead (server time in
-- ms). A waiter's channel is `P:{N}:ch:<client id>`, and the message starts with its token,
-- so that a release wakes the next waiter only. Needs errors.lua, fence.lua, holder.lua,
-- announce.lua and idle_fence.lua.
-- Drops dead waiters from the head of the queue; returns the live head (or nil). `head`: the
-- queue's first entry when the caller read it already.
local function live_head(queue, timeouts, now, head)
  head = head or redis.call('LINDEX', queue, 0)
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
-- The lock is to be freed (the caller checked that it may be): hand it to the next live
-- waiter, or remove every key when nobody is left (the fencing counter a minute later).
-- Waiters come off the queue by `LPOP` (a dead one, and the live one that gets the lock);
-- `popped`, when given, is the first one, which the caller popped already.
-- The waiter gets the lock for a claim of `claim_ms` only, so that one that died before its
-- turn holds the others up that long at most; it renews the lock to its lease when it reads
-- the message `<token> <fencing token> <claim end, server ms>` on its channel. A waiter that
-- reads it too late to rely on the claim attempts instead, which takes the lock if the claim
-- still holds its token.
-- (A queue emptied here is gone: Redis deletes an empty list or sorted set.)
local function hand_on(lock, queue, timeouts, fence, prefix, claim_ms, popped)
  local head = popped or redis.call('LPOP', queue)
  local now = head and now_ms()
  local expiry
  while head do
    expiry = tonumber(redis.call('ZSCORE', timeouts, head))
    redis.call('ZREM', timeouts, head)
    if expiry and expiry > now then
      break
    end
    head = redis.call('LPOP', queue)
  end
  if not head then
    redis.call('DEL', lock, timeouts)
    redis.call('PEXPIRE', fence, IDLE_FENCE_MS)
    return
  end
  redis.call('SET', lock, head, 'PX', claim_ms)
  local token = next_fence(lock, fence)
  if not token then
    -- The fencing counter is not an integer (the lock was given back): the waiter goes back
    -- to the head of the queue, where its attempt reports it. Keys the pops emptied come
    -- back with the waiter's own deadline.
    redis.call('LPUSH', queue, head)
    redis.call('ZADD', timeouts, expiry, head)
    for _, key in ipairs({queue, timeouts}) do
      if redis.call('PTTL', key) < expiry - now then
        redis.call('PEXPIREAT', key, expiry)
      end
    end
    wake_waiter(prefix, head)
    return
  end
  announce(prefix .. string.match(head, '^[^:]+'),
    head .. ' ' .. fence_text(token) .. ' ' .. string.format('%.0f', now + tonumber(claim_ms)))
end
