-- Withdraw a writer's claim on the next turn, when it gave up waiting.
--
-- KEYS[1]: the waiting writer.
-- ARGV[1]: the token.
-- Reply: 1 when the claim was this writer's and is gone, else 0.
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('DEL', KEYS[1])
end
return 0
