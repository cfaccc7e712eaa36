//! The batch writer: one task that takes events off the queue, inserts them
//! in batches, leaves them to the journal while the database is down, and
//! replays and deletes journal segments.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use metrics::counter;
use tokio::sync::{mpsc, oneshot};
use tokio::time::Instant;

use super::held::Held;
use super::queue::Receiver;
use super::{
    count, dropped, journal_held, Message, SinkConfig, DB_LINES, DROP_LINES, REFUSED_LINES,
};
use crate::audit::db::{AuditDb, AuditError};
use crate::audit::journal::{read_lines, Journal, Segment};
use crate::audit::journal_sync::SyncCommand;
use crate::audit::AuditEvent;
use crate::metrics::{AUDIT_BATCHES, AUDIT_JOURNAL_ERRORS};

pub(super) struct Writer {
    db: AuditDb,
    journal: Arc<Journal>,
    sync: std::sync::mpsc::Sender<SyncCommand>,
    /// What `/readyz` reads: whether the database's last answer was good.
    database: Arc<AtomicBool>,
    batch_size: usize,
    flush_interval: Duration,
    /// Longest one insert may go unanswered before its batch is left to
    /// the journal (`audit.write_timeout`).
    write_timeout: Duration,
    retention: Duration,
    prefix_digits: u32,
    /// Events the journal could not take, kept in memory until inserted
    /// (where a flush finds them, see [`Held`]).
    held: Held,
    migrated: bool,
    /// While set and in the future, batches are left to the journal.
    retry_at: Option<Instant>,
    backoff: Duration,
    /// When the database last answered or failed.
    last_contact: Instant,
}

const MAX_BACKOFF: Duration = Duration::from_secs(5);
const BACKLOG_BATCHES: usize = 8;
/// Under a flood (the last batch filled up before its deadline), a batch
/// gathers up to this many `batch_size`s within `flush_interval`: what a
/// flood costs PostgreSQL is per transaction as much as per row (the
/// rollups' upserts and prunes, the commit), so four times the rows per
/// transaction cut its CPU by about a sixth (docs/benchmarks.md).
const FLOOD_BATCHES: usize = 4;
const INSERT_TRIES: u32 = 3;
/// An idle writer checks the database this often, so `/readyz` stays true
/// to it without asking it per probe.
const PROBE_EVERY: Duration = Duration::from_secs(1);
const PROBE_TIMEOUT: Duration = Duration::from_secs(5);
/// Once a batch has begun, the writer gathers it by looking at the queue
/// after naps instead of waiting on it: a waiting receiver is woken by
/// every event, a context switch on both threads per audit row (under a
/// login flood, most of the writer thread's CPU in the profile; with a
/// few hundred audited events a second, most of the switches tollgate makes
/// beyond the lean limit's). A nap lasts about as long as the batch would
/// take to fill at the rate it has filled so far (see [`gather_nap`]),
/// at least this long ...
const GATHER_NAP: Duration = Duration::from_millis(1);
/// ... and at most this long: a flood that begins waits no more than this
/// for the writer to look (a flush asked for, or a queue past half full,
/// nudges it sooner: see [`super::queue`]).
const GATHER_NAP_MAX: Duration = Duration::from_millis(20);

/// One batch: events and the segment each went to.
#[derive(Default)]
struct Batch {
    events: Vec<AuditEvent>,
    segments: Vec<Arc<Segment>>,
}

impl Writer {
    pub(super) fn new(
        db: AuditDb,
        journal: Arc<Journal>,
        sync: std::sync::mpsc::Sender<SyncCommand>,
        database: Arc<AtomicBool>,
        held: Held,
        config: &SinkConfig,
    ) -> Self {
        // Start-up migrated when it found the database ready; a table gone
        // since is migrated again on the error it brings.
        let migrated = database.load(Ordering::Relaxed);
        Self {
            db,
            journal,
            sync,
            database,
            batch_size: config.batch_size.max(1),
            flush_interval: config.flush_interval,
            write_timeout: config.write_timeout,
            retention: config.retention,
            prefix_digits: config.prefix_digits,
            held,
            migrated,
            retry_at: None,
            backoff: Duration::ZERO,
            last_contact: Instant::now(),
        }
    }

