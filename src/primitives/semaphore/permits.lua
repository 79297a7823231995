-- Shared helpers of the semaphore's scripts. With `S` for `P:semaphore:{N}`, a semaphore
-- keeps `S:permits`, how many permits exist (set by the first user, changed only by
-- `set_permits`, never expiring); `S:holders`, a sorted set of holder tokens scored by when
-- each holder's lease ends (server time in ms), so that a dead holder's permits come back
-- after its lease; and `S:held`, a hash of how many permits each holder token holds. Needs
-- holder.lua.
local function wrong_type(key, what)
  return redis.error_reply('WRONGTYPE key ' .. key .. ' is not ' .. what)
end
-- How many permits exist: the stored count, else `wanted`, stored now. Or nil and an error.
local function permits_of(key, wanted)
  local stored = redis.pcall('GET', key)
  if type(stored) == 'table' then
    return nil, wrong_type(key, 'a permit count')
  end
  if not stored then
    redis.call('SET', key, wanted)
    return tonumber(wanted)
  end
  local n = tonumber(stored)
  if not n then
    return nil, wrong_type(key, 'a permit count')
  end
  return n
end
-- Drops the holders whose lease ended; returns how many permits the others hold, or nil and
-- an error when a key has the wrong type.
local function in_use(holders, held, now)
  local expired = redis.pcall('ZRANGEBYSCORE', holders, '-inf', now)
  if type(expired) == 'table' and expired['err'] then
    return nil, wrong_type(holders, 'a set of permit holders')
  end
  if #expired > 0 then
    redis.call('ZREMRANGEBYSCORE', holders, '-inf', now)
    redis.call('HDEL', held, unpack(expired))
  end
  local counts = redis.pcall('HVALS', held)
  if type(counts) == 'table' and counts['err'] then
    return nil, wrong_type(held, 'a hash of held permits')
  end
  local used = 0
  for _, n in ipairs(counts) do
    used = used + tonumber(n)
  end
  return used
end
-- The permits in use, `used` as `in_use` counted them, when they would keep an acquire out: 0
-- when their holders are gone (the holders' key evicted or deleted on its own), and the counts
-- are dropped as nobody's. One `EXISTS`, only on that path.
local function held_by_holders(holders, held, used)
  if used > 0 and redis.call('EXISTS', holders) == 0 then
    redis.call('DEL', held)
    return 0
  end
  return used
end
-- Keeps the holders' keys for as long as the longest lease, or removes them when empty. Both
-- end at one instant (`PEXPIREAT`): a script's `PEXPIRE` counts from when each call runs
-- (Redis 7.0), so the two could end a millisecond apart and leave counts without holders.
local function keep_holders(holders, held, now)
  local last = redis.call('ZRANGE', holders, -1, -1, 'WITHSCORES')
  if last[2] then
    local at = math.max(tonumber(last[2]), now + 1)
    redis.call('PEXPIREAT', holders, at)
    redis.call('PEXPIREAT', held, at)
  else
    redis.call('DEL', holders, held)
  end
end
-- Gives back the permits of `token` (of every holder, when `token` is false); returns how many
-- were given back.
local function give_back(holders, held, token, now)
  local freed = 0
  if not token then
    for _, n in ipairs(redis.call('HVALS', held)) do
      freed = freed + tonumber(n)
    end
    redis.call('DEL', holders, held)
    return freed
  end
  local n = redis.call('HGET', held, token)
  if not n then
    return 0
  end
  redis.call('HDEL', held, token)
  redis.call('ZREM', holders, token)
  keep_holders(holders, held, now)
  return tonumber(n)
end
-- The stored permit count, or nil when none is stored (or it is not a number).
local function stored_permits(key)
  local stored = redis.pcall('GET', key)
  if type(stored) ~= 'string' then
    return nil
  end
  return tonumber(stored)
end
-- For an acquire of `n` permits: how many exist (stored now from `wanted` when none is) and how
-- many are in use; or nil, nil and an error when a key has the wrong type or `n` is more than
-- exist (`INVALIDARG`).
local function room_for(permits_key, holders, held, wanted, n, now)
  local permits, bad = permits_of(permits_key, wanted)
  if bad then return nil, nil, bad end
  local used, wrong = in_use(holders, held, now)
  if wrong then return nil, nil, wrong end
  if n > permits then
    return nil, nil, redis.error_reply('INVALIDARG asks for ' .. n .. ' permits of the ' ..
      permits .. ' that exist')
  end
  return permits, used
end
