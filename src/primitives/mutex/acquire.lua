-- Take the lock if it is free.
--
-- KEYS[1]: the lock key; KEYS[2]: the fencing counter; KEYS[3]: the waiters flag.
-- ARGV[1]: the token; ARGV[2]: the lease in milliseconds.
-- Reply: `{1, fencing_token}` when taken (also when the lock holds this very token: the same
-- attempt sent again after its reply was lost), `{0, remaining_ttl_ms}` when held by someone
-- else; then the waiters flag is set (to outlive the holder's lease), so that the release
-- announces itself.
-- Errors with `WRONGTYPE` (and changes nothing) when the lock key is not a string with an
-- expiry, or the counter is not an integer; with Redis's own error (and changes nothing) when
-- Redis refuses a command (`OOM`, an ACL), except that a held lock still reads as held when
-- Redis is out of memory.
--
-- `SET ... NX GET` both takes a free lock and, on a held one, fails with `WRONGTYPE` when the
-- key is not a string: the type check costs nothing. Needs errors.lua and fence.lua.
local previous = redis.pcall('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2], 'GET')
if type(previous) == 'table' and previous['err'] then
  if is_type_error(previous) then
    return redis.error_reply('WRONGTYPE key ' .. KEYS[1] .. ' exists but is not a lock')
  end
  if string.sub(previous['err'], 1, 3) == 'OOM' then
    -- Out of memory refuses even a SET NX that would not write: a held lock is still held
    -- (its waiters flag cannot be set, so waiters recheck rather than hear the release).
    local held_ttl = redis.pcall('PTTL', KEYS[1])
    if type(held_ttl) == 'number' and held_ttl > 0 then
      return {0, held_ttl}
    end
  end
  return previous
end
if not previous or previous == ARGV[1] then
  if previous then
    -- Sent again after its reply was lost, and the first one took it: it is ours.
    redis.call('PEXPIRE', KEYS[1], ARGV[2])
  end
  local fence, bad = take_fence(KEYS[1], KEYS[2])
  if bad then return bad end
  return {1, fence}
end
local ttl = redis.call('PTTL', KEYS[1])
if ttl < 0 then
  return redis.error_reply('WRONGTYPE key ' .. KEYS[1] .. ' has no expiry; it is not a lock')
end
redis.call('SET', KEYS[3], '1', 'PX', ttl + tonumber(ARGV[2]))
return {0, ttl}
