//! The crate's one error type, its kinds and the mapping from Redis and pool errors.

use std::error::Error as StdError;
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use crate::human_duration::Human;

/// A `Result` whose error is [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// What a call was doing, for error messages: `acquiring lock "orders:42"`.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Doing<'a> {
    action: &'static str,
    lock: Option<&'a str>,
}

impl<'a> Doing<'a> {
    /// `action` applied to the lock called `name` ("acquiring", "releasing", …).
    pub(crate) fn lock(action: &'static str, name: &'a str) -> Self {
        Doing {
            action,
            lock: Some(name),
        }
    }

    /// Work that concerns no single lock ("renewing leases", …).
    pub(crate) fn work(action: &'static str) -> Doing<'static> {
        Doing { action, lock: None }
    }
}

impl fmt::Display for Doing<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.lock {
            Some(name) => write!(f, "{} lock {name:?}", self.action),
            None => f.write_str(self.action),
        }
    }
}

/// A server as error messages name it: its address (never credentials) and the deadlines a
/// call to it has.
#[derive(Debug, Clone)]
pub(crate) struct Server {
    pub(crate) address: Arc<str>,
    pub(crate) connect_timeout: Duration,
    pub(crate) response_timeout: Duration,
}

/// What went wrong, in broad strokes; see [`Error::kind`].
///
/// New kinds may be added in later versions, so a `match` needs a wildcard arm.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ErrorKind {
    /// No connection to Redis could be made or checked out of the pool within the connect
    /// timeout, or the connection broke during a call.
    Connection,
    /// Redis did not answer within the response timeout. The outcome of the call is unknown to
    /// the server's side; the crate has already cleaned up what it could.
    Timeout,
    /// An argument was rejected before anything was sent: an empty or oversized name, a zero
    /// or oversized lease, …
    InvalidArgument,
    /// A [`Builder`](crate::Builder) setting is out of range.
    Config,
    /// A key of the lock exists but does not hold what a lock holds (a hash, a list, a string
    /// with no expiry, a fencing counter that is not an integer). Nothing was changed.
    WrongType,
    /// The lease of a held lock ran out or the lock was taken away (deleted, overwritten or
    /// force-unlocked) while it was held.
    LockLost,
    /// The client was shut down with [`Client::shutdown`](crate::Client::shutdown): every
    /// new operation of every clone fails with this kind at once (guards still release).
    Shutdown,
    /// Redis refused the credentials or the user lacks permission for a command, key or
    /// channel the lock needs (`WRONGPASS`, `NOAUTH`, `NOPERM`, and an ACL refusal inside one
    /// of the crate's scripts, which Redis reports as `ERR`). Nothing was changed.
    Auth,
    /// Any other error reply from Redis: `OOM` (Redis reached `maxmemory` and refuses writes;
    /// the message says so and nothing was changed), `READONLY`, `BUSY`, a script error, …
    Server,
    /// Fewer replicas than [`Builder::replica_acks`](crate::Builder::replica_acks) asks for
    /// acknowledged an acquire in time; the acquire was rolled back.
    NotReplicated,
    /// A [`Shared`](crate::Shared) value stored in Redis does not decode into the handle's
    /// type, or was written with another [`Codec`](crate::Codec) (or not by this crate). The
    /// lock was released and nothing was written.
    Decode,
    /// A [`Shared`](crate::Shared) handle made with
    /// [`Client::shared_existing`](crate::Client::shared_existing) found no value stored. The
    /// lock was released and nothing was written.
    NoValue,
    /// An optimistic update of a [`Shared`](crate::Shared) value
    /// ([`update_for`](crate::Shared::update_for)) found the value changed or locked by
    /// someone else at every try until its deadline. Nothing was written.
    Conflict,
}

