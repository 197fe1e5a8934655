//! Sync redis connections for `fibra::sync::Pool`, as r2d2-redis makes them: shared by the
//! redis tests and the shortener example (`#[path]`), which both need the `redis` crate.

use redis::ConnectionLike;

/// Opens connections from the client, checks them with `PING`, and finds a closed one broken.
pub struct RedisManager(pub redis::Client);

impl fibra::sync::ManageConnection for RedisManager {
    type Connection = redis::Connection;
    type Error = redis::RedisError;
    fn connect(&self) -> Result<redis::Connection, redis::RedisError> {
        self.0.get_connection()
    }
    fn is_valid(&self, conn: &mut redis::Connection) -> Result<(), redis::RedisError> {
        redis::cmd("PING").query::<String>(conn).map(drop)
    }
    fn has_broken(&self, conn: &mut redis::Connection) -> bool {
        !conn.is_open()
    }
}