    pub(super) async fn run(mut self, mut queue: Receiver) {
        self.tidy().await;
        let mut batch = Batch::default();
        let mut acks: Vec<oneshot::Sender<()>> = Vec::new();
        let mut messages = Vec::with_capacity(self.batch_size);
        let mut closed = false;
        let mut flooded = false;
        while !closed {
            // Wait for a first message, then gather until the batch is full,
            // the flush interval has passed, or someone asks for a flush. A
            // backlog is taken whole, up to BACKLOG_BATCHES batches at once:
            // a commit, not a row, is what costs.
            let first = queue.recv_many(&mut messages, self.batch_size * BACKLOG_BATCHES);
            match tokio::time::timeout(self.first_wait(), first).await {
                Ok(0) => closed = true,
                Ok(_) => take_all(&mut messages, &mut batch, &mut acks),
                Err(_) => {}
            }
            if !closed {
                let started = Instant::now();
                let deadline = started + self.flush_interval;
                let gathering = Gathering {
                    messages: &mut messages,
                    batch: &mut batch,
                    acks: &mut acks,
                };
                let most = batch_cap(self.batch_size, flooded);
                closed = gather(&mut queue, gathering, most, started, deadline).await;
                flooded = batch.events.len() >= self.batch_size;
            }
            // What memory holds past the journal's bound, the flush itself
            // journals once its wait ends (see `DbSink::flush`): this insert
            // may outlast it.
            let flushing = !acks.is_empty() || closed;
            if !batch.events.is_empty() || (!self.held.is_empty() && self.probe_due()) {
                self.write(std::mem::take(&mut batch)).await;
            } else if self.last_contact.elapsed() >= PROBE_EVERY && self.probe_due() {
                self.probe().await;
            }
            if flushing {
                if closed {
                    journal_held(&self.journal, &self.held);
                    for event in self.held.take() {
                        dropped(&event);
                    }
                }
                self.journal.seal_if_settled();
            }
            self.tidy().await;
            for ack in acks.drain(..) {
                let _ = ack.send(());
            }
        }
    }

    /// How long to wait for a first event (see [`first_wait`]).
    fn first_wait(&self) -> Duration {
        let pending = !self.held.is_empty() || self.journal.awaits_replay();
        first_wait(
            Instant::now(),
            self.flush_interval,
            pending,
            self.last_contact,
            self.retry_at,
        )
    }

    fn probe_due(&self) -> bool {
        self.retry_at.is_none_or(|at| Instant::now() >= at)
    }

    fn healthy(&mut self, healthy: bool) {
        self.last_contact = Instant::now();
        if healthy {
            if self.retry_at.take().is_some() {
                tracing::info!("audit database is back");
            }
            self.backoff = Duration::ZERO;
        } else {
            self.backoff = (self.backoff * 2).clamp(Duration::from_millis(250), MAX_BACKOFF);
            self.retry_at = Some(Instant::now() + self.backoff);
        }
        self.database.store(healthy, Ordering::Relaxed);
    }

    /// Insert the batch and what memory holds. The events the journal did
    /// not take stay in `held` while the insert runs, so that a flush whose
    /// wait this insert outlasts still finds them.
    async fn write(&mut self, mut batch: Batch) {
        if !self.probe_due() {
            self.leave_to_journal(batch);
            return;
        }
        let journaled = batch.events.len();
        let (from_memory, mark) = self.held.copy();
        batch.events.extend(from_memory);
        match self.insert_with_retries(&batch.events).await {
            Ok(_) => {
                // The batch, not the rows new to the table: the queue's
                // depth on the dashboard is `queued - written - spooled`.
                count("written", batch.events.len());
                counter!(AUDIT_BATCHES).increment(1);
                for segment in &batch.segments {
                    segment.committed(1);
                }
                self.held.inserted(mark);
                self.healthy(true);
            }
            Err(e) => {
                if let Some(held_back) = DB_LINES.admit() {
                    tracing::warn!(error = %e, events = batch.events.len(), held_back, "audit database unavailable; events wait in the journal");
                }
                batch.events.truncate(journaled);
                self.leave_to_journal(batch);
                self.healthy(false);
            }
        }
    }

