//! The durable sink: `record` appends the event to the journal (one write,
//! no fsync; see [`super::journal`]) and enqueues it, never waiting for the
//! database; one writer task inserts in batches. An event the writer cannot
//! insert from memory (the queue was full, the database is down) is left to
//! its journal segment, which the writer replays once the database answers.
//! An event the journal did not take is held in memory ([`held`]).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use metrics::counter;
use tokio::sync::{mpsc, oneshot};

mod batch;
mod held;
mod queue;

use batch::Writer;
use held::Held;

use super::db::AuditDb;
use super::journal::{Journal, Segment};
use super::journal_sync::{spawn_sync, SyncCommand};
use super::{AuditEvent, AuditHealth, AuditSink};
use crate::metrics::AUDIT_EVENTS;
use crate::telemetry::log_budget::LogBudget;

enum Message {
    Event(Box<AuditEvent>, Arc<Segment>),
    Flush(oneshot::Sender<()>),
}

/// How a `DbSink` batches and journals: the `[audit]` settings.
#[derive(Debug, Clone)]
pub struct SinkConfig {
    /// Events per insert while the queue is calm (a flood gathers more,
    /// see `batch`).
    pub batch_size: usize,
    /// Longest an event waits for its batch to fill.
    pub flush_interval: Duration,
    /// Longest one insert may go unanswered (`audit.write_timeout`).
    pub write_timeout: Duration,
    /// Events the in-memory queue holds; further ones wait in the journal.
    pub queue_capacity: usize,
    /// How often the journal is fsync'd: what a machine crash can lose.
    pub journal_sync_interval: Duration,
    /// `audit.retention`: an event older than it when it reaches the writer
    /// (a replay after a long outage, say) is counted `expired`, not
    /// inserted.
    pub retention: Duration,
    /// `sms.prefix_digits` at start-up: how the top lists cut phones.
    pub prefix_digits: u32,
}

/// The production sink: the journal, a bounded queue, one batch writer.
pub struct DbSink {
    queue: queue::Sender,
    journal: Arc<Journal>,
    sync: std::sync::mpsc::Sender<SyncCommand>,
    database: Arc<AtomicBool>,
    /// Events the journal did not take, until the writer inserts them or a
    /// flush journals them past its bound.
    held: Held,
    /// `audit.queue_capacity`: the most events held.
    held_cap: usize,
    db: AuditDb,
    /// Longest a flush waits for the writer: `audit.write_timeout` and a
    /// second, so that with the default connection drain (10 s) a shutdown
    /// fits systemd's 30 s stop timeout. An insert cut off there is in the
    /// journal all the same.
    flush_wait: Duration,
}

/// What a flush gives the writer beyond its insert's bound.
const FLUSH_GRACE: Duration = Duration::from_secs(1);

fn count(outcome: &'static str, n: usize) {
    if n > 0 {
        counter!(AUDIT_EVENTS, "outcome" => outcome).increment(n as u64);
    }
}

/// Lines about the database being down, or events with nowhere to go.
static DB_LINES: LogBudget = LogBudget::new(Duration::from_secs(10));
static DROP_LINES: LogBudget = LogBudget::new(Duration::from_secs(10));
/// Lines about events the database refused (kept in a file of their own).
static REFUSED_LINES: LogBudget = LogBudget::new(Duration::from_secs(10));
/// Lines about a full queue: the writer fell behind (a database slow to
/// commit, or a writer that did not get to run), which the `spooled`
/// counter alone does not date.
static FULL_LINES: LogBudget = LogBudget::new(Duration::from_secs(10));

