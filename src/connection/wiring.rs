//! How a client reaches its deployment: redis-rs clients for its servers (over TLS when the
//! address says `rediss://`), and the deployment's [`Connections`] made from an address.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

#[cfg(feature = "tls")]
use super::TlsSettings;
use super::{
    AddressKind, Cluster, ClusterAddress, ClusterSettings, Connections, NodeClients, PoolSettings,
    Sentinel, SentinelAddress, SentinelSettings, Standalone,
};
use crate::error::{Error, Result, Server};

/// What a deployment's connections are made with besides its address: the TLS settings and
/// the sentinels' own credentials.
#[derive(Clone, Default)]
pub(crate) struct Wiring {
    #[cfg(feature = "tls")]
    pub(crate) tls: TlsSettings,
    /// Credentials for the sentinels, when not those of the data nodes.
    pub(crate) sentinel_auth: Option<(Option<String>, Option<String>)>,
}

/// How every server's connections are made and kept: the timeouts and the pool.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Reach {
    pub(crate) connect_timeout: Duration,
    pub(crate) response_timeout: Duration,
    pub(crate) pool: PoolSettings,
}

impl Wiring {
    /// The connections of the deployment at `address`. Connects to nothing.
    pub(crate) fn connections(&self, reach: Reach, address: AddressKind) -> Result<Connections> {
        match address {
            AddressKind::Server(info) => self.standalone(reach, info),
            AddressKind::Sentinel(address) => self.sentinel(reach, address),
            AddressKind::Cluster(address) => self.cluster(reach, address),
        }
    }

    /// Checks the TLS settings (certificates that parse, a key that fits).
    pub(crate) fn validate(&self) -> Result<()> {
        #[cfg(feature = "tls")]
        self.tls.validate()?;
        Ok(())
    }

    fn redis_client(&self, info: redis::ConnectionInfo) -> Result<redis::Client> {
        #[cfg(feature = "tls")]
        return self.tls.redis_client(info);
        #[cfg(not(feature = "tls"))]
        redis::Client::open(info).map_err(|e| Error::config(format!("invalid redis address: {e}")))
    }

    /// One server: a pool, and the subscriber's RESP3 client.
    fn standalone(&self, reach: Reach, info: redis::ConnectionInfo) -> Result<Connections> {
        let address: Arc<str> = Arc::from(info.addr().to_string());
        let info = with_nodelay(info);
        // The subscriber speaks RESP3, so that confirmations and messages come as push frames.
        let subscriber =
            self.redis_client(with_protocol(info.clone(), redis::ProtocolVersion::RESP3))?;
        let redis_client = self.redis_client(info)?;
        let server = Server {
            address,
            connect_timeout: reach.connect_timeout,
            response_timeout: reach.response_timeout,
        };
        Ok(Connections::new(Standalone::new(
            redis_client,
            subscriber,
            server,
            reach.pool,
        )))
    }

    /// A Cluster: seeds to read the slot map from, and a way to make clients for its nodes.
    fn cluster(&self, reach: Reach, address: ClusterAddress) -> Result<Connections> {
        let wiring = self.clone();
        let (tls, data) = (address.tls, address.redis.clone());
        let nodes: NodeClients = Box::new(move |host, port, protocol| {
            let info = node_info(host, port, tls, data.clone().set_protocol(protocol))
                .map_err(|e| Error::config(format!("invalid redis address: {e}")))?;
            wiring.redis_client(info)
        });
        Ok(Connections::new(Cluster::new(ClusterSettings {
            seeds: address.seeds,
            nodes,
            connect_timeout: reach.connect_timeout,
            response_timeout: reach.response_timeout,
            pool: reach.pool,
        })))
    }

