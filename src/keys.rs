//! The Redis key layout of one lock, and the validation of names and prefixes.
//!
//! Every key of lock `N` under prefix `P` carries the hash tag `{N}`, so that multi-key
//! scripts stay on one slot of a Redis Cluster.

use std::sync::{Arc, OnceLock};

use crate::error::{Error, Result};

/// The longest lock name accepted, in bytes.
pub const MAX_NAME_LEN: usize = 1024;

/// The longest key prefix accepted, in bytes.
pub(crate) const MAX_PREFIX_LEN: usize = 256;

/// The suffix after `P:{N}` of every key a kind keeps beside its lock key, in one place: a
/// kind makes its keys from these, and `inspect` lists and reads them, so a key added here
/// shows up in `redmutex show` and `lock_names` without another list to keep.
pub(crate) mod suffix {
    /// The fencing counter (every kind).
    pub(crate) const FENCE: &str = ":fence";
    /// The waiting clients of a `Mutex` (a flag for the other kinds).
    pub(crate) const WAITING: &str = ":waiting";
    /// A poison record.
    pub(crate) const POISON: &str = ":poison";
    /// A fair kind's queue of waiters, and when each counts as dead.
    pub(crate) const QUEUE: &str = ":queue";
    pub(crate) const TIMEOUTS: &str = ":timeouts";
    /// An `RwLock`'s readers, and the writer whose turn is next.
    pub(crate) const READERS: &str = ":readers";
    pub(crate) const WRITER_WAITING: &str = ":writer-waiting";
    /// A `Shared<T>`'s value, and the fencing token of the holder that wrote it (so that a
    /// Redlock's quorum reads the newest copy; kept when the value is removed).
    pub(crate) const VALUE: &str = ":value";
    pub(crate) const VALUE_FENCE: &str = ":value-fence";
    /// A semaphore's permits, holders, permits held per holder, and a fair one's waiters'
    /// wants (under the semaphore's own space, `P:semaphore:{N}`).
    pub(crate) const PERMITS: &str = ":permits";
    pub(crate) const HOLDERS: &str = ":holders";
    pub(crate) const HELD: &str = ":held";
    pub(crate) const WANTS: &str = ":wants";
    /// An election's leader (who leads, with which term and value) and its log of changes;
    /// the channel that announces a change is named as a key would be (`:leader-ch`).
    pub(crate) const LEADER: &str = ":leader";
    pub(crate) const LEADER_LOG: &str = ":leader-log";
    pub(crate) const LEADER_CHANNEL: &str = ":leader-ch";

    /// Every key under `P:{N}`: the suffixes, and the lock key itself (`""`) last.
    pub(crate) const OF_LOCKS: [&str; 13] = [
        WRITER_WAITING,
        TIMEOUTS,
        READERS,
        WAITING,
        POISON,
        QUEUE,
        VALUE_FENCE,
        VALUE,
        FENCE,
        WANTS,
        LEADER_LOG,
        LEADER,
        "",
    ];

    /// The keys that stay when a lock is free and its value removed: they alone do not make a
    /// name one in use.
    pub(crate) const LEFT_BEHIND: [&str; 4] = [FENCE, VALUE_FENCE, LEADER, LEADER_LOG];

    /// Every key under `P:semaphore:{N}`.
    pub(crate) const OF_SEMAPHORES: [&str; 8] =
        [TIMEOUTS, HOLDERS, PERMITS, WAITING, QUEUE, WANTS, HELD, ""];
}

/// Where a semaphore's keys live under prefix `P`: `P:semaphore:{N}…`, apart from the locks'.
pub(crate) const SEMAPHORE_NAMESPACE: &str = "semaphore";

/// The space of a semaphore's keys under prefix `P`: `P:semaphore`.
pub(crate) fn semaphore_space(prefix: &str) -> String {
    format!("{prefix}:{SEMAPHORE_NAMESPACE}")
}

