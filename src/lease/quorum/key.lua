-- One plain command on one key of a lock, as a script, so that a Redlock sends it to every
-- instance in the same round as its other calls.
--
-- KEYS[1]: the key; KEYS[2]: for `versioned`, the key of its version.
-- ARGV[1]: `get` (its value, or nil), `del` (1 when it existed, else 0), `type` (`none`,
-- `string`, …) or `versioned` (`{value, version}`, each nil when missing).
if ARGV[1] == 'del' then
  return redis.call('DEL', KEYS[1])
elseif ARGV[1] == 'type' then
  return redis.call('TYPE', KEYS[1]).ok
elseif ARGV[1] == 'versioned' then
  return {redis.call('GET', KEYS[1]), redis.call('GET', KEYS[2])}
end
return redis.call('GET', KEYS[1])