    /// The database cannot take these now: each event's segment will be
    /// replayed (what the journal never took stays held).
    fn leave_to_journal(&mut self, batch: Batch) {
        for segment in &batch.segments {
            segment.mark_for_replay();
        }
        count("spooled", batch.segments.len());
    }

    async fn insert_with_retries(&mut self, events: &[AuditEvent]) -> Result<u64, AuditError> {
        let mut pause = Duration::from_millis(100);
        let mut tries = 0;
        loop {
            tries += 1;
            match self.insert(events).await {
                Ok(n) => return Ok(n),
                // A database that did not answer in time is not asked again
                // at once: a hung one would hold the writer three times as long.
                Err(e) if tries >= INSERT_TRIES || e.is_timeout() => return Err(e),
                Err(_) => {
                    tokio::time::sleep(pause).await;
                    pause *= 2;
                }
            }
        }
    }

    /// Migrate first when needed; a table that has gone (the database was
    /// dropped and made again) is migrated again on the next try. Events
    /// past retention are counted and left out.
    ///
    /// The insert, not the migration, is bounded by `audit.write_timeout`:
    /// an insert waiting on a lock (an operator's DDL on the trail), on a
    /// hung server or on lost packets would otherwise hold the writer while
    /// `/readyz` kept its last good word. PostgreSQL ends the batch's lock
    /// waits and statements at the bound itself; a database that answers
    /// nothing at all is given up at twice it. A batch given up is left to
    /// the journal; if PostgreSQL did commit it, the replay skips its rows
    /// (exactly once, as after a lost commit answer).
    async fn insert(&mut self, events: &[AuditEvent]) -> Result<u64, AuditError> {
        self.migrate().await?;
        let cutoff = crate::audit::retention::cutoff(chrono::Utc::now(), self.retention);
        let expired = events.iter().filter(|e| e.occurred_at < cutoff).count();
        let inserted = if expired == 0 {
            self.insert_keeping_refused(events).await
        } else {
            count("expired", expired);
            if let Some(held_back) = DROP_LINES.admit() {
                tracing::warn!(
                    expired,
                    held_back,
                    "audit events older than audit.retention were not inserted"
                );
            }
            let kept: Vec<AuditEvent> = events
                .iter()
                .filter(|e| e.occurred_at >= cutoff)
                .cloned()
                .collect();
            self.insert_keeping_refused(&kept).await
        };
        self.note_missing_table(&inserted);
        inserted
    }

    /// Insert `events`; should the database refuse the batch for some of
    /// its rows (a constraint or trigger an operator added, a column
    /// narrowed by hand), halve it until those rows stand alone, insert the
    /// rest, and keep the refused ones in a file of their own
    /// ([`Journal::keep_refused`]): one such row would otherwise fail every
    /// batch and replay after it, and the trail would stall behind it. A
    /// failure of any other kind midway ends it as before (the rows already
    /// in are skipped when the batch goes again), and so does a file that
    /// cannot be written: the refusal is returned and the events stay in
    /// the journal.
    async fn insert_keeping_refused(&self, events: &[AuditEvent]) -> Result<u64, AuditError> {
        let refusal = match self.bounded_insert(events).await {
            Err(e) if e.is_refusal() => e,
            done => return done,
        };
        let mut inserted = 0;
        let mut refused = Vec::new();
        let mut parts = Vec::new();
        halve(events, &mut parts, &mut refused);
        while let Some(part) = parts.pop() {
            match self.bounded_insert(part).await {
                Ok(n) => inserted += n,
                Err(e) if e.is_refusal() => halve(part, &mut parts, &mut refused),
                Err(e) => return Err(e),
            }
        }
        match self.keep_refused(refused, &refusal).await {
            Ok(()) => Ok(inserted),
            Err(()) => Err(refusal),
        }
    }

