-- One plain command on one key of a lock, as a script, so that a Redlock sends it to every
-- instance in the same round as its other calls.
--
-- KEYS[1]: the key.
-- ARGV[1]: `get` (its value, or nil), `del` (1 when it existed, else 0) or `type` (`none`,
-- `string`, …).
if ARGV[1] == 'del' then
  return redis.call('DEL', KEYS[1])
elseif ARGV[1] == 'type' then
  return redis.call('TYPE', KEYS[1]).ok
end
return redis.call('GET', KEYS[1])
