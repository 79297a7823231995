-- Raise the fencing counter of a lock that holds our token to at least a value: the fencing
-- token of a Redlock acquisition (the largest counter its majority returned), so that every
-- later acquisition whose majority shares an instance with this one's gets a larger token.
--
-- KEYS[1]: the lock key; KEYS[2]: the fencing counter.
-- ARGV[1]: the token; ARGV[2]: the value (a decimal integer, as Rust writes a u64).
-- Reply: 1 when the lock holds the token (the counter is then at least the value), else 0.
if redis.pcall('GET', KEYS[1]) ~= ARGV[1] then
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
