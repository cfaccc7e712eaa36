//! The durable sink: requests enqueue (never waiting for the database); one
//! writer task inserts in batches. When the database fails, the writer
//! retries, then spools the batch to disk and keeps spooling until a probe
//! succeeds, then replays the spool. A full queue hands its events to a spool
//! thread of their own, which appends them in batches (one fsync each): a
//! request thread never writes to disk.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use metrics::counter;
use tokio::sync::{mpsc, oneshot};
use tokio::time::Instant;

use super::db::{AuditDb, AuditError};
use super::spool::{read_events, Spool};
use super::{AuditEvent, AuditSink};
use crate::metrics::AUDIT_EVENTS;

enum Message {
    Event(Box<AuditEvent>),
    Flush(oneshot::Sender<()>),
}

/// How a `DbSink` batches and where it spools: the `[audit]` settings.
#[derive(Debug, Clone)]
pub struct SinkConfig {
    /// Most events per insert.
    pub batch_size: usize,
    /// Longest an event waits for its batch to fill.
    pub flush_interval: Duration,
    /// Events the in-memory queue holds; further ones go to the spool.
    pub queue_capacity: usize,
    /// Directory of the spool files.
    pub spool_dir: std::path::PathBuf,
}

/// The production sink: a bounded queue in front of one batch writer, and
/// the spool for when the database is down or the queue is full.
pub struct DbSink {
    queue: mpsc::Sender<Message>,
    overflow: std::sync::mpsc::Sender<Message>,
    db: AuditDb,
}

fn count(outcome: &'static str, n: usize) {
    counter!(AUDIT_EVENTS, "outcome" => outcome).increment(n as u64);
}

impl DbSink {
    /// Start the writer task; it migrates the database itself (retrying while
    /// it is down) and first replays whatever an earlier run left spooled.
    pub fn start(db: AuditDb, config: SinkConfig) -> Arc<Self> {
        let (queue, receiver) = mpsc::channel(config.queue_capacity.max(1));
        let spool = Arc::new(Spool::new(&config.spool_dir));
        let writer = Writer {
            db: db.clone(),
            spool: spool.clone(),
            batch_size: config.batch_size.max(1),
            flush_interval: config.flush_interval,
            migrated: false,
            retry_at: None,
            backoff: Duration::ZERO,
        };
        tokio::spawn(writer.run(receiver));
        let (overflow, overflowed) = std::sync::mpsc::channel();
        let spooler = spool.clone();
        if let Err(e) = std::thread::Builder::new()
            .name("audit-spool".into())
            .spawn(move || spool_overflow(&spooler, overflowed))
        {
            // Without the thread, sends to `overflow` fail and `record` logs
            // the events instead; the queue still serves.
            tracing::error!(error = %e, "cannot start the audit spool thread");
        }
        Arc::new(Self {
            queue,
            overflow,
            db,
        })
    }

    /// The database the sink writes to.
    pub fn db(&self) -> &AuditDb {
        &self.db
    }
}

/// The overflow spooler: appends what a full queue handed over, as many
/// events per fsync as have arrived meanwhile, and answers flushes once what
/// came before them is on disk. Ends when the sink is dropped.
fn spool_overflow(spool: &Spool, overflowed: std::sync::mpsc::Receiver<Message>) {
    const MOST_PER_APPEND: usize = 10_000;
    let mut events = Vec::new();
    let mut acks = Vec::new();
    while let Ok(first) = overflowed.recv() {
        take(first, &mut events, &mut acks);
        while events.len() < MOST_PER_APPEND {
            match overflowed.try_recv() {
                Ok(message) => take(message, &mut events, &mut acks),
                Err(_) => break,
            }
        }
        if !events.is_empty() {
            append_or_log(spool, &events);
            events.clear();
        }
        for ack in acks.drain(..) {
            let _ = ack.send(());
        }
    }
}

