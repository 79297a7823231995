//! A pooled connection's link to its server: a plain TCP stream that this crate writes and
//! reads itself (the default, `redis://`), or a redis-rs connection (TLS, a Unix socket,
//! RESP3).
//!
//! Over plain TCP the pool writes commands already packed and reads short replies; redis-rs's
//! connection adds its general reader to each ([`reply_reader`](super::reply_reader) says
//! why it costs). A [`Wire`] keeps one buffer of received bytes, read into without clearing it
//! first, and reads each reply out of it. What a caller sees is as before: the same
//! [`redis::Value`]s, I/O errors as redis-rs gives them (a read past the timeout is
//! [`is_timeout`](redis::RedisError::is_timeout), a closed connection is `UnexpectedEof`),
//! and a connection that failed mid-way is not open any more.

use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpStream, ToSocketAddrs};
use std::time::{Duration, Instant};

use redis::{RedisError, RedisResult, Value};

use super::reply_reader::read_reply;

/// The buffer a connection starts with, and keeps: a reply that needs more grows it for
/// itself, and the buffer shrinks back once that reply is read.
const BUFFER: usize = 8 * 1024;

/// A plain TCP connection, written and read by this crate.
pub(crate) struct Wire {
    stream: TcpStream,
    /// Bytes received; those in `read..received` are not read yet.
    buffer: Vec<u8>,
    read: usize,
    received: usize,
    open: bool,
    db: i64,
}

impl Wire {
    /// Connects to `host:port` by `deadline`, trying each of its addresses in turn, with
    /// `TCP_NODELAY` (a command goes out at once, as the pool's redis-rs connections do).
    pub(crate) fn connect(host: &str, port: u16, deadline: Instant, db: i64) -> RedisResult<Self> {
        let mut last = None;
        for address in (host, port).to_socket_addrs()? {
            match connect_one(&address, deadline) {
                Ok(stream) => {
                    return Ok(Wire {
                        stream,
                        buffer: vec![0; BUFFER],
                        read: 0,
                        received: 0,
                        open: true,
                        db,
                    })
                }
                Err(e) => last = Some(e),
            }
        }
        Err(last.map_or_else(
            || {
                RedisError::from((
                    redis::ErrorKind::InvalidClientConfig,
                    "could not resolve to any addresses",
                ))
            },
            RedisError::from,
        ))
    }

    /// Writes `bytes` (commands already packed).
    pub(crate) fn send(&mut self, bytes: &[u8]) -> RedisResult<()> {
        self.stream.write_all(bytes).map_err(|e| self.failed(e))
    }

    /// Reads one reply, waiting for it within the read timeout.
    pub(crate) fn recv(&mut self) -> RedisResult<Value> {
        loop {
            let unread = &self.buffer[self.read..self.received];
            match read_reply(unread) {
                Ok(Some((value, length))) => {
                    self.consumed(length);
                    return Ok(value);
                }
                Ok(None) => self.receive()?,
                Err(e) => {
                    self.open = false;
                    return Err(e);
                }
            }
        }
    }

    /// Notes that `length` bytes were read as a reply.
    fn consumed(&mut self, length: usize) {
        self.read += length;
        if self.read == self.received {
            (self.read, self.received) = (0, 0);
            if self.buffer.len() > BUFFER {
                self.buffer.truncate(BUFFER);
                self.buffer.shrink_to_fit();
            }
        }
    }

    /// Receives more bytes, making room for them first.
    fn receive(&mut self) -> RedisResult<()> {
        if self.received == self.buffer.len() {
            if self.read > 0 {
                self.buffer.copy_within(self.read..self.received, 0);
                (self.read, self.received) = (0, self.received - self.read);
            } else {
                self.buffer.resize(self.buffer.len() * 2, 0);
            }
        }
        match self.stream.read(&mut self.buffer[self.received..]) {
            Ok(0) => Err(self.failed(io::ErrorKind::UnexpectedEof.into())),
            Ok(n) => {
                self.received += n;
                Ok(())
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => Ok(()),
            Err(e) => Err(self.failed(e)),
        }
    }

    /// A failed write or read leaves the stream in an unknown state.
    fn failed(&mut self, err: io::Error) -> RedisError {
        self.open = false;
        RedisError::from(err)
    }

    pub(crate) fn set_read_timeout(&self, timeout: Option<Duration>) -> RedisResult<()> {
        Ok(self.stream.set_read_timeout(timeout)?)
    }

    pub(crate) fn set_write_timeout(&self, timeout: Option<Duration>) -> RedisResult<()> {
        Ok(self.stream.set_write_timeout(timeout)?)
    }

    pub(crate) fn is_open(&self) -> bool {
        self.open
    }

    pub(crate) fn db(&self) -> i64 {
        self.db
    }
}

fn connect_one(address: &SocketAddr, deadline: Instant) -> io::Result<TcpStream> {
    let left = deadline
        .saturating_duration_since(Instant::now())
        .max(Duration::from_millis(1));
    let stream = TcpStream::connect_timeout(address, left)?;
    stream.set_nodelay(true)?;
    Ok(stream)
}

/// A pooled connection's link: a [`Wire`], or redis-rs's connection.
pub(crate) enum Link {
    Wire(Wire),
    Redis(redis::Connection),
}

impl Link {
    pub(crate) fn send(&mut self, bytes: &[u8]) -> RedisResult<()> {
        match self {
            Link::Wire(w) => w.send(bytes),
            Link::Redis(c) => c.send_packed_command(bytes),
        }
    }

    pub(crate) fn recv(&mut self) -> RedisResult<Value> {
        match self {
            Link::Wire(w) => w.recv(),
            Link::Redis(c) => c.recv_response(),
        }
    }

    pub(crate) fn set_read_timeout(&self, timeout: Option<Duration>) -> RedisResult<()> {
        match self {
            Link::Wire(w) => w.set_read_timeout(timeout),
            Link::Redis(c) => c.set_read_timeout(timeout),
        }
    }

    pub(crate) fn set_write_timeout(&self, timeout: Option<Duration>) -> RedisResult<()> {
        match self {
            Link::Wire(w) => w.set_write_timeout(timeout),
            Link::Redis(c) => c.set_write_timeout(timeout),
        }
    }

    pub(crate) fn is_open(&self) -> bool {
        match self {
            Link::Wire(w) => w.is_open(),
            Link::Redis(c) => redis::ConnectionLike::is_open(c),
        }
    }

    pub(crate) fn db(&self) -> i64 {
        match self {
            Link::Wire(w) => w.db(),
            Link::Redis(c) => redis::ConnectionLike::get_db(c),
        }
    }
}
