//! Every Lua script the crate runs, each with its KEYS / ARGV / reply contract.
//!
//! Scripts run by `EVALSHA` (one round trip); `redis::Script` loads one and retries when the
//! server answers `NOSCRIPT` (after a restart or `SCRIPT FLUSH`).

use std::sync::LazyLock;

use redis::Script;

/// Tells an error of `redis.pcall` that means "this key is not what a lock keeps" (a key of
/// the wrong type, a counter that is not an integer) from any other (`OOM`, a command or key
/// an ACL refuses, …), which a script must pass on as Redis said it rather than call it a
/// wrong type.
const ERROR_PRELUDE: &str = r#"
local function is_type_error(reply)
  local err = reply['err'] or ''
  return string.sub(err, 1, 9) == 'WRONGTYPE' or string.find(err, 'not an integer', 1, true) ~= nil
end
"#;

/// The next fencing token of a lock just taken: `INCR` of the counter, which starts at the
/// server's clock in microseconds when missing (first use, or Redis lost its data), so that
/// tokens never go backwards across a restart. When the counter is not an integer, the lock
/// is given back and `nil` returned; on any other error the lock is given back and the error
/// raised.
const FENCE_PRELUDE: &str = r#"
local function next_fence(lock, counter)
  local fence = redis.pcall('INCR', counter)
  if type(fence) == 'table' then
    redis.call('DEL', lock)
    if not is_type_error(fence) then
      error(fence)
    end
    return nil
  end
  if fence == 1 then
    local now = redis.call('TIME')
    fence = tonumber(now[1]) * 1000000 + tonumber(now[2])
    redis.call('SET', counter, string.format('%.0f', fence))
  end
  return fence
end
"#;

/// A script whose body may call `next_fence` and `is_type_error`.
fn with_fence(body: &str) -> Script {
    Script::new(&format!("{ERROR_PRELUDE}{FENCE_PRELUDE}{body}"))
}

/// Take the lock if it is free.
///
/// - KEYS[1]: the lock key; KEYS[2]: the fencing counter; KEYS[3]: the waiters flag.
/// - ARGV[1]: the token; ARGV[2]: the lease in milliseconds.
/// - Reply: `{1, fencing_token}` when taken (also when the lock holds this very token: the
///   same attempt sent again after its reply was lost), `{0, remaining_ttl_ms}` when held by
///   someone else; then the waiters flag is set (to outlive the holder's lease), so that the
///   release announces itself.
/// - Errors with `WRONGTYPE` (and changes nothing) when the lock key is not a string with an
///   expiry, or the counter is not an integer; with Redis's own error (and changes nothing)
///   when Redis refuses a command (`OOM`, an ACL), except that a held lock still reads as
///   held when Redis is out of memory.
///
/// `SET … NX GET` both takes a free lock and, on a held one, fails with `WRONGTYPE` when the
/// key is not a string: the type check costs nothing. The fencing token comes from
/// `next_fence` (see `FENCE_PRELUDE`).
pub(crate) static ACQUIRE: LazyLock<Script> = LazyLock::new(|| {
    with_fence(
        r#"
local previous = redis.pcall('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2], 'GET')
if type(previous) == 'table' and previous['err'] then
  if is_type_error(previous) then
    return redis.error_reply('WRONGTYPE key ' .. KEYS[1] .. ' exists but is not a lock')
  end
  if string.sub(previous['err'], 1, 3) == 'OOM' then
    -- Out of memory refuses even a SET NX that would not write: a held lock is still held
    -- (its waiters flag cannot be set, so waiters recheck rather than hear the release).
    local held_ttl = redis.pcall('PTTL', KEYS[1])
    if type(held_ttl) == 'number' and held_ttl > 0 then
      return {0, held_ttl}
    end
  end
  return previous
end
if not previous or previous == ARGV[1] then
  if previous then
    -- Sent again after its reply was lost, and the first one took it: it is ours.
    redis.call('PEXPIRE', KEYS[1], ARGV[2])
  end
  local fence = next_fence(KEYS[1], KEYS[2])
  if not fence then
    return redis.error_reply('WRONGTYPE fencing counter ' .. KEYS[2] .. ' is not an integer')
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

/// Renew the lease of a lock that still holds our token: its remaining lease becomes at
/// least the lease given, never less (an `extend` beyond it is kept). Never re-creates a lock
/// that is gone.
///
/// - KEYS[1]: the lock key.
/// - ARGV[1]: the token; ARGV[2]: the lease in milliseconds.
/// - Reply: 1 when the lock holds the token, 0 when the key held another token, was gone or
///   was not a string (no error, so that one bad key cannot fail a pipelined batch).
pub(crate) static RENEW: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r#"
local value = redis.pcall('GET', KEYS[1])
if value == ARGV[1] then
  if redis.call('PTTL', KEYS[1]) < tonumber(ARGV[2]) then
    redis.call('PEXPIRE', KEYS[1], ARGV[2])
  end
  return 1
end
return 0
"#,
    )
});

/// Change the lease of a lock that still holds our token: add to what remains (`add`) or
/// replace it (`set`, which may shorten it). Never re-creates a lock that is gone.
///
/// - KEYS[1]: the lock key.
/// - ARGV[1]: the token; ARGV[2]: milliseconds; ARGV[3]: `add` or `set`.
/// - Reply: the remaining lease in milliseconds afterwards, or -1 when the lock does not hold
///   the token.
pub(crate) static CHANGE_LEASE: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r#"
if redis.pcall('GET', KEYS[1]) ~= ARGV[1] then
  return -1
end
local ms = tonumber(ARGV[2])
if ARGV[3] == 'add' then
  ms = ms + math.max(redis.call('PTTL', KEYS[1]), 0)
end
redis.call('PEXPIRE', KEYS[1], ms)
return ms
"#,
    )
});

