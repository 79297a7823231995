-- Shared helpers of the read-write lock's scripts. Besides the writer's key (`P:{N}`, the
-- writer's token, as for a Mutex) and the fencing counter, a read-write lock keeps
-- `P:{N}:readers`, a sorted set of reader tokens scored by when each reader's lease ends
-- (server time in ms), so that every reader's hold expires by itself, and
-- `P:{N}:writer-waiting`, the token of a writer that waits, which keeps new readers out so
-- that writers are not starved. Needs errors.lua and holder.lua.
-- Drops the readers whose lease ended; returns how many are left, or nil and an error when
-- the key is not a sorted set.
local function live_readers(readers, now)
  local dropped = redis.pcall('ZREMRANGEBYSCORE', readers, '-inf', now)
  if type(dropped) == 'table' and dropped['err'] then
    return nil, redis.error_reply('WRONGTYPE key ' .. readers .. ' is not a set of readers')
  end
  return redis.call('ZCARD', readers)
end
-- Keeps the readers' key for as long as its longest reader lease.
local function expire_readers(readers, now)
  local last = redis.call('ZRANGE', readers, -1, -1, 'WITHSCORES')
  if last[2] then
    redis.call('PEXPIRE', readers, math.max(tonumber(last[2]) - now, 1))
  end
end
-- Whether `holder` was taken by the same thread of the same client as `token`
-- (`<client>:<thread>:<sequence>:<ms>`): a writer taking read, a downgrade.
local function same_thread(holder, token)
  local prefix = string.match(token, '^([^:]*:[^:]*:)')
  return holder and prefix and string.sub(holder, 1, #prefix) == prefix
end
-- Marks that someone waits for `ttl_ms` plus a lease, so that releases announce themselves.
local function someone_waits(waiting, ttl_ms, lease_ms)
  redis.call('SET', waiting, '1', 'PX', math.max(ttl_ms, 1) + tonumber(lease_ms))
end
