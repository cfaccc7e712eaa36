//! How the admin API and the console read the trail: one page at a time,
//! newest first, with the cursor of the next page; or every matching row, as
//! a stream of pages (the CSV export). The cursors are made and followed
//! here, so no caller handles a row's position itself.

use futures::Stream;

use super::query::{Cursor, EventFilter};
use super::{AuditDb, AuditError, AuditEvent};

/// Rows per database round trip while streaming.
const STREAM_PAGE: usize = 500;

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
}

fn position(event: &AuditEvent) -> Cursor {
    Cursor {
        occurred_at: event.occurred_at,
        id: event.id,
    }
}

impl AuditLog {
    /// Read the trail kept in `db`.
    pub fn new(db: AuditDb) -> Self {
        Self { db }
    }

    /// Up to `limit` events after `cursor` (from the newest without one).
    pub async fn page(
        &self,
        filter: &EventFilter,
        cursor: Option<&Cursor>,
        limit: usize,
    ) -> Result<Page, AuditError> {
        // One row more than asked tells whether another page exists.
        let mut events = self.db.page(filter, cursor, limit + 1).await?;
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
            db: AuditDb,
            filter: EventFilter,
            cursor: Option<Cursor>,
            left: usize,
            done: bool,
        }
        let walk = Walk {
            db: self.db.clone(),
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
            let page = match walk.db.page(&walk.filter, walk.cursor.as_ref(), want).await {
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
