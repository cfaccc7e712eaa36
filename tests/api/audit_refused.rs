//! A row the audit database refuses (a constraint or trigger an operator
//! added to the table) neither stalls the trail nor is lost: the rest of
//! its batch goes in, it is kept in a `refused-*.jsonl` file, and once the
//! table takes it again, that file renamed `replay-*.jsonl` is replayed.

use std::time::{Duration, SystemTime};

use serde_json::json;
use tollgate::audit::journal::read_lines;
use tollgate::audit::{AuditDb, Journal};

use crate::audit_journal::{a_refusal, app_with};
use crate::support::audit_db::{DbKind, TestDb};
use crate::support::audit_trail::{all_rows, each_once, refused_send, request_id_counts};
use crate::support::wait::eventually;

const REFUSED: &str = "refused-by-the-table";

#[tokio::test]
async fn a_row_postgresql_refuses_is_kept_and_the_rest_goes_in() {
    a_refused_row_is_kept_and_the_rest_goes_in(DbKind::Postgres).await;
}

/// A trigger's `RAISE EXCEPTION` (SQLSTATE P0001, no constraint's class)
/// is a refusal too: taken for an outage, it held every later journal
/// segment behind the one with its row.
#[tokio::test]
async fn a_row_a_postgresql_trigger_refuses_is_kept_and_the_rest_goes_in() {
    let db = TestDb::new(DbKind::Postgres).await;
    a_refused_row_is_kept_and_the_rest_goes_in_with(db, By::Trigger).await;
}

#[tokio::test]
async fn a_row_sqlite_refuses_is_kept_and_the_rest_goes_in() {
    a_refused_row_is_kept_and_the_rest_goes_in(DbKind::Sqlite).await;
}

/// How the table refuses the row: PostgreSQL's constraint or trigger
/// (SQLite's is always a trigger).
#[derive(Clone, Copy)]
enum By {
    Constraint,
    Trigger,
}

async fn a_refused_row_is_kept_and_the_rest_goes_in(kind: DbKind) {
    let db = TestDb::new(kind).await;
    a_refused_row_is_kept_and_the_rest_goes_in_with(db, By::Constraint).await;
}

async fn a_refused_row_is_kept_and_the_rest_goes_in_with(db: TestDb, by: By) {
    let spool = db.spool_dir();
    let app = app_with(db.url.clone(), spool.clone(), false).await;
    let audit = db.connect().await;
    refuse(&audit, Some(by)).await;
    let series = "tollgate_audit_events_total{outcome=\"refused\"}";
    let refused_before = app.metric(series).await;

    assert_eq!(
        app.sms_send(json!({ "phone": "+8613800138000" }))
            .await
            .status,
        200
    );
    let taken: Vec<String> = (0..8).map(|i| format!("taken-{i}")).collect();
    for id in &taken[..4] {
        refused_send(&app, id).await;
    }
    refused_send(&app, REFUSED).await;
    for id in &taken[4..] {
        refused_send(&app, id).await;
    }
    app.flush_audit().await;

    let rows = all_rows(&audit).await;
    assert!(each_once(&rows, &taken), "{:?}", request_id_counts(&rows));
    assert!(!request_id_counts(&rows).contains_key(REFUSED));
    assert_eq!(
        app.get("/readyz").await.status,
        200,
        "the trail still records"
    );
    assert!(app.metric(series).await >= refused_before + 1.0);
    let kept = refused_files(&spool);
    assert_eq!(kept.len(), 1, "{kept:?}");
    let lines = read_lines(&kept[0]).unwrap();
    assert_eq!(lines.unread, 0);
    let ids: Vec<_> = lines.events.iter().map(|e| e.request_id.clone()).collect();
    assert_eq!(ids, [Some(REFUSED.to_string())]);

    // Later events are not held back behind it.
    refused_send(&app, "after-the-refusal").await;
    app.flush_audit().await;
    assert!(each_once(&all_rows(&audit).await, ["after-the-refusal"]));

    // Handed back while the table still refuses it, a replay keeps it
    // again in a file of its own and lets the handed-back one go.
    let back = hand_back(&kept[0], &spool, "replay-too-soon.jsonl");
    eventually(
        "refused again on replay",
        Duration::from_secs(30),
        || async { !back.exists() && refused_files(&spool).len() == 1 },
    )
    .await;
    assert!(!request_id_counts(&all_rows(&audit).await).contains_key(REFUSED));
    let kept = refused_files(&spool);
    let ids: Vec<_> = read_lines(&kept[0])
        .unwrap()
        .events
        .into_iter()
        .map(|e| e.request_id)
        .collect();
    assert_eq!(ids, [Some(REFUSED.to_string())]);

    // The operator lifts the constraint and hands the file back: replayed
    // once, like any leftover (a running process takes it a minute old).
    refuse(&audit, None).await;
    let back = hand_back(&kept[0], &spool, "replay-refused.jsonl");
    eventually(
        "the refused row replayed",
        Duration::from_secs(30),
        || async { each_once(&all_rows(&audit).await, [REFUSED]) },
    )
    .await;
    eventually(
        "the handed-back file deleted",
        Duration::from_secs(10),
        || async { !back.exists() },
    )
    .await;
    assert!(refused_files(&spool).is_empty());
}

