//! A TCP proxy in front of a server that holds every reply for a set time before passing it
//! on (requests pass at once), so that a test can make replies arrive late while the server
//! itself runs every command on time; or drops one reply and closes its connection, so that
//! a command ran but its client never heard.

use std::io::{Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Listens on a free loopback port while it lives (its threads end with their connections).
pub struct DelayProxy {
    port: u16,
    delay_ms: Arc<AtomicU64>,
    cut: Arc<AtomicBool>,
}

impl DelayProxy {
    /// A proxy to `127.0.0.1:upstream`, passing replies on at once until told otherwise.
    pub fn start(upstream: u16) -> DelayProxy {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let delay_ms = Arc::new(AtomicU64::new(0));
        let cut = Arc::new(AtomicBool::new(false));
        let (delay, cut_next) = (Arc::clone(&delay_ms), Arc::clone(&cut));
        std::thread::spawn(move || {
            for client in listener.incoming().flatten() {
                let Ok(server) = TcpStream::connect(("127.0.0.1", upstream)) else {
                    continue;
                };
                forward(client, server, Arc::clone(&delay), Arc::clone(&cut_next));
            }
        });
        DelayProxy {
            port,
            delay_ms,
            cut,
        }
    }

    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/", self.port)
    }

    /// Every reply read from the server from now on is passed on `delay` later.
    pub fn hold_replies(&self, delay: Duration) {
        self.delay_ms
            .store(delay.as_millis() as u64, Ordering::SeqCst);
    }

    /// The next reply read from the server, on any connection, is dropped and its
    /// connection closed both ways: the command ran, its client hears only the close.
    pub fn cut_next_reply(&self) {
        self.cut.store(true, Ordering::SeqCst);
    }
}

fn forward(client: TcpStream, server: TcpStream, delay_ms: Arc<AtomicU64>, cut: Arc<AtomicBool>) {
    let (mut to_server, mut from_client) =
        (server.try_clone().unwrap(), client.try_clone().unwrap());
    std::thread::spawn(move || {
        let mut buf = [0u8; 16 * 1024];
        while let Ok(n @ 1..) = from_client.read(&mut buf) {
            if to_server.write_all(&buf[..n]).is_err() {
                break;
            }
        }
        let _ = to_server.shutdown(Shutdown::Both);
    });
    let (due_tx, due_rx) = mpsc::channel::<(Instant, Vec<u8>)>();
    let mut from_server = server;
    std::thread::spawn(move || {
        let mut buf = [0u8; 16 * 1024];
        while let Ok(n @ 1..) = from_server.read(&mut buf) {
            if cut.swap(false, Ordering::SeqCst) {
                let _ = from_server.shutdown(Shutdown::Both);
                break;
            }
            let due = Instant::now() + Duration::from_millis(delay_ms.load(Ordering::SeqCst));
            if due_tx.send((due, buf[..n].to_vec())).is_err() {
                break;
            }
        }
    });
    let mut to_client = client;
    std::thread::spawn(move || {
        for (due, bytes) in due_rx {
            std::thread::sleep(due.saturating_duration_since(Instant::now()));
            if to_client.write_all(&bytes).is_err() {
                break;
            }
        }
        let _ = to_client.shutdown(Shutdown::Both);
    });
}
