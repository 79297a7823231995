-- The end of `release.lua`, after the helpers: our own hold with waiters queued (the first of
-- them popped), a forced release, or a lock that does not hold our token (or a key of the
-- wrong type).
if not popped then
  local holder, refused = holder_of(KEYS[1])
  if refused then return refused end
  if not holder or (holder ~= ARGV[1] and ARGV[3] ~= 'force') then
    return 0
  end
end
hand_on(KEYS[1], KEYS[3], KEYS[4], KEYS[2], ARGV[2], ARGV[4], popped)
return 1
