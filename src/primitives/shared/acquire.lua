-- Take the lock if it is free, and read the value kept under it: a `Mutex`'s acquire whose
-- reply also carries the value, in the same round trip.
--
-- KEYS[1..3]: as for mutex/acquire.lua (lock, fencing counter, waiting clients); KEYS[4]: the
-- value; KEYS[5]: the fencing token of the holder that wrote it (or removed it).
-- ARGV: as for mutex/acquire.lua (the token, the lease in milliseconds, what the caller does
-- if the lock is held, the fencing token of a lock handed to its client that it takes).
-- Reply: `{1, fencing_token, value, written_by}` when taken, `value` nil when there is none
-- (`{1, fencing_token}` when neither is stored); as mutex/acquire.lua's when held. Errors with `WRONGTYPE` (changing nothing) when the value key
-- is not a string, and as mutex/acquire.lua otherwise. Needs errors.lua, fence.lua,
-- announce.lua, mutex/waiters.lua and mutex/take.lua.
local value = redis.pcall('GET', KEYS[4])
if type(value) == 'table' and value['err'] then
  if is_type_error(value) then
    return redis.error_reply('WRONGTYPE key ' .. KEYS[4] .. ' exists but is not a shared value')
  end
  return value
end
local written_by = redis.call('GET', KEYS[5])
local claim = ARGV[4]
if claim == '' then
  claim = nil
end
local reply = take_lock(KEYS[1], KEYS[2], KEYS[3], ARGV[1], ARGV[2], ARGV[3], claim)
if reply[1] == 1 and (value or written_by) then
  reply[3] = value
  reply[4] = written_by
end
return reply