/// Record that the holder's thread panicked, if the lock still holds its token (the release
/// follows). The record stays until a holder clears it.
///
/// - KEYS[1]: the lock key; KEYS[2]: the poison record.
/// - ARGV[1]: the token; ARGV[2]: the record.
/// - Reply: 1 when recorded, 0 when the lock no longer held the token.
pub(crate) static MARK_POISONED: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r#"
if redis.pcall('GET', KEYS[1]) == ARGV[1] then
  redis.call('SET', KEYS[2], ARGV[2])
  return 1
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

// ---------------------------------------------------------------------------------------
// Fair (FIFO) locks. Besides the lock and the fencing counter, a fair lock keeps
// `P:{N}:queue`, a list of waiter tokens in arrival order, and `P:{N}:timeouts`, a sorted set
// of the same tokens scored by when each waiter counts as dead (server time in ms). Every
// deadline is computed from the server's clock (`TIME`) inside the script, never from a
// client's. A waiter's channel is `P:{N}:ch:<client id>`, and the message is its token, so
// that a release wakes the next waiter only.
// ---------------------------------------------------------------------------------------

/// The Lua shared by the fair scripts: the server's time in ms, and dropping dead waiters
/// from the head of the queue.
const FAIR_PRELUDE: &str = r#"
-- The token in the lock key (false when free), or nil and the error to reply with when the
-- key holds another type or the GET was refused.
local function holder_of(lock)
  local holder = redis.pcall('GET', lock)
  if type(holder) == 'table' and holder['err'] then
    if is_type_error(holder) then
      return nil, redis.error_reply('WRONGTYPE key ' .. lock .. ' exists but is not a lock')
    end
    return nil, holder
  end
  return holder
end
local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end
-- Drops dead waiters from the head of the queue; returns the live head (or nil).
local function live_head(queue, timeouts, now)
  local head = redis.call('LINDEX', queue, 0)
  while head do
    local expiry = redis.call('ZSCORE', timeouts, head)
    if expiry and tonumber(expiry) > now then
      return head, tonumber(expiry)
    end
    redis.call('LPOP', queue)
    redis.call('ZREM', timeouts, head)
    head = redis.call('LINDEX', queue, 0)
  end
  return nil
