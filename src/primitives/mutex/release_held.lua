-- The release of a hold that a guard took for itself (not one of several taken at once):
-- `release.lua`, and the releasing client's own place among the waiting clients set right,
-- since threads of one client pass the lock among themselves without Redis (lock cohorting):
-- when more of its threads wait, the client waits behind every client waiting now; when none
-- does, a place it took before this hold began is given up (one taken since stays: a thread
-- that began to wait meanwhile).
--
-- KEYS[1]: the lock key; KEYS[2]: the waiting clients; KEYS[3]: the fencing counter.
-- ARGV[1]: the token; ARGV[2]: the release channel; ARGV[3]: the hold's fencing token;
-- ARGV[4]: 'more' when other threads of the client wait, '' when none does; ARGV[5]: how long
-- a place among the waiting is kept, ms; ARGV[6], when given: the claim of a lock handed to
-- the client named, ms (waiters.lua).
-- Reply: 1 when deleted, 0 when the key held another token or was gone.
-- Needs errors.lua, fence.lua, announce.lua and waiters.lua.
if redis.call('GET', KEYS[1]) ~= ARGV[1] then
  return 0
end
local client = string.match(ARGV[1], '^[^:]+')
if string.find(ARGV[1], ':h:', 1, true) then
  -- A hold a release handed over (waiters.lua): the list its note was left in is spent (no
  -- release hands the client the lock while it holds it).
  redis.pcall('DEL', KEYS[2] .. ':' .. client)
end
if ARGV[4] == 'more' then
  local now = redis.pcall('GET', KEYS[3])
  local score = tonumber(type(now) == 'string' and now or '0') or 0
  if type(redis.pcall('ZADD', KEYS[2], score, client)) == 'number' then
    redis.call('PEXPIRE', KEYS[2], ARGV[5])
  end
else
  local score = redis.pcall('ZSCORE', KEYS[2], client)
  if type(score) == 'string' and tonumber(score) < tonumber(ARGV[3]) then
    redis.call('ZREM', KEYS[2], client)
  end
end
-- The lock is deleted unless the release wrote it for the client it named (a claim or a
-- turn replaces the token: one call fewer per hand-off).
if not name_next(KEYS[2], ARGV[2], KEYS[1], KEYS[3], ARGV[6]) then
  redis.call('DEL', KEYS[1])
end
return 1
