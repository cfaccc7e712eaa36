//! The trail at attack scale: daily partitions (PostgreSQL) made for the
//! retention period and on demand, retention by whole partitions (batched
//! deletes on SQLite), an upgrade from the unpartitioned schema that keeps
//! every row, rollups equal to the rows they count, and `/admin/api/stats`.

use std::collections::BTreeMap;
use std::time::Duration;

use chrono::{DateTime, Utc};
use serde_json::json;
use sqlx::Connection;
use tollgate::audit::db::partitions;
use tollgate::audit::query::EventFilter;
use tollgate::audit::rollup::{self, TopList};
use tollgate::audit::{retention, AuditDb, AuditDecision, AuditEvent};
use tollgate::domain::admin_role::Role;
use tollgate::domain::{Action, Subject, SubjectKind};
use tollgate::settings::{AdminToken, NamedAdminToken, Secret};

use crate::on_both_databases;
use crate::support::app::{spawn_app_with_audit_db, Backend, TestApp, ADMIN_TOKEN};
use crate::support::audit_db::{pg_pool, DbKind, TestDb};

/// `audit.read_timeout` as shipped.
const READ_BOUND: Duration = Duration::from_secs(10);
use crate::support::audit_trail::{all_rows, assert_rollups_match};

on_both_databases!(
    concurrent_writers_merge_rollups_without_deadlock,
    retention_cuts_whole_days_or_hours_past_it_and_their_rollups,
    an_upgrade_from_the_unpartitioned_schema_keeps_every_row_and_rolls_it_up,
    rollups_count_only_rows_that_were_new,
    stats_answers_counts_and_top_lists_from_the_rollups,
    a_crowd_of_subjects_gives_approximate_top_lists_within_their_bound,
    tied_top_entries_are_ordered_by_their_bytes,
);

fn refusal(kind: SubjectKind, id: &str, at: DateTime<Utc>) -> AuditEvent {
    let mut e = AuditEvent::new(
        Action::LoginAttempt,
        AuditDecision::Deny,
        "user_locked",
        &Subject::new(kind, id),
    );
    e.id = uuid::Uuid::now_v7();
    // Milliseconds, as the trail keeps them.
    e.occurred_at = DateTime::from_timestamp_millis(at.timestamp_millis()).expect("a valid time");
    e.ip = Some("203.0.113.7".into());
    e
}

fn days_ago(days: i64) -> DateTime<Utc> {
    Utc::now() - chrono::Duration::days(days)
}

async fn retention_cuts_whole_days_or_hours_past_it_and_their_rollups(kind: DbKind) {
    let db = TestDb::new(kind).await;
    let audit = db.connect().await;
    let fresh = refusal(SubjectKind::User, "alice", Utc::now());
    let recent = refusal(SubjectKind::User, "bob", days_ago(10));
    let old = refusal(SubjectKind::User, "carol", days_ago(91));
    let older = refusal(SubjectKind::User, "dave", days_ago(120));
    // A day without a partition gets one on demand (PostgreSQL).
    audit
        .insert(&[fresh.clone(), recent.clone(), old, older], 7)
        .await
        .unwrap();
    assert_rollups_match(&audit).await;

    let cut = retention::apply(&audit, Duration::from_secs(90 * 86_400), Utc::now())
        .await
        .unwrap();
    assert!(!cut.skipped);
    let left: Vec<String> = all_rows(&audit)
        .await
        .into_iter()
        .map(|r| r.subject)
        .collect();
    assert_eq!(left, ["alice", "bob"]);
    match kind {
        DbKind::Postgres => {
            assert_eq!(
                cut.partitions,
                [
                    partitions::name(partitions::day(days_ago(120))),
                    partitions::name(partitions::day(days_ago(91)))
                ]
            );
        }
        DbKind::Sqlite => assert_eq!(cut.rows, 2),
    }
    assert_rollups_match(&audit).await;

    // Top summaries are kept only as long as a period reads them: bob's
    // (ten days ago) are gone, alice's (now) are there; counts stay.
    let (old_tops, new_tops): (i64, i64) = {
        const SQL: &str = "SELECT CAST(COALESCE(SUM(CASE WHEN start_ms < $1 THEN 1 ELSE 0 END), 0) AS BIGINT), \
                                  CAST(COALESCE(SUM(CASE WHEN start_ms >= $1 THEN 1 ELSE 0 END), 0) AS BIGINT) FROM audit_top";
        let since = days_ago(2).timestamp_millis();
        match &audit {
            AuditDb::Postgres(pool) => sqlx::query_as(SQL).bind(since).fetch_one(pool).await,
            AuditDb::Sqlite(pool) => sqlx::query_as(SQL).bind(since).fetch_one(pool).await,
        }
        .unwrap()
    };
    assert_eq!(
        old_tops, 0,
        "summaries older than any period's reach are trimmed"
    );
    assert!(new_tops > 0);

    // Nothing more to cut: the same call again removes nothing.
    let again = retention::apply(&audit, Duration::from_secs(90 * 86_400), Utc::now())
        .await
        .unwrap();
    assert!(again.partitions.is_empty() && again.rows == 0, "{again:?}");
}

/// An instance whose clock is far ahead (a bad RTC at boot, an NTP step)
/// cuts at the database's clock, not its own: it cannot drop the shared
/// trail's days as past retention.
#[tokio::test]
async fn a_clock_far_ahead_cuts_nothing_the_databases_clock_keeps() {
    let db = TestDb::new(DbKind::Postgres).await;
    let audit = db.connect().await;
    let fresh = refusal(SubjectKind::User, "alice", Utc::now());
    let recent = refusal(SubjectKind::User, "bob", days_ago(10));
    let old = refusal(SubjectKind::User, "carol", days_ago(91));
    audit.insert(&[fresh, recent, old], 7).await.unwrap();

    let ahead = Utc::now() + chrono::Duration::days(400);
    let cut = retention::apply(&audit, Duration::from_secs(90 * 86_400), ahead)
        .await
        .unwrap();

    let left: Vec<String> = all_rows(&audit)
        .await
        .into_iter()
        .map(|r| r.subject)
        .collect();
    assert_eq!(left, ["alice", "bob"], "{cut:?}");
    assert_rollups_match(&audit).await;
}

/// A retention of years makes its partitions a month a transaction: in one,
/// their locks would pass PostgreSQL's lock table (out of shared memory,
/// for every session of the server) and retention would never run. (About
/// 13,500 locks in one: past the 6,400 of a default server, not of one with
/// a larger `max_connections` or `max_locks_per_transaction`.)
#[tokio::test]
async fn partitions_of_a_retention_of_years_are_made() {
    let db = TestDb::new(DbKind::Postgres).await;
    let audit = db.connect().await;
    let old = refusal(SubjectKind::User, "old", days_ago(1_600));
    audit.insert(&[old], 7).await.unwrap();
    let cut = retention::apply(&audit, Duration::from_secs(1_500 * 86_400), Utc::now())
        .await
        .unwrap();
    assert_eq!(
        cut.partitions,
        [partitions::name(partitions::day(days_ago(1_600)))]
    );
    let have = partitions::existing(pg_pool(&audit)).await.unwrap();
    let today = partitions::day(Utc::now());
    for day in partitions::days(partitions::day(days_ago(1_500)), today) {
        assert!(have.contains(&day), "{day} has a partition");
    }
}