/// The keys and channel of one lock. A handle is often made per operation, so the keys
/// that only some kinds or rare paths use (the poison record, a fair lock's queue, the
/// waiters' channels) are made when first asked for.
#[derive(Debug, Clone)]
pub(crate) struct LockKeys {
    /// `P:{N}` — a string holding the holder's token, with a PX expiry.
    pub(crate) lock: String,
    /// `P:{N}:fence` — the fencing counter.
    pub(crate) fence: String,
    /// `P:{N}:waiting` — the clients waiting for a `Mutex`, a sorted set scored by the hold
    /// during which each began to wait, so that a release names the first (a flag, for the
    /// other primitives).
    pub(crate) waiting: String,
    /// `P:{N}:ch` — the channel on which a release is announced to every waiter (an
    /// `RwLock`'s, a semaphore's).
    pub(crate) channel: Arc<str>,
    /// `P:{N}` when the lock key is elsewhere (a bare lock); `None` when it is the lock key.
    space: Option<String>,
    /// `P:{N}:poison` — left by a holder whose thread panicked; see `PoisonInfo`.
    poison: OnceLock<String>,
    /// `P:{N}:queue` — a fair lock's waiters, in arrival order.
    queue: OnceLock<String>,
    /// `P:{N}:timeouts` — when each waiter of a fair lock counts as dead (server time, ms).
    timeouts: OnceLock<String>,
    /// `P:{N}:ch:` — the channels that name one waiting client (a `Mutex`'s, a fair lock's)
    /// are this plus its id.
    waiter_channel_prefix: OnceLock<String>,
    /// `P:{N}:value` — a shared value.
    #[cfg(feature = "serde")]
    value: OnceLock<String>,
    /// `P:{N}:value-fence` — the version of a shared value: who wrote (or removed) it last.
    #[cfg(feature = "serde")]
    value_fence: OnceLock<String>,
}

/// `base` with `suffix` after it, in one allocation.
fn joined(base: &str, suffix: &str) -> String {
    let mut key = String::with_capacity(base.len() + suffix.len());
    key.push_str(base);
    key.push_str(suffix);
    key
}

impl LockKeys {
    /// The key of a kind's own beside the lock key: `P:{N}<suffix>` (see [`suffix`]).
    pub(crate) fn beside(&self, suffix: &str) -> String {
        joined(&self.lock, suffix)
    }

    /// `P:{N}`, under which every key of the lock but a bare lock key lies.
    fn space(&self) -> &str {
        self.space.as_deref().unwrap_or(&self.lock)
    }

    /// `P:{N}<suffix>`, made at the first call.
    fn made<'a>(&'a self, cell: &'a OnceLock<String>, suffix: &str) -> &'a str {
        cell.get_or_init(|| joined(self.space(), suffix))
    }

    /// `P:{N}:poison`.
    pub(crate) fn poison(&self) -> &str {
        self.made(&self.poison, suffix::POISON)
    }

    /// `P:{N}:queue`.
    pub(crate) fn queue(&self) -> &str {
        self.made(&self.queue, suffix::QUEUE)
    }

    /// `P:{N}:timeouts`.
    pub(crate) fn timeouts(&self) -> &str {
        self.made(&self.timeouts, suffix::TIMEOUTS)
    }

    /// `P:{N}:value`: a `Shared<T>`'s value, beside the lock, in its slot.
    #[cfg(feature = "serde")]
    pub(crate) fn value(&self) -> &str {
        self.made(&self.value, suffix::VALUE)
    }

    /// `P:{N}:value-fence`: the version of the value's last write (or removal), who wrote it.
    /// An optimistic update compares it; a quorum's acquire reads the copy with the largest.
    #[cfg(feature = "serde")]
    pub(crate) fn value_fence(&self) -> &str {
        self.made(&self.value_fence, suffix::VALUE_FENCE)
    }

    /// `P:{N}:ch:`, which the channel of one waiting client starts with.
    pub(crate) fn waiter_channel_prefix(&self) -> &str {
        self.made(&self.waiter_channel_prefix, ":ch:")
    }

    /// The channel on which a release names this client (a `Mutex`'s, a fair lock's):
    /// `P:{N}:ch:` and its id. Made at every contending acquire, so in one allocation (the
    /// `Arc`'s) when it fits in a buffer on the stack.
    pub(crate) fn waiter_channel(&self, client_id: &str) -> Arc<str> {
        let parts = [self.space(), ":ch:", client_id];
        let mut buffer = [0u8; 256];
        let mut len = 0;
        for part in parts {
            let Some(room) = buffer.get_mut(len..len + part.len()) else {
                return Arc::from(parts.concat());
            };
            room.copy_from_slice(part.as_bytes());
            len += part.len();
        }
        match std::str::from_utf8(&buffer[..len]) {
            Ok(channel) => Arc::from(channel),
            Err(_) => Arc::from(parts.concat()),
        }
    }
}

impl LockKeys {
    /// The keys of the lock `name` under `prefix`: `prefix:{name}` and those beside it.
    pub(crate) fn new(prefix: &str, name: &str) -> Result<Self> {
        validate_name(name)?;
        // Plain concatenation: a handle is often made per operation, and `format!` would cost
        // more than the rest of an uncontended acquire's client-side work.
        let mut lock = String::with_capacity(prefix.len() + name.len() + 3);
        lock.push_str(prefix);
        lock.push_str(":{");
        lock.push_str(name);
        lock.push('}');
        Ok(LockKeys {
            fence: joined(&lock, suffix::FENCE),
            waiting: joined(&lock, suffix::WAITING),
            channel: Arc::from(joined(&lock, ":ch")),
            space: None,
            poison: OnceLock::new(),
            queue: OnceLock::new(),
            timeouts: OnceLock::new(),
            waiter_channel_prefix: OnceLock::new(),
            #[cfg(feature = "serde")]
            value: OnceLock::new(),
            #[cfg(feature = "serde")]
            value_fence: OnceLock::new(),
            lock,
        })
    }
}

