//! Holder tokens: `<client uuid>:<thread id>:<sequence>:<unix ms>`, unique per acquisition;
//! the last field is when the acquire call began, by the client's clock, for people who look
//! at a lock (`redmutex show`), never for a decision.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
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
    client_uuid: Arc<str>,
    sequence: AtomicU64,
}

impl TokenSource {
    pub(crate) fn new() -> Self {
        TokenSource {
            client_uuid: Arc::from(uuid::Uuid::new_v4().simple().to_string()),
            sequence: AtomicU64::new(1),
        }
    }

    /// The client's id, shared (a `Mutex`'s waiters filter their wake-ups by it).
    pub(crate) fn client_uuid(&self) -> &Arc<str> {
        &self.client_uuid
    }

    /// A new token, written on the stack and copied once into its `Arc` (every acquire makes
    /// one, and `format!` would cost a tenth of an uncontended acquire's client-side work).
    pub(crate) fn next(&self) -> Arc<str> {
        let seq = self.sequence.fetch_add(1, Ordering::Relaxed);
        // Milliseconds since 1970 fit in 64 bits for 500 million years.
        let ms = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX));
        let mut token = TokenText::default();
        token.push(self.client_uuid.as_bytes());
        for number in [thread_id(), seq, ms] {
            token.push(b":");
            token.push(itoa::Buffer::new().format(number).as_bytes());
        }
        Arc::from(token.as_str())
    }
}

/// A token being written: the client's id (32 hex digits) and three decimal numbers of at
/// most 39 digits, with their separators, always fit.
struct TokenText {
    bytes: [u8; 160],
    len: usize,
}

impl Default for TokenText {
    fn default() -> Self {
        TokenText {
            bytes: [0; 160],
            len: 0,
        }
    }
}

impl TokenText {
    fn push(&mut self, part: &[u8]) {
        let end = (self.len + part.len()).min(self.bytes.len());
        self.bytes[self.len..end].copy_from_slice(&part[..end - self.len]);
        self.len = end;
    }

    fn as_str(&self) -> &str {
        // Only ASCII is written (hex digits, decimal digits, colons).
        std::str::from_utf8(&self.bytes[..self.len]).unwrap_or_default()
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
        assert!(a.starts_with(&**source.client_uuid()));
        let fields: Vec<&str> = a.split(':').collect();
        assert_eq!(fields.len(), 4, "{a}");
        assert_eq!(fields[1], thread_id().to_string());
        assert!(fields[2..].iter().all(|f| f.parse::<u128>().is_ok()), "{a}");
        let other = std::thread::spawn(thread_id).join().unwrap();
        assert_ne!(other, thread_id());
        assert_ne!(TokenSource::new().client_uuid(), source.client_uuid());
    }
}