#[tokio::test]
async fn partitions_cover_the_retention_period_and_days_ahead_for_plain_sql_too() {
    let db = TestDb::new(DbKind::Postgres).await;
    let audit = db.connect().await;
    retention::apply(&audit, Duration::from_secs(30 * 86_400), Utc::now())
        .await
        .unwrap();
    let pool = pg_pool(&audit);
    let have = partitions::existing(pool).await.unwrap();
    let today = partitions::day(Utc::now());
    let first = partitions::day(days_ago(30));
    let last = today + chrono::Days::new(tollgate::audit::db::PARTITION_DAYS_AHEAD);
    for day in partitions::days(first, last) {
        assert!(have.contains(&day), "{day} has a partition");
    }

    // Plain SQL (an import, a restore) can write any time within retention.
    for at in [days_ago(29), Utc::now() + chrono::Duration::days(6)] {
        sqlx::query(
            "INSERT INTO audit_events (id, occurred_at, action, decision, reason, subject_kind, subject) \
             VALUES ($1, $2, 'login_attempt', 'deny', 'user_locked', 'user', 'imported')",
        )
        .bind(uuid::Uuid::now_v7())
        .bind(at)
        .execute(pool)
        .await
        .unwrap_or_else(|e| panic!("a row of {at} is insertable: {e}"));
    }

    // The writer's path makes a day far ahead on demand.
    let far = refusal(
        SubjectKind::User,
        "eve",
        Utc::now() + chrono::Duration::days(40),
    );
    assert_eq!(audit.insert(&[far], 7).await.unwrap(), 1);
    let have = partitions::existing(pool).await.unwrap();
    assert!(have.contains(&partitions::day(Utc::now() + chrono::Duration::days(40))));
}

/// The idle writer's probe (`check_table`, every second) asks the parent
/// table alone: planned over every partition it took PostgreSQL 8-9 ms of
/// CPU each time. Asked of the parent, it opens no partition, so it answers
/// while today's is locked against every reader; a read of the whole table
/// waits on that lock.
#[tokio::test]
async fn the_idle_probe_reads_the_parent_table_alone() {
    let db = TestDb::new(DbKind::Postgres).await;
    let audit = db.connect().await;
    let mut holder = sqlx::PgConnection::connect(&db.url).await.unwrap();
    let mut lock = holder.begin().await.unwrap();
    let today = partitions::name(partitions::day(Utc::now()));
    sqlx::query(&format!("LOCK TABLE {today} IN ACCESS EXCLUSIVE MODE"))
        .execute(&mut *lock)
        .await
        .unwrap();

    tokio::time::timeout(Duration::from_secs(5), audit.check_table())
        .await
        .expect("the probe opens no partition")
        .unwrap();
    // The same question of the whole table waits on the lock.
    let mut reader = sqlx::PgConnection::connect(&db.url).await.unwrap();
    let reader_pid: i32 = sqlx::query_scalar("SELECT pg_backend_pid()")
        .fetch_one(&mut reader)
        .await
        .unwrap();
    let whole = tokio::spawn(async move {
        sqlx::query("SELECT 1 FROM audit_events LIMIT 1")
            .execute(&mut reader)
            .await
            .map(drop)
    });
    crate::support::wait::eventually(
        "a read of every partition waits on the lock",
        Duration::from_secs(10),
        || async {
            let waits: Option<bool> = sqlx::query_scalar(
                "SELECT wait_event_type = 'Lock' FROM pg_stat_activity WHERE pid = $1",
            )
            .bind(reader_pid)
            .fetch_optional(pg_pool(&audit))
            .await
            .unwrap()
            .flatten();
            waits == Some(true)
        },
    )
    .await;
    lock.rollback().await.unwrap();
    whole
        .await
        .unwrap()
        .expect("the read goes on once the lock is gone");
}

/// The partition an insert makes on demand waits on the lock a retention
/// cut holds while its detach waits on readers. With the writer's bound,
/// PostgreSQL ends that wait: no server process is left waiting on it
/// behind a writer that gave up.
#[tokio::test]
async fn a_partition_made_on_demand_waits_no_longer_than_the_bound() {
    let db = TestDb::new(DbKind::Postgres).await;
    let audit = db.connect().await;
    let mut holder = sqlx::PgConnection::connect(&db.url).await.unwrap();
    sqlx::query("SELECT pg_advisory_lock($1)")
        .bind(partitions::CREATE_LOCK)
        .execute(&mut holder)
        .await
        .unwrap();
    let ahead = refusal(SubjectKind::User, "ahead", days_ago(-40));
    let day = partitions::day(ahead.occurred_at);
    assert!(!partitions::existing(pg_pool(&audit))
        .await
        .unwrap()
        .contains(&day));

    let bound = Duration::from_secs(1);
    let insert = audit.insert_within(std::slice::from_ref(&ahead), 7, Some(bound));
    let refused = tokio::time::timeout(Duration::from_secs(20), insert)
        .await
        .expect("PostgreSQL ends the wait at the bound");
    assert!(refused.is_err(), "the partition could not be made");
    let waiting: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM pg_stat_activity \
         WHERE datname = current_database() AND wait_event = 'advisory'",
    )
    .fetch_one(pg_pool(&audit))
    .await
    .unwrap();
    assert_eq!(waiting, 0, "nothing waits on the lock");

    sqlx::query("SELECT pg_advisory_unlock($1)")
        .bind(partitions::CREATE_LOCK)
        .execute(&mut holder)
        .await
        .unwrap();
    audit
        .insert_within(std::slice::from_ref(&ahead), 7, Some(bound))
        .await
        .expect("made once the lock is free");
    assert!(partitions::existing(pg_pool(&audit))
        .await
        .unwrap()
        .contains(&day));
}

#[tokio::test]
async fn tollgate_migrate_makes_the_partitions_of_the_retention_period() {
    let db = TestDb::new(DbKind::Postgres).await;
    let (ok, _, stderr) = crate::support::app::run_binary(
        &["migrate"],
        &[
            ("TOLLGATE__AUDIT__DATABASE_URL", &db.url),
            ("TOLLGATE__AUDIT__RETENTION", "20d"),
        ],
    );
    assert!(ok, "{stderr}");
    let audit = db.connect().await;
    let pool = pg_pool(&audit);
    let have = partitions::existing(pool).await.unwrap();
    assert!(have.contains(&partitions::day(days_ago(20))), "{have:?}");
    assert!(!have.contains(&partitions::day(days_ago(22))), "{have:?}");
}

/// The migrations before partitions and rollups, as an older tollgate
/// applied them.
async fn migrate_as_before(db: &TestDb) -> AuditDb {
    db.migrated_before(20261126000000).await
}

/// Rows written as the old schema's writer wrote them: one INSERT per row.
async fn insert_the_old_way(audit: &AuditDb, events: &[AuditEvent]) {
    const SQL: &str = "INSERT INTO audit_events (id, occurred_at, action, decision, reason, \
        subject_kind, subject, ip, retry_after_ms, shadow) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10)";
    for e in events {
        match audit {
            AuditDb::Postgres(pool) => sqlx::query(SQL)
                .bind(e.id)
                .bind(e.occurred_at)
                .bind(e.action.as_str())
                .bind(e.decision.as_str())
                .bind(&e.reason)
                .bind(e.subject_kind.as_str())
                .bind(&e.subject)
                .bind(&e.ip)
                .bind(e.retry_after_ms)
                .bind(e.shadow)
                .execute(pool)
                .await
                .map(drop),
            AuditDb::Sqlite(pool) => sqlx::query(SQL)
                .bind(e.id.to_string())
                .bind(e.occurred_at.format("%Y-%m-%dT%H:%M:%S%.3fZ").to_string())
                .bind(e.action.as_str())
                .bind(e.decision.as_str())
                .bind(&e.reason)
                .bind(e.subject_kind.as_str())
                .bind(&e.subject)
                .bind(&e.ip)
                .bind(e.retry_after_ms)
                .bind(e.shadow)
                .execute(pool)
                .await
                .map(drop),
        }
        .unwrap();
    }
}