/// Append to the spool; when the disk refuses too, the log is the last place
/// left for the events (phones masked: logs travel further than the audit
/// database).
fn append_or_log(spool: &Spool, events: &[AuditEvent]) {
    match spool.append(events) {
        Ok(()) => count("spooled", events.len()),
        Err(e) => {
            for event in events {
                tracing::error!(error = %e, event = %loggable(event), "audit event could not be spooled");
            }
        }
    }
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

#[async_trait]
impl AuditSink for DbSink {
    fn record(&self, event: AuditEvent) {
        match self.queue.try_send(Message::Event(Box::new(event))) {
            Ok(()) => count("queued", 1),
            Err(mpsc::error::TrySendError::Full(message))
            | Err(mpsc::error::TrySendError::Closed(message)) => {
                if let Err(std::sync::mpsc::SendError(Message::Event(event))) =
                    self.overflow.send(message)
                {
                    tracing::error!(event = %loggable(&event), "audit event could not be handed to the spool");
                }
            }
        }
    }

    /// Overflowed events first (on disk once the spool thread answers), then
    /// the queue.
    async fn flush(&self) {
        let (ack, done) = oneshot::channel();
        if self.overflow.send(Message::Flush(ack)).is_ok() {
            let _ = done.await;
        }
        let (ack, done) = oneshot::channel();
        if self.queue.send(Message::Flush(ack)).await.is_ok() {
            let _ = done.await;
        }
    }

    async fn ready(&self) -> bool {
        matches!(
            tokio::time::timeout(Duration::from_secs(2), self.db.ping()).await,
            Ok(Ok(()))
        )
    }
}

struct Writer {
    db: AuditDb,
    spool: Arc<Spool>,
    batch_size: usize,
    flush_interval: Duration,
    migrated: bool,
    /// While set and in the future, batches go straight to the spool.
    retry_at: Option<Instant>,
    backoff: Duration,
}

const MAX_BACKOFF: Duration = Duration::from_secs(5);
const BACKLOG_BATCHES: usize = 8;
const INSERT_TRIES: u32 = 3;

impl Writer {
    async fn run(mut self, mut queue: mpsc::Receiver<Message>) {
        self.replay().await;
        let mut batch: Vec<AuditEvent> = Vec::with_capacity(self.batch_size);
        let mut acks: Vec<oneshot::Sender<()>> = Vec::new();
        let mut messages = Vec::with_capacity(self.batch_size);
        let mut closed = false;
        while !closed {
            // Wait for a first message, then gather until the batch is full,
            // the flush interval has passed, or someone asks for a flush. A
            // backlog is taken whole, up to BACKLOG_BATCHES batches at once:
            // one transaction (SQLite) or one statement (PostgreSQL) for all
            // of it, since a commit, not a row, is what costs.
            let first = queue.recv_many(&mut messages, self.batch_size * BACKLOG_BATCHES);
            match tokio::time::timeout(self.flush_interval, first).await {
                Ok(0) => closed = true,
                Ok(_) => take_all(&mut messages, &mut batch, &mut acks),
                Err(_) => {}
            }
            let deadline = Instant::now() + self.flush_interval;
            while !closed && acks.is_empty() && !batch.is_empty() && batch.len() < self.batch_size {
                let more = queue.recv_many(&mut messages, self.batch_size - batch.len());
                match tokio::time::timeout_at(deadline, more).await {
                    Ok(0) => closed = true,
                    Ok(_) => take_all(&mut messages, &mut batch, &mut acks),
                    Err(_) => break,
                }
            }
            if !batch.is_empty() {
                let events = std::mem::take(&mut batch);
                self.write(events).await;
            }
            if self.probe_due() && self.spool.has_backlog() {
                self.replay().await;
            }
            for ack in acks.drain(..) {
                let _ = ack.send(());
            }
        }
    }

    fn probe_due(&self) -> bool {
        self.retry_at.is_none_or(|at| Instant::now() >= at)
    }

    async fn write(&mut self, events: Vec<AuditEvent>) {
        if !self.probe_due() {
            self.spool(&events);
            return;
        }
        match self.insert_with_retries(&events).await {
            Ok(()) => {
                count("written", events.len());
                if self.retry_at.take().is_some() {
                    tracing::info!("audit database is back");
                }
                self.backoff = Duration::ZERO;
            }
            Err(e) => {
                tracing::warn!(error = %e, events = events.len(), "audit database unavailable, spooling");
                self.spool(&events);
                self.degrade();
            }
        }
    }

    async fn insert_with_retries(&mut self, events: &[AuditEvent]) -> Result<(), AuditError> {
        let mut pause = Duration::from_millis(100);
        let mut tries = 0;
        loop {
            tries += 1;
            match self.insert(events).await {
                Ok(()) => return Ok(()),
                Err(e) if tries >= INSERT_TRIES => return Err(e),
                Err(_) => {
                    tokio::time::sleep(pause).await;
                    pause *= 2;
                }
            }
        }
    }

    async fn insert(&mut self, events: &[AuditEvent]) -> Result<(), AuditError> {
        if !self.migrated {
            self.db.migrate().await?;
            self.migrated = true;
        }
        self.db.insert(events).await.map(|_| ())
    }

    fn spool(&self, events: &[AuditEvent]) {
        append_or_log(&self.spool, events);
    }

    fn degrade(&mut self) {
        self.backoff = (self.backoff * 2).clamp(Duration::from_millis(250), MAX_BACKOFF);
        self.retry_at = Some(Instant::now() + self.backoff);
    }

    /// Insert every spooled file, oldest first; a file is deleted only once all
    /// its events are in. Stops (and backs off) at the first failure.
    async fn replay(&mut self) {
        let files = match self.spool.take_for_replay() {
            Ok(files) => files,
            Err(e) => {
                tracing::error!(error = %e, "cannot read the audit spool");
                return;
            }
        };
        for file in files {
            let events = match read_events(&file) {
                Ok(events) => events,
                Err(e) => {
                    tracing::error!(error = %e, file = %file.display(), "cannot read a spool file");
                    return;
                }
            };
            for chunk in events.chunks(self.batch_size) {
                if let Err(e) = self.insert(chunk).await {
                    tracing::warn!(error = %e, "audit database unavailable, replay postponed");
                    self.degrade();
                    return;
                }
            }
            if let Err(e) = std::fs::remove_file(&file) {
                tracing::error!(error = %e, file = %file.display(), "cannot delete a replayed spool file");
                return;
            }
            count("replayed", events.len());
            tracing::info!(events = events.len(), "replayed spooled audit events");
        }
        self.retry_at = None;
        self.backoff = Duration::ZERO;
    }
}

fn take_all(
    messages: &mut Vec<Message>,
    batch: &mut Vec<AuditEvent>,
    acks: &mut Vec<oneshot::Sender<()>>,
) {
    for message in messages.drain(..) {
        take(message, batch, acks);
    }
}

fn take(message: Message, batch: &mut Vec<AuditEvent>, acks: &mut Vec<oneshot::Sender<()>>) {
    match message {
        Message::Event(event) => batch.push(*event),
        Message::Flush(ack) => acks.push(ack),
    }
}
