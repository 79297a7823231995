//! Making a pooled connection within one deadline: the TCP (and TLS) connect, then the
//! handshake (`AUTH`, `SELECT`), all bounded by the same connect timeout.
//!
//! redis-rs applies its connect timeout to each read of its handshake on its own, and sends
//! `CLIENT SETINFO` twice, whose replies it reads one by one: a server that accepts the TCP
//! connection and never answers (a hung host, a paused process, a half-open load balancer)
//! then costs the caller twice the connect timeout, or more. So the pool has redis-rs only
//! connect (no credentials, no database, no `CLIENT SETINFO`), and sends the handshake itself
//! in one write, reading each reply with what is left of the deadline: `AUTH` and `SELECT`
//! when the address has them, else a `PING`, so that a server that does not answer (or a TLS
//! port that never completes its handshake, or a port that does not speak Redis) fails the
//! connect, within the connect timeout, as a connection error. Pooled connections speak
//! RESP2; a client with RESP3 connections keeps redis-rs's own handshake.
//!
//! Over plain TCP (`redis://`) with RESP2 the connection is a [`Wire`], written and read by
//! this crate; over TLS or a Unix socket it is redis-rs's.

use std::time::{Duration, Instant};

use super::wire::{Link, Wire};

/// How the pool makes a connection to one server.
pub(crate) struct Handshake {
    /// Connects without any handshake of redis-rs's (or with it, for RESP3).
    client: redis::Client,
    /// The handshake commands, packed in one write, and how many replies they get.
    commands: Option<(Vec<u8>, usize)>,
    /// Whether the address asks for TLS (`rediss://`).
    tls: bool,
    /// The host, port and database of a plain TCP address, connected by a [`Wire`].
    plain: Option<(String, u16, i64)>,
}

/// Why a connection could not be made.
pub(crate) enum ConnectFailure {
    /// The connect itself: refused, not accepted in time, a TLS failure.
    Connect(redis::RedisError),
    /// The handshake: a refusal (a wrong password, a database out of range), or no answer
    /// within the deadline after the server accepted the connection.
    Handshake(redis::RedisError),
    /// No answer, or no sense, from a server that a TLS address (`rediss://`) reached: most
    /// likely a plain port, which waits for a command that never comes.
    Tls(redis::RedisError),
}

impl Handshake {
    /// The handshake of the connections `client` makes.
    pub(crate) fn of(client: &redis::Client) -> Self {
        let info = client.get_connection_info();
        let settings = info.redis_settings();
        let tls = matches!(info.addr(), redis::ConnectionAddr::TcpTls { .. });
        if settings.protocol().supports_resp3() {
            return Handshake {
                client: client.clone(),
                commands: None,
                tls,
                plain: None,
            };
        }
        let plain = match info.addr() {
            redis::ConnectionAddr::Tcp(host, port) => Some((host.clone(), *port, settings.db())),
            _ => None,
        };
        let mut pipe = redis::pipe();
        if let Some(password) = settings.password() {
            let auth = pipe.cmd("AUTH");
            if let Some(user) = settings.username() {
                auth.arg(user);
            }
            auth.arg(password);
        }
        if settings.db() != 0 {
            pipe.cmd("SELECT").arg(settings.db());
        }
        if pipe.is_empty() {
            pipe.cmd("PING");
        }
        let bare = info.clone().set_redis_settings(
            redis::RedisConnectionInfo::default()
                .set_protocol(settings.protocol())
                .set_skip_set_lib_name(),
        );
        match redis::Client::open(bare) {
            Ok(bare) => Handshake {
                client: bare,
                commands: Some((pipe.get_packed_pipeline(), pipe.len())),
                tls,
                plain,
            },
            // Cannot happen for an address that made a client; keep redis-rs's handshake.
            Err(_) => Handshake {
                client: client.clone(),
                commands: None,
                tls,
                plain: None,
            },
        }
    }

    /// Connects and shakes hands by `deadline`.
    pub(crate) fn connect(&self, deadline: Instant) -> Result<Link, ConnectFailure> {
        let left = || {
            deadline
                .saturating_duration_since(Instant::now())
                .max(Duration::from_millis(1))
        };
        let made = match (&self.plain, &self.commands) {
            (Some((host, port, db)), Some(_)) => {
                Wire::connect(host, *port, deadline, *db).map(Link::Wire)
            }
            _ => self
                .client
                .get_connection_with_timeout(left())
                .map(Link::Redis),
        };
        let mut conn = made.map_err(|e| self.failed(e, ConnectFailure::Connect))?;
        let Some((packed, count)) = &self.commands else {
            return Ok(conn);
        };
        let shake = |conn: &mut Link| -> redis::RedisResult<()> {
            // Both timeouts before the write: over TLS the write runs the TLS handshake,
            // which reads the server's part of it.
            conn.set_write_timeout(Some(left()))?;
            conn.set_read_timeout(Some(left()))?;
            conn.send(packed)?;
            let mut refused = None;
            for _ in 0..*count {
                conn.set_read_timeout(Some(left()))?;
                if let redis::Value::ServerError(e) = conn.recv()? {
                    refused.get_or_insert(redis::RedisError::from(e));
                }
            }
            refused.map_or(Ok(()), Err)
        };
        shake(&mut conn).map_err(|e| self.failed(e, ConnectFailure::Handshake))?;
        Ok(conn)
    }

    /// How a connect or handshake failed: over TLS, a time-out or a broken exchange with a
    /// server that did not refuse the connection says more as [`ConnectFailure::Tls`].
    fn failed(
        &self,
        err: redis::RedisError,
        or: fn(redis::RedisError) -> ConnectFailure,
    ) -> ConnectFailure {
        let unanswered = err.is_timeout()
            || matches!(err.kind(), redis::ErrorKind::Io | redis::ErrorKind::Parse);
        match self.tls && unanswered && !err.is_connection_refusal() {
            true => ConnectFailure::Tls(err),
            false => or(err),
        }
    }
}