    /// A Sentinel deployment: a client per sentinel, and a way to make clients for the data
    /// nodes the sentinels name.
    fn sentinel(&self, reach: Reach, address: SentinelAddress) -> Result<Connections> {
        let invalid = |e: redis::RedisError| Error::config(format!("invalid redis address: {e}"));
        let sentinel_redis = match &self.sentinel_auth {
            Some((user, password)) => {
                let mut r = redis::RedisConnectionInfo::default();
                if let Some(user) = user {
                    r = r.set_username(user);
                }
                if let Some(password) = password {
                    r = r.set_password(password);
                }
                r
            }
            None => address.redis.clone().set_db(0),
        };
        // RESP3: the switch events come as push frames (see `connection::sentinel`).
        let sentinel_redis = sentinel_redis.set_protocol(redis::ProtocolVersion::RESP3);
        let sentinels = address
            .sentinels
            .iter()
            .map(|(host, port)| {
                let info =
                    node_info(host, *port, address.tls, sentinel_redis.clone()).map_err(invalid)?;
                self.redis_client(info)
            })
            .collect::<Result<Vec<_>>>()?;
        let wiring = self.clone();
        let (tls, data) = (address.tls, address.redis.clone());
        let nodes: NodeClients = Box::new(move |host, port, protocol| {
            let info = node_info(
                host,
                port,
                tls,
                with_protocol_settings(data.clone(), protocol),
            )
            .map_err(invalid)?;
            wiring.redis_client(info)
        });
        Ok(Connections::new(Sentinel::new(SentinelSettings {
            master_name: address.master_name,
            sentinels,
            nodes,
            connect_timeout: reach.connect_timeout,
            response_timeout: reach.response_timeout,
            pool: reach.pool,
        })))
    }
}

impl fmt::Debug for Wiring {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut d = f.debug_struct("Wiring");
        #[cfg(feature = "tls")]
        d.field("tls", &self.tls);
        // The sentinels' user, never their password.
        let user = self.sentinel_auth.as_ref().map(|(user, _)| user);
        d.field("sentinel_user", &user).finish()
    }
}

/// The nodes of a deployment: their addresses, whether any wants TLS, and the credentials of
/// the first.
pub(crate) type Nodes = (Vec<(String, u16)>, bool, redis::RedisConnectionInfo);

/// Nodes given as `host:port` or `redis://` / `rediss://` URLs.
pub(crate) fn tcp_nodes<I>(nodes: I, what: &str) -> Result<Nodes>
where
    I: IntoIterator,
    I::Item: AsRef<str>,
{
    let mut hosts = Vec::new();
    let (mut tls, mut redis) = (false, None);
    for node in nodes {
        let node = node.as_ref();
        let url = match node.contains("://") {
            true => node.to_owned(),
            false => format!("redis://{node}"),
        };
        let info = redis::IntoConnectionInfo::into_connection_info(url.as_str())
            .map_err(|e| Error::config(format!("invalid {what} address {node:?}: {e}")))?;
        let (host, port, is_tls) = match info.addr() {
            redis::ConnectionAddr::Tcp(host, port) => (host.clone(), *port, false),
            redis::ConnectionAddr::TcpTls { host, port, .. } => (host.clone(), *port, true),
            _ => {
                return Err(Error::config(format!(
                    "invalid {what} address {node:?}: it must be reached over TCP"
                )))
            }
        };
        tls |= is_tls;
        redis.get_or_insert_with(|| info.redis_settings().clone());
        hosts.push((host, port));
    }
    if hosts.is_empty() {
        return Err(Error::config(format!("no {what} address given")));
    }
    Ok((hosts, tls, redis.unwrap_or_default()))
}

/// The connection settings of a data node or a sentinel at (host, port).
fn node_info(
    host: &str,
    port: u16,
    tls: bool,
    redis: redis::RedisConnectionInfo,
) -> redis::RedisResult<redis::ConnectionInfo> {
    let addr = if tls {
        redis::ConnectionAddr::TcpTls {
            host: host.to_owned(),
            port,
            insecure: false,
            tls_params: None,
        }
    } else {
        redis::ConnectionAddr::Tcp(host.to_owned(), port)
    };
    redis::IntoConnectionInfo::into_connection_info((host.to_owned(), port))
        .map(|info| with_nodelay(info.set_addr(addr).set_redis_settings(redis)))
}

/// A lock's round trips are small request/reply pairs: never let Nagle hold one back.
fn with_nodelay(info: redis::ConnectionInfo) -> redis::ConnectionInfo {
    let tcp = info.tcp_settings().clone().set_nodelay(true);
    info.set_tcp_settings(tcp)
}

fn with_protocol(
    info: redis::ConnectionInfo,
    protocol: redis::ProtocolVersion,
) -> redis::ConnectionInfo {
    let redis = with_protocol_settings(info.redis_settings().clone(), protocol);
    info.set_redis_settings(redis)
}

fn with_protocol_settings(
    redis: redis::RedisConnectionInfo,
    protocol: redis::ProtocolVersion,
) -> redis::RedisConnectionInfo {
    redis.set_protocol(protocol)
}
