-- Shared helper: tells an error of `redis.pcall` that means "this key is not what a lock
-- keeps" (a key of the wrong type, a counter that is not an integer) from any other (`OOM`,
-- a command or key an ACL refuses, ...), which a script must pass on as Redis said it rather
-- than call it a wrong type.
local function is_type_error(reply)
  local err = reply['err'] or ''
  return string.sub(err, 1, 9) == 'WRONGTYPE' or string.find(err, 'not an integer', 1, true) ~= nil
end
-- Shared helper: the code an error of `redis.pcall` starts with (`WRONGTYPE`, `OOM`, ...).
-- Redis before 7.0 puts `@user_script: <line>: -` before the errors it raises itself for a
-- command it refuses to run (`OOM`, an ACL refusal): that is skipped.
local function error_code(reply)
  local err = reply['err'] or ''
  return string.match(err, '^@user_script: %d+: %-?(%S+)') or string.match(err, '^(%S+)') or ''
end
-- Shared helper: raises an error of `redis.pcall` as the script's own error reply. Redis
-- before 7.0 cannot raise a table: there its text (read past its prefix on the client side).
local function raise(reply)
  if redis.REDIS_VERSION_NUM then
    error(reply)
  end
  error(reply['err'])
end