async fn an_upgrade_from_the_unpartitioned_schema_keeps_every_row_and_rolls_it_up(kind: DbKind) {
    let db = TestDb::new(kind).await;
    let old = migrate_as_before(&db).await;
    let mut events = Vec::new();
    for (i, days) in [0, 0, 1, 5, 33, 33, 80].into_iter().enumerate() {
        let mut e = refusal(
            SubjectKind::Phone,
            &format!("+861380013800{i}"),
            days_ago(days),
        );
        e.retry_after_ms = Some(60_000);
        e.shadow = i == 1;
        events.push(e);
    }
    // A three-day lock from two days ago: still running after the upgrade.
    let mut lock = refusal(SubjectKind::User, "alice", days_ago(2));
    lock.decision = AuditDecision::Lock;
    lock.retry_after_ms = Some(3 * 86_400_000);
    events.push(lock);
    insert_the_old_way(&old, &events).await;

    let audit = db.connect().await; // migrates to today's schema
    let mut rows = all_rows(&audit).await;
    rows.sort_by_key(|r| r.id);
    let mut expected: Vec<AuditEvent> = events
        .iter()
        .map(|e| AuditEvent {
            rule: None,
            request_id: None,
            user_agent: None,
            ..e.clone()
        })
        .collect();
    expected.sort_by_key(|e| e.id);
    assert_eq!(rows, expected, "every row, unchanged");
    assert_rollups_match(&audit).await;
    let now = Utc::now();
    let span = tollgate::audit::stats::Span::ending_at(now, 3_600_000, 24);
    let limits = tollgate::audit::stats::Limits { top: 10, locks: 10 };
    let overview = audit
        .overview(&span, now, limits, READ_BOUND)
        .await
        .unwrap();
    let locked: Vec<&str> = overview
        .locks
        .iter()
        .map(|l| l.subject.id.as_str())
        .collect();
    assert_eq!(locked, ["alice"], "the old lock row is found as running");
    if let AuditDb::Postgres(pool) = &audit {
        let have = partitions::existing(pool).await.unwrap();
        for days in [0, 1, 5, 33, 80] {
            assert!(have.contains(&partitions::day(days_ago(days))));
        }
    }
    // And the upgraded trail takes new rows.
    let new = refusal(SubjectKind::User, "bob", Utc::now());
    assert_eq!(audit.insert(&[new], 7).await.unwrap(), 1);
    assert_rollups_match(&audit).await;
}

async fn rollups_count_only_rows_that_were_new(kind: DbKind) {
    let db = TestDb::new(kind).await;
    let audit = db.connect().await;
    let batch: Vec<AuditEvent> = (0..50)
        .map(|i| refusal(SubjectKind::User, &format!("u{}", i % 7), Utc::now()))
        .collect();
    assert_eq!(audit.insert(&batch, 7).await.unwrap(), 50);
    // A replay of the same batch (a journal after a crash) adds nothing.
    assert_eq!(audit.insert(&batch, 7).await.unwrap(), 0);
    assert_eq!(audit.insert(&batch[..10], 7).await.unwrap(), 0);
    // Old rows among new ones (a replay of a segment partly inserted): only
    // the new go in and count.
    let fresh: Vec<AuditEvent> = (0..20)
        .map(|i| refusal(SubjectKind::Ip, &format!("198.51.100.{i}"), Utc::now()))
        .collect();
    let mixed: Vec<AuditEvent> = batch[..10].iter().chain(&fresh).cloned().collect();
    assert_eq!(audit.insert(&mixed, 7).await.unwrap(), 20);
    // An event twice in one batch goes in once.
    let again = refusal(SubjectKind::User, "twice", Utc::now());
    let twice = [again.clone(), again];
    assert_eq!(audit.insert(&twice, 7).await.unwrap(), 1);
    // A present row before one of a day without a partition (PostgreSQL:
    // the plain statement meets the present row, the skipping one the
    // missing day, which is made, then both again): the new row goes in.
    let returning = refusal(SubjectKind::User, "returning", days_ago(120));
    let present_then_new_day = [batch[0].clone(), returning];
    assert_eq!(audit.insert(&present_then_new_day, 7).await.unwrap(), 1);
    assert_eq!(all_rows(&audit).await.len(), 72);
    assert_rollups_match(&audit).await;
}

/// A batch of new rows goes in as a plain `INSERT` (PostgreSQL): `ON
/// CONFLICT` costs every row a speculative insertion, a third more of
/// PostgreSQL's work, and is kept for batches that meet a present row.
/// Without the key, `ON CONFLICT (occurred_at, id)` has no arbiter and is
/// refused (42P10), so only the plain statement can take this batch; a row
/// already present is then found by nothing, and goes in again.
#[tokio::test]
async fn a_batch_of_new_rows_is_a_plain_insert() {
    let db = TestDb::new(DbKind::Postgres).await;
    let audit = db.connect().await;
    let pool = pg_pool(&audit);
    let first = refusal(SubjectKind::User, "alice", Utc::now());
    assert_eq!(
        audit.insert(std::slice::from_ref(&first), 7).await.unwrap(),
        1
    );
    sqlx::query("ALTER TABLE audit_events DROP CONSTRAINT audit_events_pkey")
        .execute(pool)
        .await
        .unwrap();
    let batch: Vec<AuditEvent> = (0..30)
        .map(|i| refusal(SubjectKind::User, &format!("u{i}"), Utc::now()))
        .collect();
    assert_eq!(audit.insert(&batch, 7).await.unwrap(), 30);
    // The same statement, with nothing to stop it, takes a present row twice:
    // the key is what sends a replay down the other path.
    assert_eq!(audit.insert(&[first], 7).await.unwrap(), 1);
    assert_eq!(all_rows(&audit).await.len(), 32);
}

/// Four writers (instances, or a writer and a replay) merging batches into
/// the same summaries, prunes included: every batch goes in, and the counts
/// equal the rows.
async fn concurrent_writers_merge_rollups_without_deadlock(kind: DbKind) {
    let db = TestDb::new(kind).await;
    let audit = db.connect().await;
    let writers: Vec<_> = (0..4)
        .map(|w| {
            let audit = audit.clone();
            tokio::spawn(async move {
                for b in 0..15 {
                    // 120 users, the k-th refused 13 - k/10 times: a batch
                    // summary keeps ~100 of them, each writer and batch a
                    // different hundred of 400, so the stored summaries
                    // outgrow their bound and are pruned while others merge.
                    let batch: Vec<AuditEvent> = (0..120)
                        .flat_map(|k| {
                            let user = format!("u{}", (k + b * 11 + w * 37) % 400);
                            (0..13 - k / 10).map(move |_| user.clone())
                        })
                        .map(|user| refusal(SubjectKind::User, &user, Utc::now()))
                        .collect();
                    audit.insert(&batch, 7).await.expect("a batch goes in");
                }
            })
        })
        .collect();
    for writer in writers {
        writer.await.unwrap();
    }
    let per_batch: usize = (0..120).map(|k| 13 - k / 10).sum();
    assert_eq!(all_rows(&audit).await.len(), 4 * 15 * per_batch);
    assert_rollups_match(&audit).await;
    let stored = summary_sizes(&audit).await;
    assert!(
        stored
            .values()
            .all(|&n| n <= rollup::PRUNE_ABOVE as i64 + rollup::TOP_CAPACITY as i64),
        "{stored:?}"
    );
}

