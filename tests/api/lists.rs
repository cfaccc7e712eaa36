//! Allow and block lists: from the config file, and from admins at run time
//! (stored in the audit database, shared by every instance).

use std::time::Duration;

use serde_json::{json, Value};
use tollgate::audit::AuditDecision;
use tollgate::domain::SubjectKind;
use tollgate::settings::Settings;

use crate::support::app::{limits, spawn_app, spawn_app_with_audit_db, Backend, TestApp};
use crate::support::audit_db::{DbKind, TestDb};
use crate::{on_both_backends, on_both_databases};

on_both_backends!(
    an_allow_listed_ip_is_past_every_limit,
    an_allow_listed_phone_is_past_its_own_windows_not_its_askers,
    a_phone_a_prefix_allows_keeps_its_own_windows,
    an_allow_listed_address_past_its_failure_budget_pays_as_if_delivered,
    block_entries_are_refused_with_403_and_audited,
    the_block_list_wins_over_the_allow_list,
    in_shadow_mode_a_block_is_audited_not_enforced,
);

on_both_databases!(
    admins_add_and_delete_entries_and_every_instance_follows,
    bad_entries_answer_400_and_unknown_ids_404,
    a_row_no_version_reads_stops_no_refresh_and_no_admins_change,
);

const ALLOWED_IP: &str = "203.0.113.9";
const OTHER_IP: &str = "198.51.100.20";
const PHONE: &str = "+8613800138000";

async fn send(app: &TestApp, phone: &str, ip: &str) -> crate::support::app::Answer {
    app.sms_send(json!({ "phone": phone, "ip": ip })).await
}

async fn fail(app: &TestApp, user: &str, ip: &str) -> crate::support::app::Answer {
    app.login_attempt(json!({ "user": user, "ip": ip, "success": false }))
        .await
}

fn strict(s: &mut Settings) {
    s.sms.phone_limits = limits(&[(1, 3_600_000)]);
    s.sms.ip_limits = limits(&[(2, 3_600_000)]);
    s.sms.captcha_after = 1000;
    s.login.captcha_after = 2;
    s.login.lock_after = 3;
}

/// An allow-listed address is past its own windows and every captcha tier
/// (and a login's every limit); its sends still count in the phone's, the
/// prefix's and the global windows and the pumping guard, unless the phone
/// is listed too (a test rig and its phone). Else whoever may name the
/// client (any API key, with `ip`) could name the listed address and text
/// any number without end.
async fn an_allow_listed_ip_is_past_every_limit(backend: Backend) {
    const QA_PHONE: &str = "+8613900139099";
    let app = spawn_app(backend, |s| {
        strict(s);
        s.lists.allow_ips = vec!["203.0.113.0/24".parse().unwrap()];
        s.lists.allow_phones = vec![QA_PHONE.into(), "+86137*".into()];
    })
    .await;
    let exempted = r#"tollgate_list_matches_total{list="allow",kind="ip",action="sms_send"}"#;
    // The recorder is the process's: no other allow-listed send (this
    // test's twin on the other store included) runs while this one counts.
    let counting = crate::support::ALLOW_LISTED_IP_SENDS.lock().await;
    let before = app.metric(exempted).await;
    // Five phones from one address: past its 2/1h.
    for i in 0..5 {
        let answer = send(&app, &format!("+86138001381{i:02}"), ALLOWED_IP).await;
        assert_eq!(answer.status, 200, "send {i}: {}", answer.body);
    }
    let again = send(&app, "+8613800138100", ALLOWED_IP).await;
    assert_eq!(
        (again.status.as_u16(), again.error()),
        (429, "rate_limited"),
        "the phone's own window: {}",
        again.body
    );
    assert_eq!(again.body["rule"], "phone 1/1h");
    for i in 0..5 {
        let answer = send(&app, QA_PHONE, ALLOWED_IP).await;
        assert_eq!(answer.status, 200, "the rig's phone {i}: {}", answer.body);
        assert_eq!(answer.body["resend_after_secs"], 0);
    }
    // A prefix entry is no rig's phone: its numbers keep their windows.
    let ranged = "+8613700137000";
    assert_eq!(send(&app, ranged, ALLOWED_IP).await.status, 200);
    let again = send(&app, ranged, ALLOWED_IP).await;
    assert_eq!(again.status, 429, "a prefix's phone: {}", again.body);
    assert_eq!(again.body["rule"], "phone 1/1h");
    assert_eq!(app.metric(exempted).await - before, 13.0);
    drop(counting);
    // The code of the last send is the one that verifies: codes still work.
    assert_eq!(send(&app, "+8613900139000", OTHER_IP).await.status, 200);
    assert_eq!(
        send(&app, "+8613900139000", OTHER_IP).await.status,
        429,
        "another IP is limited"
    );

    for i in 0..10 {
        let answer = fail(&app, "alice", ALLOWED_IP).await;
        assert_eq!(
            answer.body["decision"], "allow",
            "failure {i}: {}",
            answer.body
        );
        assert_eq!(answer.body["captcha_required"], false);
        assert_eq!(answer.body["locked"], false);
    }
    let check = app
        .login_check(json!({ "user": "alice", "ip": ALLOWED_IP }))
        .await;
    assert_eq!(check.body["decision"], "allow", "{}", check.body);
    // Nothing was counted for alice: from elsewhere she starts from zero.
    assert_eq!(fail(&app, "alice", OTHER_IP).await.body["failures"], 1);
    assert!(app.audit_events().iter().all(|e| e.subject != "alice"));
}

