//! Shadow for one rule (`shadow = true` on a window) and for one section
//! (`sms.shadow`, `login.shadow`): tried on live traffic while the rest
//! enforces.

use std::time::Duration;

use serde_json::json;
use tollgate::audit::{AuditDecision, AuditEvent};
use tollgate::domain::Action;
use tollgate::settings::LimitSetting;
use tollgate::store::ManualClock;

use crate::on_both_backends;
use crate::support::app::{limits, spawn_app, spawn_app_with_clock, Backend, TestApp};

const PHONE: &str = "+8613800138000";

on_both_backends!(
    a_rule_in_shadow_is_audited_but_not_enforced,
    sms_shadow_lets_sends_through_while_logins_enforce,
    login_shadow_lets_logins_through_while_sends_enforce,
);

fn on_trial(limit: u32, window_ms: u64) -> LimitSetting {
    LimitSetting {
        shadow: true,
        ..LimitSetting::new(limit, Duration::from_millis(window_ms))
    }
}

fn rules(events: &[AuditEvent]) -> Vec<(Option<&str>, AuditDecision, bool, Option<i64>)> {
    events
        .iter()
        .map(|e| (e.rule.as_deref(), e.decision, e.shadow, e.observed))
        .collect()
}

async fn a_rule_in_shadow_is_audited_but_not_enforced(backend: Backend) {
    let app = spawn_app(backend, |s| {
        s.sms.phone_limits = vec![
            on_trial(1, 3_600_000),
            LimitSetting::new(3, Duration::from_secs(3600)),
        ];
    })
    .await;

    let first = app.sms_send(json!({ "phone": PHONE })).await;
    assert_eq!(first.status, 200, "{}", first.body);
    assert_eq!(
        first.body["resend_after_secs"], 0,
        "a rule on trial does not say to wait"
    );
    for _ in 0..2 {
        let answer = app.sms_send(json!({ "phone": PHONE })).await;
        assert_eq!(answer.status, 200, "{}", answer.body);
    }
    let refused = app.sms_send(json!({ "phone": PHONE })).await;
    assert_eq!(refused.status, 429, "the enforced rule still refuses");
    assert_eq!(refused.body["rule"], "phone 3/1h");
    assert_eq!(app.sms.messages().len(), 3);

    let events = app.audit_events();
    assert_eq!(
        rules(&events),
        vec![
            (Some("phone 1/1h"), AuditDecision::Deny, true, Some(1)),
            (Some("phone 1/1h"), AuditDecision::Deny, true, Some(2)),
            (Some("phone 3/1h"), AuditDecision::Deny, false, Some(3)),
        ],
        "each send the trial rule would refuse, then the real refusal alone"
    );
    for row in &events[..2] {
        assert_eq!(row.reason, "rate_limited");
        let retry = row.retry_after_ms.expect("a would-be wait");
        assert!(retry > 3_500_000 && retry <= 3_600_000, "{retry}");
    }

    let state = app
        .admin_get("/admin/api/subjects/phone/%2B8613800138000")
        .await;
    assert_eq!(state.status, 200, "{}", state.body);
    let windows = state.body["windows"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    let trial = windows.iter().find(|w| w["rule"] == "phone 1/1h");
    assert_eq!(trial.map(|w| &w["shadow"]), Some(&json!(true)));
    assert_eq!(trial.map(|w| &w["count"]), Some(&json!(3)));
    let enforced = windows.iter().find(|w| w["rule"] == "phone 3/1h");
    assert_eq!(
        enforced.map(|w| w.get("shadow").is_none()),
        Some(true),
        "{windows:?}"
    );
}

#[tokio::test]
async fn a_shadow_rows_wait_is_exact_to_the_millisecond() {
    let clock = ManualClock::new(1_700_000_000_000);
    let app = spawn_app_with_clock(Backend::Memory, Some(clock.clone()), |s| {
        s.sms.phone_limits = vec![on_trial(1, 60_000)];
    })
    .await;

    assert_eq!(app.sms_send(json!({ "phone": PHONE })).await.status, 200);
    clock.advance_ms(15_500);
    assert_eq!(app.sms_send(json!({ "phone": PHONE })).await.status, 200);
    let events = app.audit_events();
    assert_eq!(events.len(), 1);
    assert_eq!(
        (
            events[0].retry_after_ms,
            events[0].limit,
            events[0].window_ms
        ),
        (Some(44_500), Some(1), Some(60_000))
    );
}

async fn login_failures(app: &TestApp, n: usize) -> Vec<serde_json::Value> {
    let mut answers = Vec::new();
    for _ in 0..n {
        let answer = app
            .login_attempt(json!({ "user": "alice", "success": false, "captcha_passed": true }))
            .await;
        assert_eq!(answer.status, 200, "{}", answer.body);
        answers.push(answer.body);
    }
    answers
}

async fn sms_shadow_lets_sends_through_while_logins_enforce(backend: Backend) {
    let app = spawn_app(backend, |s| {
        s.sms.shadow = true;
        s.sms.phone_limits = limits(&[(1, 3_600_000)]);
        s.login.lock_after = 2;
    })
    .await;

    for _ in 0..2 {
        assert_eq!(app.sms_send(json!({ "phone": PHONE })).await.status, 200);
    }
    let answers = login_failures(&app, 3).await;
    assert_eq!(answers[1]["locked"], true, "{answers:?}");
    assert_eq!(answers[2]["decision"], "deny");

    let events = app.audit_events();
    let sms: Vec<_> = events
        .iter()
        .filter(|e| e.action == Action::SmsSend)
        .collect();
    assert_eq!(sms.len(), 1);
    assert!(sms[0].shadow);
    assert!(events
        .iter()
        .filter(|e| e.action == Action::LoginAttempt)
        .all(|e| !e.shadow));
}

async fn login_shadow_lets_logins_through_while_sends_enforce(backend: Backend) {
    let app = spawn_app(backend, |s| {
        s.login.shadow = true;
        s.sms.phone_limits = limits(&[(1, 3_600_000)]);
        s.login.lock_after = 2;
    })
    .await;

    assert_eq!(app.sms_send(json!({ "phone": PHONE })).await.status, 200);
    assert_eq!(app.sms_send(json!({ "phone": PHONE })).await.status, 429);
    let answers = login_failures(&app, 3).await;
    assert!(
        answers
            .iter()
            .all(|a| a["decision"] == "allow" && a["locked"] == false),
        "{answers:?}"
    );

    let events = app.audit_events();
    let logins: Vec<_> = events
        .iter()
        .filter(|e| e.action == Action::LoginAttempt)
        .collect();
    assert!(
        logins
            .iter()
            .any(|e| e.decision == AuditDecision::Lock && e.shadow),
        "the would-be lock is audited: {logins:?}"
    );
    assert!(events
        .iter()
        .filter(|e| e.action == Action::SmsSend)
        .all(|e| !e.shadow));
}

#[test]
fn a_window_in_shadow_reads_from_the_file_and_prints_back() {
    let path =
        std::env::temp_dir().join(format!("tollgate-{}.toml", uuid::Uuid::new_v4().simple()));
    std::fs::write(
        &path,
        "[sms]\nphone_limits = [{ limit = 1, window = \"60s\", shadow = true }, { limit = 5, window = \"1h\" }]\nshadow = false\n[login]\nshadow = true\n",
    )
    .unwrap();
    let settings = tollgate::settings::Settings::load(Some(&path));
    std::fs::remove_file(&path).unwrap();
    let settings = settings.unwrap();
    assert_eq!(
        settings.sms.phone_limits,
        vec![
            on_trial(1, 60_000),
            LimitSetting::new(5, Duration::from_secs(3600))
        ]
    );
    assert!(settings.login.shadow && !settings.sms.shadow);
    let printed = settings.to_redacted_toml();
    assert!(
        printed.contains("shadow = true"),
        "the trial window prints its flag: {printed}"
    );
    let back: tollgate::settings::Settings = toml::from_str(&printed).unwrap();
    assert_eq!(back.sms.phone_limits, settings.sms.phone_limits);
}
