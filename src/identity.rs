//! Who a client is: its name, host, process and start time, announced under
//! `P:client:<client id>` for as long as the client lives, so that a lock's holder (whose
//! token starts with the client id) can be named by whoever looks (`redmutex list`).
//!
//! The renewal thread keeps the announcement alive: one `PEXPIRE` per renewal period, and
//! the whole hash again when Redis lost it. Nothing is added to an acquire or a release.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use crate::connection::millis;

/// The fields of a client's announcement, in the order they are written.
pub(crate) const FIELDS: [&str; 6] = ["name", "host", "pid", "started_ms", "version", "lease_ms"];

/// One client's announcement.
#[derive(Debug, Clone)]
pub(crate) struct Identity {
    /// `P:client:<client id>`.
    pub(crate) key: String,
    /// The values of [`FIELDS`], in order.
    values: [String; 6],
}

impl Identity {
    pub(crate) fn new(prefix: &str, client_id: &str, name: &str, lease: Duration) -> Self {
        let started = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_millis());
        Identity {
            key: key(prefix, client_id),
            values: [
                name.to_owned(),
                host_name(),
                std::process::id().to_string(),
                started.to_string(),
                env!("CARGO_PKG_VERSION").to_owned(),
                millis(lease).to_string(),
            ],
        }
    }

    /// `HSET` of every field, then the expiry: the whole announcement.
    pub(crate) fn announce(&self, ttl: Duration) -> redis::Pipeline {
        let mut hset = redis::cmd("HSET");
        hset.arg(&self.key);
        for (field, value) in FIELDS.iter().zip(&self.values) {
            hset.arg(field).arg(value);
        }
        let mut pipe = redis::pipe();
        pipe.add_command(hset).ignore();
        pipe.cmd("PEXPIRE").arg(&self.key).arg(millis(ttl));
        pipe
    }

    /// `DEL`: the announcement of a client that shuts down cleanly.
    pub(crate) fn withdraw(&self) -> redis::Cmd {
        let mut cmd = redis::cmd("DEL");
        cmd.arg(&self.key);
        cmd
    }

    /// `PEXPIRE`: keeps the announcement alive; replies 0 when it is gone (Redis lost it).
    pub(crate) fn keep(&self, ttl: Duration) -> redis::Cmd {
        let mut cmd = redis::cmd("PEXPIRE");
        cmd.arg(&self.key).arg(millis(ttl));
        cmd
    }
}

/// `P:client:<client id>`: where client `client_id` announces itself.
pub(crate) fn key(prefix: &str, client_id: &str) -> String {
    format!("{prefix}:client:{client_id}")
}

/// The client id a holder token starts with (`<client id>:<thread>:<sequence>`).
pub(crate) fn client_id_of(token: &str) -> &str {
    token.split(':').next().unwrap_or(token)
}

/// The name of this program: the file name of its executable, or `redmutex` when unknown.
pub(crate) fn program_name() -> String {
    std::env::current_exe()
        .ok()
        .and_then(|p| p.file_stem().map(|s| s.to_string_lossy().into_owned()))
        .or_else(|| {
            std::env::args()
                .next()
                .and_then(|a| a.rsplit('/').next().map(str::to_owned))
        })
        .unwrap_or_else(|| "redmutex".to_owned())
}

/// This machine's host name, or `unknown`.
fn host_name() -> String {
    ["/proc/sys/kernel/hostname", "/etc/hostname"]
        .iter()
        .find_map(|path| std::fs::read_to_string(path).ok())
        .map(|s| s.trim().to_owned())
        .filter(|s| !s.is_empty())
        .or_else(|| std::env::var("HOSTNAME").ok())
        .unwrap_or_else(|| "unknown".to_owned())
}
