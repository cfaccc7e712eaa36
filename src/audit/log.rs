//! How the admin API and the console read the trail: one page at a time,
//! newest first, with the cursor of the next page; or every matching row, as
//! a stream of pages (the CSV export). The cursors are made and followed
//! here, so no caller handles a row's position itself.
//!
//! Admins' reads share the audit database's pool with the writer and the
//! single-sign-on sessions: a filter no index serves reads every
//! partition, so at most [`READS_AT_ONCE`] of them run at a time, and on
//! PostgreSQL each ends at `audit.read_timeout`.

use std::sync::Arc;
use std::time::Duration;

use futures::Stream;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use super::query::{Cursor, EventFilter};
use super::{AuditDb, AuditError, AuditEvent};

/// Rows per database round trip while streaming.
const STREAM_PAGE: usize = 500;
/// Admin reads running at once, of the pool's 5 connections (4 on SQLite):
/// the writer and the sessions keep the rest.
pub const READS_AT_ONCE: usize = 2;
/// How long a page waits for its turn, as long as for a pooled connection
/// (then 503). A streamed export's pages wait a read's bound more: its
/// status has gone out, and a refusal would cut the file short.
const TURN_WAIT: Duration = Duration::from_secs(3);

/// One page of events and, when more match, the cursor of the next.
pub struct Page {
    /// The page's events, newest first.
    pub events: Vec<AuditEvent>,
    /// Where the next page starts; `None` on the last page.
    pub next: Option<Cursor>,
}

/// The trail, for reading.
#[derive(Clone)]
pub struct AuditLog {
    db: AuditDb,
    turns: Arc<Semaphore>,
    /// `audit.read_timeout`.
    bound: Duration,
}

fn position(event: &AuditEvent) -> Cursor {
    Cursor {
        occurred_at: event.occurred_at,
        id: event.id,
    }
}

impl AuditLog {
    /// Read the trail kept in `db`, each read within `bound`.
    pub fn new(db: AuditDb, bound: Duration) -> Self {
        Self {
            db,
            turns: Arc::new(Semaphore::new(READS_AT_ONCE)),
            bound,
        }
    }

    /// This read's turn; refused when the reads before it hold every turn
    /// past `wait`.
    async fn turn(&self, wait: Duration) -> Result<OwnedSemaphorePermit, AuditError> {
        match tokio::time::timeout(wait, self.turns.clone().acquire_owned()).await {
            Ok(Ok(turn)) => Ok(turn),
            _ => Err(AuditError::ReadsBusy),
        }
    }

    /// One page of rows, in its turn (waited for at most `wait`) and within
    /// the bound.
    async fn read(
        &self,
        filter: &EventFilter,
        cursor: Option<&Cursor>,
        limit: usize,
        wait: Duration,
    ) -> Result<Vec<AuditEvent>, AuditError> {
        let _turn = self.turn(wait).await?;
        self.db.page_within(filter, cursor, limit, self.bound).await
    }

    /// Up to `limit` events after `cursor` (from the newest without one).
    pub async fn page(
        &self,
        filter: &EventFilter,
        cursor: Option<&Cursor>,
        limit: usize,
    ) -> Result<Page, AuditError> {
        // One row more than asked tells whether another page exists.
        let mut events = self.read(filter, cursor, limit + 1, TURN_WAIT).await?;
        let next = if events.len() > limit {
            events.truncate(limit);
            events.last().map(position)
        } else {
            None
        };
        Ok(Page { events, next })
    }

    /// Every event after `cursor` that matches, at most `cap`, in pages. A
    /// database error ends the stream after yielding it.
    pub fn stream(
        &self,
        filter: EventFilter,
        cursor: Option<Cursor>,
        cap: usize,
    ) -> impl Stream<Item = Result<Vec<AuditEvent>, AuditError>> + use<> {
        struct Walk {
            log: AuditLog,
            filter: EventFilter,
            cursor: Option<Cursor>,
            left: usize,
            done: bool,
        }
        let walk = Walk {
            log: self.clone(),
            filter,
            cursor,
            left: cap,
            done: false,
        };
        futures::stream::unfold(walk, |mut walk| async move {
            if walk.done || walk.left == 0 {
                return None;
            }
            let want = walk.left.min(STREAM_PAGE);
            let wait = walk.log.bound.saturating_add(TURN_WAIT);
            let page = match walk
                .log
                .read(&walk.filter, walk.cursor.as_ref(), want, wait)
                .await
            {
                Ok(page) => page,
                Err(e) => {
                    walk.done = true;
                    return Some((Err(e), walk));
                }
            };
            walk.done = page.len() < want;
            walk.left -= page.len();
            walk.cursor = page.last().map(position);
            (!page.is_empty()).then_some((Ok(page), walk))
        })
    }
}
