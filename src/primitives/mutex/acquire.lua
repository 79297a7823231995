-- Take the lock if it is free.
--
-- KEYS[1]: the lock key; KEYS[2]: the fencing counter; KEYS[3]: the waiting clients; KEYS[4],
-- when given: the list where releases leave the caller's client the note of a lock handed to
-- it (waiters.lua), on which the caller pops behind this call in the same round trip.
-- ARGV[1]: the token; ARGV[2]: the lease in milliseconds; ARGV[3]: what the caller does if
-- the lock is held: '' gives up, 'wait' waits, 'more' waits and other threads of its client
-- wait too (the client stays among the waiting when it takes the lock); either with
-- ' recheck' after it when the caller re-checks after a silent wait (see take.lua); ARGV[4]:
-- the fencing token of a lock handed to the caller's client whose note the caller took, or
-- '' (see take.lua); ARGV[5], with KEYS[4]: how long the pop behind this call waits, ms.
-- Reply: `{1, fencing_token}` when taken (also when the lock holds this very token: the same
-- attempt sent again after its reply was lost), `{0, remaining_ttl_ms}` when held by someone
-- else (`{0, -remaining_ttl_ms}` when the holder is not a redmutex client, whose release
-- nobody announces); then a caller that waits has its client added to the waiting clients
-- (for a lease past the holder's), so that a release names it in its turn, and is told the
-- server's clock: `{0, remaining_ttl_ms, server_ms, nil, score}`, with the score of the
-- place it was given when the holder is of the caller's own client (else nil; see
-- take.lua). A re-check that finds the lock held gets
-- `{0, remaining_ttl_ms, server_ms, nil, score or nil, ahead}`: how many waiting clients a
-- release names before the caller's.
-- Errors with `WRONGTYPE` (and changes nothing) when the lock key is not a string with an
-- expiry, or the counter is not an integer; with Redis's own error (and changes nothing) when
-- Redis refuses a command (`OOM`, an ACL), except that a held lock still reads as held when
-- Redis is out of memory.
--
-- `SET ... NX GET` both takes a free lock and, on a held one, fails with `WRONGTYPE` when the
-- key is not a string: the type check costs nothing. Needs errors.lua, fence.lua and take.lua.
-- With KEYS[4], an attempt that leaves the client no place from which a release hands it the
-- lock (it took the lock, gives up, waits for a holder that announces nothing, or failed)
-- leaves an empty mark in the list, which the caller's pop takes at once instead of waiting
-- for a note that will not come; the mark lasts a second, should the pop not come. An attempt
-- that places the client records that the pop waits (`KEYS[4]` plus `:pop`) for a
-- millisecond less than the pop does: a release that names the client and finds the record
-- leaves the note to the pop alone, without an announcement (waiters.lua). Neither is left
-- when a note waits in the list already: the pop takes it at once.
local claim = ARGV[4]
if claim == '' then
  claim = nil
end
local reply = take_lock(KEYS[1], KEYS[2], KEYS[3], ARGV[1], ARGV[2], ARGV[3], claim)
-- A note waiting in the list already goes to the pop at once: then neither is left.
if KEYS[4] and redis.pcall('LLEN', KEYS[4]) == 0 then
  if not (reply[1] == 0 and reply[3]) then
    if type(redis.pcall('RPUSH', KEYS[4], '')) == 'number' then
      redis.call('PEXPIRE', KEYS[4], 1000)
    end
  else
    local pop_ms = tonumber(ARGV[5]) or 0
    if pop_ms > 1 then
      redis.pcall('SET', KEYS[4] .. ':pop', '1', 'PX', pop_ms - 1)
    end
  end
end
return reply
