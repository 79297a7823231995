//! Poisoning across processes: the record a holder leaves when its thread panics while
//! holding a lock, so that the next holder, in any process, learns the work was cut short.

use std::fmt;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// Who held a lock when their thread panicked, and when.
///
/// Read it with [`MutexGuard::poison`](crate::MutexGuard::poison) and clear it with
/// [`MutexGuard::clear_poison`](crate::MutexGuard::clear_poison) once the protected resource
/// is known to be consistent again.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct PoisonInfo {
    /// The holder's token (`<client id>:<thread>:<sequence>:<unix ms>`).
    pub holder: String,
    /// The holder's process id.
    pub process_id: u32,
    /// The name of the thread that panicked (empty when it had none).
    pub thread: String,
    /// When the panic released the lock, by the holder's clock.
    pub poisoned_at: SystemTime,
}

impl PoisonInfo {
    pub(crate) fn here(holder: &str) -> Self {
        PoisonInfo {
            holder: holder.to_owned(),
            process_id: std::process::id(),
            thread: std::thread::current().name().unwrap_or("").to_owned(),
            poisoned_at: SystemTime::now(),
        }
    }

    /// The stored form: `v1`, then the fields, one per line (the thread name last, so that
    /// it may hold anything but a newline).
    pub(crate) fn encode(&self) -> String {
        let millis = self
            .poisoned_at
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_millis());
        let thread = self.thread.replace('\n', " ");
        format!(
            "v1\n{}\n{}\n{millis}\n{thread}",
            self.holder, self.process_id
        )
    }

    /// Reads the stored form; anything else (written by hand, say) is reported as it is.
    pub(crate) fn decode(stored: &str) -> Self {
        let mut fields = stored.splitn(5, '\n');
        let parsed = (|| {
            if fields.next()? != "v1" {
                return None;
            }
            let holder = fields.next()?.to_owned();
            let process_id = fields.next()?.parse().ok()?;
            let millis: u64 = fields.next()?.parse().ok()?;
            let thread = fields.next().unwrap_or("").to_owned();
            Some(PoisonInfo {
                holder,
                process_id,
                thread,
                poisoned_at: UNIX_EPOCH + Duration::from_millis(millis),
            })
        })();
        parsed.unwrap_or_else(|| PoisonInfo {
            holder: stored.to_owned(),
            process_id: 0,
            thread: String::new(),
            poisoned_at: UNIX_EPOCH,
        })
    }
}

impl fmt::Display for PoisonInfo {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "holder {} (process {}, thread {:?}) panicked while holding the lock",
            self.holder, self.process_id, self.thread
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_through_the_stored_form() {
        let info = PoisonInfo {
            holder: "abc:3:9".into(),
            process_id: 42,
            thread: "worker\nwith newline".into(),
            poisoned_at: UNIX_EPOCH + Duration::from_millis(1_700_000_000_123),
        };
        let back = PoisonInfo::decode(&info.encode());
        assert_eq!(back.holder, "abc:3:9");
        assert_eq!(back.process_id, 42);
        assert_eq!(back.thread, "worker with newline");
        assert_eq!(back.poisoned_at, info.poisoned_at);
        assert_eq!(PoisonInfo::decode("junk").holder, "junk");
    }
}