async fn stats_app(db: &TestDb) -> TestApp {
    let (url, spool) = (db.url.clone(), db.spool_dir());
    spawn_app_with_audit_db(Backend::Memory, move |s| {
        s.audit.database_url = tollgate::settings::SecretUrl::new(url);
        s.audit.spool_dir = spool.display().to_string();
    })
    .await
}

/// Tied counts in a top list are ordered by their keys' bytes on both
/// databases, whatever collation the PostgreSQL cluster defaults to (here a
/// language's, as one initialised under `en_US.UTF-8` has), so that both
/// show the same subjects where the list is cut.
async fn tied_top_entries_are_ordered_by_their_bytes(kind: DbKind) {
    let db = TestDb::new(kind).await;
    let audit = db.connect().await;
    if let AuditDb::Postgres(pool) = &audit {
        sqlx::query(r#"ALTER TABLE audit_top ALTER COLUMN key TYPE TEXT COLLATE "en-x-icu""#)
            .execute(pool)
            .await
            .unwrap();
    }
    let now = Utc::now();
    let rows: Vec<AuditEvent> = ["z", "\u{e9}", "f"]
        .into_iter()
        .map(|user| refusal(SubjectKind::User, user, now))
        .collect();
    audit.insert(&rows, 7).await.unwrap();

    let app = stats_app(&db).await;
    let stats = app.admin_get("/admin/api/stats?period=1h").await;
    assert_eq!(stats.status, 200, "{}", stats.body);
    let keys: Vec<&str> = stats.body["top"]["subjects"]["entries"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["key"].as_str().unwrap())
        .collect();
    assert_eq!(keys, ["user:f", "user:z", "user:\u{e9}"], "{}", stats.body);
}

async fn stats_answers_counts_and_top_lists_from_the_rollups(kind: DbKind) {
    let db = TestDb::new(kind).await;
    let audit = db.connect().await;
    let now = Utc::now();
    let mut rows = Vec::new();
    for _ in 0..3 {
        rows.push(refusal(SubjectKind::User, "mallory", now));
    }
    rows.push(refusal(SubjectKind::User, "trent", now));
    let mut phone = refusal(SubjectKind::Phone, "+8613800138000", now);
    phone.action = Action::SmsSend;
    phone.ip = Some("198.51.100.9".into());
    rows.push(phone);
    let mut shadowed = refusal(SubjectKind::User, "shadowed", now);
    shadowed.shadow = true;
    rows.push(shadowed);
    let mut unblock = refusal(SubjectKind::User, "mallory", now);
    unblock.decision = AuditDecision::Unblock;
    rows.push(unblock);
    // Eight days ago: outside every period.
    rows.push(refusal(SubjectKind::User, "ancient", days_ago(8)));
    audit.insert(&rows, 7).await.unwrap();

    let app = stats_app(&db).await;
    for period in ["1h", "24h", "7d"] {
        let stats = app
            .admin_get(&format!("/admin/api/stats?period={period}"))
            .await;
        assert_eq!(stats.status, 200, "{period}: {}", stats.body);
        let body = &stats.body;
        assert_eq!(body["period"], period);
        assert_eq!(
            body["total"], 5,
            "{period}: refusals only, shadow left out: {body}"
        );
        let counted: u64 = body["buckets"]
            .as_array()
            .unwrap()
            .iter()
            .map(|b| b["count"].as_u64().unwrap())
            .sum();
        assert_eq!(counted, 5);
        assert_eq!(
            body["top"]["subjects"],
            json!({
                "entries": [
                    { "key": "user:mallory", "count": 3 },
                    { "key": "phone:+8613800138000", "count": 1 },
                    { "key": "user:trent", "count": 1 },
                ],
                "exact": true,
                "max_error": 0,
            })
        );
        assert_eq!(
            body["top"]["ips"]["entries"],
            json!([
                { "key": "203.0.113.7", "count": 4 },
                { "key": "198.51.100.9", "count": 1 },
            ])
        );
        assert_eq!(
            body["top"]["prefixes"]["entries"],
            json!([{ "key": "+8613800", "count": 1 }])
        );
    }
    let default = app.admin_get("/admin/api/stats").await;
    assert_eq!(default.body["period"], "24h");
    for bad in ["?period=30d", "?period=", "?window=1h"] {
        let answer = app.admin_get(&format!("/admin/api/stats{bad}")).await;
        assert_eq!(answer.status, 400, "{bad}: {}", answer.body);
        assert_eq!(answer.body["error"], "invalid_request");
    }
    let anonymous = app.get("/admin/api/stats").await;
    assert_eq!(anonymous.status, 401);
}

async fn a_crowd_of_subjects_gives_approximate_top_lists_within_their_bound(kind: DbKind) {
    let db = TestDb::new(kind).await;
    let audit = db.connect().await;
    let now = Utc::now();
    // 60 refusals of mallory hidden among 1,500 users refused once each,
    // written in batches as the writer does.
    let mut truth: BTreeMap<String, u64> = BTreeMap::new();
    let mut rows = Vec::new();
    for i in 0..1_500 {
        rows.push(refusal(SubjectKind::User, &format!("u{i}"), now));
        if i % 25 == 0 {
            rows.push(refusal(SubjectKind::User, "mallory", now));
        }
    }
    for r in &rows {
        *truth.entry(format!("user:{}", r.subject)).or_default() += 1;
    }
    for chunk in rows.chunks(250) {
        audit.insert(chunk, 7).await.unwrap();
    }
    let total = rows.len() as u64;
    assert_eq!(truth["user:mallory"], 60);

    let app = stats_app(&db).await;
    let stats = app.admin_get("/admin/api/stats?period=1h").await;
    assert_eq!(stats.status, 200, "{}", stats.body);
    assert_eq!(stats.body["total"], total, "counts stay exact");
    let top = &stats.body["top"]["subjects"];
    let max_error = top["max_error"].as_u64().unwrap();
    assert_eq!(top["exact"], false, "{top}");
    assert!(max_error > 0);
    // The bound the docs state: refusals / (capacity + 1) per summary, and
    // the 1h period reads at most two hours' worth of summaries.
    assert!(
        max_error <= 2 * total / (rollup::TOP_CAPACITY as u64 + 1) + 2,
        "{max_error} of {total}"
    );
    let entries = top["entries"].as_array().unwrap();
    assert_eq!(entries[0]["key"], "user:mallory", "{top}");
    for entry in entries {
        let key = entry["key"].as_str().unwrap();
        let shown = entry["count"].as_u64().unwrap();
        let real = truth[key];
        assert!(
            shown <= real && real <= shown + max_error,
            "{key}: shown {shown}, true {real}, bound {max_error}"
        );
    }
    // The stored summaries stay bounded however many keys came.
    let stored = summary_sizes(&audit).await;
    assert!(
        stored.values().all(|&n| n <= rollup::PRUNE_ABOVE as i64),
        "{stored:?}"
    );
    assert!(stored.contains_key(TopList::Subject.as_str()));
    // The console labels the list.
    let page = app
        .client
        .get(format!("{}/admin/overview?period=1h", app.address))
        .basic_auth("admin", Some(ADMIN_TOKEN))
        .send()
        .await
        .unwrap();
    assert_eq!(page.status(), 200);
    let html = page.text().await.unwrap();
    assert!(
        html.contains(&format!("each count may lack up to {max_error} refusals")),
        "{html}"
    );
}

/// The largest stored summary of each list.
async fn summary_sizes(audit: &AuditDb) -> BTreeMap<String, i64> {
    const SQL: &str = "SELECT list, CAST(MAX(c) AS BIGINT) FROM \
        (SELECT list, COUNT(*) AS c FROM audit_top GROUP BY width_ms, start_ms, list) s GROUP BY list";
    let rows: Vec<(String, i64)> = match audit {
        AuditDb::Postgres(pool) => sqlx::query_as(SQL).fetch_all(pool).await,
        AuditDb::Sqlite(pool) => sqlx::query_as(SQL).fetch_all(pool).await,
    }
    .unwrap();
    rows.into_iter().collect()
}

/// 30 days of trail (PostgreSQL), a process started with a 7-day
/// retention, and a flood of refused logins from its first moment: the cut
/// of 23 days is done within seconds, and every answered refusal is in the
/// database with nothing spooled.
#[tokio::test]
async fn a_login_flood_during_a_retention_cut_is_audited_and_nothing_spools() {
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;

    let db = TestDb::new(DbKind::Postgres).await;
    let audit = db.connect().await;
    retention::apply(&audit, Duration::from_secs(31 * 86_400), Utc::now())
        .await
        .unwrap();
    let pool = pg_pool(&audit);
    // 2,000 rows on each of the last 30 days, by plain SQL (fast).
    sqlx::query(
        "INSERT INTO audit_events (id, occurred_at, action, decision, reason, subject_kind, subject, ip) \
         SELECT gen_random_uuid(), now() - make_interval(days => d, secs => i), 'login_attempt', 'deny', \
                'user_locked', 'user', 'u' || i, '203.0.113.' || (i % 200) \
           FROM generate_series(1, 30) AS d, generate_series(1, 2000) AS i",
    )
    .execute(pool)
    .await
    .unwrap();
    let old_days = partitions::existing(pool)
        .await
        .unwrap()
        .into_iter()
        .filter(|d| *d < partitions::day(days_ago(7)))
        .count();
    assert!(old_days >= 23, "{old_days}");

    let dir = db.dir.path();
    let config = crate::support::process::config_file(dir, "", "retention = \"7d\"");
    let started = std::time::Instant::now();
    let server = crate::support::process::Tollgate::start_with_env(
        &config,
        &[("TOLLGATE__AUDIT__DATABASE_URL", &db.url)],
    )
    .await;
    let stop = Arc::new(AtomicBool::new(false));
    let clients: Vec<_> = (0..8)
        .map(|c| {
            let address = server.address.clone();
            let stop = stop.clone();
            // Each client fails one user's password from one address: past
            // `captcha_after`, every attempt is a refusal (a challenge),
            // audited.
            tokio::spawn(async move {
                let client = reqwest::Client::new();
                let mut refused = 0u64;
                for i in 0.. {
                    if stop.load(Ordering::Relaxed) {
                        break;
                    }
                    let sent = client
                        .post(format!("{address}/login/attempt"))
                        .header("x-request-id", format!("flood-{c}-{i}"))
                        .json(&json!({ "user": format!("flood{c}"), "ip": format!("198.51.100.{c}"), "success": false }))
                        .send()
                        .await
                        .expect("an answer");
                    assert_eq!(sent.status(), 200);
                    let state: serde_json::Value = sent.json().await.expect("a LoginState");
                    if state["decision"] != "allow" {
                        refused += 1;
                    }
                }
                refused
            })
        })
        .collect();

    let cut_done = crate::support::wait::eventually(
        "the 23 old days dropped",
        Duration::from_secs(30),
        || async {
            let left = partitions::existing(pool).await.unwrap();
            left.iter().all(|d| *d >= partitions::day(days_ago(8)))
        },
    );
    cut_done.await;
    let cut_after = started.elapsed();
    tokio::time::sleep(Duration::from_secs(2)).await;
    stop.store(true, Ordering::Relaxed);
    let mut flood = 0;
    for client in clients {
        flood += client.await.unwrap();
    }
    assert!(flood > 100, "a flood: {flood}");
    assert!(
        !server
            .logged("cut audit rows past audit.retention")
            .await
            .is_empty(),
        "the cut is logged"
    );
    assert!(
        cut_after < Duration::from_secs(20),
        "cut after {cut_after:?}"
    );

    let metrics = reqwest::get(format!("{}/metrics", server.address))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let value = |series: &str| -> f64 {
        metrics
            .lines()
            .find_map(|l| l.strip_prefix(series).map(|v| v.trim().parse().unwrap()))
            .unwrap_or(0.0)
    };
    assert_eq!(
        value("tollgate_audit_events_total{outcome=\"spooled\"}"),
        0.0,
        "{metrics}"
    );
    crate::support::wait::eventually(
        "every refused login of the flood in the database",
        Duration::from_secs(30),
        || async {
            let (n,): (i64,) = sqlx::query_as(
                "SELECT COUNT(DISTINCT request_id) FROM audit_events WHERE request_id LIKE 'flood-%'",
            )
            .fetch_one(pool)
            .await
            .unwrap();
            n as u64 >= flood
        },
    )
    .await;
    // The flood's rows (the only ones of the last hour) and their rollups
    // agree: the plain-SQL rows of earlier days have none, by design.
    let since = rollup::floor_to(
        (Utc::now() - chrono::Duration::hours(1)).timestamp_millis(),
        rollup::BUCKET_MS,
    );
    let (rows,): (i64,) = sqlx::query_as(
        "SELECT COUNT(*) FROM audit_events WHERE occurred_at >= to_timestamp($1::double precision / 1000)",
    )
    .bind(since)
    .fetch_one(pool)
    .await
    .unwrap();
    let (rolled,): (i64,) = sqlx::query_as(
        "SELECT CAST(COALESCE(SUM(n), 0) AS BIGINT) FROM audit_counts WHERE bucket_ms >= $1",
    )
    .bind(since)
    .fetch_one(pool)
    .await
    .unwrap();
    assert!(rows as u64 >= flood);
    assert_eq!(rolled, rows, "the rollups count the flood's rows");
}

/// An event older than retention when it reaches the writer (a journal
/// replayed after a long outage) is left out and counted, and the writer
/// goes on with the rest.
#[tokio::test]
async fn the_writer_leaves_out_events_past_retention_and_goes_on() {
    use tollgate::audit::{AuditSink, DbSink, Journal, SinkConfig};

    let db = TestDb::new(DbKind::Postgres).await;
    let audit = db.connect().await;
    let journal = Journal::open(db.spool_dir(), 1 << 20).unwrap();
    let sink = DbSink::start(
        audit.clone(),
        journal,
        SinkConfig {
            batch_size: 10,
            flush_interval: Duration::from_millis(20),
            write_timeout: Duration::from_secs(10),
            queue_capacity: 100,
            journal_sync_interval: Duration::from_millis(50),
            retention: Duration::from_secs(86_400),
            prefix_digits: 7,
        },
        true,
    )
    .unwrap();
    sink.record(refusal(SubjectKind::User, "expired", days_ago(2)));
    sink.record(refusal(SubjectKind::User, "fresh", Utc::now()));
    sink.flush().await;
    let rows: Vec<String> = all_rows(&audit)
        .await
        .into_iter()
        .map(|r| r.subject)
        .collect();
    assert_eq!(rows, ["fresh"]);
    sink.record(refusal(SubjectKind::User, "later", Utc::now()));
    sink.flush().await;
    assert_eq!(all_rows(&audit).await.len(), 2);
    assert!(sink.health().database);
}

/// Subjects, kinds and IPs compare bytewise after the upgrade, in every
/// partition and in a day's table a cut left detached (which is attached
/// again with them); rows and the lookups by subject and by IP are as before.
#[tokio::test]
async fn identifiers_compare_bytewise_after_the_upgrade_even_in_a_detached_day() {
    let db = TestDb::new(DbKind::Postgres).await;
    let old = db.migrated_before(20261129000000).await;
    let pool = pg_pool(&old);
    let today = refusal(SubjectKind::User, "Émile", Utc::now());
    let earlier = refusal(SubjectKind::User, "émile", days_ago(3));
    old.insert(&[today.clone(), earlier.clone()], 7)
        .await
        .unwrap();
    sqlx::query(&format!(
        "ALTER TABLE audit_events DETACH PARTITION {}",
        partitions::name(partitions::day(earlier.occurred_at))
    ))
    .execute(pool)
    .await
    .unwrap();

    let audit = db.connect().await; // migrates to today's schema
    let pool = pg_pool(&audit);
    let collations: Vec<(String, String, String)> = sqlx::query_as(
        "SELECT c.relname::text, a.attname::text, co.collname::text \
         FROM pg_attribute a JOIN pg_class c ON c.oid = a.attrelid \
         JOIN pg_collation co ON co.oid = a.attcollation \
         WHERE c.relkind IN ('r', 'p') AND c.relname LIKE 'audit\\_events%' \
         AND a.attname IN ('subject_kind', 'subject', 'ip')",
    )
    .fetch_all(pool)
    .await
    .unwrap();
    let tables: std::collections::BTreeSet<&str> =
        collations.iter().map(|(t, _, _)| t.as_str()).collect();
    assert!(
        tables.len() > 2,
        "the parent and its partitions: {tables:?}"
    );
    let detached = partitions::name(partitions::day(earlier.occurred_at));
    assert!(tables.contains(detached.as_str()), "{tables:?}");
    assert!(
        collations.iter().all(|(_, _, collation)| collation == "C"),
        "{collations:?}"
    );

    // The detached day is attached again when a row of that day comes.
    let later = refusal(SubjectKind::User, "émile", days_ago(3));
    assert_eq!(
        audit.insert(std::slice::from_ref(&later), 7).await.unwrap(),
        1
    );
    let by_subject = EventFilter {
        subject_kind: Some(SubjectKind::User),
        subject: Some("émile".into()),
        ..EventFilter::default()
    };
    let found: Vec<uuid::Uuid> = audit
        .page(&by_subject, None, 10)
        .await
        .unwrap()
        .iter()
        .map(|e| e.id)
        .collect();
    assert_eq!(found, [later.id, earlier.id], "exact, newest first");
    let by_ip = EventFilter {
        ip: Some("203.0.113.7".into()),
        ..EventFilter::default()
    };
    assert_eq!(audit.page(&by_ip, None, 10).await.unwrap().len(), 3);
}

/// A cut that died between detaching a partition and dropping it leaves a
/// plain table: the next cut drops it when its day is past retention, and
/// making partitions attaches it again when its day is wanted.
#[tokio::test]
async fn a_partition_left_detached_is_dropped_or_attached_again() {
    let db = TestDb::new(DbKind::Postgres).await;
    let audit = db.connect().await;
    let pool = pg_pool(&audit);
    let old = refusal(SubjectKind::User, "old", days_ago(40));
    let kept = refusal(SubjectKind::User, "kept", days_ago(3));
    audit.insert(&[old.clone(), kept.clone()], 7).await.unwrap();
    for at in [old.occurred_at, kept.occurred_at] {
        sqlx::query(&format!(
            "ALTER TABLE audit_events DETACH PARTITION {}",
            partitions::name(partitions::day(at))
        ))
        .execute(pool)
        .await
        .unwrap();
    }
    assert!(all_rows(&audit).await.is_empty());

    let cut = retention::apply(&audit, Duration::from_secs(30 * 86_400), Utc::now())
        .await
        .unwrap();
    assert!(
        cut.partitions
            .contains(&partitions::name(partitions::day(old.occurred_at))),
        "{cut:?}"
    );
    let rows: Vec<String> = all_rows(&audit)
        .await
        .into_iter()
        .map(|r| r.subject)
        .collect();
    assert_eq!(rows, ["kept"], "the day within retention is attached again");
    let (orphans,): (i64,) = sqlx::query_as(
        "SELECT COUNT(*) FROM pg_class c WHERE c.relkind = 'r' AND c.relname LIKE 'audit\\_events\\_p%' \
         AND NOT EXISTS (SELECT 1 FROM pg_inherits i WHERE i.inhrelid = c.oid)",
    )
    .fetch_one(pool)
    .await
    .unwrap();
    assert_eq!(orphans, 0);
}

/// Retention is cut by one instance at a time: while another holds the
/// lock, a cut is skipped, and done once the lock is free.
#[tokio::test]
async fn a_cut_is_skipped_while_another_instance_holds_the_retention_lock() {
    let db = TestDb::new(DbKind::Postgres).await;
    let audit = db.connect().await;
    audit
        .insert(&[refusal(SubjectKind::User, "old", days_ago(40))], 7)
        .await
        .unwrap();
    let mut other = sqlx::PgConnection::connect(&db.url).await.unwrap();
    // The lock `cut_before` takes ("tollgate" + 2).
    sqlx::query("SELECT pg_advisory_lock(8390043843661231106)")
        .execute(&mut other)
        .await
        .unwrap();
    let retention = Duration::from_secs(30 * 86_400);
    let skipped = retention::apply(&audit, retention, Utc::now())
        .await
        .unwrap();
    assert!(
        skipped.skipped && skipped.partitions.is_empty(),
        "{skipped:?}"
    );
    assert_eq!(all_rows(&audit).await.len(), 1);

    other.close().await.unwrap();
    let cut = retention::apply(&audit, retention, Utc::now())
        .await
        .unwrap();
    assert!(!cut.skipped);
    assert!(all_rows(&audit).await.is_empty());
}

/// A second admin's token in `reads_app`: a viewer, who may read the trail.
const VIEWER: &str = "viewer-token-0123456789";

async fn reads_app(db: &TestDb, read_timeout: Duration) -> TestApp {
    let (url, spool) = (db.url.clone(), db.spool_dir());
    let app = spawn_app_with_audit_db(Backend::Memory, move |s| {
        s.audit.database_url = tollgate::settings::SecretUrl::new(url);
        s.audit.spool_dir = spool.display().to_string();
        s.audit.read_timeout = read_timeout;
        s.server.admin_tokens = vec![
            AdminToken::plain(ADMIN_TOKEN),
            AdminToken::Named(NamedAdminToken {
                name: "viewer".into(),
                token: Secret::new(VIEWER),
                role: Role::Viewer,
            }),
        ];
    })
    .await;
    // Migrated, so that the lock below has a table to take. With SQLite's
    // 20 ms bound a loaded machine may take longer than it for the first
    // read (the pool's first connection): a read in time is what counts.
    assert_eq!(answered_in_time(&app, "/admin/api/events").await, 200);
    app
}

/// The status of `path`'s read, asked again while it answers 503: on a
/// machine busy with other tests a read that an index serves may still
/// miss a bound of milliseconds now and then; one that walks every row
/// never makes it.
async fn answered_in_time(app: &TestApp, path: &str) -> reqwest::StatusCode {
    for _ in 0..20 {
        let answer = app.admin_get(path).await;
        if answer.status != reqwest::StatusCode::SERVICE_UNAVAILABLE {
            return answer.status;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    reqwest::StatusCode::SERVICE_UNAVAILABLE
}

/// Holds `audit_events` so that every read of it waits: as a filter no
/// index serves keeps a read going through every partition.
async fn lock_the_trail(db: &TestDb) -> sqlx::PgConnection {
    let mut holder = sqlx::PgConnection::connect(&db.url).await.unwrap();
    for sql in ["BEGIN", "LOCK TABLE audit_events IN ACCESS EXCLUSIVE MODE"] {
        sqlx::query(sql).execute(&mut holder).await.unwrap();
    }
    holder
}

/// How many admin reads of the trail wait in PostgreSQL on
/// [`lock_the_trail`]'s lock.
async fn reads_waiting_on_the_lock(db: &TestDb) -> i64 {
    sqlx::query_scalar(
        "SELECT count(*) FROM pg_stat_activity \
         WHERE datname = current_database() AND wait_event_type = 'Lock' \
         AND query LIKE '%ORDER BY occurred_at DESC, id DESC LIMIT%'",
    )
    .fetch_one(pg_pool(&db.connect().await))
    .await
    .unwrap()
}

/// An admin's read of the trail ends at `audit.read_timeout` with a 503,
/// and takes its connection back to the pool, rather than waiting as long
/// as the database does.
#[tokio::test]
async fn an_admin_read_ends_at_the_read_timeout() {
    let db = TestDb::new(DbKind::Postgres).await;
    let app = reads_app(&db, Duration::from_secs(1)).await;
    let holder = lock_the_trail(&db).await;

    let read = app.admin_get("/admin/api/events?subject=nobody&limit=500");
    let answer = tokio::time::timeout(Duration::from_secs(20), read)
        .await
        .expect("PostgreSQL ends the read at the bound");
    assert_eq!(answer.status, 503, "{}", answer.body);
    assert_eq!(answer.body["error"], "audit_unavailable");
    let waiting = reads_waiting_on_the_lock(&db).await;
    assert_eq!(waiting, 0, "no read still waits in PostgreSQL");
    drop(holder);
    assert_eq!(app.admin_get("/admin/api/events").await.status, 200);
}

/// An admin who asks and goes away cannot keep more reads running than
/// its turn allows: the read goes on to its bound in its turn (the HTTP
/// layer does not drop a handler whose client closed its side), so the
/// next asks queue behind it rather than start reads of their own that
/// PostgreSQL, which notices a closed client only when it writes to it,
/// would run on.
#[tokio::test]
async fn asking_and_leaving_in_a_loop_keeps_one_read_running() {
    let db = TestDb::new(DbKind::Postgres).await;
    let app = reads_app(&db, Duration::from_secs(60)).await;
    let holder = lock_the_trail(&db).await;
    let client = reqwest::Client::new();
    for _ in 0..6 {
        let asked = client
            .get(format!("{}/admin/api/events?subject=nobody", app.address))
            .bearer_auth(VIEWER)
            .timeout(Duration::from_millis(300))
            .send()
            .await;
        assert!(
            asked.is_err_and(|e| e.is_timeout()),
            "the read waits on the lock"
        );
    }
    let waiting = reads_waiting_on_the_lock(&db).await;
    assert_eq!(waiting, 1, "the first ask's read, in the viewer's one turn");
    drop(holder);
}

/// The same when each ask's connection is reset (a client that closes with
/// `SO_LINGER` 0 sends RST): the HTTP layer then drops the handler, and
/// with it the request, but the read it started runs on to its end in the
/// viewer's turn, so the next asks still queue behind it.
#[tokio::test]
async fn asking_and_resetting_in_a_loop_keeps_one_read_running() {
    let db = TestDb::new(DbKind::Postgres).await;
    let app = reads_app(&db, Duration::from_secs(60)).await;
    let holder = lock_the_trail(&db).await;
    let ask = format!(
        "GET /admin/api/events?subject=nobody HTTP/1.1\r\nHost: tollgate\r\n\
         Authorization: Bearer {VIEWER}\r\n\r\n"
    );
    for _ in 0..6 {
        app.ask_and_reset(ask.as_bytes(), Duration::from_millis(300))
            .await;
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    let waiting = reads_waiting_on_the_lock(&db).await;
    assert_eq!(waiting, 1, "the first ask's read, in the viewer's one turn");
    drop(holder);
}

/// Rows enough that a filter no index serves takes SQLite far longer than
/// [`SQLITE_BOUND`] to walk.
const SQLITE_ROWS: u32 = 300_000;
/// A read timeout short enough that no machine walks [`SQLITE_ROWS`] in it.
const SQLITE_BOUND: Duration = Duration::from_millis(20);

/// On SQLite, the embedded default, an admin's read ends at
/// `audit.read_timeout` too (SQLite's progress handler) with the same 503,
/// rather than walking the whole trail, and the deadline leaves with the
/// read: the writer's next batch, on the same pooled connection, is not
/// cut short by it.
#[tokio::test]
async fn on_sqlite_an_admin_read_ends_at_the_read_timeout() {
    let db = TestDb::new(DbKind::Sqlite).await;
    let audit = db.connect().await;
    let AuditDb::Sqlite(pool) = &audit else {
        panic!("a SQLite test was given PostgreSQL")
    };
    // Written by SQL, not batch by batch: three hundred thousand refusals
    // of a thousand users, a second apart.
    sqlx::query(&format!(
        "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < {SQLITE_ROWS}) \
         INSERT INTO audit_events \
             (id, occurred_at, action, decision, reason, subject_kind, subject, ip) \
         SELECT printf('00000000-0000-7000-8000-%012d', i), \
                strftime('%Y-%m-%dT%H:%M:%fZ', 'now', printf('-%d seconds', i)), \
                'login_attempt', 'deny', 'user_locked', 'user', 'u' || (i % 1000), '203.0.113.7' \
           FROM n"
    ))
    .execute(pool)
    .await
    .unwrap();

    let app = reads_app(&db, SQLITE_BOUND).await;
    let answer = app
        .admin_get("/admin/api/events?subject=nobody&limit=500")
        .await;
    assert_eq!(answer.status, 503, "{}", answer.body);
    assert_eq!(answer.body["error"], "audit_unavailable");
    // A page the index serves still answers within the bound.
    assert_eq!(
        answered_in_time(&app, "/admin/api/events?limit=1").await,
        200
    );

    // The same through the database's own pool; then, past the read's
    // deadline, batches on every connection the pool holds (it hands out
    // the longest idle first), the read's among them.
    let nobody = EventFilter {
        subject: Some("nobody".into()),
        ..EventFilter::default()
    };
    let read = audit.page_within(&nobody, None, 500, SQLITE_BOUND).await;
    assert!(
        read.as_ref().is_err_and(|e| e.is_timeout()),
        "{:?}",
        read.map(|rows| rows.len())
    );
    tokio::time::sleep(SQLITE_BOUND * 3).await;
    for round in 0..4 {
        let batch: Vec<AuditEvent> = (0..500)
            .map(|i| refusal(SubjectKind::User, &format!("late{round}-{i}"), Utc::now()))
            .collect();
        assert_eq!(audit.insert(&batch, 7).await.unwrap(), 500, "round {round}");
    }
}

/// Slow reads take at most two of the pool's connections: the rest of the
/// admin surface (here the stats, from the rollups) goes on answering.
#[tokio::test]
async fn slow_admin_reads_leave_the_pool_to_the_rest() {
    let db = TestDb::new(DbKind::Postgres).await;
    let app = std::sync::Arc::new(reads_app(&db, Duration::from_secs(30)).await);
    let mut holder = lock_the_trail(&db).await;
    // Two admins, so that both turns are taken.
    let reads: Vec<_> = [ADMIN_TOKEN, VIEWER, ADMIN_TOKEN, VIEWER, ADMIN_TOKEN]
        .into_iter()
        .map(|token| {
            let app = app.clone();
            tokio::spawn(async move {
                app.admin_get_as(token, "/admin/api/events")
                    .await
                    .status
                    .as_u16()
            })
        })
        .collect();
    tokio::time::sleep(Duration::from_millis(500)).await;

    let stats = app.admin_get("/admin/api/stats").await;
    assert_eq!(stats.status, 200, "{}", stats.body);

    sqlx::query("COMMIT").execute(&mut holder).await.unwrap();
    let mut statuses = Vec::new();
    for read in reads {
        let status = tokio::time::timeout(Duration::from_secs(20), read)
            .await
            .expect("every read answers once the trail is free")
            .unwrap();
        statuses.push(status);
    }
    // Two read at once; those kept waiting for a turn past 3 s are refused.
    assert!(
        statuses.iter().all(|s| *s == 200 || *s == 503),
        "{statuses:?}"
    );
    assert!(statuses.contains(&200), "{statuses:?}");
}

/// An export's status goes out before its first page: a page that waits
/// for its turn behind slow reads waits as long as they may run, rather
/// than the 3 s a page of the API waits, which would cut the file short.
#[tokio::test]
async fn an_export_waits_for_its_turn_as_long_as_the_reads_ahead_may_run() {
    let db = TestDb::new(DbKind::Postgres).await;
    let audit = db.connect().await;
    audit
        .insert(&[refusal(SubjectKind::User, "alice", Utc::now())], 7)
        .await
        .unwrap();
    let app = std::sync::Arc::new(reads_app(&db, Duration::from_secs(6)).await);
    let mut holder = lock_the_trail(&db).await;
    // Two admins' reads: one admin holds one turn at most.
    let slow: Vec<_> = [ADMIN_TOKEN, VIEWER]
        .into_iter()
        .map(|token| {
            let app = app.clone();
            tokio::spawn(async move {
                app.admin_get_as(token, "/admin/api/events")
                    .await
                    .status
                    .as_u16()
            })
        })
        .collect();
    tokio::time::sleep(Duration::from_millis(500)).await;
    let export = {
        let app = app.clone();
        tokio::spawn(async move {
            let response = app
                .client
                .get(format!("{}/admin/api/events.csv", app.address))
                .bearer_auth(ADMIN_TOKEN)
                .send()
                .await
                .unwrap();
            (response.status(), response.text().await)
        })
    };
    // Past the 3 s a page waits, within the slow reads' 6 s.
    tokio::time::sleep(Duration::from_millis(4_000)).await;
    sqlx::query("COMMIT").execute(&mut holder).await.unwrap();
    for read in slow {
        assert_eq!(read.await.unwrap(), 200);
    }
    let (status, body) = tokio::time::timeout(Duration::from_secs(20), export)
        .await
        .expect("the export ends")
        .unwrap();
    assert_eq!(status, 200);
    let body = body.expect("the whole file, not cut short");
    assert!(body.contains("alice"), "{body}");
}

/// One admin's slow reads take one turn between them: another admin's read
/// still gets the other turn, however many the first keeps sending.
#[tokio::test]
async fn one_admins_slow_reads_leave_a_turn_to_the_others() {
    let db = TestDb::new(DbKind::Postgres).await;
    let app = reads_app(&db, Duration::from_secs(30)).await;
    let holder = lock_the_trail(&db).await;
    a_viewers_flood_leaves_another_admin_a_read(app, holder, "/admin/api/events").await;
}

/// The overview's counts and top lists (`/admin/api/stats`, the console's
/// overview) take turns, on one connection each: a viewer's flood of them,
/// the rollups held, holds one connection and no more of the pool, and
/// another admin's read still answers.
#[tokio::test]
async fn one_admins_flood_of_stats_holds_one_connection_and_leaves_the_rest() {
    let db = TestDb::new(DbKind::Postgres).await;
    let app = reads_app(&db, Duration::from_secs(30)).await;
    let mut holder = sqlx::PgConnection::connect(&db.url).await.unwrap();
    for sql in ["BEGIN", "LOCK TABLE audit_counts IN ACCESS EXCLUSIVE MODE"] {
        sqlx::query(sql).execute(&mut holder).await.unwrap();
    }
    a_viewers_flood_leaves_another_admin_a_read(app, holder, "/admin/api/stats?period=7d").await;
}

/// The viewer sends four reads of `path` while `holder`'s transaction
/// holds what they read; then another admin reads events. Once the hold
/// ends (past the 3 s a read waits for its turn, and for a pooled
/// connection), the other admin's read answers 200, and of the viewer's
/// the first ran and the rest waited past 3 s behind it.
async fn a_viewers_flood_leaves_another_admin_a_read(
    app: TestApp,
    mut holder: sqlx::PgConnection,
    path: &'static str,
) {
    let app = std::sync::Arc::new(app);
    let flood: Vec<_> = (0..4)
        .map(|_| {
            let app = app.clone();
            tokio::spawn(async move { app.admin_get_as(VIEWER, path).await.status.as_u16() })
        })
        .collect();
    tokio::time::sleep(Duration::from_millis(500)).await;
    let other = {
        let app = app.clone();
        tokio::spawn(async move { app.admin_get_as(ADMIN_TOKEN, "/admin/api/events").await })
    };
    tokio::time::sleep(Duration::from_millis(4_000)).await;
    sqlx::query("COMMIT").execute(&mut holder).await.unwrap();
    let other = tokio::time::timeout(Duration::from_secs(20), other)
        .await
        .expect("the other admin's read answers")
        .unwrap();
    assert_eq!(
        other.status, 200,
        "the other admin had a turn: {}",
        other.body
    );
    let mut flooded = Vec::new();
    for read in flood {
        flooded.push(read.await.unwrap());
    }
    flooded.sort_unstable();
    assert_eq!(flooded, [200, 503, 503, 503]);
}
