//! The durable audit trail: batches into the database, spooling while it is
//! down, replay exactly once, after a crash too, and drain on shutdown.

use std::time::Duration;

use serde_json::json;
use tollgate::audit::AuditDecision;
use tollgate::domain::{Action, SubjectKind};

use crate::on_both_databases;
use crate::support::app::{limits, spawn_app_with_audit_db, Backend, TestApp};
use crate::support::audit_db::{DbKind, FaultProxy, TestDb};
use crate::support::audit_trail::{all_rows, refused_send, request_id_counts};
use crate::support::process::Tollgate;
use crate::support::wait::eventually;

const PHONE: &str = "+8613800138000";

on_both_databases!(refused_requests_are_written_to_the_database,);

async fn app_on(db: &TestDb, configure: impl FnOnce(&mut tollgate::settings::Settings)) -> TestApp {
    let (url, spool) = (db.url.clone(), db.spool_dir());
    spawn_app_with_audit_db(Backend::Memory, move |s| {
        s.audit.database_url = tollgate::settings::SecretUrl::new(url);
        s.audit.spool_dir = spool.display().to_string();
        s.audit.flush_interval = Duration::from_millis(50);
        s.sms.phone_limits = limits(&[(1, 3_600_000)]);
        configure(s);
    })
    .await
}

async fn refused_requests_are_written_to_the_database(kind: DbKind) {
    let db = TestDb::new(kind).await;
    let app = app_on(&db, |_| {}).await;
    assert_eq!(app.sms_send(json!({ "phone": PHONE })).await.status, 200);
    for i in 0..3 {
        refused_send(&app, &format!("refused-{i}")).await;
    }
    app.flush_audit().await;

    let rows = all_rows(&db.connect().await).await;
    assert_eq!(rows.len(), 3, "allowed sends are not audited");
    let row = rows
        .iter()
        .find(|r| r.request_id.as_deref() == Some("refused-0"))
        .unwrap();
    assert_eq!(
        (row.action, row.decision, row.subject_kind),
        (Action::SmsSend, AuditDecision::Deny, SubjectKind::Phone)
    );
    assert_eq!(
        (row.subject.as_str(), row.reason.as_str()),
        (PHONE, "rate_limited")
    );
    assert_eq!(
        (row.rule.as_deref(), row.observed, row.limit, row.window_ms),
        (Some("phone 1/1h"), Some(1), Some(1), Some(3_600_000))
    );
    assert!(
        row.retry_after_ms.is_some_and(|ms| ms > 3_590_000),
        "{row:?}"
    );
    assert_eq!(row.ip.as_deref(), Some("127.0.0.1"));
    assert!(!row.shadow);
    assert!(
        rows.windows(2)
            .all(|w| (w[0].occurred_at, w[0].id) > (w[1].occurred_at, w[1].id)),
        "newest first"
    );
}

/// Under a flood the writer gathers several `batch_size`s per transaction
/// (the rollups and the commit cost per transaction); every event still
/// lands once. Rows a transaction inserted share its `xmin`.
#[tokio::test]
async fn a_flood_is_written_in_transactions_of_several_batches() {
    use sqlx::Connection;

    let db = TestDb::new(DbKind::Postgres).await;
    let app = app_on(&db, |s| {
        s.audit.batch_size = 10;
        // Long enough that no batch closes on time before it is full, however
        // slowly a loaded machine sends the waves; the flush closes the last.
        s.audit.flush_interval = Duration::from_secs(10);
    })
    .await;
    assert_eq!(app.sms_send(json!({ "phone": PHONE })).await.status, 200);
    let batches = "tollgate_audit_batches_total";
    let batches_before = app.metric(batches).await;
    for wave in 0..8 {
        let ids: Vec<String> = (0..50).map(|i| format!("flood-{wave}-{i}")).collect();
        futures::future::join_all(ids.iter().map(|id| refused_send(&app, id))).await;
    }
    app.flush_audit().await;

    let mut conn = sqlx::PgConnection::connect(&db.url).await.unwrap();
    let (rows, transactions): (i64, i64) =
        sqlx::query_as("SELECT count(*), count(DISTINCT xmin::text) FROM audit_events")
            .fetch_one(&mut conn)
            .await
            .unwrap();
    assert_eq!(rows, 400, "every refusal once");
    // One batch of 10 per transaction would be 40 of them; four per
    // transaction make about 11.
    assert!(
        transactions * 20 <= rows,
        "{rows} rows in {transactions} transactions"
    );
    // The recorder is the process's: other tests' batches may count too,
    // never fewer than these.
    let counted = app.metric(batches).await - batches_before;
    assert!(
        counted >= transactions as f64,
        "{batches} rose by {counted}, {transactions} transactions"
    );
}