impl DbSink {
    /// Start the journal's sync thread and the writer task, which first
    /// replays what an earlier process left in the journal. `database_ready`
    /// says whether start-up reached and migrated the database.
    pub fn start(
        db: AuditDb,
        journal: Journal,
        config: SinkConfig,
        database_ready: bool,
    ) -> std::io::Result<Arc<Self>> {
        let journal = Arc::new(journal);
        let sync = spawn_sync(journal.clone(), config.journal_sync_interval)?;
        let (queue, receiver) = queue::channel(config.queue_capacity);
        let database = Arc::new(AtomicBool::new(database_ready));
        let held = Held::default();
        let writer = Writer::new(
            db.clone(),
            journal.clone(),
            sync.clone(),
            database.clone(),
            held.clone(),
            &config,
        );
        let writing = tokio::spawn(writer.run(receiver));
        tokio::spawn(watch_the_writer(
            writing,
            database.clone(),
            stop_the_process,
        ));
        Ok(Arc::new(Self {
            queue,
            journal,
            sync,
            database,
            held,
            held_cap: config.queue_capacity.max(1),
            db,
            flush_wait: config.write_timeout + FLUSH_GRACE,
        }))
    }

    /// The database the sink writes to.
    pub fn db(&self) -> &AuditDb {
        &self.db
    }
}

/// Set once the writer panicked: the process then stops and exits with an
/// error (`main`), so that systemd's `Restart=on-failure` or the
/// orchestrator starts a new one, which replays the journal.
static WRITER_PANICKED: AtomicBool = AtomicBool::new(false);

/// Whether the audit writer panicked: the service stopped for it.
pub fn writer_panicked() -> bool {
    WRITER_PANICKED.load(Ordering::Relaxed)
}

/// A writer that panicked (a bug) writes nothing again, though the journal
/// still takes every event. Say so, have `/readyz` answer 503 from then
/// on, and `stop`: a liveness probe on `/healthz` would never restart it.
async fn watch_the_writer(
    writing: tokio::task::JoinHandle<()>,
    database: Arc<AtomicBool>,
    stop: impl FnOnce(),
) {
    if let Err(e) = writing.await {
        if e.is_panic() {
            database.store(false, Ordering::Relaxed);
            WRITER_PANICKED.store(true, Ordering::Relaxed);
            tracing::error!(
                "the audit writer panicked: events are journaled but no longer written to the \
                 database; stopping, so that a new process replays them"
            );
            stop();
        }
    }
}

/// Asked by a writer that panicked, awaited by `startup::stop_signal`
/// beside `SIGTERM`. A signal to ourselves was lost when the writer
/// panicked during start-up, before the handler was installed: as PID 1
/// in a container the kernel drops it (the process ran on, unready for
/// good), and under systemd it killed the process as a clean stop, which
/// `Restart=on-failure` does not restart. A `Notify` keeps the request
/// until someone waits for it.
static STOP: tokio::sync::Notify = tokio::sync::Notify::const_new();

/// The graceful stop a `SIGTERM` starts (`startup::stop_signal`): the
/// listeners drain, the sink's flush journals what memory holds, and the
/// journal is fsync'd before the process exits.
fn stop_the_process() {
    STOP.notify_one();
}

/// Returns once the writer panicked and asked the service to stop, at
/// once if it did before this was called.
pub async fn stop_asked() {
    STOP.notified().await;
}

/// An event as JSON for a log line, a phone subject masked (`+86138****8000`).
fn loggable(event: &AuditEvent) -> String {
    let mut event = event.clone();
    if event.subject_kind == crate::domain::SubjectKind::Phone {
        event.subject = crate::domain::PhoneNumber::parse(&event.subject)
            .map_or_else(|_| "+***".to_string(), |p| p.masked());
    }
    serde_json::to_string(&event).unwrap_or_default()
}

/// The events held in memory past the journal's bound go to the journal
/// past it (at most `audit.queue_capacity` of them), each segment marked
/// for replay: the next process on the spool directory inserts them, or
/// this one if it goes on (ids already in the database are skipped, so an
/// insert under way that commits them too costs nothing). What the journal
/// still cannot take stays held.
fn journal_held(journal: &Journal, held: &Held) {
    let mut kept = Vec::new();
    let mut journaled = 0;
    for event in held.take() {
        match journal.append_past_bound(&event) {
            Some(segment) => {
                segment.mark_for_replay();
                journaled += 1;
            }
            None => kept.push(event),
        }
    }
    held.extend(kept);
    count("spooled", journaled);
    if journaled > 0 {
        tracing::info!(
            events = journaled,
            "audit events held in memory were journaled past audit.journal_max_bytes"
        );
    }
}

