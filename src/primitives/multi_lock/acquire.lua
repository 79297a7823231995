-- Take locks of one hash slot in their order, in one round trip, as taking each in turn
-- would: every one up to the first that is held.
--
-- KEYS[3i-2], KEYS[3i-1], KEYS[3i]: the i-th lock's key, fencing counter and waiting
-- clients.
-- ARGV[1]: the lease in milliseconds; ARGV[1 + i]: the i-th lock's token.
-- Reply: `{taken, wait_ms, fence_1, ..., fence_taken}`: the first `taken` locks are ours,
-- with these fencing tokens; when that is short of all of them, the next one is held by
-- someone else for `wait_ms` more (nothing is claimed on it: the caller waits for it on its
-- own, as a `Mutex`). An error (a key of the wrong type) is the reply, and then the locks
-- this call took are given back first: nothing is left behind. Needs errors.lua, fence.lua and mutex/take.lua (with its helpers).
local count = #KEYS / 3
local fences = {}
for i = 1, count do
  local reply =
    take_lock(KEYS[3 * i - 2], KEYS[3 * i - 1], KEYS[3 * i], ARGV[1 + i], ARGV[1], '')
  if reply['err'] then
    for j = 1, i - 1 do
      redis.call('DEL', KEYS[3 * j - 2])
    end
    return reply
  end
  if reply[1] == 0 then
    return {i - 1, reply[2], unpack(fences)}
  end
  fences[i] = reply[2]
end
return {count, 0, unpack(fences)}