impl LockKeys {
    /// The keys of a lock kept at `key` itself (the bare layout, shared with other lock
    /// clients such as redis-py's `Lock`): the lock key is `key`, and the fencing counter,
    /// waiting clients, channel and poison record stay at `P:{key}…`, whose hash tag puts them
    /// in `key`'s Cluster slot. A key with a brace is refused: its slot would differ.
    pub(crate) fn bare(prefix: &str, key: &str) -> Result<Self> {
        if key.contains(['{', '}']) {
            return Err(Error::invalid_argument(format!(
                "a bare lock key must not contain '{{' or '}}' (its Cluster slot would differ \
                 from its fencing counter's): {key:?}"
            )));
        }
        let mut keys = LockKeys::new(prefix, key)?;
        keys.space = Some(std::mem::replace(&mut keys.lock, key.to_owned()));
        Ok(keys)
    }
}

pub(crate) fn validate_name(name: &str) -> Result<()> {
    if name.is_empty() {
        return Err(Error::invalid_argument("lock name is empty"));
    }
    if name.len() > MAX_NAME_LEN {
        return Err(Error::invalid_argument(format!(
            "lock name is {} bytes long; the limit is {MAX_NAME_LEN}",
            name.len()
        )));
    }
    Ok(())
}

pub(crate) fn validate_prefix(prefix: &str) -> Result<()> {
    if prefix.is_empty() {
        return Err(Error::config("key prefix is empty"));
    }
    if prefix.len() > MAX_PREFIX_LEN {
        return Err(Error::config(format!(
            "key prefix is {} bytes long; the limit is {MAX_PREFIX_LEN}",
            prefix.len()
        )));
    }
    if prefix.contains(['{', '}']) {
        // A brace would become the hash tag of every lock and put them all on one slot.
        return Err(Error::config("key prefix must not contain '{' or '}'"));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_share_the_hash_tag_of_the_name() {
        let k = LockKeys::new("redmutex", "orders:42").unwrap();
        assert_eq!(k.lock, "redmutex:{orders:42}");
        assert_eq!(k.fence, "redmutex:{orders:42}:fence");
        assert_eq!(k.waiting, "redmutex:{orders:42}:waiting");
        assert_eq!(&*k.channel, "redmutex:{orders:42}:ch");
    }

    #[test]
    fn keys_made_on_first_use_lie_under_the_name_also_for_a_bare_key() {
        let k = LockKeys::new("redmutex", "orders:42").unwrap();
        assert_eq!(k.poison(), "redmutex:{orders:42}:poison");
        assert_eq!(k.queue(), "redmutex:{orders:42}:queue");
        assert_eq!(k.timeouts(), "redmutex:{orders:42}:timeouts");
        assert_eq!(&*k.waiter_channel("c1"), "redmutex:{orders:42}:ch:c1");
        let long_id = "i".repeat(300);
        let channel = k.waiter_channel(&long_id);
        assert_eq!(&*channel, format!("redmutex:{{orders:42}}:ch:{long_id}"));
        let bare = LockKeys::bare("redmutex", "export").unwrap();
        assert_eq!(bare.lock, "export");
        assert_eq!(bare.fence, "redmutex:{export}:fence");
        assert_eq!(bare.poison(), "redmutex:{export}:poison");
        assert_eq!(bare.waiter_channel_prefix(), "redmutex:{export}:ch:");
        assert_eq!(&*bare.waiter_channel("c1"), "redmutex:{export}:ch:c1");
    }

    #[test]
    fn bad_names_are_rejected() {
        assert!(LockKeys::new("p", "").unwrap_err().is_invalid_argument());
        let long = "x".repeat(MAX_NAME_LEN + 1);
        assert!(LockKeys::new("p", &long).unwrap_err().is_invalid_argument());
        assert!(LockKeys::new("p", &"x".repeat(MAX_NAME_LEN)).is_ok());
    }

    #[test]
    fn bad_prefixes_are_rejected() {
        assert!(validate_prefix("").unwrap_err().is_config());
        assert!(validate_prefix("a{b}").unwrap_err().is_config());
        assert!(validate_prefix(&"p".repeat(MAX_PREFIX_LEN + 1)).is_err());
        assert!(validate_prefix("app:locks").is_ok());
    }
}