impl ErrorKind {
    fn describe(self) -> &'static str {
        match self {
            ErrorKind::Connection => "connection error",
            ErrorKind::Timeout => "timed out",
            ErrorKind::InvalidArgument => "invalid argument",
            ErrorKind::Config => "invalid configuration",
            ErrorKind::WrongType => "wrong key type",
            ErrorKind::LockLost => "lock lost",
            ErrorKind::Shutdown => "client shut down",
            ErrorKind::Auth => "authentication or permission error",
            ErrorKind::Server => "error reply from redis",
            ErrorKind::NotReplicated => "not acknowledged by enough replicas",
            ErrorKind::Decode => "stored value does not decode",
            ErrorKind::NoValue => "no value stored",
            ErrorKind::Conflict => "changed by someone else at every try",
        }
    }
}

/// The error of every fallible operation in this crate.
///
/// It carries a [`kind`](Error::kind), a human-readable message and, where there is one, the
/// underlying error as [`source`](StdError::source). It is cheap to clone. No message ever
/// contains a password.
///
/// # Examples
///
/// ```no_run
/// # fn main() -> redmutex::Result<()> {
/// let client = redmutex::Client::open("redis://127.0.0.1/")?;
/// match client.mutex("report").try_lock() {
///     Ok(Some(_guard)) => println!("acquired"),
///     Ok(None) => println!("someone else holds it"),
///     Err(e) if e.is_connection() || e.is_timeout() => println!("redis unavailable: {e}"),
///     Err(e) => return Err(e),
/// }
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct Error {
    kind: ErrorKind,
    message: String,
    source: Option<Arc<dyn StdError + Send + Sync>>,
    /// No connection could be had: nothing was sent.
    at_checkout: bool,
}

impl Error {
    pub(crate) fn new(kind: ErrorKind, message: impl Into<String>) -> Self {
        Error {
            kind,
            message: message.into(),
            source: None,
            at_checkout: false,
        }
    }

    pub(crate) fn with_source(mut self, source: impl StdError + Send + Sync + 'static) -> Self {
        self.source = Some(Arc::new(source));
        self
    }

    pub(crate) fn invalid_argument(message: impl Into<String>) -> Self {
        Error::new(ErrorKind::InvalidArgument, message)
    }

    pub(crate) fn config(message: impl Into<String>) -> Self {
        Error::new(ErrorKind::Config, message)
    }

    /// The broad category of the error.
    pub fn kind(&self) -> ErrorKind {
        self.kind
    }

    /// Whether Redis could not be reached or the connection broke.
    pub fn is_connection(&self) -> bool {
        self.kind == ErrorKind::Connection
    }

    /// Whether Redis did not answer within the response timeout.
    pub fn is_timeout(&self) -> bool {
        self.kind == ErrorKind::Timeout
    }

    /// Whether an argument was rejected before anything was sent.
    pub fn is_invalid_argument(&self) -> bool {
        self.kind == ErrorKind::InvalidArgument
    }

    /// Whether a builder setting is out of range.
    pub fn is_config(&self) -> bool {
        self.kind == ErrorKind::Config
    }

    /// Whether a key of the lock holds a value that is not a lock.
    pub fn is_wrong_type(&self) -> bool {
        self.kind == ErrorKind::WrongType
    }

    /// Whether the lease ran out or the lock was taken away while held.
    pub fn is_lock_lost(&self) -> bool {
        self.kind == ErrorKind::LockLost
    }

    /// Whether the client was shut down.
    pub fn is_shutdown(&self) -> bool {
        self.kind == ErrorKind::Shutdown
    }

    /// Whether too few replicas acknowledged an acquire (which was rolled back).
    pub fn is_not_replicated(&self) -> bool {
        self.kind == ErrorKind::NotReplicated
    }

    /// Whether Redis refused the credentials or a permission.
    pub fn is_auth(&self) -> bool {
        self.kind == ErrorKind::Auth
    }

    /// Whether Redis refused the call with another error (`OOM`, `BUSY`, a script error, …):
    /// see [`ErrorKind::Server`].
    pub fn is_server(&self) -> bool {
        self.kind == ErrorKind::Server
    }

