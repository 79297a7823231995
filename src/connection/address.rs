//! Where a client connects: one server, or a Sentinel deployment, named by a URL.
//!
//! - `redis://[user:password@]host[:port][/db]`, `rediss://…` (TLS): one server.
//! - `redis+sentinel://[user:password@]host1[:port1][,host2[:port2]…]/master-name[/db]`, and
//!   `rediss+sentinel://…` (TLS to the sentinels and the data nodes): the sentinels, the
//!   master's name, and the credentials and database of the data nodes (which the sentinels
//!   are also asked with, unless `Builder::sentinel_credentials` gives theirs). Sentinel ports
//!   default to 26379. This is the form of the `redis+sentinel` scheme that Celery, Kombu and
//!   other clients read.
//! - `redis+cluster://[user:password@]host1[:port1][,host2[:port2]…]`, and
//!   `rediss+cluster://…` (TLS): seed nodes of a Redis Cluster (ports default to 6379).

use std::fmt;

use crate::error::{Error, Result};

/// Where a [`Client`](crate::Client) connects: what [`Client::open`](crate::Client::open) and
/// [`Builder::open`](crate::Builder::open) accept.
///
/// Implemented for URL strings (see [`Address::parse`]) and for a redis-rs
/// [`ConnectionInfo`](redis::ConnectionInfo) naming one server.
pub trait IntoAddress {
    /// The address, or a [`Config`](crate::ErrorKind::Config) error when it cannot be parsed.
    fn into_address(self) -> Result<Address>;
}

/// A parsed address: one server, or a Sentinel deployment. Its `Debug` output never shows a
/// password.
#[derive(Clone)]
pub struct Address {
    pub(crate) kind: AddressKind,
}

#[derive(Clone)]
pub(crate) enum AddressKind {
    Server(redis::ConnectionInfo),
    Sentinel(SentinelAddress),
    Cluster(ClusterAddress),
}

/// The parts of a `redis+cluster://` URL.
#[derive(Clone)]
pub(crate) struct ClusterAddress {
    /// Nodes to read the slot map from first.
    pub(crate) seeds: Vec<(String, u16)>,
    pub(crate) tls: bool,
    /// Credentials of the nodes.
    pub(crate) redis: redis::RedisConnectionInfo,
}

/// The parts of a `redis+sentinel://` URL.
#[derive(Clone)]
pub(crate) struct SentinelAddress {
    pub(crate) master_name: String,
    pub(crate) sentinels: Vec<(String, u16)>,
    pub(crate) tls: bool,
    /// Credentials and database of the data nodes.
    pub(crate) redis: redis::RedisConnectionInfo,
}

/// The port sentinels listen on unless told otherwise.
const SENTINEL_PORT: u16 = 26379;

impl Address {
    /// Parses a URL: `redis://`, `rediss://`, `redis+sentinel://` or `rediss+sentinel://`.
    ///
    /// # Errors
    ///
    /// [`ErrorKind::Config`](crate::ErrorKind::Config) for a URL that does not parse, a
    /// sentinel URL without hosts or without a master name.
    ///
    /// # Examples
    ///
    /// ```
    /// let a = redmutex::Address::parse("redis+sentinel://10.0.0.1:26379,10.0.0.2/mymaster")?;
    /// let b = redmutex::Address::parse("redis://127.0.0.1:6379/0")?;
    /// assert!(redmutex::Address::parse("redis+sentinel://10.0.0.1:26379/").is_err());
    /// # Ok::<(), redmutex::Error>(())
    /// ```
    pub fn parse(url: &str) -> Result<Address> {
        let cluster = url
            .strip_prefix("redis+cluster://")
            .map(|rest| (false, rest))
            .or_else(|| {
                url.strip_prefix("rediss+cluster://")
                    .map(|rest| (true, rest))
            });
        if let Some((tls, rest)) = cluster {
            return parse_cluster(tls, rest).map(|c| Address {
                kind: AddressKind::Cluster(c),
            });
        }
        let (tls, rest) = if let Some(rest) = url.strip_prefix("redis+sentinel://") {
            (false, rest)
        } else if let Some(rest) = url.strip_prefix("rediss+sentinel://") {
            (true, rest)
        } else {
            if !url.contains("://") {
                return Err(Error::config(format!(
                    "invalid redis address {:?}: it has no scheme; write it as \
                     redis://host:port/ (rediss:// for TLS, redis+sentinel:// or \
                     redis+cluster:// for a deployment)",
                    redact(url)
                )));
            }
            let info = redis::IntoConnectionInfo::into_connection_info(url).map_err(|e| {
                Error::config(format!(
                    "invalid redis address {:?}: {}",
                    redact(url),
                    e.detail()
                        .unwrap_or("it does not parse as redis://[user:password@]host[:port][/db]")
                ))
            })?;
            return Ok(Address {
                kind: AddressKind::Server(info),
            });
        };
        parse_sentinel(tls, rest).map(|s| Address {
            kind: AddressKind::Sentinel(s),
        })
    }
}