end
local function wake(prefix, head)
  redis.call('PUBLISH', prefix .. string.match(head, '^[^:]+'), head)
end
-- The lock is free: wake the next live waiter, or remove every key when nobody is left.
local function hand_on(queue, timeouts, fence, prefix)
  local head = live_head(queue, timeouts, now_ms())
  if head then
    wake(prefix, head)
  elseif redis.call('LLEN', queue) == 0 then
    redis.call('DEL', queue, timeouts, fence)
  end
end
"#;

fn fair_script(body: &str) -> Script {
    with_fence(&format!("{FAIR_PRELUDE}{body}"))
}

/// Take a fair lock when it is free and it is our turn (the queue is empty or we are its
/// live head); else, in `wait` mode, join the queue (or keep our place) until told.
///
/// - KEYS[1]: lock; KEYS[2]: fencing counter; KEYS[3]: queue; KEYS[4]: timeouts.
/// - ARGV[1]: token (also the waiter's id); ARGV[2]: lease ms; ARGV[3]: waiter timeout ms;
///   ARGV[4]: `wait` to queue, `try` not to; ARGV[5]: the waiter channel prefix.
/// - Reply: `{1, fencing_token}` when taken (also when the lock holds this very token: the
///   same attempt sent again after its reply was lost); `{0, ms}` when not, where `ms` is how
///   long the caller may wait before checking again (the lock's remaining lease, or the time
///   until the waiter ahead counts as dead). When the lock is free and another live waiter
///   is next, that waiter is told again.
/// - Errors with `WRONGTYPE` when a key holds the wrong type (nothing is changed).
pub(crate) static FAIR_ACQUIRE: LazyLock<Script> = LazyLock::new(|| {
    fair_script(
        r#"
local holder, refused = holder_of(KEYS[1])
if refused then return refused end
if holder == ARGV[1] then
  -- Sent again after its reply was lost, and the first one took it: it is ours.
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  local fence = next_fence(KEYS[1], KEYS[2])
  if not fence then
    return redis.error_reply('WRONGTYPE fencing counter ' .. KEYS[2] .. ' is not an integer')
  end
  return {1, fence}
end
local now = now_ms()
local head, head_expiry = live_head(KEYS[3], KEYS[4], now)
if not holder and (not head or head == ARGV[1]) then
  redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
  if head then
    redis.call('LPOP', KEYS[3])
    redis.call('ZREM', KEYS[4], ARGV[1])
  end
  local fence = next_fence(KEYS[1], KEYS[2])
  if not fence then
    return redis.error_reply('WRONGTYPE fencing counter ' .. KEYS[2] .. ' is not an integer')
  end
  if redis.call('LLEN', KEYS[3]) == 0 then
    redis.call('DEL', KEYS[3], KEYS[4])
  end
  return {1, fence}
end
local wait = 0
if holder then
  wait = redis.call('PTTL', KEYS[1])
  if wait < 0 then
    return redis.error_reply('WRONGTYPE key ' .. KEYS[1] .. ' has no expiry; it is not a lock')
  end
elseif head then
  wait = math.max(head_expiry - now, 1)
  -- The lock is free and another live waiter is next: tell it (again), in case a dead one
  -- was just dropped from ahead of it or its announcement went astray.
  wake(ARGV[5], head)
end
if ARGV[4] == 'wait' then
  local ttl = tonumber(ARGV[3])
  if not redis.call('ZSCORE', KEYS[4], ARGV[1]) then
    redis.call('RPUSH', KEYS[3], ARGV[1])
  end
  redis.call('ZADD', KEYS[4], now + ttl, ARGV[1])
  redis.call('PEXPIRE', KEYS[3], ttl)
  redis.call('PEXPIRE', KEYS[4], ttl)
end
return {0, wait}
"#,
    )
});