    /// Whether a [`Shared`](crate::Shared) value did not decode into the handle's type.
    pub fn is_decode(&self) -> bool {
        self.kind == ErrorKind::Decode
    }

    /// Whether a [`Shared`](crate::Shared) handle that needs a stored value found none.
    pub fn is_no_value(&self) -> bool {
        self.kind == ErrorKind::NoValue
    }

    /// Whether the same call may succeed if tried again a little later: Redis could not be
    /// reached or did not answer in time, said "not now" (`CLUSTERDOWN`, `TRYAGAIN`,
    /// `LOADING`, `MASTERDOWN`, `READONLY`: a restart or failover under way), or too few
    /// replicas acknowledged an acquire (a replica resyncing, a new master whose replicas are
    /// not back yet). Blocking acquires keep trying through these for the
    /// [outage patience](crate::Builder::outage_patience).
    pub fn is_transient(&self) -> bool {
        match self.kind {
            ErrorKind::Connection | ErrorKind::Timeout | ErrorKind::NotReplicated => true,
            ErrorKind::Server => {
                [
                    "CLUSTERDOWN",
                    "TRYAGAIN",
                    "LOADING",
                    "MASTERDOWN",
                    "READONLY",
                ]
                .iter()
                .any(|code| self.is_server_code(code))
                    || self.message.contains("(CLUSTERDOWN)")
            }
            _ => false,
        }
    }

    /// Maps the error of a call to the server at `server`, made while `doing`.
    pub(crate) fn from_call(server: &Server, doing: Doing<'_>, err: redis::RedisError) -> Self {
        let kind = redis_error_kind(&err);
        let at = &server.address;
        let message = match kind {
            ErrorKind::Timeout => format!(
                "redis at {at} did not answer within {} while {doing}",
                Human(server.response_timeout)
            ),
            ErrorKind::Connection if err.is_connection_dropped() => {
                format!("the connection to redis at {at} broke while {doing}")
            }
            ErrorKind::Connection => {
                format!("redis at {at} could not be used while {doing}: {err}")
            }
            _ => match refusal(&err) {
                Some(why) => format!("{doing}: redis at {at} refused: {why}: {err}"),
                None => format!("{doing}: redis at {at} replied: {err}"),
            },
        };
        Error::new(kind, message).with_source(err)
    }

    /// Maps the error of making a connection to `server`, needed while `doing`.
    pub(crate) fn from_connect(server: &Server, doing: Doing<'_>, err: redis::RedisError) -> Self {
        let at = &server.address;
        let (kind, message) = if err.is_timeout() {
            (
                ErrorKind::Connection,
                format!(
                    "redis at {at} did not accept a connection within {} while {doing}",
                    Human(server.connect_timeout)
                ),
            )
        } else if err.is_connection_refusal() {
            (
                ErrorKind::Connection,
                format!("redis at {at} refused the connection while {doing}"),
            )
        } else {
            match redis_error_kind(&err) {
                ErrorKind::Timeout => (
                    ErrorKind::Connection,
                    format!("cannot connect to redis at {at} while {doing}: {err}"),
                ),
                kind => (
                    kind,
                    format!("cannot connect to redis at {at} while {doing}: {err}"),
                ),
            }
        };
        Error::new(kind, message).with_source(err).at_checkout()
    }

