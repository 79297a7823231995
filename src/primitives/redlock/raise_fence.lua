-- Raise the fencing counter of a lock that holds our token to at least a value: the fencing
-- token of a Redlock acquisition (the largest counter its majority returned), so that every
-- later acquisition whose majority shares an instance with this one's gets a larger token.
--
-- KEYS[1]: the lock key; KEYS[2]: the fencing counter.
-- ARGV[1]: the token; ARGV[2]: the value (an integer below 2^53).
-- Reply: 1 when the lock holds the token (the counter is then at least the value), else 0.
if redis.pcall('GET', KEYS[1]) ~= ARGV[1] then
  return 0
end
local current = redis.pcall('GET', KEYS[2])
if type(current) ~= 'string' or (tonumber(current) or 0) < tonumber(ARGV[2]) then
  redis.call('SET', KEYS[2], ARGV[2])
end
return 1