/// Hosts, credentials, and the path that follows them in a URL.
type Hosts<'a> = (Vec<(String, u16)>, redis::RedisConnectionInfo, &'a str);

/// `[user:password@]host[:port],host[:port]…` and what follows the first `/`.
fn parse_hosts<'a>(
    rest: &'a str,
    default_port: u16,
    bad: &dyn Fn(&str) -> Error,
) -> Result<Hosts<'a>> {
    let (authority, path) = rest.split_once('/').unwrap_or((rest, ""));
    let (userinfo, hosts) = match authority.rsplit_once('@') {
        Some((userinfo, hosts)) => (Some(userinfo), hosts),
        None => (None, authority),
    };
    let mut nodes = Vec::new();
    for host in hosts.split(',').filter(|h| !h.is_empty()) {
        let (name, port) = match host.rsplit_once(':') {
            Some((name, port)) => (
                name,
                port.parse::<u16>()
                    .map_err(|_| bad(&format!("{port:?} is not a port")))?,
            ),
            None => (host, default_port),
        };
        if name.is_empty() {
            return Err(bad("a node without a host"));
        }
        nodes.push((name.to_owned(), port));
    }
    if nodes.is_empty() {
        return Err(bad("no host"));
    }
    let mut redis = redis::RedisConnectionInfo::default();
    if let Some(userinfo) = userinfo {
        let (user, password) = userinfo.split_once(':').unwrap_or((userinfo, ""));
        if !user.is_empty() {
            redis = redis.set_username(percent_decode(user).map_err(|e| bad(&e))?);
        }
        if !password.is_empty() {
            redis = redis.set_password(percent_decode(password).map_err(|e| bad(&e))?);
        }
    }
    Ok((nodes, redis, path))
}

fn parse_sentinel(tls: bool, rest: &str) -> Result<SentinelAddress> {
    let bad = |why: &str| Error::config(format!("invalid sentinel address: {why}"));
    let (sentinels, mut redis, path) = parse_hosts(rest, SENTINEL_PORT, &bad)?;
    let mut parts = path.split('/');
    let master_name = parts.next().unwrap_or("");
    if master_name.is_empty() {
        return Err(bad(
            "no master name (redis+sentinel://host:port,host:port/master-name)",
        ));
    }
    let master_name = percent_decode(master_name).map_err(|e| bad(&e))?;
    if let Some(db) = parts.next().filter(|d| !d.is_empty()) {
        let db: i64 = db
            .parse()
            .map_err(|_| bad(&format!("{db:?} is not a database number")))?;
        redis = redis.set_db(db);
    }
    Ok(SentinelAddress {
        master_name,
        sentinels,
        tls,
        redis,
    })
}

fn parse_cluster(tls: bool, rest: &str) -> Result<ClusterAddress> {
    let bad = |why: &str| Error::config(format!("invalid cluster address: {why}"));
    let (seeds, redis, path) = parse_hosts(rest, 6379, &bad)?;
    if !path.is_empty() {
        return Err(bad(
            "a cluster has only database 0: no path after the hosts",
        ));
    }
    Ok(ClusterAddress { seeds, tls, redis })
}

/// Decodes `%XX` escapes (user names, passwords and names may hold any byte).
fn percent_decode(s: &str) -> std::result::Result<String, String> {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = s
                .get(i + 1..i + 3)
                .and_then(|h| u8::from_str_radix(h, 16).ok())
                .ok_or_else(|| "a bad %-escape".to_owned())?;
            out.push(hex);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out).map_err(|_| "an escape that is not UTF-8".to_owned())
}