    /// Write the refused events to their file, counted and logged; past
    /// the bound on such files, drop them, counted and logged as lost.
    /// `Err` when the file could not be written (a journal failure).
    async fn keep_refused(&self, refused: Vec<AuditEvent>, refusal: &AuditError) -> Result<(), ()> {
        let journal = self.journal.clone();
        let n = refused.len();
        match tokio::task::spawn_blocking(move || journal.keep_refused(&refused)).await {
            Ok(Ok(Some(file))) => {
                count("refused", n);
                if let Some(held_back) = REFUSED_LINES.admit() {
                    tracing::error!(
                        events = n,
                        file = %file.display(),
                        error = %refusal,
                        held_back,
                        "the audit database refused events; kept in a file of their own: \
                         once the table takes them, rename it replay-<anything>.jsonl"
                    );
                }
                Ok(())
            }
            Ok(Ok(None)) => {
                count("refused", n);
                count("dropped", n);
                if let Some(held_back) = DROP_LINES.admit() {
                    tracing::error!(
                        events = n,
                        error = %refusal,
                        held_back,
                        "audit events lost: the audit database refused them, and the files of \
                         refused events hold audit.journal_max_bytes"
                    );
                }
                Ok(())
            }
            Ok(Err(e)) => {
                self.journal.failed("refused", &e);
                Err(())
            }
            Err(_) => Err(()),
        }
    }

    async fn bounded_insert(&self, events: &[AuditEvent]) -> Result<u64, AuditError> {
        let bound = self.write_timeout;
        let given_up_at = bound.saturating_mul(2);
        let insert = self
            .db
            .insert_within(events, self.prefix_digits, Some(bound));
        tokio::time::timeout(given_up_at, insert)
            .await
            .unwrap_or(Err(AuditError::TimedOut(given_up_at)))
    }

    async fn migrate(&mut self) -> Result<(), AuditError> {
        if !self.migrated {
            self.db.migrate().await?;
            self.migrated = true;
        }
        Ok(())
    }

    fn note_missing_table<T>(&mut self, result: &Result<T, AuditError>) {
        if let Err(e) = result {
            if e.is_missing_table() {
                tracing::warn!("the audit table is missing; migrating the database again");
                self.migrated = false;
            }
        }
    }

    /// Ask the database whether the table answers (migrating it when it is
    /// missing); the answer is what `/readyz` says.
    async fn probe(&mut self) {
        // Migrating is not under the timeout, as on the insert path: a
        // migration dropped midway is rolled back only once PostgreSQL has
        // done its work under its locks, and the next probe would start it
        // again (a collation change rebuilds indexes: seconds a million rows).
        let checked = match self.migrate().await {
            Err(e) => Ok(Err(e)),
            Ok(()) => {
                tokio::time::timeout(PROBE_TIMEOUT, async {
                    let checked = self.db.check_table().await;
                    self.note_missing_table(&checked);
                    checked
                })
                .await
            }
        };
        match checked {
            Ok(Ok(())) => self.healthy(true),
            Ok(Err(e)) => {
                if let Some(held_back) = DB_LINES.admit() {
                    tracing::warn!(error = %e, held_back, "audit database unavailable");
                }
                self.healthy(false);
            }
            Err(_) => self.healthy(false),
        }
    }

    /// Delete the sealed segments whose events are all in the database;
    /// replay, oldest first, those that need it while the database answers;
    /// and have the open segment sealed when it needs a replay.
    async fn tidy(&mut self) {
        for segment in self.journal.sealed() {
            if segment.settled() {
                self.remove(&segment);
            } else if segment.needs_replay() {
                if !self.probe_due() {
                    return;
                }
                match self.replay(&segment).await {
                    Replay::Done | Replay::Unreadable => {}
                    Replay::Postponed => return,
                }
            }
        }
        if self.probe_due() && self.journal.open_needs_replay() {
            let _ = self.sync.send(SyncCommand::Rotate);
        }
    }

    fn remove(&self, segment: &Arc<Segment>) {
        if let Err(e) = self.journal.remove(segment) {
            self.journal.failed("delete", &e);
        }
    }

