-- Shared helper: a hold that is one member of a sorted set, scored by when its lease ends
-- (server time in ms): a read-write lock's reader, a semaphore's holder.
-- Renews `member` to at least `lease_ms` from `now`; never re-creates one that is gone or
-- whose lease ended. Returns 1 while it holds (else 0), and whether its score moved (the
-- set's own expiry may then need to follow).
local function renew_member(set, member, lease_ms, now)
  local expiry = redis.pcall('ZSCORE', set, member)
  if type(expiry) ~= 'string' or tonumber(expiry) <= now then
    return 0, false
  end
  local wanted = now + tonumber(lease_ms)
  if tonumber(expiry) < wanted then
    redis.call('ZADD', set, 'XX', wanted, member)
    return 1, true
  end
  return 1, false
end
-- The remaining lease of `member` in milliseconds, or -1 when it is gone or its lease ended.
local function member_left(set, member, now)
  local expiry = redis.pcall('ZSCORE', set, member)
  if type(expiry) ~= 'string' or tonumber(expiry) <= now then
    return -1
  end
  return math.floor(tonumber(expiry) - now)
end
-- Adds `ms` to what remains of `member`'s lease (`add`) or replaces it (`set`, which may
-- shorten it); never re-creates one that is gone. Returns the remaining lease afterwards, or
-- -1 (the set's own expiry may then need to follow).
local function change_member(set, member, ms, how, now)
  local left = member_left(set, member, now)
  if left < 0 then
    return -1
  end
  local new = tonumber(ms)
  if how == 'add' then
    new = new + left
  end
  redis.call('ZADD', set, 'XX', now + new, member)
  return new
end
