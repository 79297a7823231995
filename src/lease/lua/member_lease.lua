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