    /// Keep a segment with lines this release cannot read (a newer one
    /// wrote them, or a byte was spoilt on disk): its events are in the
    /// database, the lines are not, and deleting it would lose them.
    fn set_aside(&self, segment: &Arc<Segment>, unread: usize) {
        counter!(AUDIT_JOURNAL_ERRORS, "op" => "parse").increment(unread as u64);
        match self.journal.set_aside(segment) {
            Ok(kept) => tracing::error!(
                file = %kept.display(),
                lines = unread,
                "kept an audit journal segment with lines this release cannot read; \
                 rename it replay-<anything>.jsonl for a release that can"
            ),
            Err(e) => tracing::error!(
                file = %segment.path().display(),
                lines = unread,
                error = %e,
                "an audit journal segment with lines this release cannot read could not be \
                 renamed; left for the next process"
            ),
        }
    }

    /// Insert a sealed segment whole (ids already present are skipped), then
    /// delete it. A segment that cannot be read does not hold back the ones
    /// after it; one whose file is gone (deleted by hand, or by a cleaner
    /// of old files) is forgotten, its events lost, and said so.
    async fn replay(&mut self, segment: &Arc<Segment>) -> Replay {
        let path = segment.path().to_path_buf();
        let lines = match tokio::task::spawn_blocking(move || read_lines(&path)).await {
            Ok(Ok(lines)) => lines,
            Ok(Err(e)) if e.kind() == std::io::ErrorKind::NotFound => {
                tracing::error!(
                    file = %segment.path().display(),
                    "an audit journal segment was deleted before its replay; its events are lost"
                );
                self.remove(segment);
                return Replay::Unreadable;
            }
            Ok(Err(e)) => {
                self.journal.unreadable(segment.path(), &e);
                return Replay::Unreadable;
            }
            Err(_) => return Replay::Unreadable,
        };
        let events = lines.events;
        let mut inserted = 0;
        for chunk in events.chunks(self.batch_size * BACKLOG_BATCHES) {
            match self.insert(chunk).await {
                Ok(n) => inserted += n,
                Err(e) => {
                    if let Some(held_back) = DB_LINES.admit() {
                        tracing::warn!(error = %e, held_back, "audit database unavailable, replay postponed");
                    }
                    self.healthy(false);
                    return Replay::Postponed;
                }
            }
        }
        segment.replayed();
        self.healthy(true);
        count("replayed", inserted as usize);
        tracing::info!(
            events = events.len(),
            inserted,
            file = %segment.path().display(),
            "replayed an audit journal segment"
        );
        if lines.unread == 0 {
            self.remove(segment);
        } else {
            self.set_aside(segment, lines.unread);
        }
        Replay::Done
    }
}

/// A part of a batch the database refused: a single event is one it
/// refuses; a longer part is halved, its earlier half to be tried first
/// (`parts` is a stack).
fn halve<'a>(
    part: &'a [AuditEvent],
    parts: &mut Vec<&'a [AuditEvent]>,
    refused: &mut Vec<AuditEvent>,
) {
    if let [event] = part {
        refused.push(event.clone());
    } else {
        let (earlier, later) = part.split_at(part.len() / 2);
        parts.push(later);
        parts.push(earlier);
    }
}

/// What became of a segment's replay.
enum Replay {
    /// In the database (and deleted, or its deletion tried again later).
    Done,
    /// The database did not take it: later segments wait too.
    Postponed,
    /// Its file could not be read: the later ones go on.
    Unreadable,
}

/// How long a writer with an empty batch waits for a first event: a flush
/// interval while events wait in memory or in the journal for the
/// database; otherwise until its next probe is due (an idle writer wakes
/// once a probe, not every flush interval), and never less than a flush
/// interval.
fn first_wait(
    now: Instant,
    flush_interval: Duration,
    pending: bool,
    last_contact: Instant,
    retry_at: Option<Instant>,
) -> Duration {
    if pending {
        return flush_interval;
    }
    let probe_at = (last_contact + PROBE_EVERY).max(retry_at.unwrap_or(now));
    probe_at.saturating_duration_since(now).max(flush_interval)
}

/// Where [`gather`] puts what it takes.
struct Gathering<'a> {
    messages: &'a mut Vec<Message>,
    batch: &'a mut Batch,
    acks: &'a mut Vec<oneshot::Sender<()>>,
}

/// The most events the next batch gathers: `batch_size` while the queue is
/// calm, [`FLOOD_BATCHES`] of them while the last batch filled up.
fn batch_cap(batch_size: usize, flooded: bool) -> usize {
    if flooded {
        batch_size.saturating_mul(FLOOD_BATCHES)
    } else {
        batch_size
    }
}