    /// An error of the handshake of a connection the server accepted (`AUTH`, `SELECT`), as
    /// the checkout that connected reports it.
    pub(crate) fn from_handshake(
        server: &Server,
        doing: Doing<'_>,
        err: redis::RedisError,
    ) -> Self {
        let at = &server.address;
        if err.is_timeout() {
            let message = format!(
                "redis at {at} accepted a connection but did not answer its handshake within {} \
                 while {doing}",
                Human(server.connect_timeout)
            );
            return Error::new(ErrorKind::Connection, message)
                .with_source(err)
                .at_checkout();
        }
        if err
            .detail()
            .is_some_and(|d| d.contains("DB index is out of range"))
        {
            let message = format!(
                "the database index in the address is out of range for redis at {at} (its \
                 `databases` setting allows fewer) while {doing}"
            );
            return Error::new(ErrorKind::Config, message)
                .with_source(err)
                .at_checkout();
        }
        if err
            .detail()
            .is_some_and(|d| d.contains("called without any password configured"))
        {
            let message = format!(
                "the address gives a password, but redis at {at} has none set (remove it from \
                 the address, or set one on the server) while {doing}"
            );
            return Error::new(ErrorKind::Auth, message)
                .with_source(err)
                .at_checkout();
        }
        if matches!(err.kind(), redis::ErrorKind::Parse) {
            let message = format!(
                "the server at {at} does not speak the Redis protocol (is it the right port?) \
                 while {doing}"
            );
            return Error::new(ErrorKind::Connection, message)
                .with_source(err)
                .at_checkout();
        }
        let kind = match redis_error_kind(&err) {
            ErrorKind::Timeout => ErrorKind::Connection,
            kind => kind,
        };
        let message = format!("cannot connect to redis at {at} while {doing}: {err}");
        Error::new(kind, message).with_source(err).at_checkout()
    }

    /// A TLS address whose server accepted the connection and then did not answer, or not
    /// in TLS: most often a `rediss://` address pointed at a plain port.
    pub(crate) fn from_tls_handshake(
        server: &Server,
        doing: Doing<'_>,
        err: redis::RedisError,
    ) -> Self {
        let at = &server.address;
        let message = format!(
            "redis at {at} accepted a connection but did not complete the TLS handshake \
             within {} while {doing} (is this a TLS port? a rediss:// address needs a server \
             that speaks TLS there): {err}",
            Human(server.connect_timeout)
        );
        Error::new(ErrorKind::Connection, message)
            .with_source(err)
            .at_checkout()
    }

    /// Whether Redis replied with this error code (`READONLY`, `MOVED`, …).
    pub(crate) fn is_server_code(&self, code: &str) -> bool {
        self.source
            .as_deref()
            .and_then(|s| s.downcast_ref::<redis::RedisError>())
            .and_then(redis::RedisError::code)
            .is_some_and(|c| c == code)
    }

    /// The `host:port` a `MOVED` or `ASK` reply names.
    pub(crate) fn redirect_target(&self) -> Option<String> {
        self.source
            .as_deref()
            .and_then(|s| s.downcast_ref::<redis::RedisError>())
            .and_then(redis::RedisError::redirect_node)
            .map(|(addr, _)| addr.to_owned())
    }

    /// Marks an error that happened before anything was sent.
    pub(crate) fn at_checkout(mut self) -> Self {
        self.at_checkout = true;
        self
    }

    pub(crate) fn is_checkout(&self) -> bool {
        self.at_checkout
    }

    /// Whether the call that failed may still have been carried out by Redis.
    pub(crate) fn outcome_unknown(&self) -> bool {
        !self.at_checkout && matches!(self.kind, ErrorKind::Timeout | ErrorKind::Connection)
    }
}

/// Why Redis refused a command, in words, for the refusals whose own text does not say it
/// plainly: redis-rs shows `NOPERM` as `NoPerm`, an ACL refusal inside a script arrives as
/// `ERR`, and `OOM` is terse.
fn refusal(err: &redis::RedisError) -> Option<&'static str> {
    match code_and_detail(err).0 {
        Some("NOPERM") => Some("permission denied by a redis ACL (NOPERM)"),
        Some("ERR") if is_acl_refusal_in_script(err) => {
            Some("permission denied by a redis ACL inside a script (NOPERM)")
        }
        Some("OOM") => Some("redis is out of memory (OOM: maxmemory reached, writes refused)"),
        _ => None,
    }
}

/// Whether an `ERR` reply is Redis refusing, by ACL, a command, key or channel that a script
/// used: Redis 7.0 says "The user executing the script can't …", later versions "ACL failure
/// in script: …".
fn is_acl_refusal_in_script(err: &redis::RedisError) -> bool {
    code_and_detail(err).1.is_some_and(|d| {
        d.starts_with("The user executing the script can't")
            || d.starts_with("ACL failure in script")
    })
}