/// An allow-listed address counts in no address window, so past its
/// budget of declined deliveries such a send keeps every other window,
/// as a delivered one would: else whoever names the address could have
/// the provider called for one number without end.
async fn an_allow_listed_address_past_its_failure_budget_pays_as_if_delivered(backend: Backend) {
    let app = spawn_app(backend, |s| {
        strict(s);
        s.lists.allow_ips = vec!["203.0.113.0/24".parse().unwrap()];
        s.sms.failed_delivery_limit = limits(&[(1, 3_600_000)]).remove(0);
    })
    .await;
    let _sends = crate::support::ALLOW_LISTED_IP_SENDS.lock().await;
    app.sms.decline(true);
    for i in 0..2 {
        let failed = send(&app, PHONE, ALLOWED_IP).await;
        assert_eq!(
            failed.error(),
            "delivery_failed",
            "send {i}: {}",
            failed.body
        );
    }
    let refused = send(&app, PHONE, ALLOWED_IP).await;
    assert_eq!(
        (refused.status.as_u16(), refused.body["rule"].as_str()),
        (429, Some("phone 1/1h")),
        "one given back, the next kept by the phone's window: {}",
        refused.body
    );
    // A number refused for good is no budget's: the first send's windows
    // keep it at once.
    app.sms.decline(false);
    app.sms.refuse(true);
    let invalid = "+8613800138077";
    let failed = send(&app, invalid, ALLOWED_IP).await;
    assert_eq!(failed.error(), "delivery_failed", "{}", failed.body);
    let again = send(&app, invalid, ALLOWED_IP).await;
    assert_eq!(
        (again.status.as_u16(), again.body["rule"].as_str()),
        (429, Some("phone 1/1h")),
        "the refused send kept by the phone's window: {}",
        again.body
    );
}

/// An allow-listed phone is past its own window (1/1h here), its prefix's,
/// the global ones and the pumping guard, but not its asker's: else anyone
/// could ask for its codes without end and guess each one's tries.
async fn an_allow_listed_phone_is_past_its_own_windows_not_its_askers(backend: Backend) {
    let app = spawn_app(backend, |s| {
        strict(s);
        s.sms.verify_ip_limits = limits(&[(3, 3_600_000)]);
        s.lists.allow_phones = vec![PHONE.into()];
    })
    .await;
    let asker = "192.0.2.30";
    for i in 0..2 {
        let answer = send(&app, PHONE, asker).await;
        assert_eq!(answer.status, 200, "send {i}: {}", answer.body);
    }
    let third = send(&app, PHONE, asker).await;
    assert_eq!(third.status, 429, "the asker's 2/1h: {}", third.body);
    assert_eq!(third.body["rule"], "ip 2/1h");
    let elsewhere = send(&app, PHONE, OTHER_IP).await;
    assert_eq!(elsewhere.status, 200, "{}", elsewhere.body);
    // A backend that names no client has no asker to count: the phone is
    // counted as any other (1/1h), else its codes would come without end.
    let unnamed = app.sms_send(json!({ "phone": PHONE })).await;
    assert_eq!(unnamed.status, 200, "{}", unnamed.body);
    let unnamed = app.sms_send(json!({ "phone": PHONE })).await;
    assert_eq!(unnamed.status, 429, "the phone's 1/1h: {}", unnamed.body);
    assert_eq!(unnamed.body["rule"], "phone 1/1h");

    let code = app.sms.last_code(PHONE);
    let guess = |ip: &'static str, code: String| {
        app.sms_verify(json!({ "phone": PHONE, "code": code, "ip": ip }))
    };
    let wrong = if code.starts_with('0') { "1" } else { "0" }.repeat(code.len());
    for i in 0..3 {
        let answer = guess(asker, wrong.clone()).await;
        assert_eq!(answer.body["valid"], false, "guess {i}: {}", answer.body);
    }
    let refused = guess(asker, wrong.clone()).await;
    assert_eq!(refused.status, 429, "the guesser's 3/1h: {}", refused.body);
    assert_eq!(refused.body["rule"], "ip 3/1h");
    assert_eq!(
        guess("192.0.2.31", code).await.body,
        json!({ "valid": true })
    );
}