impl fmt::Debug for Address {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.kind {
            AddressKind::Server(info) => f
                .debug_struct("Address")
                .field("server", &info.addr().to_string())
                .finish_non_exhaustive(),
            AddressKind::Sentinel(s) => f
                .debug_struct("Address")
                .field("sentinels", &s.sentinels)
                .field("master_name", &s.master_name)
                .field("tls", &s.tls)
                .finish_non_exhaustive(),
            AddressKind::Cluster(c) => f
                .debug_struct("Address")
                .field("cluster_seeds", &c.seeds)
                .field("tls", &c.tls)
                .finish_non_exhaustive(),
        }
    }
}

impl IntoAddress for Address {
    fn into_address(self) -> Result<Address> {
        Ok(self)
    }
}

impl IntoAddress for &str {
    fn into_address(self) -> Result<Address> {
        Address::parse(self)
    }
}

impl IntoAddress for String {
    fn into_address(self) -> Result<Address> {
        Address::parse(&self)
    }
}

impl IntoAddress for &String {
    fn into_address(self) -> Result<Address> {
        Address::parse(self)
    }
}

impl IntoAddress for redis::ConnectionInfo {
    fn into_address(self) -> Result<Address> {
        Ok(Address {
            kind: AddressKind::Server(self),
        })
    }
}

/// `url` with any password replaced by `***`, for messages.
fn redact(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return match url.split_once('@') {
            Some((_, host)) => format!("***@{host}"),
            None => url.to_owned(),
        };
    };
    match rest.split_once('@') {
        Some((credentials, host)) => {
            let user = credentials.split_once(':').map_or(credentials, |(u, _)| u);
            format!("{scheme}://{user}:***@{host}")
        }
        None => url.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sentinel(url: &str) -> SentinelAddress {
        match Address::parse(url).unwrap().kind {
            AddressKind::Sentinel(s) => s,
            _ => panic!("{url} did not parse as a sentinel address"),
        }
    }

    #[test]
    fn sentinel_urls_name_hosts_master_credentials_and_db() {
        let s = sentinel("redis+sentinel://u:p%40ss@10.0.0.1:26380,10.0.0.2/my%20master/3");
        assert_eq!(
            s.sentinels,
            [
                ("10.0.0.1".to_owned(), 26380),
                ("10.0.0.2".to_owned(), 26379)
            ]
        );
        assert_eq!(s.master_name, "my master");
        assert_eq!(s.redis.password(), Some("p@ss"));
        assert_eq!(s.redis.username(), Some("u"));
        assert_eq!(s.redis.db(), 3);
        assert!(!s.tls);
        assert!(sentinel("rediss+sentinel://h/m").tls);
        let dbg = format!(
            "{:?}",
            Address::parse("redis+sentinel://u:secret@h/m").unwrap()
        );
        assert!(!dbg.contains("secret"), "{dbg}");
    }

    #[test]
    fn cluster_urls_name_seeds_and_credentials() {
        let AddressKind::Cluster(c) = Address::parse("redis+cluster://:pw@n1:7000,n2")
            .unwrap()
            .kind
        else {
            panic!("not a cluster address");
        };
        assert_eq!(c.seeds, [("n1".to_owned(), 7000), ("n2".to_owned(), 6379)]);
        assert_eq!(c.redis.password(), Some("pw"));
        assert!(Address::parse("redis+cluster://").unwrap_err().is_config());
        assert!(Address::parse("redis+cluster://n1/3")
            .unwrap_err()
            .is_config());
    }

    #[test]
    fn bad_sentinel_urls_are_config_errors() {
        for url in [
            "redis+sentinel://10.0.0.1:26379",
            "redis+sentinel://10.0.0.1:26379/",
            "redis+sentinel:///mymaster",
            "redis+sentinel://h:notaport/m",
            "redis+sentinel://h/m/notadb",
        ] {
            let err = Address::parse(url).unwrap_err();
            assert!(err.is_config(), "{url}: {err}");
        }
    }

    #[test]
    fn an_address_without_a_scheme_says_so_and_shows_one_without_the_password() {
        for url in ["127.0.0.1:16500", "locker:s3cret@10.0.0.1:6379"] {
            let err = Address::parse(url).unwrap_err();
            let text = err.to_string();
            assert!(err.is_config(), "{text}");
            assert!(
                text.contains("no scheme") && text.contains("redis://"),
                "{text}"
            );
            assert!(
                !text.contains("s3cret") && !text.contains("InvalidClientConfig"),
                "{text}"
            );
        }
        let err = Address::parse("redis://:s3cret@host:notaport/").unwrap_err();
        assert!(!err.to_string().contains("s3cret"), "{err}");
    }
}
