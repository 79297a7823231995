//! Every Lua script the crate runs, each with its KEYS / ARGV / reply contract.
//!
//! Scripts run by `EVALSHA` (one round trip); `redis::Script` loads one and retries when the
//! server answers `NOSCRIPT` (after a restart or `SCRIPT FLUSH`).

use std::sync::LazyLock;

use redis::Script;

/// Take the lock if it is free.
///
/// - KEYS[1]: the lock key; KEYS[2]: the fencing counter; KEYS[3]: the waiters flag.
/// - ARGV[1]: the token; ARGV[2]: the lease in milliseconds.
/// - Reply: `{1, fencing_token}` when taken, `{0, remaining_ttl_ms}` when held by someone;
///   then the waiters flag is set (to outlive the holder's lease), so that the release
///   announces itself.
/// - Errors with `WRONGTYPE` (and changes nothing) when the lock key is not a string with an
///   expiry, or the counter is not an integer.
///
/// `SET … NX GET` both takes a free lock and, on a held one, fails with `WRONGTYPE` when the
/// key is not a string: the type check costs nothing. A missing counter (first use, or Redis
/// lost its data) starts at the server's clock in microseconds, so that fencing tokens never
/// go backwards across a restart.
pub(crate) static ACQUIRE: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r#"
local previous = redis.pcall('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2], 'GET')
if type(previous) == 'table' and previous['err'] then
  return redis.error_reply('WRONGTYPE key ' .. KEYS[1] .. ' exists but is not a lock')
end
if not previous then
  local fence = redis.pcall('INCR', KEYS[2])
  if type(fence) == 'table' then
    redis.call('DEL', KEYS[1])
    return redis.error_reply('WRONGTYPE fencing counter ' .. KEYS[2] .. ' is not an integer')
  end
  if fence == 1 then
    local now = redis.call('TIME')
    fence = tonumber(now[1]) * 1000000 + tonumber(now[2])
    redis.call('SET', KEYS[2], string.format('%.0f', fence))
  end
  return {1, fence}
end
local ttl = redis.call('PTTL', KEYS[1])
if ttl < 0 then
  return redis.error_reply('WRONGTYPE key ' .. KEYS[1] .. ' has no expiry; it is not a lock')
end
redis.call('SET', KEYS[3], '1', 'PX', ttl + tonumber(ARGV[2]))
return {0, ttl}
"#,
    )
});

/// Release the lock if it still holds our token, and announce the release when someone
/// waits (the waiters flag exists): an uncontended release costs no more than a plain
/// compare-and-delete.
///
/// - KEYS[1]: the lock key; KEYS[2]: the waiters flag.
/// - ARGV[1]: the token; ARGV[2]: the release channel.
/// - Reply: 1 when deleted, 0 when the key held another token or was gone.
pub(crate) static RELEASE: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r#"
if redis.call('GET', KEYS[1]) == ARGV[1] then
  if redis.call('DEL', KEYS[1], KEYS[2]) > 1 then
    redis.call('PUBLISH', ARGV[2], 'released')
  end
  return 1
end
return 0
"#,
    )
});

/// Set the lease of a lock that still holds our token. Never re-creates a lock that is gone.
///
/// - KEYS[1]: the lock key.
/// - ARGV[1]: the token; ARGV[2]: the new lease in milliseconds.
/// - Reply: 1 when extended, 0 when the key held another token, was gone or was not a
///   string (no error, so that one bad key cannot fail a pipelined batch of renewals).
pub(crate) static EXTEND: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r#"
local value = redis.pcall('GET', KEYS[1])
if value == ARGV[1] then
  return redis.call('PEXPIRE', KEYS[1], ARGV[2])
end
return 0
"#,
    )
});

/// Whether the lock still holds our token, and for how long.
///
/// - KEYS[1]: the lock key.
/// - ARGV[1]: the token.
/// - Reply: the remaining lease in milliseconds when it does, -1 when it does not.
pub(crate) static CHECK: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r#"
if redis.pcall('GET', KEYS[1]) == ARGV[1] then
  return redis.call('PTTL', KEYS[1])
end
return -1
"#,
    )
});

/// Delete the lock whoever holds it, and announce the release.
///
/// - KEYS[1]: the lock key; KEYS[2]: the waiters flag.
/// - ARGV[1]: the release channel.
/// - Reply: 1 when a lock was deleted, 0 when there was none.
pub(crate) static FORCE_RELEASE: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r#"
local t = redis.call('TYPE', KEYS[1])['ok']
if t == 'none' then
  return 0
end
if t ~= 'string' then
  return redis.error_reply('WRONGTYPE key ' .. KEYS[1] .. ' exists but is not a lock')
end
redis.call('DEL', KEYS[1], KEYS[2])
redis.call('PUBLISH', ARGV[1], 'released')
return 1
"#,
    )
});
