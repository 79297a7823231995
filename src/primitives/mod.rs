//! The kinds of lock users take. Each brings only its protocol (its keys, its Lua scripts
//! beside it, how its waiters wait) to the shared lease machinery, and a public handle.

mod acquire_family;
mod fair_mutex;
mod guard_traits;
mod lock;
mod multi_lock;
mod mutex;
mod mutex_guard;
mod redlock;
mod rw_lock;
mod semaphore;
#[cfg(feature = "serde")]
mod shared;

pub use fair_mutex::FairMutex;
pub use guard_traits::{Fenced, Lease};
pub use lock::{Fair, Lock, LockKind, Plain};
pub use multi_lock::{MultiLock, MultiLockGuard};
pub use mutex::Mutex;
pub use mutex_guard::MutexGuard;
pub use redlock::{Redlock, RedlockBuilder, RedlockGuard, RedlockMutex};
pub use rw_lock::{RwLock, RwLockReadGuard, RwLockWriteGuard};
pub use semaphore::{Semaphore, SemaphorePermit, MAX_PERMITS};
#[cfg(feature = "serde")]
pub use shared::{Codec, Shared, SharedGuard, MAX_VALUE_LEN};

#[cfg(test)]
mod tests {
    //! Every script loads into a real Redis: a syntax error fails here, not in production.

    use std::process::{Child, Command, Stdio};
    use std::time::{Duration, Instant};

    /// A `redis-server` on a Unix socket of its own, killed on drop.
    struct Server {
        child: Child,
        dir: std::path::PathBuf,
    }

    impl Drop for Server {
        fn drop(&mut self) {
            let _ = self.child.kill();
            let _ = self.child.wait();
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }

    #[test]
    fn every_script_loads_into_redis() {
        let dir = std::env::temp_dir().join(format!("redmutex-scripts-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let socket = dir.join("redis.sock");
        let binary = std::env::var("REDMUTEX_SERVER").unwrap_or_else(|_| "redis-server".into());
        let child = Command::new(binary)
            .args(["--port", "0", "--save", "", "--appendonly", "no"])
            .arg("--unixsocket")
            .arg(&socket)
            .arg("--dir")
            .arg(&dir)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("redis-server (scripts/ensure-redis installs it)");
        let server = Server { child, dir };
        let url = format!("redis+unix://{}", socket.display());
        let client = redis::Client::open(url.as_str()).unwrap();
        let started = Instant::now();
        let mut conn = loop {
            match client.get_connection() {
                Ok(conn) => break conn,
                Err(e) if started.elapsed() > Duration::from_secs(20) => panic!("{e}"),
                Err(_) => std::thread::sleep(Duration::from_millis(20)),
            }
        };
        let scripts = crate::lease::scripts::scripts()
            .into_iter()
            .chain(crate::lease::quorum_scripts())
            .chain(super::mutex::scripts())
            .chain(super::fair_mutex::scripts())
            .chain(super::rw_lock::scripts())
            .chain(super::semaphore::scripts())
            .chain(super::multi_lock::scripts())
            .chain(super::shared::scripts());
        let mut loaded = 0;
        for (name, script) in scripts {
            if let Err(e) = script.load(&mut conn) {
                panic!("script {name} does not load: {e}");
            }
            loaded += 1;
        }
        assert_eq!(loaded, 38);
        drop(server);
    }
}
