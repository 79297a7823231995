//! A `redis-server` of an example's own, on a free loopback port, for the examples that run
//! without `REDIS_URL`.

use std::net::{TcpListener, TcpStream};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// The URL of `$REDIS_URL`, or of a private `redis-server` started now (kept running while
/// the returned guard lives).
pub fn url_or_start() -> Result<(String, Option<LocalRedis>), Box<dyn std::error::Error>> {
    match std::env::var("REDIS_URL") {
        Ok(url) => Ok((url, None)),
        Err(_) => {
            let server = LocalRedis::start()?;
            Ok((server.url(), Some(server)))
        }
    }
}

/// A redis-server of the demo's own on a free loopback port, killed when dropped.
pub struct LocalRedis {
    port: u16,
    child: Child,
    dir: std::path::PathBuf,
}

impl LocalRedis {
    /// Starts one, or says why it could not.
    pub fn start() -> Result<Self, Box<dyn std::error::Error>> {
        let port = TcpListener::bind("127.0.0.1:0")?.local_addr()?.port();
        let dir = std::env::temp_dir().join(format!("redmutex-example-{}", std::process::id()));
        std::fs::create_dir_all(&dir)?;
        // `REDMUTEX_SERVER` names another server binary (`scripts/demo --server …` sets it).
        let binary = std::env::var("REDMUTEX_SERVER")
            .ok()
            .filter(|s| !s.is_empty())
            .unwrap_or_else(|| "redis-server".to_owned());
        let child = Command::new(&binary)
            .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
            .args(["--save", "", "--appendonly", "no"])
            .arg("--dir")
            .arg(&dir)
            .stdout(Stdio::null())
            .spawn()
            .map_err(|e| {
                format!("cannot start {binary} (install redis-server, or set REDIS_URL): {e}")
            })?;
        let server = LocalRedis { port, child, dir };
        let deadline = Instant::now() + Duration::from_secs(10);
        while TcpStream::connect(("127.0.0.1", port)).is_err() {
            if Instant::now() > deadline {
                return Err("redis-server did not start within 10 s".into());
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        Ok(server)
    }

    /// Its URL.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/", self.port)
    }
}

impl Drop for LocalRedis {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
