-- Writes who leads an election, while the lock holds the leader's token: `elected` writes
-- the record of a new term (its term, since when by the server's clock, the leading client
-- and the value); `proclaimed` changes the value of the term the record holds; `vacant`
-- removes the record (the leader resigns; its guard releases the lock after, which names the
-- next candidate). Each adds the change to the election's log (its last 100 changes) and
-- announces it on the election's channel, so that observers read the log.
--
-- KEYS[1]: the lock; KEYS[2]: the leader record; KEYS[3]: the log.
-- ARGV[1]: the token; ARGV[2]: `elected`, `proclaimed` or `vacant`; ARGV[3]: the term;
-- ARGV[4]: the channel; ARGV[5]: the leading client's id; ARGV[6]: the value; ARGV[7]: which
-- change of the term it is (0 for `elected`, then 1, 2, … for each `proclaimed`), so that
-- the copies of a log kept on several servers (a Redlock's) line up.
-- Reply: 1 when written (or, for `vacant`, when there was nothing to remove), 0 when the
-- lock no longer holds the token (nothing is written).
-- Needs announce.lua.
if redis.call('GET', KEYS[1]) ~= ARGV[1] then
  return 0
end
local event, own = ARGV[2], redis.call('HGET', KEYS[2], 'token') == ARGV[1]
if event == 'vacant' then
  if own then
    redis.call('DEL', KEYS[2])
    redis.call('XADD', KEYS[3], 'MAXLEN', '~', 100, '*', 'event', event, 'term', ARGV[3])
    announce(ARGV[4], ARGV[3])
  end
  return 1
end
local since
if event == 'elected' then
  local now = redis.call('TIME')
  since = string.format('%.0f', tonumber(now[1]) * 1000 + math.floor(tonumber(now[2]) / 1000))
  redis.call('DEL', KEYS[2])
  redis.call('HSET', KEYS[2], 'token', ARGV[1], 'term', ARGV[3], 'since', since,
    'client', ARGV[5], 'value', ARGV[6], 'n', ARGV[7])
elseif own then
  since = redis.call('HGET', KEYS[2], 'since')
  redis.call('HSET', KEYS[2], 'value', ARGV[6], 'n', ARGV[7])
else
  return 0
end
redis.call('XADD', KEYS[3], 'MAXLEN', '~', 100, '*', 'event', event, 'term', ARGV[3],
  'since', since, 'client', ARGV[5], 'value', ARGV[6], 'n', ARGV[7])
announce(ARGV[4], ARGV[3])
return 1