/// Add to a started batch until it holds `batch_size`, `deadline` has
/// passed, someone asks for a flush, or every sender is gone (answered
/// `true`). It looks at the queue after naps rather than wait on it (see
/// `GATHER_NAP`), so that no event wakes the writer, unless the queue
/// fills past half within a nap (see [`super::queue`]).
async fn gather(
    queue: &mut Receiver,
    into: Gathering<'_>,
    batch_size: usize,
    started: Instant,
    deadline: Instant,
) -> bool {
    let Gathering {
        messages,
        batch,
        acks,
    } = into;
    // A nap must not let the queue fill: its senders would spool.
    let queue_room = (queue.max_capacity() / 2).max(1);
    loop {
        let room = batch_size.saturating_sub(batch.events.len());
        let closed = take_ready(queue, messages, room);
        take_all(messages, batch, acks);
        let now = Instant::now();
        let full = batch.events.len() >= batch_size;
        if closed || full || !acks.is_empty() || batch.events.is_empty() || now >= deadline {
            return closed;
        }
        let room = batch_size
            .saturating_sub(batch.events.len())
            .min(queue_room);
        let nap = gather_nap(now - started, batch.events.len(), room);
        queue.nap(nap.min(deadline - now)).await;
    }
}

/// How long to nap before looking at the queue again: about as long as
/// `room` more events take to come at the rate `gathered` came in
/// `elapsed`, between `GATHER_NAP` and `GATHER_NAP_MAX`.
fn gather_nap(elapsed: Duration, gathered: usize, room: usize) -> Duration {
    let per_event = elapsed.max(GATHER_NAP).as_secs_f64() / gathered.max(1) as f64;
    // Capped before it is made a `Duration`, which a huge `room` would overflow.
    Duration::from_secs_f64((per_event * room as f64).min(GATHER_NAP_MAX.as_secs_f64()))
        .max(GATHER_NAP)
}

/// Up to `most` messages already queued, without waiting (so without
/// registering to be woken); answers whether every sender is gone.
fn take_ready(queue: &mut Receiver, into: &mut Vec<Message>, most: usize) -> bool {
    for _ in 0..most {
        match queue.try_recv() {
            Ok(message) => into.push(message),
            Err(mpsc::error::TryRecvError::Empty) => return false,
            Err(mpsc::error::TryRecvError::Disconnected) => return true,
        }
    }
    false
}

