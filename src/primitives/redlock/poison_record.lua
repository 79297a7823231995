-- Read or clear a lock's poison record (the record a holder left when its thread panicked).
--
-- KEYS[1]: the poison record.
-- ARGV[1]: `get` or `clear`.
-- Reply: the record (or nil) for `get`; 1 when a record was removed, 0 when none, for `clear`.
if ARGV[1] == 'clear' then
  return redis.call('DEL', KEYS[1])
end
return redis.call('GET', KEYS[1])