/// Release a fair lock (if it holds our token, or whoever holds it when forced) and wake the
/// next live waiter; when nobody waits, remove every key of the lock.
///
/// - KEYS[1]: lock; KEYS[2]: fencing counter; KEYS[3]: queue; KEYS[4]: timeouts.
/// - ARGV[1]: token; ARGV[2]: the waiter channel prefix; ARGV[3]: `force` to release
///   whoever holds it.
/// - Reply: 1 when released, 0 when the lock held another token (or none).
pub(crate) static FAIR_RELEASE: LazyLock<Script> = LazyLock::new(|| {
    fair_script(
        r#"
local holder, refused = holder_of(KEYS[1])
if refused then return refused end
if not holder or (holder ~= ARGV[1] and ARGV[3] ~= 'force') then
  return 0
end
redis.call('DEL', KEYS[1])
if redis.call('EXISTS', KEYS[3]) == 0 then
  redis.call('DEL', KEYS[2], KEYS[4])
  return 1
end
hand_on(KEYS[3], KEYS[4], KEYS[2], ARGV[2])
return 1
"#,
    )
});

/// Leave a fair lock for good (a waiter that gave up, or the clean-up of an attempt whose
/// reply was lost): drop our place in the queue and, if the lock holds our token, the lock;
/// then wake the next waiter when the lock is free, and remove every key of the lock when
/// nobody is left.
///
/// - KEYS[1]: lock; KEYS[2]: fencing counter; KEYS[3]: queue; KEYS[4]: timeouts.
/// - ARGV[1]: token; ARGV[2]: the waiter channel prefix.
/// - Reply: 1 when the waiter was queued or held the lock, else 0.
pub(crate) static FAIR_LEAVE: LazyLock<Script> = LazyLock::new(|| {
    fair_script(
        r#"
local removed = redis.call('LREM', KEYS[3], 0, ARGV[1])
redis.call('ZREM', KEYS[4], ARGV[1])
local holder, refused = holder_of(KEYS[1])
if refused then return refused end
if holder == ARGV[1] then
  redis.call('DEL', KEYS[1])
  removed = 1
  holder = false
end
if not holder then
  hand_on(KEYS[3], KEYS[4], KEYS[2], ARGV[2])
end
return math.min(removed, 1)
"#,
    )
});

/// Keep the places of waiters alive (the renewal thread's heartbeat, one call per lock for
/// every waiter of one client). Never re-adds a waiter that was dropped as dead: it re-joins
/// at the back on its next attempt.
///
/// - KEYS[1]: queue; KEYS[2]: timeouts.
/// - ARGV[1]: waiter timeout ms; ARGV[2..]: the waiters' tokens.
/// - Reply: the tokens that are no longer queued (dropped as dead), so that their waiters
///   are told to join again.
///
/// Two commands per 500 waiters (`ZMSCORE`, `ZADD XX`), so that the heartbeat of a hundred
/// waiting threads costs Redis a handful of commands.
pub(crate) static FAIR_HEARTBEAT: LazyLock<Script> = LazyLock::new(|| {
    fair_script(
        r#"
local ttl = tonumber(ARGV[1])
local deadline = now_ms() + ttl
local dropped = {}
local alive = 0
local i = 2
while i <= #ARGV do
  local last = math.min(i + 499, #ARGV)
  local scores = redis.call('ZMSCORE', KEYS[2], unpack(ARGV, i, last))
  local update = {'ZADD', KEYS[2], 'XX'}
  for j = i, last do
    if scores[j - i + 1] then
      update[#update + 1] = deadline
      update[#update + 1] = ARGV[j]
      alive = alive + 1
    else
      dropped[#dropped + 1] = ARGV[j]
    end
  end
  if #update > 3 then
    redis.call(unpack(update))
  end
  i = last + 1
end
if alive > 0 then
  redis.call('PEXPIRE', KEYS[1], ttl)
  redis.call('PEXPIRE', KEYS[2], ttl)
end
return dropped
"#,
    )
});