/// A phone that a prefix entry (`+86137*`) allows is past its prefix's and
/// the global windows, but its own windows count, as its asker's do: else
/// the entry took every limit off each number of the range, and anyone
/// could text one of them without end.
async fn a_phone_a_prefix_allows_keeps_its_own_windows(backend: Backend) {
    const RANGE_PHONE: &str = "+8613700137000";
    const NEIGHBOUR: &str = "+8613700137001";
    let app = spawn_app(backend, |s| {
        strict(s);
        s.sms.prefix_limits = limits(&[(1, 3_600_000)]);
        s.lists.allow_phones = vec!["+86137*".into()];
    })
    .await;
    let first = send(&app, RANGE_PHONE, "192.0.2.40").await;
    assert_eq!(first.status, 200, "{}", first.body);
    let again = send(&app, RANGE_PHONE, "192.0.2.41").await;
    assert_eq!(again.status, 429, "the phone's 1/1h: {}", again.body);
    assert_eq!(again.body["rule"], "phone 1/1h");
    let neighbour = send(&app, NEIGHBOUR, "192.0.2.41").await;
    assert_eq!(
        neighbour.status, 200,
        "past the prefix's 1/1h: {}",
        neighbour.body
    );
    let second = send(&app, "+8613700137002", "192.0.2.41").await;
    assert_eq!(second.status, 200, "{}", second.body);
    let asker_full = send(&app, "+8613700137003", "192.0.2.41").await;
    assert_eq!(
        asker_full.status, 429,
        "the asker's 2/1h: {}",
        asker_full.body
    );
    assert_eq!(asker_full.body["rule"], "ip 2/1h");
}

async fn block_entries_are_refused_with_403_and_audited(backend: Backend) {
    let app = spawn_app(backend, |s| {
        s.lists.block_phones = vec!["+88213*".into(), "+8613700137000".into()];
        s.lists.block_users = vec!["Mallory".into()];
        s.lists.block_ips = vec!["192.0.2.66/32".parse().unwrap()];
    })
    .await;
    let refused = send(&app, "+882130000001", OTHER_IP).await;
    assert_eq!(refused.status, 403, "{}", refused.body);
    assert_eq!(refused.error(), "blocklisted");
    assert_eq!(
        send(&app, "+8613700137000", OTHER_IP).await.error(),
        "blocklisted"
    );
    assert_eq!(send(&app, PHONE, "192.0.2.66").await.error(), "blocklisted");
    assert_eq!(send(&app, PHONE, OTHER_IP).await.status, 200);
    let verify = app
        .sms_verify(json!({ "phone": "+8613700137000", "code": "123456" }))
        .await;
    assert_eq!(verify.status, 403, "{}", verify.body);

    let login = fail(&app, "mallory", OTHER_IP).await;
    assert_eq!((login.status.as_u16(), login.error()), (403, "blocklisted"));
    let check = app.login_check(json!({ "user": "MALLORY" })).await;
    assert_eq!(check.status, 403, "{}", check.body);
    assert_eq!(
        fail(&app, "alice", "192.0.2.66").await.error(),
        "blocklisted"
    );

    let rows: Vec<_> = app
        .audit_events()
        .into_iter()
        .filter(|e| e.reason == "blocklisted")
        .map(|e| (e.decision, e.subject_kind, e.subject, e.shadow))
        .collect();
    let row = |kind, id: &str| (AuditDecision::Deny, kind, id.to_string(), false);
    assert_eq!(
        rows,
        [
            row(SubjectKind::Phone, "+882130000001"),
            row(SubjectKind::Phone, "+8613700137000"),
            row(SubjectKind::Ip, "192.0.2.66"),
            row(SubjectKind::Phone, "+8613700137000"),
            row(SubjectKind::User, "mallory"),
            row(SubjectKind::Ip, "192.0.2.66"),
        ],
        "a check audits nothing"
    );
}

async fn the_block_list_wins_over_the_allow_list(backend: Backend) {
    let app = spawn_app(backend, |s| {
        s.lists.allow_ips = vec!["203.0.113.0/24".parse().unwrap()];
        s.lists.block_phones = vec![PHONE.into()];
    })
    .await;
    assert_eq!(send(&app, PHONE, ALLOWED_IP).await.error(), "blocklisted");
}

