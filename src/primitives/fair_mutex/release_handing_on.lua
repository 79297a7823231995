-- The end of `release.lua`, after the helpers: a forced release, a lock that does not hold
-- our token (or a key of the wrong type), or waiters queued.
local holder, refused = holder_of(KEYS[1])
if refused then return refused end
if not holder or (holder ~= ARGV[1] and ARGV[3] ~= 'force') then
  return 0
end
hand_on(KEYS[1], KEYS[3], KEYS[4], KEYS[2], ARGV[2], ARGV[4])
return 1
