-- How long a lock is held for, whoever holds it.
--
-- KEYS[1]: the lock key.
-- Reply: the remaining lease in milliseconds, or -2 when the lock is free (`PTTL`).
return redis.call('PTTL', KEYS[1])
