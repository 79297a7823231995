//! Holder tokens: `<client uuid>:<thread id>:<sequence>:<unix ms>`, unique per acquisition;
//! the last field is when the acquire call began, by the client's clock, for people who look
//! at a lock (`redmutex show`), never for a decision.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

static NEXT_THREAD_ID: AtomicU64 = AtomicU64::new(1);

thread_local! {
    static THREAD_ID: u64 = NEXT_THREAD_ID.fetch_add(1, Ordering::Relaxed);
}

/// A small number that names the calling thread within this process.
pub(crate) fn thread_id() -> u64 {
    THREAD_ID.try_with(|id| *id).unwrap_or(0)
}

/// Makes the tokens of one client.
#[derive(Debug)]
pub(crate) struct TokenSource {
    client_uuid: String,
    sequence: AtomicU64,
}

impl TokenSource {
    pub(crate) fn new() -> Self {
        TokenSource {
            client_uuid: uuid::Uuid::new_v4().simple().to_string(),
            sequence: AtomicU64::new(1),
        }
    }

    pub(crate) fn client_uuid(&self) -> &str {
        &self.client_uuid
    }

    pub(crate) fn next(&self) -> String {
        let seq = self.sequence.fetch_add(1, Ordering::Relaxed);
        let ms = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_millis());
        format!("{}:{}:{seq}:{ms}", self.client_uuid, thread_id())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_are_unique_and_name_client_and_thread() {
        let source = TokenSource::new();
        let a = source.next();
        let b = source.next();
        assert_ne!(a, b);
        assert!(a.starts_with(source.client_uuid()));
        let other = std::thread::spawn(thread_id).join().unwrap();
        assert_ne!(other, thread_id());
        assert_ne!(TokenSource::new().client_uuid(), source.client_uuid());
    }
}
