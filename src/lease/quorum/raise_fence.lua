-- Raise a lock's fencing counter to at least a value: the fencing token of a Redlock
-- acquisition (the largest counter its majority returned), so that every later acquisition
-- whose majority shares an instance with this one's gets a larger token. Refused where the
-- lock key holds another holder's token: that holder took the lock here after this one, and
-- its counter may already be below the value. A lock key that is gone (no one took the lock
-- since) or that is not a string (a shared hold's keys) does not refuse it: any later `INCR`
-- here runs after this raise.
--
-- KEYS[1]: the lock key; KEYS[2]: the fencing counter.
-- ARGV[1]: the token; ARGV[2]: the value (a decimal integer, as Rust writes a u64).
-- Reply: 1 when the counter is at least the value now, 0 when refused.
local holder = redis.pcall('GET', KEYS[1])
if type(holder) == 'string' and holder ~= ARGV[1] then
  return 0
end
-- Compared as text, exactly (Lua's numbers are doubles, exact only below 2^53): a longer
-- decimal integer is the larger one, and of two as long, the later in byte order.
local current = redis.pcall('GET', KEYS[2])
local below = type(current) ~= 'string' or not string.match(current, '^%d+$')
  or #current < #ARGV[2] or (#current == #ARGV[2] and current < ARGV[2])
if below then
  redis.call('SET', KEYS[2], ARGV[2])
end
return 1