async fn in_shadow_mode_a_block_is_audited_not_enforced(backend: Backend) {
    let app = spawn_app(backend, |s| {
        s.sms.shadow = true;
        s.lists.block_phones = vec![PHONE.into()];
        s.lists.block_users = vec!["mallory".into()];
    })
    .await;
    assert_eq!(send(&app, PHONE, OTHER_IP).await.status, 200);
    assert_eq!(
        fail(&app, "mallory", OTHER_IP).await.status,
        403,
        "login is not in shadow"
    );
    let shadowed: Vec<_> = app
        .audit_events()
        .into_iter()
        .filter(|e| e.reason == "blocklisted")
        .map(|e| (e.subject, e.shadow))
        .collect();
    assert_eq!(
        shadowed,
        [(PHONE.to_string(), true), ("mallory".to_string(), false)]
    );
}

async fn db_app(db: &TestDb, refresh: Duration) -> TestApp {
    let (url, spool) = (db.url.clone(), db.spool_dir());
    spawn_app_with_audit_db(Backend::Memory, move |s| {
        s.audit.database_url = tollgate::settings::SecretUrl::new(url);
        s.audit.spool_dir = spool.display().to_string();
        s.lists.refresh_interval = refresh;
        s.lists.allow_users = vec!["ops".into()];
    })
    .await
}

async fn admin_send(
    app: &TestApp,
    method: reqwest::Method,
    path: &str,
    body: Option<Value>,
) -> crate::support::app::Answer {
    let mut request = app
        .client
        .request(method, format!("{}{path}", app.address))
        .bearer_auth(crate::support::app::ADMIN_TOKEN);
    if let Some(body) = body {
        request = request.json(&body);
    }
    app.send_raw(request).await
}

