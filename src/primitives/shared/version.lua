-- Shared helper: moves a value's version, the lock's fencing counter, on a holder's write, so
-- that an optimistic update that read the value before the write is refused. The holder took
-- a token from the counter, so it is an integer; should it be gone (a failover, a restart),
-- `INCR` starts it again below the clock, and the next take seeds it from the clock.
local function move_version(counter)
  redis.pcall('INCR', counter)
end