#[tokio::test]
async fn a_cut_database_connection_loses_no_event_and_duplicates_none() {
    let db = TestDb::new(DbKind::Postgres).await;
    let proxy = FaultProxy::start("127.0.0.1:5432").await;
    let via_proxy = db.url_via(proxy.port);
    let app = spawn_app_with_audit_db(Backend::Memory, {
        let spool = db.spool_dir();
        move |s| {
            s.audit.database_url = tollgate::settings::SecretUrl::new(via_proxy);
            s.audit.spool_dir = spool.display().to_string();
            s.audit.flush_interval = Duration::from_millis(20);
            s.audit.batch_size = 7;
            s.audit.queue_capacity = 16;
            s.sms.phone_limits = limits(&[(1, 3_600_000)]);
        }
    })
    .await;
    assert_eq!(app.sms_send(json!({ "phone": PHONE })).await.status, 200);
    let outcome = |o: &str| format!("tollgate_audit_events_total{{outcome=\"{o}\"}}");
    let spooled_before = app.metric(&outcome("spooled")).await;
    let replayed_before = app.metric(&outcome("replayed")).await;

    let mut expected = Vec::new();
    for i in 0..20 {
        let id = format!("before-{i}");
        refused_send(&app, &id).await;
        expected.push(id);
    }
    app.flush_audit().await;
    proxy.cut();
    // Blocked requests keep coming while the database is unreachable; a burst
    // fills the 16-event queue, so some go to the spool straight from requests.
    let burst = (0..150).map(|i| format!("during-{i}")).collect::<Vec<_>>();
    futures::future::join_all(burst.iter().map(|id| refused_send(&app, id))).await;
    expected.extend(burst);
    app.flush_audit().await;
    proxy.restore();
    for i in 0..20 {
        let id = format!("after-{i}");
        refused_send(&app, &id).await;
        expected.push(id);
    }

    let pool = db.connect().await;
    eventually(
        "every event in the database",
        Duration::from_secs(30),
        || async {
            app.flush_audit().await;
            all_rows(&pool).await.len() >= expected.len()
        },
    )
    .await;
    let counts = request_id_counts(&all_rows(&pool).await);
    for id in &expected {
        assert_eq!(
            counts.get(id),
            Some(&1),
            "{id} must be recorded exactly once"
        );
    }
    assert_eq!(counts.len(), expected.len());
    // Every event of the outage went through the spool and came back.
    assert!(app.metric(&outcome("spooled")).await - spooled_before >= 150.0);
    assert!(app.metric(&outcome("replayed")).await - replayed_before >= 150.0);
    assert!(
        app.metric(&outcome("written")).await >= 20.0,
        "the events before the cut"
    );

    // And the admin API finds them all.
    let mut seen = 0;
    let mut cursor: Option<String> = None;
    loop {
        let path = match &cursor {
            Some(c) => format!("/admin/api/events?limit=500&cursor={c}"),
            None => "/admin/api/events?limit=500".to_string(),
        };
        let page = app.admin_get(&path).await;
        assert_eq!(page.status, 200, "{}", page.body);
        seen += page.body["events"].as_array().unwrap().len();
        match page.body["next_cursor"].as_str() {
            Some(c) => cursor = Some(c.to_string()),
            None => break,
        }
    }
    assert_eq!(seen, expected.len());
}