/// The code and text of an error reply. Redis before 7.0 puts `@user_script: <line>: ` (and
/// a `-`) before the errors it raises inside a script for a command it refused to run (`OOM`,
/// an ACL refusal), and wraps one that ended the script in `ERR Error running script (call to
/// …): @user_script:<line>: `: the code and text are read past that (`ERR` when the text has
/// no code of its own).
fn code_and_detail(err: &redis::RedisError) -> (Option<&str>, Option<&str>) {
    const MARK: &str = "@user_script: ";
    let inner = match (err.code(), err.detail()) {
        (Some(code), Some(detail)) if code.starts_with("@user_script") => detail,
        (Some("ERR"), Some(detail)) if detail.starts_with("Error running script") => {
            match detail.rfind(MARK) {
                Some(at) => &detail[at + MARK.len()..],
                None => return (err.code(), err.detail()),
            }
        }
        other => return other,
    };
    let inner = inner
        .trim_start_matches(|c: char| c.is_ascii_digit())
        .trim_start_matches(':')
        .trim_start()
        .trim_start_matches('-');
    match inner.split_once(' ') {
        Some((code, rest)) if !code.is_empty() && code.bytes().all(|b| b.is_ascii_uppercase()) => {
            (Some(code), Some(rest))
        }
        _ => (Some("ERR"), Some(inner)),
    }
}

fn redis_error_kind(err: &redis::RedisError) -> ErrorKind {
    if err.is_timeout() {
        return ErrorKind::Timeout;
    }
    match code_and_detail(err).0 {
        Some("WRONGTYPE") => return ErrorKind::WrongType,
        // Our scripts' refusal of an argument that only Redis can check.
        Some("INVALIDARG") => return ErrorKind::InvalidArgument,
        Some("WRONGPASS" | "NOAUTH" | "NOPERM") => return ErrorKind::Auth,
        Some("ERR") if is_acl_refusal_in_script(err) => return ErrorKind::Auth,
        _ => {}
    }
    match err.kind() {
        redis::ErrorKind::AuthenticationFailed => ErrorKind::Auth,
        redis::ErrorKind::Io | redis::ErrorKind::Parse | redis::ErrorKind::Client => {
            ErrorKind::Connection
        }
        redis::ErrorKind::InvalidClientConfig => ErrorKind::Config,
        _ if err.is_connection_dropped() || err.is_connection_refusal() => ErrorKind::Connection,
        _ => ErrorKind::Server,
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.kind.describe(), self.message)
    }
}

impl fmt::Debug for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Error")
            .field("kind", &self.kind)
            .field("message", &self.message)
            .finish()
    }
}