async fn admins_add_and_delete_entries_and_every_instance_follows(kind: DbKind) {
    let db = TestDb::new(kind).await;
    let here = db_app(&db, Duration::from_secs(3600)).await;
    let there = db_app(&db, Duration::from_millis(100)).await;
    let blocked = "198.51.100.77";
    assert_eq!(send(&here, PHONE, blocked).await.status, 200);

    let added = admin_send(
        &here,
        reqwest::Method::POST,
        "/admin/api/lists/ip",
        Some(json!({ "list": "block", "value": "198.51.100.0/24", "note": "abuse" })),
    )
    .await;
    assert_eq!(added.status, 201, "{}", added.body);
    assert_eq!(added.body["value"], "198.51.100.0/24");
    assert_eq!(added.body["source"], "admin");
    let id = added.body["id"].as_str().expect("an id").to_string();
    // In force here at once, and on the other instance within its refresh.
    assert_eq!(
        send(&here, "+8613900139000", blocked).await.error(),
        "blocklisted"
    );
    let mut seen = false;
    for _ in 0..50 {
        if send(&there, "+8613600136000", blocked).await.status == 403 {
            seen = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(seen, "the other instance read the entry from the database");

    let again = admin_send(
        &here,
        reqwest::Method::POST,
        "/admin/api/lists/ip",
        Some(json!({ "list": "block", "value": "198.51.100.0/24" })),
    )
    .await;
    assert_eq!(
        again.body["id"],
        id.as_str(),
        "the stored entry is answered"
    );

    let listed = admin_send(&here, reqwest::Method::GET, "/admin/api/lists", None).await;
    assert_eq!(listed.status, 200);
    let entries: Vec<_> = listed.body["entries"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| {
            (
                e["list"].clone(),
                e["kind"].clone(),
                e["value"].clone(),
                e["source"].clone(),
            )
        })
        .collect();
    assert_eq!(
        entries,
        [
            (json!("allow"), json!("user"), json!("ops"), json!("config")),
            (
                json!("block"),
                json!("ip"),
                json!("198.51.100.0/24"),
                json!("admin")
            ),
        ]
    );

    let deleted = admin_send(
        &here,
        reqwest::Method::DELETE,
        &format!("/admin/api/lists/{id}"),
        None,
    )
    .await;
    assert_eq!(deleted.status, 204, "{}", deleted.body);
    assert_eq!(send(&here, "+8613500135000", blocked).await.status, 200);
    let gone = admin_send(
        &here,
        reqwest::Method::DELETE,
        &format!("/admin/api/lists/{id}"),
        None,
    )
    .await;
    assert_eq!((gone.status.as_u16(), gone.error()), (404, "not_found"));

    // Each change is in the audit trail: the admin's address and request id,
    // the list as the reason, the entry as the subject (the repeated add
    // answered the stored entry and is audited too; the 404 is not).
    here.flush_audit().await;
    let trail = admin_send(
        &here,
        reqwest::Method::GET,
        "/admin/api/events?action=admin",
        None,
    )
    .await;
    assert_eq!(trail.status, 200, "{}", trail.body);
    let rows: Vec<_> = trail.body["events"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| {
            (
                e["decision"].as_str().unwrap().to_string(),
                e["reason"].as_str().unwrap().to_string(),
                e["subject_kind"].as_str().unwrap().to_string(),
                e["subject"].as_str().unwrap().to_string(),
                e["ip"].as_str().unwrap_or_default().to_string(),
            )
        })
        .collect();
    let row = |decision: &str| {
        (
            decision.to_string(),
            "block_list".to_string(),
            "ip".to_string(),
            "198.51.100.0/24".to_string(),
            "127.0.0.1".to_string(),
        )
    };
    // Newest first.
    assert_eq!(rows, [row("list_remove"), row("list_add"), row("list_add")]);
}

async fn bad_entries_answer_400_and_unknown_ids_404(kind: DbKind) {
    let db = TestDb::new(kind).await;
    let app = db_app(&db, Duration::from_secs(3600)).await;
    for (kind, body) in [
        ("ip", json!({ "list": "block", "value": "300.1.1.1" })),
        // The IPv4-mapped /96 would be stored as 0.0.0.0/0: every IPv4
        // client blocked by an entry meant for "mapped" ones.
        ("ip", json!({ "list": "block", "value": "::ffff:0:0/96" })),
        (
            "ip",
            json!({ "list": "allow", "value": "::ffff:0.0.0.0/96" }),
        ),
        ("ip", json!({ "list": "block", "value": "64:ff9b::/96" })),
        ("phone", json!({ "list": "block", "value": "+86abc*" })),
        ("phone", json!({ "list": "block", "value": "+1 555" })),
        // Not what they seem to say: a typo's range, everyone, no number.
        ("ip", json!({ "list": "block", "value": "198.51.100.7/2" })),
        ("ip", json!({ "list": "allow", "value": "0.0.0.0/0" })),
        ("ip", json!({ "list": "block", "value": "::/0" })),
        ("phone", json!({ "list": "block", "value": "+28*" })),
        ("ip", json!({ "list": "deny", "value": "192.0.2.1" })),
        ("user", json!({ "list": "block" })),
        // PostgreSQL refuses NUL in text: a 400, never a 503 that looks
        // like an outage.
        (
            "user",
            json!({ "list": "block", "value": "mallory", "note": "a\u{0}b" }),
        ),
        (
            "user",
            json!({ "list": "block", "value": "mallory", "note": "x".repeat(257) }),
        ),
        (
            "user",
            json!({ "list": "block", "kind": "user", "value": "x" }),
        ),
    ] {
        let path = format!("/admin/api/lists/{kind}");
        let answer = admin_send(&app, reqwest::Method::POST, &path, Some(body.clone())).await;
        assert_eq!(
            (answer.status.as_u16(), answer.error()),
            (400, "invalid_request"),
            "{kind} {body}: {}",
            answer.body
        );
    }
    let email = admin_send(
        &app,
        reqwest::Method::POST,
        "/admin/api/lists/email",
        Some(json!({ "list": "block", "value": "a@b.c" })),
    )
    .await;
    assert_eq!(
        email.status.as_u16(),
        405,
        "no kind email: only DELETE of an id"
    );
    let bad_id = admin_send(&app, reqwest::Method::DELETE, "/admin/api/lists/nope", None).await;
    assert_eq!(bad_id.status, 400);
    let unknown = admin_send(
        &app,
        reqwest::Method::DELETE,
        &format!("/admin/api/lists/{}", uuid::Uuid::now_v7()),
        None,
    )
    .await;
    assert_eq!(unknown.status, 404);
    let no_token = app.client.get(format!("{}/admin/api/lists", app.address));
    assert_eq!(app.send_raw(no_token).await.status, 401);
    // Without a token nothing is said about the body: 401 before 400 or 415.
    for (content_type, body) in [
        ("application/json", "{not json"),
        (
            "application/json",
            r#"{"list": "block", "value": "300.1.1.1"}"#,
        ),
        ("text/plain", "hello"),
    ] {
        let anonymous = app
            .client
            .post(format!("{}/admin/api/lists/ip", app.address))
            .header("content-type", content_type)
            .body(body);
        let answer = app.send_raw(anonymous).await;
        assert_eq!(
            (answer.status.as_u16(), answer.error()),
            (401, "unauthorized"),
            "{content_type} {body}"
        );
    }
    // With one, each gets its own answer.
    for (content_type, body, status, error) in [
        ("application/json", "{not json", 400, "invalid_request"),
        ("text/plain", "hello", 415, "unsupported_media_type"),
        (
            "text/json",
            r#"{"list": "block", "value": "10.0.0.1"}"#,
            415,
            "unsupported_media_type",
        ),
    ] {
        let request = app
            .client
            .post(format!("{}/admin/api/lists/ip", app.address))
            .bearer_auth(crate::support::app::ADMIN_TOKEN)
            .header("content-type", content_type)
            .body(body);
        let answer = app.send_raw(request).await;
        assert_eq!(
            (answer.status.as_u16(), answer.error()),
            (status, error),
            "{content_type} {body}"
        );
    }
}

#[test]
fn list_entries_read_from_the_file_and_bad_ones_name_their_key() {
    let load = crate::support::app::load_config;
    let settings = load(
        "[lists]\nallow_ips = [\"10.0.0.0/8\"]\nblock_phones = [\"+88213*\", \"+86 138 0013 8000\"]\n",
    )
    .unwrap();
    let values: Vec<_> = settings
        .lists
        .entries()
        .into_iter()
        .map(|e| e.value)
        .collect();
    assert_eq!(values, ["10.0.0.0/8", "+88213*", "+8613800138000"]);
    assert!(settings.to_redacted_toml().contains("block_phones = ["));
    let error = load("[lists]\nblock_phones = [\"+88213*\", \"nope\"]\n")
        .err()
        .map(|e| e.to_string())
        .unwrap_or_default();
    assert!(error.contains("lists.block_phones[1]"), "{error}");
    let error = load("[lists]\nallow_ips = [\"10.0.0.300\"]\n")
        .err()
        .map(|e| e.to_string())
        .unwrap_or_default();
    assert!(error.contains("lists.allow_ips"), "{error}");
    // The IPv4-mapped /96, once taken as 0.0.0.0/0: every IPv4 client.
    let error = load("[lists]\nallow_ips = [\"10.0.0.0/8\", \"::ffff:0:0/96\"]\n")
        .err()
        .map(|e| e.to_string())
        .unwrap_or_default();
    assert!(error.contains("lists.allow_ips[1]"), "{error}");
    assert!(error.contains("every IPv4 client"), "{error}");
    // A typo's range, everyone, a prefix of no number: each named by its key.
    for (file, key) in [
        ("allow_ips = [\"10.0.0.1/8\"]", "lists.allow_ips[0]"),
        (
            "block_ips = [\"10.0.0.0/8\", \"::/0\"]",
            "lists.block_ips[1]",
        ),
        ("block_phones = [\"+0*\"]", "lists.block_phones[0]"),
    ] {
        let error = load(&format!("[lists]\n{file}\n"))
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(error.contains(key), "{file}: {error}");
    }
}

/// A row of `list_entries` that is no entry (edited by hand: a kind no
/// version writes) is left out; it used to fail every instance's refresh,
/// and with it every admin's change, answered 503 after the database had
/// committed it, without its audit row.
async fn a_row_no_version_reads_stops_no_refresh_and_no_admins_change(kind: DbKind) {
    let db = TestDb::new(kind).await;
    let app = db_app(&db, Duration::from_millis(100)).await;
    let audit = db.connect().await;
    // A row no version reads, and an allow entry of everyone an earlier
    // version took: only a refresh past the first brings in the second.
    let bogus = "0192f0c4-5b6e-7d30-8a55-3f1c2b9e4d10";
    // And a block entry of a kind this version reads, of a value it does
    // not: not in force, and shown apart so that an admin sees it is not.
    let misread = "0192f0c4-5b6e-7d30-8a55-3f1c2b9e4d12";
    run_sql(
        &audit,
        &format!(
            "INSERT INTO list_entries (id, list, kind, value, note, created_at_ms) VALUES \
             ('{bogus}', 'block', 'bogus', 'x', '', 0), \
             ('0192f0c4-5b6e-7d30-8a55-3f1c2b9e4d11', 'allow', 'ip', '0.0.0.0/0', '', 1), \
             ('{misread}', 'block', 'phone', 'not a phone', '', 2), \
             ('not-a-uuid', 'block', 'ip', '203.0.113.0/24', '', 3)"
        ),
    )
    .await;
    let admins_values = || async {
        let listed = admin_send(&app, reqwest::Method::GET, "/admin/api/lists", None).await;
        assert_eq!(listed.status, 200, "{}", listed.body);
        let entries = listed.body["entries"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        entries
            .iter()
            .filter(|e| e["source"] == "admin")
            .filter_map(|e| e["value"].as_str().map(str::to_string))
            .collect::<Vec<_>>()
    };
    crate::support::wait::eventually(
        "the refresh past the row",
        Duration::from_secs(5),
        || async { admins_values().await == ["0.0.0.0/0"] },
    )
    .await;
    let unreadable_ids = || async {
        let listed = admin_send(&app, reqwest::Method::GET, "/admin/api/lists", None).await;
        listed.body["unreadable"]
            .as_array()
            .cloned()
            .unwrap_or_default()
            .iter()
            .filter_map(|e| e["id"].as_str().map(str::to_string))
            .collect::<Vec<_>>()
    };
    assert_eq!(unreadable_ids().await, [misread], "listed apart");
    let console = || async {
        let page = app
            .client
            .get(format!("{}/admin/lists", app.address))
            .bearer_auth(crate::support::app::ADMIN_TOKEN)
            .send()
            .await
            .expect("the page is answered");
        assert_eq!(page.status(), 200);
        page.text().await.expect("a readable page")
    };
    let page = console().await;
    let apart = page.split("Not in force").nth(1).unwrap_or_default();
    assert!(apart.contains("not a phone"), "shown apart: {page}");
    let deleted = admin_send(
        &app,
        reqwest::Method::DELETE,
        &format!("/admin/api/lists/{misread}"),
        None,
    )
    .await;
    assert_eq!(deleted.status, 204, "{}", deleted.body);
    assert!(unreadable_ids().await.is_empty(), "deleted by its id");
    assert!(
        !console().await.contains("Not in force"),
        "and gone from the page"
    );

    let blocked = "198.51.100.77";
    let added = admin_send(
        &app,
        reqwest::Method::POST,
        "/admin/api/lists/ip",
        Some(json!({ "list": "block", "value": "198.51.100.0/24" })),
    )
    .await;
    assert_eq!(added.status, 201, "{}", added.body);
    // The block list is checked first: this send matches no allow entry,
    // so it need not take `ALLOW_LISTED_IP_SENDS` with 0.0.0.0/0 in force.
    assert_eq!(send(&app, PHONE, blocked).await.error(), "blocklisted");
    assert_eq!(admins_values().await, ["0.0.0.0/0", "198.51.100.0/24"]);
    // Its deletion could not be audited as an entry's: refused, kept.
    let unreadable = admin_send(
        &app,
        reqwest::Method::DELETE,
        &format!("/admin/api/lists/{bogus}"),
        None,
    )
    .await;
    assert_eq!(
        (unreadable.status.as_u16(), unreadable.error()),
        (400, "invalid_request"),
        "{}",
        unreadable.body
    );
    let kept = format!("SELECT id FROM list_entries WHERE id = '{bogus}'");
    assert_eq!(run_sql(&audit, &kept).await, 1, "rolled back");

    // A row of an entry an admin means, whose id no version reads (edited
    // by hand), is in force nowhere; the admin's add takes its place rather
    // than answering it, or the address could never be blocked.
    let meant = admin_send(
        &app,
        reqwest::Method::POST,
        "/admin/api/lists/ip",
        Some(json!({ "list": "block", "value": "203.0.113.0/24" })),
    )
    .await;
    assert_eq!(meant.status, 201, "{}", meant.body);
    assert!(
        meant.body["id"].as_str().is_some_and(|id| id.len() == 36),
        "{}",
        meant.body
    );
    assert_eq!(
        send(&app, PHONE, "203.0.113.9").await.error(),
        "blocklisted"
    );
    let replaced = "SELECT id FROM list_entries WHERE id = 'not-a-uuid'";
    assert_eq!(run_sql(&audit, replaced).await, 0, "replaced");

    app.flush_audit().await;
    let trail = admin_send(
        &app,
        reqwest::Method::GET,
        "/admin/api/events?action=admin",
        None,
    )
    .await;
    let mut decisions: Vec<&str> = trail.body["events"]
        .as_array()
        .expect("events")
        .iter()
        .filter_map(|e| e["decision"].as_str())
        .collect();
    // Two rows within one millisecond may come in either order.
    decisions.sort_unstable();
    assert_eq!(
        decisions,
        ["list_add", "list_add", "list_remove"],
        "{}",
        trail.body
    );
}

/// Run `sql` on `audit`'s database; the rows it returned or changed.
async fn run_sql(audit: &tollgate::audit::AuditDb, sql: &str) -> u64 {
    use tollgate::audit::AuditDb;
    let returns_rows = sql.trim_start().starts_with("SELECT");
    match audit {
        AuditDb::Postgres(pool) if returns_rows => sqlx::query(sql)
            .fetch_all(pool)
            .await
            .map(|r| r.len() as u64),
        AuditDb::Postgres(pool) => sqlx::query(sql)
            .execute(pool)
            .await
            .map(|r| r.rows_affected()),
        AuditDb::Sqlite(pool) if returns_rows => sqlx::query(sql)
            .fetch_all(pool)
            .await
            .map(|r| r.len() as u64),
        AuditDb::Sqlite(pool) => sqlx::query(sql)
            .execute(pool)
            .await
            .map(|r| r.rows_affected()),
    }
    .expect("the statement runs")
}

/// A database that takes the connection but not the query (the table
/// locked by another instance's migration) holds no start-up: the ports
/// are bound within `audit.read_timeout`, `/readyz` says not ready for the
/// lists, and once the lock goes the next refresh reads them.
#[tokio::test]
async fn a_locked_list_table_does_not_hold_start_up() {
    use sqlx::Connection;
    let db = TestDb::new(DbKind::Postgres).await;
    db.connect().await;
    let mut holder = sqlx::PgConnection::connect(&db.url).await.unwrap();
    let mut lock = holder.begin().await.unwrap();
    sqlx::query("LOCK TABLE list_entries IN ACCESS EXCLUSIVE MODE")
        .execute(&mut *lock)
        .await
        .unwrap();
    let (url, spool) = (db.url.clone(), db.spool_dir());
    let start = spawn_app_with_audit_db(Backend::Memory, move |s| {
        s.audit.database_url = tollgate::settings::SecretUrl::new(url);
        s.audit.spool_dir = spool.display().to_string();
        s.audit.read_timeout = Duration::from_secs(1);
        s.audit.write_timeout = Duration::from_secs(2);
        s.lists.refresh_interval = Duration::from_millis(200);
        s.sms.phone_limits = limits(&[(1, 3_600_000)]);
    });
    let app = tokio::time::timeout(Duration::from_secs(20), start)
        .await
        .expect("start-up is not held by the locked table");
    assert_eq!(app.get("/healthz").await.status, 200);
    let ready = app.get("/readyz?exclude=audit_database").await;
    assert_eq!(ready.status, 503, "the lists are not read: {}", ready.body);

    // Refreshes go on meanwhile, each given up by PostgreSQL itself: cut
    // off on the client, each left its query queued behind the lock on a
    // pooled connection, and within seconds the audit writer had none.
    tokio::time::sleep(Duration::from_secs(8)).await;
    let phone = "+8613800138000";
    assert_eq!(app.sms_send(json!({ "phone": phone })).await.status, 200);
    assert_eq!(app.sms_send(json!({ "phone": phone })).await.status, 429);
    let trail = db.trail(&app).await;
    assert!(
        trail.iter().any(|e| e.subject == phone),
        "the refusal reached the database while the lists' table stayed locked: {trail:?}"
    );

    lock.rollback().await.unwrap();
    crate::support::wait::eventually("the lists read", Duration::from_secs(30), || async {
        app.get("/readyz").await.status == 200
    })
    .await;
}

/// An admin's add or delete waits no longer than `audit.read_timeout` on a
/// table another session locked against writes (reads still pass): 503,
/// nothing stored, and the audit writer keeps its connections (a statement
/// left queued on a pooled one held it). Once the lock goes both are done.
#[tokio::test]
async fn a_write_to_a_locked_list_table_is_given_up_at_the_read_timeout() {
    use sqlx::Connection;
    let db = TestDb::new(DbKind::Postgres).await;
    let (url, spool) = (db.url.clone(), db.spool_dir());
    let app = spawn_app_with_audit_db(Backend::Memory, move |s| {
        s.audit.database_url = tollgate::settings::SecretUrl::new(url);
        s.audit.spool_dir = spool.display().to_string();
        s.audit.read_timeout = Duration::from_secs(1);
        s.sms.phone_limits = limits(&[(1, 3_600_000)]);
    })
    .await;
    let add = || {
        admin_send(
            &app,
            reqwest::Method::POST,
            "/admin/api/lists/ip",
            Some(json!({ "list": "block", "value": "198.51.100.0/24" })),
        )
    };
    let mut holder = sqlx::PgConnection::connect(&db.url).await.unwrap();
    let mut lock = holder.begin().await.unwrap();
    sqlx::query("LOCK TABLE list_entries IN SHARE MODE")
        .execute(&mut *lock)
        .await
        .unwrap();
    for _ in 0..6 {
        let started = std::time::Instant::now();
        let refused = tokio::time::timeout(Duration::from_secs(10), add())
            .await
            .expect("the add is given up, not held by the lock");
        assert_eq!(
            (refused.status.as_u16(), refused.error()),
            (503, "audit_unavailable"),
            "{}",
            refused.body
        );
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "{:?}",
            started.elapsed()
        );
    }
    // Six given-up writes left no statement queued on the pool's
    // connections: a refusal's row still reaches the database.
    let phone = "+8613800138000";
    assert_eq!(app.sms_send(json!({ "phone": phone })).await.status, 200);
    assert_eq!(app.sms_send(json!({ "phone": phone })).await.status, 429);
    let trail = db.trail(&app).await;
    assert!(trail.iter().any(|e| e.subject == phone), "{trail:?}");

    lock.rollback().await.unwrap();
    let added = add().await;
    assert_eq!(added.status, 201, "{}", added.body);
}
