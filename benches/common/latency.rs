//! A network's latency on loopback: a TCP proxy in front of a server that passes every chunk
//! of bytes on, in either direction, a set time after it arrived (in order), as a link of that
//! one-way latency would. The server runs every command on time; only the way to it and back
//! is long, so that a shape's cost in round trips and one-way messages shows, where loopback
//! shows only its cost in wake-ups.

use std::io::{Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// Listens on a free loopback port for the life of the process (its threads end with their
/// connections).
pub struct LatencyProxy {
    port: u16,
}

impl LatencyProxy {
    /// A proxy to `127.0.0.1:upstream` whose every byte arrives `one_way` late.
    pub fn start(upstream: u16, one_way: Duration) -> LatencyProxy {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind the latency proxy");
        let port = listener.local_addr().expect("the proxy's address").port();
        std::thread::spawn(move || {
            for client in listener.incoming().flatten() {
                let Ok(server) = TcpStream::connect(("127.0.0.1", upstream)) else {
                    continue;
                };
                let (Ok(client_side), Ok(server_side)) = (client.try_clone(), server.try_clone())
                else {
                    continue;
                };
                forward(client, server_side, one_way);
                forward(server, client_side, one_way);
            }
        });
        LatencyProxy { port }
    }

    /// The URL of the server through the proxy.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/", self.port)
    }
}

/// Passes what `from` sends on to `to`, each chunk `delay` after it was read: one thread
/// reads and stamps, another waits for each stamp and writes.
fn forward(mut from: TcpStream, mut to: TcpStream, delay: Duration) {
    let _ = from.set_nodelay(true);
    let _ = to.set_nodelay(true);
    let (chunks, due) = mpsc::channel::<(Instant, Vec<u8>)>();
    std::thread::spawn(move || {
        let mut buf = vec![0u8; 64 * 1024];
        while let Ok(n @ 1..) = from.read(&mut buf) {
            if chunks
                .send((Instant::now() + delay, buf[..n].to_vec()))
                .is_err()
            {
                break;
            }
        }
    });
    std::thread::spawn(move || {
        while let Ok((at, bytes)) = due.recv() {
            let now = Instant::now();
            if at > now {
                std::thread::sleep(at - now);
            }
            if to.write_all(&bytes).is_err() {
                break;
            }
        }
        let _ = to.shutdown(Shutdown::Write);
    });
}