fn write_config(
    dir: &std::path::Path,
    name: &str,
    database_url: &str,
    flush_interval: &str,
) -> std::path::PathBuf {
    let path = dir.join(name);
    let spool = dir.join("spool");
    std::fs::write(
        &path,
        format!(
            r#"
[server]
bind = "127.0.0.1:0"
[audit]
database_url = "{database_url}"
spool_dir = "{}"
flush_interval = "{flush_interval}"
[sms]
phone_limits = [{{ limit = 1, window = "1h" }}]
"#,
            spool.display()
        ),
    )
    .unwrap();
    path
}

fn spooled_text(dir: &std::path::Path) -> String {
    std::fs::read_dir(dir.join("spool"))
        .map(|entries| {
            entries
                .filter_map(|e| e.ok())
                .filter_map(|e| std::fs::read_to_string(e.path()).ok())
                .collect()
        })
        .unwrap_or_default()
}

#[tokio::test]
async fn a_process_killed_mid_spool_replays_everything_after_restart_and_drains_on_sigterm() {
    let db = TestDb::new(DbKind::Postgres).await;
    let dir = db.dir.path().to_path_buf();
    let client = reqwest::Client::new();

    // 1. The database is unreachable: every refusal goes to the spool.
    let down = write_config(
        &dir,
        "down.toml",
        "postgres://postgres@127.0.0.1:1/nowhere",
        "20ms",
    );
    let first = Tollgate::start(&down).await;
    let sent = client
        .post(format!("{}/sms/send", first.address))
        .json(&json!({ "phone": PHONE }))
        .send()
        .await
        .unwrap();
    assert_eq!(sent.status(), 200, "{:?}", sent.text().await);
    let ids: Vec<String> = (0..40).map(|i| format!("killed-{i}")).collect();
    for id in &ids {
        first.refused_send(&client, id).await;
    }
    eventually(
        "every refusal in the spool",
        Duration::from_secs(30),
        || {
            let text = spooled_text(&dir);
            let all = ids.iter().all(|id| text.contains(&format!("\"{id}\"")));
            async move { all }
        },
    )
    .await;
    let mut first = first;
    first.child.start_kill().unwrap(); // SIGKILL: no drain, no goodbye
    first.child.wait().await.unwrap();

    // 2. Restarted with the database back: the spool is replayed exactly once.
    let up = write_config(&dir, "up.toml", &db.url, "10s");
    let second = Tollgate::start(&up).await;
    let pool = db.connect().await;
    eventually("the spool replayed", Duration::from_secs(30), || async {
        all_rows(&pool).await.len() >= ids.len()
    })
    .await;
    let counts = request_id_counts(&all_rows(&pool).await);
    for id in &ids {
        assert_eq!(counts.get(id), Some(&1), "{id} exactly once");
    }

    // 3. SIGTERM drains what is still queued (the flush interval is 10 s).
    let sent = client
        .post(format!("{}/sms/send", second.address))
        .json(&json!({ "phone": PHONE }))
        .send()
        .await
        .unwrap();
    assert_eq!(sent.status(), 200, "a fresh process has fresh windows");
    let queued: Vec<String> = (0..5).map(|i| format!("queued-{i}")).collect();
    for id in &queued {
        second.refused_send(&client, id).await;
    }
    second.signal("-TERM");
    let mut second = second;
    let status = tokio::time::timeout(Duration::from_secs(30), second.child.wait())
        .await
        .expect("tollgate stops within 30 s")
        .unwrap();
    assert!(status.success(), "exit status {status:?}");
    let counts = request_id_counts(&all_rows(&pool).await);
    for id in &queued {
        assert_eq!(counts.get(id), Some(&1), "{id} drained on shutdown");
    }
}