/// Rename a file of refused events as a leftover to replay, a minute old
/// (a running process takes only those).
fn hand_back(file: &std::path::Path, spool: &std::path::Path, name: &str) -> std::path::PathBuf {
    let back = spool.join(name);
    std::fs::rename(file, &back).unwrap();
    let opened = std::fs::File::options().write(true).open(&back).unwrap();
    opened
        .set_modified(SystemTime::now() - Duration::from_secs(61))
        .unwrap();
    back
}

/// Files of refused events stop at `audit.journal_max_bytes` for a run: a
/// constraint refusing what any caller can send cannot fill the disk.
#[test]
fn files_of_refused_events_stop_at_the_journal_bound() {
    let dir = tempfile::tempdir().unwrap();
    let bound = 1 << 20;
    let journal = Journal::open(dir.path(), bound).unwrap();
    let events: Vec<_> = (0..1000).map(|i| a_refusal(&format!("user-{i}"))).collect();
    let first = journal
        .keep_refused(&events)
        .unwrap()
        .expect("within the bound");
    let size = std::fs::metadata(&first).unwrap().len();
    assert_eq!(read_lines(&first).unwrap().events, events);
    let mut kept = 1;
    while journal.keep_refused(&events).unwrap().is_some() {
        kept += 1;
        assert!(kept < 100, "no bound");
    }
    assert!(
        kept * size <= bound && (kept + 1) * size > bound,
        "{kept} x {size}"
    );
    assert_eq!(refused_files(dir.path()).len() as u64, kept);
    assert!(journal.sealed().is_empty(), "not segments to replay");
}

/// Add what makes the table refuse the row of [`REFUSED`] (`by`), or
/// drop it (`None`).
async fn refuse(audit: &AuditDb, by: Option<By>) {
    let statements: Vec<String> = match (audit, by) {
        (AuditDb::Postgres(_), Some(By::Constraint)) => vec![format!(
            "ALTER TABLE audit_events ADD CONSTRAINT refuse_one \
             CHECK (request_id IS DISTINCT FROM '{REFUSED}')"
        )],
        (AuditDb::Postgres(_), Some(By::Trigger)) => vec![
            format!(
                "CREATE FUNCTION refuse_one() RETURNS trigger LANGUAGE plpgsql AS $$ \
                 BEGIN IF NEW.request_id = '{REFUSED}' THEN \
                 RAISE EXCEPTION 'refused by an operator'; END IF; RETURN NEW; END $$"
            ),
            "CREATE TRIGGER refuse_one BEFORE INSERT ON audit_events \
             FOR EACH ROW EXECUTE FUNCTION refuse_one()"
                .to_string(),
        ],
        (AuditDb::Postgres(_), None) => vec![
            "ALTER TABLE audit_events DROP CONSTRAINT IF EXISTS refuse_one".to_string(),
            "DROP TRIGGER IF EXISTS refuse_one ON audit_events".to_string(),
            "DROP FUNCTION IF EXISTS refuse_one()".to_string(),
        ],
        (AuditDb::Sqlite(_), Some(_)) => vec![format!(
            "CREATE TRIGGER refuse_one BEFORE INSERT ON audit_events \
             WHEN NEW.request_id = '{REFUSED}' \
             BEGIN SELECT RAISE(ABORT, 'refused by an operator'); END"
        )],
        (AuditDb::Sqlite(_), None) => vec!["DROP TRIGGER refuse_one".to_string()],
    };
    for sql in statements {
        match audit {
            AuditDb::Postgres(pool) => {
                sqlx::query(&sql).execute(pool).await.unwrap();
            }
            AuditDb::Sqlite(pool) => {
                sqlx::query(&sql).execute(pool).await.unwrap();
            }
        }
    }
}

fn refused_files(spool: &std::path::Path) -> Vec<std::path::PathBuf> {
    std::fs::read_dir(spool)
        .unwrap()
        .filter_map(|e| Some(e.ok()?.path()))
        .filter(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with("refused-"))
        })
        .collect()
}
