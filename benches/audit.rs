//! Audit rows per second sustained through the sink (journal, queue → batch writer →
//! database), into PostgreSQL and SQLite. Prints plain figures:
//!
//!     cargo bench --bench audit
//!
//! PostgreSQL: `TOLLGATE_BENCH_DATABASE_URL` (default
//! `postgres://postgres@127.0.0.1:5432/postgres`); a scratch database is
//! created and dropped.

use std::time::{Duration, Instant};

use sqlx::Connection;
use tollgate::audit::query::EventFilter;
use tollgate::audit::{AuditDb, AuditDecision, AuditEvent, AuditSink, DbSink, Journal, SinkConfig};
use tollgate::domain::{Action, Subject, SubjectKind};

const EVENTS: usize = 100_000;

fn event(i: usize) -> AuditEvent {
    let subject = Subject::new(SubjectKind::Phone, format!("+86138{:08}", i % 50_000));
    let mut e = AuditEvent::new(
        Action::SmsSend,
        AuditDecision::Deny,
        "rate_limited",
        &subject,
    );
    e.rule = Some("phone 5/1h".into());
    e.observed = Some(5);
    e.limit = Some(5);
    e.window_ms = Some(3_600_000);
    e.retry_after_ms = Some(1_200_000);
    e.ip = Some(format!("203.0.113.{}", i % 250));
    e.request_id = Some(uuid::Uuid::now_v7().to_string());
    e.user_agent = Some("bench/1.0".into());
    e
}

async fn run(name: &str, url: &str) {
    let db = AuditDb::connect_lazy(url).expect("a valid database URL");
    db.migrate().await.expect("migrations apply");
    let spool = tempfile::tempdir().expect("a temporary directory");
    let journal = Journal::open(spool.path(), 1 << 30).expect("a usable journal directory");
    let sink = DbSink::start(
        db.clone(),
        journal,
        SinkConfig {
            batch_size: 500,
            flush_interval: Duration::from_millis(200),
            write_timeout: Duration::from_secs(10),
            queue_capacity: 10_000,
            journal_sync_interval: Duration::from_millis(200),
            retention: Duration::from_secs(90 * 86_400),
            prefix_digits: 7,
        },
        true,
    )
    .expect("the journal thread starts");
    let events: Vec<AuditEvent> = (0..EVENTS).map(event).collect();
    let started = Instant::now();
    for (i, e) in events.into_iter().enumerate() {
        sink.record(e);
        // Offer load at the pace a busy service would, not faster than the
        // queue drains: yield every 1,000 events.
        if i % 1_000 == 999 {
            tokio::task::yield_now().await;
        }
    }
    sink.flush().await;
    let elapsed = started.elapsed();
    let rows = db
        .page(&EventFilter::default(), None, EVENTS + 1)
        .await
        .map(|r| r.len())
        .unwrap_or(0);
    // A journal segment still there after the flush holds an event that
    // missed the database from memory (every event is journaled first).
    let segments = std::fs::read_dir(spool.path()).map(|d| {
        d.filter_map(|e| e.ok())
            .filter(|e| e.path().extension().is_some_and(|x| x == "jsonl"))
            .count()
    });
    let spooled = match segments {
        Ok(0) => "none spooled",
        Ok(_) => "some spooled",
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => "none spooled",
        Err(_) => "spool unreadable",
    };
    println!(
        "audit rows/s: {name} {:.0}   ({rows} rows in {:.2} s, batches of 500, {spooled})",
        rows as f64 / elapsed.as_secs_f64(),
        elapsed.as_secs_f64()
    );
}

#[tokio::main]
async fn main() {
    let admin_url = std::env::var("TOLLGATE_BENCH_DATABASE_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/postgres".into());
    match sqlx::PgConnection::connect(&admin_url).await {
        Ok(mut admin) => {
            let name = format!("tgbench_{}", uuid::Uuid::new_v4().simple());
            sqlx::query(&format!("CREATE DATABASE {name}"))
                .execute(&mut admin)
                .await
                .expect("create");
            let url = match admin_url.rfind('/') {
                Some(i) => format!("{}/{name}", &admin_url[..i]),
                None => format!("{admin_url}/{name}"),
            };
            run("postgres", &url).await;
            let _ = sqlx::query(&format!("DROP DATABASE {name} WITH (FORCE)"))
                .execute(&mut admin)
                .await;
        }
        Err(e) => println!("audit rows/s: postgres skipped ({e})"),
    }
    let dir = tempfile::tempdir().expect("a temporary directory");
    run(
        "sqlite",
        &format!(
            "sqlite://{}?mode=rwc",
            dir.path().join("bench.db").display()
        ),
    )
    .await;
}
