//! One standalone Redis server: every route is its one shard.

use std::time::Duration;

use crate::connection::{Checkout, Deployment, Pool, PoolSettings};
use crate::error::{Doing, Result, Server};

/// A standalone server: a pool of connections, and the subscriber's RESP3 client.
pub(crate) struct Standalone {
    pool: Pool,
    subscriber: redis::Client,
}

impl Standalone {
    /// `redis` makes the pool's connections and `subscriber` the subscriber's (RESP3); both
    /// name the same server.
    pub(crate) fn new(
        redis: redis::Client,
        subscriber: redis::Client,
        server: Server,
        pool: PoolSettings,
    ) -> Self {
        Standalone {
            pool: Pool::new(redis, server, pool),
            subscriber,
        }
    }
}

impl Deployment for Standalone {
    #[inline]
    fn shard_of(&self, _route: &str) -> usize {
        0
    }

    #[inline]
    fn checkout(&self, _shard: usize, doing: Doing<'_>, by: Option<Duration>) -> Result<Checkout> {
        self.pool.get(doing, by)
    }

    fn subscriber_connection(&self, _shard: usize) -> redis::RedisResult<redis::Connection> {
        let server = self.pool.server();
        let (connect, write) = (server.connect_timeout, server.response_timeout);
        super::subscriber_of(Ok(&self.subscriber), connect, write)
    }

    fn server(&self, _shard: usize) -> Server {
        self.pool.server().clone()
    }

    fn describe(&self) -> String {
        self.pool.server().address.to_string()
    }

    fn settle_unread(&self) {
        self.pool.settle_idle();
    }
}
