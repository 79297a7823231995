-- Keep the places of queued waiters alive (the renewal thread's heartbeat, one call per lock
-- for every waiter of one client). Never re-adds a waiter that was dropped as dead: it
-- re-joins at the back on its next attempt. Two commands per 500 waiters (`ZMSCORE`,
-- `ZADD XX`), so that the heartbeat of a hundred waiting threads costs Redis a handful of
-- commands. Shared by every queue-style primitive.
--
-- KEYS[1]: the waiters' timeouts (a sorted set of tokens scored by when each waiter counts
-- as dead, server time in ms); KEYS[2..]: the queue's other keys, kept for as long.
-- ARGV[1]: waiter timeout ms; ARGV[2..]: the waiters' tokens.
-- Reply: the tokens that are no longer queued (dropped as dead), so that their waiters are
-- told to join again. Needs holder.lua.
local ttl = tonumber(ARGV[1])
local deadline = now_ms() + ttl
local dropped = {}
local alive = 0
local i = 2
while i <= #ARGV do
  local last = math.min(i + 499, #ARGV)
  local scores = redis.call('ZMSCORE', KEYS[1], unpack(ARGV, i, last))
  local update = {'ZADD', KEYS[1], 'XX'}
  for j = i, last do
    if scores[j - i + 1] then
      update[#update + 1] = deadline
      update[#update + 1] = ARGV[j]
      alive = alive + 1
    else
      dropped[#dropped + 1] = ARGV[j]
    end
  end
  if #update > 3 then
    redis.call(unpack(update))
  end
  i = last + 1
end
if alive > 0 then
  -- All end at one instant: a script's `PEXPIRE` counts from when each call runs.
  for _, key in ipairs(KEYS) do
    redis.call('PEXPIREAT', key, deadline)
  end
end
return dropped
