//! How the admin API and the console read the trail: one page at a time,
//! newest first, with the cursor of the next page; every matching row, as
//! a stream of pages (the CSV export); or a period's overview. The cursors are made and followed
//! here, so no caller handles a row's position itself.
//!
//! Admins' reads share the audit database's pool with the writer and the
//! single-sign-on sessions: a filter no index serves reads every
//! partition, so they take turns ([`super::read_turns`]), and on
//! PostgreSQL each ends at `audit.read_timeout`.

use std::future::Future;
use std::time::Duration;

use chrono::{DateTime, Utc};
use futures::Stream;

use super::query::{Cursor, EventFilter};
use super::read_turns::{ReadTurns, Turn, OVERVIEWS_AT_ONCE};
use super::stats::{Limits, Overview, Span};
use super::{AuditDb, AuditError, AuditEvent};

/// Rows per database round trip while streaming.
const STREAM_PAGE: usize = 500;
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
    turns: ReadTurns,
    overview_turns: ReadTurns,
    /// `audit.read_timeout`.
    bound: Duration,
}

/// `reader`'s turn among `turns`, or `ReadsBusy` (503) when not had
/// within `wait`.
async fn turn(turns: &ReadTurns, reader: &str, wait: Duration) -> Result<Turn, AuditError> {
    turns.take(reader, wait).await.ok_or(AuditError::ReadsBusy)
}

/// Runs `read` to its end in a task of its own that holds `turn` until
/// then. The turns bound the reads the database works on, not the requests
/// waiting for them: an admin whose connection resets has its handler
/// dropped, and had the turn gone with it, asking and resetting in a loop
/// would start reads without end. PostgreSQL notices a closed client only
/// when it writes to it, so each would scan to `audit.read_timeout`, and
/// on SQLite each would hold one of the pool's four connections as long.
async fn in_turn<T, F>(turn: Turn, read: F) -> Result<T, AuditError>
where
    T: Send + 'static,
    F: Future<Output = Result<T, AuditError>> + Send + 'static,
{
    let task = tokio::spawn(async move {
        let _turn = turn;
        read.await
    });
    match task.await {
        Ok(read) => read,
        Err(joined) if joined.is_panic() => std::panic::resume_unwind(joined.into_panic()),
        // Cancelled: only as the runtime shuts down.
        Err(_) => Err(AuditError::ReadsBusy),
    }
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
            turns: ReadTurns::default(),
            overview_turns: ReadTurns::new(OVERVIEWS_AT_ONCE),
            bound,
        }
    }

    /// One page of rows for `reader` (an admin's actor), in its turn
    /// (waited for at most `wait`) and within the bound.
    async fn read(
        &self,
        reader: &str,
        filter: &EventFilter,
        cursor: Option<&Cursor>,
        limit: usize,
        wait: Duration,
    ) -> Result<Vec<AuditEvent>, AuditError> {
        let turn = turn(&self.turns, reader, wait).await?;
        let (db, bound) = (self.db.clone(), self.bound);
        let (filter, cursor) = (filter.clone(), cursor.copied());
        in_turn(turn, async move {
            db.page_within(&filter, cursor.as_ref(), limit, bound).await
        })
        .await
    }

    /// Up to `limit` events after `cursor` (from the newest without one),
    /// read for `reader`.
    pub async fn page(
        &self,
        reader: &str,
        filter: &EventFilter,
        cursor: Option<&Cursor>,
        limit: usize,
    ) -> Result<Page, AuditError> {
        // One row more than asked tells whether another page exists.
        let mut events = self
            .read(reader, filter, cursor, limit + 1, TURN_WAIT)
            .await?;
        let next = if events.len() > limit {
            events.truncate(limit);
            events.last().map(position)
        } else {
            None
        };
        Ok(Page { events, next })
    }

    /// The overview of `span` for `reader`, in its turn (of the overviews'
    /// own) and within the bound: any admin may ask for it, as often as it
    /// likes.
    pub async fn overview(
        &self,
        reader: &str,
        span: &Span,
        now: DateTime<Utc>,
        limits: Limits,
    ) -> Result<Overview, AuditError> {
        let turn = turn(&self.overview_turns, reader, TURN_WAIT).await?;
        let (db, bound, span) = (self.db.clone(), self.bound, *span);
        in_turn(
            turn,
            async move { db.overview(&span, now, limits, bound).await },
        )
        .await
    }

    /// Every event after `cursor` that matches, at most `cap`, in pages,
    /// read for `reader`. A database error ends the stream after yielding
    /// it.
    pub fn stream(
        &self,
        reader: String,
        filter: EventFilter,
        cursor: Option<Cursor>,
        cap: usize,
    ) -> impl Stream<Item = Result<Vec<AuditEvent>, AuditError>> + use<> {
        struct Walk {
            log: AuditLog,
            reader: String,
            filter: EventFilter,
            cursor: Option<Cursor>,
            left: usize,
            done: bool,
        }
        let walk = Walk {
            log: self.clone(),
            reader,
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
                .read(&walk.reader, &walk.filter, walk.cursor.as_ref(), want, wait)
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
