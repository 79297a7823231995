-- Keep the places of waiters alive (the renewal thread's heartbeat, one call per lock for
-- every waiter of one client). Never re-adds a waiter that was dropped as dead: it re-joins
-- at the back on its next attempt. Two commands per 500 waiters (`ZMSCORE`, `ZADD XX`), so
-- that the heartbeat of a hundred waiting threads costs Redis a handful of commands.
--
-- KEYS[1]: queue; KEYS[2]: timeouts.
-- ARGV[1]: waiter timeout ms; ARGV[2..]: the waiters' tokens.
-- Reply: the tokens that are no longer queued (dropped as dead), so that their waiters are
-- told to join again.
-- Needs queue.lua.
local ttl = tonumber(ARGV[1])
local deadline = now_ms() + ttl
local dropped = {}
local alive = 0
local i = 2
while i <= #ARGV do
  local last = math.min(i + 499, #ARGV)
  local scores = redis.call('ZMSCORE', KEYS[2], unpack(ARGV, i, last))
  local update = {'ZADD', KEYS[2], 'XX'}
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
  redis.call('PEXPIRE', KEYS[1], ttl)
  redis.call('PEXPIRE', KEYS[2], ttl)
end
return dropped
