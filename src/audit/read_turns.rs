//! Whose turn it is to read the trail. A filter no index serves reads every
//! partition, so admin reads take turns: [`READS_AT_ONCE`] run at a time in
//! a process, and each admin holds at most one of them, so that one admin's
//! slow filters (any role may read) queue behind each other rather than
//! keep every other admin waiting.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// Admin reads running at once, of the pool's 5 connections (4 on SQLite):
/// the overviews, the writer and the sessions keep the rest.
pub const READS_AT_ONCE: usize = 2;

/// Overviews (`/admin/api/stats`, the console's) running at once, in turns
/// of their own: they read the rollups, not the rows, so they go on while
/// slow filters hold the reads' turns.
pub const OVERVIEWS_AT_ONCE: usize = 1;

/// Each reader's own turn, by name, while it reads or waits.
type Seats = Arc<Mutex<HashMap<String, Arc<Semaphore>>>>;

/// The turns of one process.
#[derive(Clone)]
pub struct ReadTurns {
    shared: Arc<Semaphore>,
    seats: Seats,
}

/// A read's turn: released when dropped.
pub struct Turn {
    // Declared first, so dropped before the seat is given up.
    _shared: OwnedSemaphorePermit,
    _own: OwnedSemaphorePermit,
    _seat: Seat,
}

/// A reader's place in the map; the last one out removes the entry, so the
/// map holds only readers reading or waiting.
struct Seat {
    seats: Seats,
    reader: String,
    /// Taken and dropped under the map's lock, so that two seats of one
    /// reader dropped at once cannot both see the other and leave the
    /// entry behind.
    own: Option<Arc<Semaphore>>,
}

impl Drop for Seat {
    fn drop(&mut self) {
        let mut seats = self.seats.lock();
        let Some(own) = self.own.take() else { return };
        // Each seat's clone is made and dropped under this lock, and a
        // turn's permits, which hold clones too, are dropped before its
        // seat: two left (the map's and this one) means no one else reads
        // or waits under this name.
        if Arc::strong_count(&own) == 2 {
            seats.remove(&self.reader);
        }
        drop(own);
    }
}

impl Default for ReadTurns {
    fn default() -> Self {
        Self::new(READS_AT_ONCE)
    }
}

impl ReadTurns {
    /// Turns of which `at_once` run at a time.
    pub fn new(at_once: usize) -> Self {
        Self {
            shared: Arc::new(Semaphore::new(at_once)),
            seats: Seats::default(),
        }
    }

    /// `reader`'s turn: first its own (after its reads before this one),
    /// then one of the process's. `None` when not had within `wait`.
    pub async fn take(&self, reader: &str, wait: Duration) -> Option<Turn> {
        let seat = self.seat(reader);
        let own = seat.own.clone();
        let shared = self.shared.clone();
        let both = async move {
            let own = own?.acquire_owned().await.ok()?;
            let shared = shared.acquire_owned().await.ok()?;
            Some((shared, own))
        };
        let (shared, own) = tokio::time::timeout(wait, both).await.ok()??;
        Some(Turn {
            _shared: shared,
            _own: own,
            _seat: seat,
        })
    }

    fn seat(&self, reader: &str) -> Seat {
        let mut seats = self.seats.lock();
        let own = seats
            .entry(reader.to_owned())
            .or_insert_with(|| Arc::new(Semaphore::new(1)))
            .clone();
        Seat {
            seats: self.seats.clone(),
            reader: reader.to_owned(),
            own: Some(own),
        }
    }

    /// Readers reading or waiting (tests).
    #[cfg(test)]
    fn readers(&self) -> usize {
        self.seats.lock().len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const NOW: Duration = Duration::from_millis(50);

    #[tokio::test]
    async fn one_reader_holds_one_turn_at_a_time() {
        let turns = ReadTurns::default();
        let first = turns.take("token:ops", NOW).await;
        assert!(first.is_some());
        assert!(turns.take("token:ops", NOW).await.is_none());
        drop(first);
        assert!(turns.take("token:ops", NOW).await.is_some());
    }

    #[tokio::test]
    async fn a_busy_reader_leaves_the_other_turn_to_the_rest() {
        let turns = ReadTurns::default();
        let _slow = turns.take("token:viewer", NOW).await.expect("a turn");
        assert!(turns.take("token:viewer", NOW).await.is_none());
        let other = turns.take("oidc:ana@example.com", NOW).await;
        assert!(other.is_some(), "the second turn is another admin's");
        assert!(turns.take("oidc:bo@example.com", NOW).await.is_none());
    }

    #[tokio::test]
    async fn a_waiting_read_gets_the_turn_when_it_frees() {
        let turns = ReadTurns::default();
        let first = turns.take("token:ops", NOW).await.expect("a turn");
        let waiting = {
            let turns = turns.clone();
            tokio::spawn(async move {
                turns
                    .take("token:ops", Duration::from_secs(5))
                    .await
                    .is_some()
            })
        };
        tokio::time::sleep(NOW).await;
        drop(first);
        assert!(waiting.await.expect("joined"));
    }

    #[tokio::test]
    async fn the_map_forgets_readers_gone_and_readers_who_gave_up() {
        let turns = ReadTurns::default();
        let held = turns.take("token:ops", NOW).await.expect("a turn");
        assert!(turns.take("token:ops", NOW).await.is_none());
        assert_eq!(turns.readers(), 1, "kept while one reads");
        drop(held);
        assert_eq!(turns.readers(), 0);
        for n in 0..3 {
            drop(turns.take(&format!("token:{n}"), NOW).await);
        }
        assert_eq!(turns.readers(), 0);
    }
}