impl StdError for Error {
    fn source(&self) -> Option<&(dyn StdError + 'static)> {
        self.source
            .as_deref()
            .map(|s| s as &(dyn StdError + 'static))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn display_names_kind_and_message() {
        let e = Error::invalid_argument("lock name is empty");
        assert_eq!(e.to_string(), "invalid argument: lock name is empty");
        assert!(e.is_invalid_argument());
        assert!(!e.is_timeout());
    }

    #[test]
    fn wrongtype_reply_maps_to_wrong_type() {
        let err = redis::RedisError::from((
            redis::ErrorKind::Server(redis::ServerErrorKind::ResponseError),
            "x",
        ));
        assert_eq!(redis_error_kind(&err), ErrorKind::Server);
        let io = redis::RedisError::from(std::io::Error::new(
            std::io::ErrorKind::TimedOut,
            "timed out",
        ));
        assert_eq!(redis_error_kind(&io), ErrorKind::Timeout);
        let refused = redis::RedisError::from(std::io::Error::new(
            std::io::ErrorKind::ConnectionRefused,
            "refused",
        ));
        assert_eq!(redis_error_kind(&refused), ErrorKind::Connection);
    }

    fn server() -> Server {
        Server {
            address: Arc::from("127.0.0.1:6379"),
            connect_timeout: Duration::from_secs(5),
            response_timeout: Duration::from_secs(1),
        }
    }

    fn acquiring() -> Doing<'static> {
        Doing::lock("acquiring", "orders:42")
    }

    #[test]
    fn a_timeout_says_what_timed_out_where_and_after_how_long() {
        let io = redis::RedisError::from(std::io::Error::new(
            std::io::ErrorKind::WouldBlock,
            "Resource temporarily unavailable",
        ));
        let e = Error::from_call(&server(), acquiring(), io);
        assert!(e.is_timeout(), "{e}");
        assert_eq!(
            e.to_string(),
            "timed out: redis at 127.0.0.1:6379 did not answer within 1 s while acquiring \
             lock \"orders:42\""
        );
        assert!(StdError::source(&e).is_some());
    }

    /// An error reply as redis-rs parses it off the wire.
    fn reply(line: &str) -> redis::RedisError {
        let wire = format!("-{line}\r\n");
        match redis::parse_redis_value(wire.as_bytes()) {
            Ok(redis::Value::ServerError(e)) => e.into(),
            other => panic!("not an error reply: {other:?}"),
        }
    }

    #[test]
    fn acl_refusals_are_auth_errors_that_say_noperm() {
        for line in [
            "NOPERM this user has no permissions to run the 'evalsha' command",
            "ERR The user executing the script can't run this command or subcommand script: 0123, on @user_script:1.",
            "ERR ACL failure in script: User locker has no permissions to run the 'set' command",
        ] {
            let e = Error::from_call(&server(), acquiring(), reply(line));
            assert_eq!(e.kind(), ErrorKind::Auth, "{line}: {e}");
            assert!(e.to_string().contains("NOPERM"), "{e}");
        }
        let other = Error::from_call(&server(), acquiring(), reply("ERR unknown command 'FOO'"));
        assert_eq!(other.kind(), ErrorKind::Server, "{other}");
    }

    #[test]
    fn oom_is_a_server_error_that_says_out_of_memory() {
        let e = Error::from_call(
            &server(),
            acquiring(),
            reply("OOM command not allowed when used memory > 'maxmemory'."),
        );
        assert_eq!(e.kind(), ErrorKind::Server, "{e}");
        assert!(e.to_string().contains("out of memory"), "{e}");
    }

    #[test]
    fn refusals_raised_inside_a_script_by_redis_6_read_as_on_redis_7() {
        let oom = "@user_script: 118: -OOM command not allowed when used memory > 'maxmemory'.";
        let e = Error::from_call(&server(), acquiring(), reply(oom));
        assert_eq!(e.kind(), ErrorKind::Server, "{e}");
        assert!(e.to_string().contains("out of memory"), "{e}");
        let acl = "@user_script: 1: The user executing the script can't run this command or \
                   subcommand";
        let e = Error::from_call(&server(), acquiring(), reply(acl));
        assert_eq!(e.kind(), ErrorKind::Auth, "{e}");
        assert!(e.to_string().contains("NOPERM"), "{e}");
        // Raised by `redis.call`, which ends the script.
        let ended = "ERR Error running script (call to f_27873f1f): @user_script:171: \
                     @user_script: 171: The user executing the script can't run this command \
                     or subcommand";
        let e = Error::from_call(&server(), acquiring(), reply(ended));
        assert_eq!(e.kind(), ErrorKind::Auth, "{e}");
        let ended = "ERR Error running script (call to f_27873f1f): @user_script:118: \
                     @user_script: 118: -OOM command not allowed when used memory > 'maxmemory'.";
        let e = Error::from_call(&server(), acquiring(), reply(ended));
        assert!(e.to_string().contains("out of memory"), "{e}");
        let other = Error::from_call(&server(), acquiring(), reply("ERR Error running script"));
        assert_eq!(other.kind(), ErrorKind::Server, "{other}");
    }
}
