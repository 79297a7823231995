-- Give back the permits of a token, and announce it when someone waits (with the number of
-- permits freed).
--
-- KEYS[1]: the holders; KEYS[2]: the held permits; KEYS[3]: the waiters flag.
-- ARGV[1]: the token (empty with `force`); ARGV[2]: the release channel; ARGV[3]: `force` to
-- give back every holder's permits.
-- Reply: 1 when permits were given back, 0 when the token held none. Needs holder.lua,
-- permits.lua and announce.lua.
local token = ARGV[1]
if ARGV[3] == 'force' then
  token = false
end
local freed = give_back(KEYS[1], KEYS[2], token, now_ms())
if freed == 0 then
  return 0
end
if redis.call('DEL', KEYS[3]) == 1 then
  announce(ARGV[2], tostring(freed))
end
return 1
