-- Announces a message on a channel: with sharded pub/sub on Redis 7 and later (in a Cluster
-- the message stays in its slot's shard instead of crossing the cluster bus to every node),
-- with classic pub/sub before. The subscriber listens the same way. An announcement is a
-- hint: a refusal (an ACL without the command) does not fail the script, and waiters then
-- find the lock free at their next re-check.
local function announce(channel, message)
  if redis.REDIS_VERSION_NUM then
    redis.pcall('SPUBLISH', channel, message)
  else
    redis.pcall('PUBLISH', channel, message)
  end
end
-- Wakes one queued waiter: the message is its token, on the channel of its client
-- (`prefix` plus the client id that starts the token).
local function wake_waiter(prefix, token)
  announce(prefix .. string.match(token, '^[^:]+'), token)
end
