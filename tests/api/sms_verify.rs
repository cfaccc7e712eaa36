use serde_json::json;
use tollgate::audit::AuditDecision;
use tollgate::store::ManualClock;

use crate::helpers::{spawn_app, spawn_app_with_clock, Backend};
use crate::on_both_backends;

const PHONE: &str = "+8613800138000";

on_both_backends!(
    a_code_verifies_once_and_is_then_used_up,
    wrong_codes_count_down_and_the_last_one_burns_the_code,
    a_new_send_replaces_the_previous_code,
    a_code_never_sent_is_invalid_with_no_attempts_left,
);

fn wrong(code: &str) -> String {
    // Any six digits but the right ones.
    let first = code.as_bytes()[0];
    let swapped = if first == b'9' {
        '0'
    } else {
        char::from(first + 1)
    };
    format!("{swapped}{}", &code[1..])
}

async fn a_code_verifies_once_and_is_then_used_up(backend: Backend) {
    let app = spawn_app(backend, |_| {}).await;
    assert_eq!(app.sms_send(json!({ "phone": PHONE })).await.status, 200);
    let code = app.sms.last_code(PHONE);

    let first = app
        .sms_verify(json!({ "phone": "+86 138 0013 8000", "code": code }))
        .await;
    assert_eq!(first.status, 200);
    assert_eq!(first.body, json!({ "valid": true }));

    let again = app
        .sms_verify(json!({ "phone": PHONE, "code": code }))
        .await;
    assert_eq!(again.body, json!({ "valid": false, "attempts_left": 0 }));
}

async fn wrong_codes_count_down_and_the_last_one_burns_the_code(backend: Backend) {
    let app = spawn_app(backend, |s| s.sms.max_verify_attempts = 3).await;
    app.sms_send(json!({ "phone": PHONE })).await;
    let code = app.sms.last_code(PHONE);

    for left in [2, 1, 0] {
        let answer = app
            .sms_verify(json!({ "phone": PHONE, "code": wrong(&code) }))
            .await;
        assert_eq!(answer.status, 200);
        assert_eq!(
            answer.body,
            json!({ "valid": false, "attempts_left": left })
        );
    }
    let burnt = app
        .sms_verify(json!({ "phone": PHONE, "code": code }))
        .await;
    assert_eq!(
        burnt.status, 429,
        "even the right code is refused once burnt"
    );
    assert_eq!(burnt.error(), "rate_limited");
    assert_eq!(burnt.body["rule"], "phone 3/5m");
    let secs: u64 = burnt.retry_after.as_deref().unwrap().parse().unwrap();
    assert!(
        (299..=300).contains(&secs),
        "until the code expires: {secs}"
    );

    let events = app.audit_events();
    assert_eq!(events[0].reason, "verify_attempts_exhausted");
    assert_eq!(events[0].decision, AuditDecision::Deny);
    assert_eq!(events[0].subject, PHONE);
    assert_eq!(events.len(), 2, "the burn and the refused try after it");

    app.sms_send(json!({ "phone": PHONE, "captcha_passed": true }))
        .await;
    let fresh = app.sms.last_code(PHONE);
    let answer = app
        .sms_verify(json!({ "phone": PHONE, "code": fresh }))
        .await;
    assert_eq!(
        answer.body,
        json!({ "valid": true }),
        "a new send starts afresh"
    );
}

async fn a_new_send_replaces_the_previous_code(backend: Backend) {
    let app = spawn_app(backend, |_| {}).await;
    app.sms_send(json!({ "phone": PHONE })).await;
    let old = app.sms.last_code(PHONE);
    app.sms_send(json!({ "phone": PHONE })).await;
    let new = app.sms.last_code(PHONE);
    if old != new {
        let answer = app.sms_verify(json!({ "phone": PHONE, "code": old })).await;
        assert_eq!(answer.body["valid"], false);
    }
    let answer = app.sms_verify(json!({ "phone": PHONE, "code": new })).await;
    assert_eq!(answer.body, json!({ "valid": true }));
}

async fn a_code_never_sent_is_invalid_with_no_attempts_left(backend: Backend) {
    let app = spawn_app(backend, |_| {}).await;
    let answer = app
        .sms_verify(json!({ "phone": PHONE, "code": "123456" }))
        .await;
    assert_eq!(answer.status, 200);
    assert_eq!(answer.body, json!({ "valid": false, "attempts_left": 0 }));
    assert!(app.audit_events().is_empty());
}

#[tokio::test]
async fn an_expired_code_is_invalid_with_no_attempts_left() {
    let clock = ManualClock::new(1_700_000_000_000);
    let app = spawn_app_with_clock(Backend::Memory, Some(clock.clone()), |_| {}).await;
    app.sms_send(json!({ "phone": PHONE })).await;
    let code = app.sms.last_code(PHONE);
    clock.advance_ms(300_001);
    let answer = app
        .sms_verify(json!({ "phone": PHONE, "code": code }))
        .await;
    assert_eq!(answer.body, json!({ "valid": false, "attempts_left": 0 }));
}
