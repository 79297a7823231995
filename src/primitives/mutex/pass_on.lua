-- Passes a held lock to another thread of the holder's client, asking Redis: the lock keeps
-- its token and is held on for a new lease, and a block of fencing tokens is reserved for
-- the run of passes within the client, the first for the new holder (lock cohorting: see
-- docs/design.md). Later passes of the run take the next tokens of the block without a
-- round trip.
--
-- KEYS[1]: the lock key; KEYS[2]: the fencing counter; KEYS[3]: the waiting clients.
-- ARGV[1]: the token; ARGV[2]: how many fencing tokens to reserve; ARGV[3]: the new lease
-- in milliseconds.
-- Reply: `{1, last_reserved_token, other_waiting_clients}` when passed on (the last token as
-- text from 2^53 on, as fence.lua gives tokens), `{0}` when the lock no longer held the token
-- (nothing is changed). Errors with `WRONGTYPE` (and changes nothing) when the counter is not
-- an integer.
-- Needs errors.lua.
if redis.call('GET', KEYS[1]) ~= ARGV[1] then
  return {0}
end
local last = redis.pcall('INCRBY', KEYS[2], ARGV[2])
if type(last) == 'table' then
  if is_type_error(last) then
    return redis.error_reply('WRONGTYPE fencing counter ' .. KEYS[2] .. ' is not an integer')
  end
  return last
end
if last >= 9007199254740992 then
  last = redis.call('GET', KEYS[2])
end
redis.call('PEXPIRE', KEYS[1], ARGV[3])
local others = 0
local waiting = redis.pcall('ZCARD', KEYS[3])
if type(waiting) == 'number' and waiting > 0 then
  others = waiting
  if redis.call('ZSCORE', KEYS[3], string.match(ARGV[1], '^[^:]+')) then
    others = others - 1
  end
end
return {1, last, others}
