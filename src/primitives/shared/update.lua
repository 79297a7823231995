-- Write a value read without the lock (an optimistic update), if nothing changed since the
-- read: nobody holds the lock, and who wrote the value last (the version of its last write,
-- which every holder's write and every update records) is still who the read found. The
-- write records a version of its own, the next fencing token.
--
-- KEYS[1]: the lock; KEYS[2]: the fencing counter; KEYS[3]: the value; KEYS[4]: who wrote the
-- value (the version of its last write).
-- ARGV[1]: the version read ('' when there was none); ARGV[2]: the value's new bytes.
-- Reply: `{1, version}` when written (the version as text); `{0, 'held'}` when the lock is
-- held, `{0, 'moved'}` when the version moved (nothing written). Errors with `WRONGTYPE`
-- (changing nothing) when the lock, the value or who wrote it is not a string or the counter
-- not an integer.
-- Needs errors.lua and fence.lua.
local lock = redis.call('TYPE', KEYS[1])['ok']
if lock == 'string' then
  return {0, 'held'}
elseif lock ~= 'none' then
  return redis.error_reply('WRONGTYPE key ' .. KEYS[1] .. ' exists but is not a lock')
end
local version = redis.pcall('GET', KEYS[4])
if type(version) == 'table' then
  return redis.error_reply('WRONGTYPE key ' .. KEYS[4] .. ' exists but is not a version')
end
if (version or '') ~= ARGV[1] then
  return {0, 'moved'}
end
local t = redis.call('TYPE', KEYS[3])['ok']
if t ~= 'none' and t ~= 'string' then
  return redis.error_reply('WRONGTYPE key ' .. KEYS[3] .. ' exists but is not a shared value')
end
local moved = next_fence(KEYS[1], KEYS[2])
if not moved then
  return redis.error_reply('WRONGTYPE fencing counter ' .. KEYS[2] .. ' is not an integer')
end
redis.call('MSET', KEYS[3], ARGV[2], KEYS[4], fence_text(moved))
return {1, fence_text(moved)}
