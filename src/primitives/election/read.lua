-- Reads an election. `leader`: who leads now — the record, if the lock still holds the token
-- it names (a leader whose lease ran out leaves a record that no longer counts) — and the id
-- of the log's last change, from which an observer reads on. `changes`: the changes logged
-- after the id `ARGV[2]` (`0-0`: from the start), oldest first, at most 100.
--
-- KEYS[1]: the lock; KEYS[2]: the leader record; KEYS[3]: the log.
-- ARGV[1]: `leader` or `changes`; ARGV[2]: for `changes`, the id of the last change read.
-- Reply: `leader`: `{term, since, client, value, last_id, n}` (`n`: which change of the term
-- the value came with), all but `last_id` `false` when nobody leads, `last_id` `0-0` when the
-- log is empty. `changes`: XRANGE's reply,
-- `{{id, {field, value, ...}}, ...}`.
if ARGV[1] == 'changes' then
  return redis.call('XRANGE', KEYS[3], '(' .. ARGV[2], '+', 'COUNT', 100)
end
local last = redis.call('XREVRANGE', KEYS[3], '+', '-', 'COUNT', 1)
local last_id = last[1] and last[1][1] or '0-0'
local record = redis.call('HMGET', KEYS[2], 'token', 'term', 'since', 'client', 'value', 'n')
local holder = redis.call('GET', KEYS[1])
if not record[1] or record[1] ~= holder then
  return {false, false, false, false, last_id, false}
end
return {record[2], record[3], record[4], record[5], last_id, record[6] or '0'}