/// An event the queue did not take: its segment is replayed.
fn left_to_the_journal(message: Message) {
    if let Message::Event(_, segment) = message {
        segment.mark_for_replay();
        count("spooled", 1);
    }
}

/// An event neither the journal nor memory could keep.
fn dropped(event: &AuditEvent) {
    count("dropped", 1);
    if let Some(held_back) = DROP_LINES.admit() {
        tracing::error!(event = %loggable(event), held_back, "audit event lost: the journal and the queue are both full or failing");
    }
}

#[async_trait]
impl AuditSink for DbSink {
    fn record(&self, event: AuditEvent) {
        let Some(segment) = self.journal.append(&event) else {
            // Held, not queued: a flush finds it there even while the
            // writer is stuck in an insert, with this event behind it.
            match self.held.push_within(event, self.held_cap) {
                None => crate::metrics::audit_queued(),
                Some(event) => dropped(&event),
            }
            return;
        };
        match self
            .queue
            .try_send(Message::Event(Box::new(event), segment))
        {
            Ok(()) => crate::metrics::audit_queued(),
            Err(mpsc::error::TrySendError::Full(message)) => {
                if let Some(held_back) = FULL_LINES.admit() {
                    tracing::warn!(
                        capacity = self.held_cap,
                        held_back,
                        "audit queue full: the writer is behind; events are left to the journal and replayed from it"
                    );
                }
                left_to_the_journal(message);
            }
            Err(mpsc::error::TrySendError::Closed(message)) => left_to_the_journal(message),
        }
    }

    /// Everything queued so far is in the database or left to the journal,
    /// and the journal is fsync'd. The writer is waited for at most
    /// `flush_wait`: one stuck in a migration (which has no bound) or an
    /// insert must not hold a `SIGTERM`. Whatever it has not written is in
    /// the journal, which the next process on the spool directory replays:
    /// the events the journal took when they came, and those it did not,
    /// held in memory, journaled here past its bound, even those an insert
    /// still under way has taken or that came while it ran.
    async fn flush(&self) {
        let written = async {
            let (ack, done) = oneshot::channel();
            if self.queue.send(Message::Flush(ack)).await.is_ok() {
                let _ = done.await;
            }
        };
        if tokio::time::timeout(self.flush_wait, written)
            .await
            .is_err()
        {
            tracing::warn!(
                waited = ?self.flush_wait,
                "the audit writer did not finish in time; what it has not written waits in the journal for the next process"
            );
        }
        journal_held(&self.journal, &self.held);
        let (ack, done) = oneshot::channel();
        if self.sync.send(SyncCommand::Sync(ack)).is_ok() {
            let _ = done.await;
        }
    }

    /// From state, never a fresh probe: the writer's last word on the
    /// database, the journal's on its last write.
    fn health(&self) -> AuditHealth {
        AuditHealth {
            database: self.database.load(Ordering::Relaxed),
            journal: self.journal.healthy(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_writer_that_panicked_stops_the_service_and_one_that_ended_does_not() {
        let stopped = std::cell::Cell::new(false);
        let database = Arc::new(AtomicBool::new(true));
        watch_the_writer(tokio::spawn(async {}), database.clone(), || {
            stopped.set(true)
        })
        .await;
        assert!(database.load(Ordering::Relaxed), "after a clean end");
        assert!(!stopped.get() && !writer_panicked());

        let writing = tokio::spawn(async { panic!("a bug") });
        watch_the_writer(writing, database.clone(), || stopped.set(true)).await;
        assert!(!database.load(Ordering::Relaxed), "unready after a panic");
        assert!(stopped.get() && writer_panicked(), "and stopping");
    }

    /// A writer may panic before the service waits for a stop (during
    /// start-up): the request is kept for it.
    #[tokio::test]
    async fn a_stop_asked_before_anyone_waits_is_kept() {
        stop_the_process();
        let waited = tokio::time::timeout(std::time::Duration::from_secs(5), stop_asked()).await;
        assert!(waited.is_ok(), "the stop asked earlier was lost");
    }
}
