-- Give back the permits of a token of a fair semaphore, and wake the waiters they let in, in
-- arrival order; remove the queue's keys when nobody waits.
--
-- KEYS[1]: the permit count; KEYS[2]: the holders; KEYS[3]: the held permits; KEYS[4]: the
-- queue; KEYS[5]: the waiters' timeouts; KEYS[6]: the permits each waiter wants.
-- ARGV[1]: the token (empty with `force`); ARGV[2]: the waiter channel prefix; ARGV[3]:
-- `force` to give back every holder's permits.
-- Reply: 1 when permits were given back, 0 when the token held none. Needs errors.lua,
-- holder.lua, permits.lua, announce.lua and fair_queue.lua.
local now = now_ms()
local token = ARGV[1]
if ARGV[3] == 'force' then
  token = false
end
if give_back(KEYS[2], KEYS[3], token, now) == 0 then
  return 0
end
local bad = hand_on(KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6], ARGV[2], now)
if bad then return bad end
return 1