fn take_all(messages: &mut Vec<Message>, batch: &mut Batch, acks: &mut Vec<oneshot::Sender<()>>) {
    for message in messages.drain(..) {
        match message {
            Message::Event(event, segment) => {
                batch.events.push(*event);
                batch.segments.push(segment);
            }
            Message::Flush(ack) => acks.push(ack),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::queue::channel;
    use super::*;

    fn flush() -> Message {
        Message::Flush(oneshot::channel().0)
    }

    fn event() -> Message {
        let subject = crate::domain::Subject::new(crate::domain::SubjectKind::Ip, "192.0.2.1");
        let event = AuditEvent::new(
            crate::domain::Action::LoginAttempt,
            crate::audit::AuditDecision::Deny,
            crate::domain::Reason::IpBlocked,
            &subject,
        );
        let segment = Segment::new(std::path::PathBuf::from("test.jsonl"), false, 0);
        Message::Event(Box::new(event), Arc::new(segment))
    }

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    /// What [`gather_begun`] ended with.
    struct Gathered {
        closed: bool,
        batch: Batch,
        acks: Vec<oneshot::Sender<()>>,
        took: Duration,
    }

    /// `gather` onto a batch begun with one event, as `run` begins one,
    /// with its deadline `deadline_in` from now.
    async fn gather_begun(rx: &mut Receiver, deadline_in: Duration) -> Gathered {
        let (mut messages, mut batch, mut acks) = (Vec::new(), Batch::default(), Vec::new());
        take_all(&mut vec![event()], &mut batch, &mut acks);
        let started = Instant::now();
        let gathering = Gathering {
            messages: &mut messages,
            batch: &mut batch,
            acks: &mut acks,
        };
        let closed = gather(rx, gathering, usize::MAX, started, started + deadline_in).await;
        Gathered {
            closed,
            batch,
            acks,
            took: started.elapsed(),
        }
    }

    /// A flush asked for while the writer naps ends the batch at its next
    /// look, not at the batch's deadline; so does every sender going.
    #[tokio::test]
    async fn a_flush_or_the_senders_end_cuts_a_nap_short() {
        let (tx, mut rx) = channel(64);
        let asker = tokio::spawn({
            let tx = tx.clone();
            async move {
                tokio::time::sleep(ms(5)).await;
                tx.send(flush()).await.is_ok()
            }
        });
        let gathered = gather_begun(&mut rx, Duration::from_secs(30)).await;
        assert_eq!(asker.await.ok(), Some(true));
        assert!(!gathered.closed, "senders alive");
        assert_eq!(gathered.acks.len(), 1, "the flush taken");
        // One nap is at most GATHER_NAP_MAX; the bound is wide for a
        // loaded machine, and far below the 30 s deadline.
        assert!(
            gathered.took < Duration::from_secs(5),
            "{:?}",
            gathered.took
        );

        let ender = tokio::spawn(async move {
            tokio::time::sleep(ms(5)).await;
            drop(tx);
        });
        let gathered = gather_begun(&mut rx, Duration::from_secs(30)).await;
        let _ = ender.await;
        assert!(gathered.closed, "the senders' end seen");
        assert!(
            gathered.took < Duration::from_secs(5),
            "{:?}",
            gathered.took
        );
    }

    /// Events coming faster than the writer looks (a thread of its own
    /// sending twenty every 0.1 ms) leave the queue never empty when it
    /// looks: the batch still ends at its deadline, not when the stream
    /// stops.
    #[tokio::test]
    async fn a_batch_under_a_steady_stream_ends_at_its_deadline() {
        let (tx, mut rx) = channel(10_000);
        let stop = Arc::new(AtomicBool::new(false));
        let stream = std::thread::spawn({
            let stop = stop.clone();
            move || {
                while !stop.load(Ordering::Relaxed) {
                    for _ in 0..20 {
                        if tx.blocking_send(event()).is_err() {
                            return;
                        }
                    }
                    std::thread::sleep(Duration::from_micros(100));
                }
            }
        });
        let gathered =
            tokio::time::timeout(Duration::from_secs(3), gather_begun(&mut rx, ms(50))).await;
        stop.store(true, Ordering::Relaxed);
        drop(rx);
        let _ = stream.join();
        let Ok(Gathered {
            closed,
            batch,
            took,
            ..
        }) = gathered
        else {
            panic!("the batch never ended");
        };
        assert!(!closed, "the batch ended, senders alive");
        // Past the deadline by one nap and one look, not by the stream's
        // whims: the bound is wide for a loaded machine.
        assert!(
            took >= Duration::from_millis(50) && took < Duration::from_secs(1),
            "{took:?}"
        );
        assert!(
            batch.events.len() > 20,
            "{} events gathered",
            batch.events.len()
        );
    }

    #[test]
    fn a_nap_lasts_as_long_as_the_batch_takes_to_fill_within_bounds() {
        // Three refusals in 30 ms, 497 to go: the longest nap, a few
        // looks a batch instead of a wake-up an event.
        assert_eq!(gather_nap(ms(30), 3, 497), GATHER_NAP_MAX);
        // 40 events a millisecond, room for 200 more: 5 ms.
        assert_eq!(gather_nap(ms(1), 40, 200), ms(5));
        // Faster still, or a batch just begun: the shortest nap.
        assert_eq!(gather_nap(ms(1), 4000, 200), GATHER_NAP);
        assert_eq!(gather_nap(Duration::ZERO, 1, 1), GATHER_NAP);
        assert_eq!(gather_nap(ms(5), 0, 0), GATHER_NAP, "nothing to fill");
        // A batch with no cap of its own (`usize::MAX`) after a slow second:
        // past what a `Duration` holds, capped before it is made one.
        assert_eq!(gather_nap(ms(1000), 1, usize::MAX), GATHER_NAP_MAX);
    }

    /// A small queue bounds the nap as much as the batch does: a nap that
    /// let the queue fill would spool what its senders could not queue.
    #[tokio::test]
    async fn a_nap_leaves_room_in_a_small_queue() {
        let (tx, mut rx) = channel(8);
        let sender = tokio::spawn(async move {
            for _ in 0..100 {
                if tx.try_send(event()).is_err() {
                    return false;
                }
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
            true
        });
        let Gathered { closed, batch, .. } = gather_begun(&mut rx, Duration::from_secs(5)).await;
        assert_eq!(sender.await.ok(), Some(true), "the queue never filled");
        assert!(closed, "the sender's end seen");
        assert_eq!(batch.events.len(), 101, "every event gathered");
    }

    /// A burst after a lone event outruns the nap that event set (the
    /// longest, 20 ms): sixteen events a millisecond would fill a queue of
    /// eighty in five. The sender that takes the queue past half nudges
    /// the writer, which takes what is queued before the sender's next
    /// chunk (one thread: it runs while the sender sleeps), so the queue
    /// never fills and nothing is spooled.
    #[tokio::test]
    async fn a_burst_nudges_the_napping_writer_before_the_queue_fills() {
        let (tx, mut rx) = channel(80);
        let sender = tokio::spawn(async move {
            for _ in 0..20 {
                for _ in 0..16 {
                    if tx.try_send(event()).is_err() {
                        return false;
                    }
                }
                tokio::time::sleep(ms(1)).await;
            }
            true
        });
        let Gathered { closed, batch, .. } = gather_begun(&mut rx, Duration::from_secs(5)).await;
        assert_eq!(sender.await.ok(), Some(true), "the queue never filled");
        assert!(closed, "the sender's end seen");
        assert_eq!(batch.events.len(), 321, "every event gathered");
    }

    #[test]
    fn a_flood_gathers_four_batches_and_a_calm_queue_one() {
        assert_eq!(batch_cap(500, false), 500);
        assert_eq!(batch_cap(500, true), 2000);
        assert_eq!(batch_cap(usize::MAX, true), usize::MAX, "no overflow");
    }

    #[tokio::test]
    async fn take_ready_takes_what_is_queued_up_to_most_and_sees_the_senders_gone() {
        let (tx, mut rx) = channel(8);
        let mut into = Vec::new();
        assert!(!take_ready(&mut rx, &mut into, 4), "empty, senders alive");
        assert_eq!(into.len(), 0);
        for _ in 0..3 {
            assert!(tx.try_send(flush()).is_ok(), "room");
        }
        assert!(!take_ready(&mut rx, &mut into, 2));
        assert_eq!(into.len(), 2, "at most `most`");
        assert!(!take_ready(&mut rx, &mut into, 4));
        assert_eq!(into.len(), 3, "the rest");
        drop(tx);
        assert!(take_ready(&mut rx, &mut into, 4), "senders gone");
        assert_eq!(into.len(), 3);
    }

    #[test]
    fn an_idle_writer_waits_for_its_next_probe() {
        // Ahead, so that instants before it exist however new the clock.
        let now = Instant::now() + Duration::from_secs(10);
        let flush = Duration::from_millis(200);
        let ms = Duration::from_millis;
        assert_eq!(first_wait(now, flush, false, now, None), PROBE_EVERY);
        assert_eq!(
            first_wait(now, flush, false, now - ms(700), None),
            ms(300),
            "what is left of the probe's second"
        );
        assert_eq!(
            first_wait(now, flush, false, now - ms(5000), None),
            flush,
            "a probe overdue: a flush interval, as before"
        );
        assert_eq!(
            first_wait(now, flush, false, now, Some(now + ms(4000))),
            ms(4000),
            "a database down: its next retry"
        );
        let slow = Duration::from_secs(5);
        assert_eq!(first_wait(now, slow, false, now, None), slow);
    }

    #[test]
    fn events_waiting_for_the_database_keep_the_flush_interval() {
        let now = Instant::now();
        let flush = Duration::from_millis(200);
        let down = Some(now + Duration::from_secs(4));
        assert_eq!(first_wait(now, flush, true, now, down), flush);
        assert_eq!(first_wait(now, flush, true, now, None), flush);
    }
}
