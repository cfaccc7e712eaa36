//! A pooled PostgreSQL connection for work its caller may cut off: the
//! audit writer drops an insert at `audit.write_timeout`.
//!
//! sqlx 0.8.6 raises a transaction's depth only once `BEGIN` has answered,
//! so a future dropped while it waits queues no `ROLLBACK`, and the pool
//! takes the connection back with the transaction open (launchbadge/sqlx
//! #4385): the next batch, or an admin's session write, would run inside
//! it and never commit. A connection cut off mid-work is closed instead;
//! one whose work ended, well or not, goes back to the pool.

use std::ops::{Deref, DerefMut};

use sqlx::pool::PoolConnection;
use sqlx::{PgConnection, PgPool, Postgres};

pub(super) struct ClosedUnlessDone(Option<PoolConnection<Postgres>>);

impl ClosedUnlessDone {
    pub(super) async fn acquire(pool: &PgPool) -> Result<Self, sqlx::Error> {
        Ok(Self(Some(pool.acquire().await?)))
    }

    /// The work ended and its transaction, if any, committed or had its
    /// rollback queued: the connection may serve again.
    pub(super) fn done(mut self) {
        drop(self.0.take());
    }
}

impl Deref for ClosedUnlessDone {
    type Target = PgConnection;

    fn deref(&self) -> &PgConnection {
        self.0.as_deref().expect("held until done")
    }
}

impl DerefMut for ClosedUnlessDone {
    fn deref_mut(&mut self) -> &mut PgConnection {
        self.0.as_deref_mut().expect("held until done")
    }
}

impl Drop for ClosedUnlessDone {
    fn drop(&mut self) {
        if let Some(conn) = self.0.as_mut() {
            conn.close_on_drop();
        }
    }
}
