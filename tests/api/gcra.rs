//! `algorithm = "gcra"` on a limit: a meter with one value per subject,
//! answering like a sliding log (rule name, `retry_after`, audit).

use std::time::Duration;

use serde_json::json;
use tollgate::settings::{Algorithm, LimitSetting};
use tollgate::store::ManualClock;

use crate::on_both_backends;
use crate::support::app::{spawn_app, spawn_app_with_clock, Backend};

const PHONE: &str = "+8613800138000";

on_both_backends!(
    a_gcra_rule_refuses_past_its_burst_and_names_itself,
    a_failed_delivery_gives_the_meter_back,
    an_unblock_clears_the_meter,
);

fn meter(limit: u32, window: Duration) -> LimitSetting {
    LimitSetting {
        algorithm: Algorithm::Gcra,
        ..LimitSetting::new(limit, window)
    }
}

async fn a_gcra_rule_refuses_past_its_burst_and_names_itself(backend: Backend) {
    let app = spawn_app(backend, |s| {
        s.sms.phone_limits = vec![meter(2, Duration::from_secs(3600))];
    })
    .await;

    assert_eq!(app.sms_send(json!({ "phone": PHONE })).await.status, 200);
    let second = app.sms_send(json!({ "phone": PHONE })).await;
    assert_eq!(second.status, 200);
    let resend = second.body["resend_after_secs"].as_u64().unwrap_or(0);
    assert!(
        (1_799..=1_800).contains(&resend),
        "one per 30 min: {resend}"
    );

    let refused = app.sms_send(json!({ "phone": PHONE })).await;
    assert_eq!(refused.status, 429, "{}", refused.body);
    assert_eq!(refused.body["rule"], "phone 2/1h");
    let retry = refused.body["retry_after_secs"].as_u64().unwrap_or(0);
    assert!((1_799..=1_800).contains(&retry), "{retry}");
    let row = &app.audit_events()[0];
    assert_eq!(
        (row.rule.as_deref(), row.observed, row.limit),
        (Some("phone 2/1h"), Some(2), Some(2))
    );

    let state = app
        .admin_get("/admin/api/subjects/phone/%2B8613800138000")
        .await;
    let windows = state.body["windows"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    let window = windows.iter().find(|w| w["rule"] == "phone 2/1h");
    assert_eq!(window.map(|w| &w["count"]), Some(&json!(2)), "{windows:?}");
}

#[tokio::test]
async fn gcra_retry_after_is_exact_to_the_millisecond() {
    let clock = ManualClock::new(1_700_000_000_000);
    let app = spawn_app_with_clock(Backend::Memory, Some(clock.clone()), |s| {
        s.sms.phone_limits = vec![meter(2, Duration::from_secs(60))];
    })
    .await;

    assert_eq!(
        app.sms_send(json!({ "phone": PHONE })).await.body["resend_after_secs"],
        0,
        "a burst of two: the second may follow at once"
    );
    let second = app.sms_send(json!({ "phone": PHONE })).await;
    assert_eq!(second.body["resend_after_secs"], 30);

    clock.advance_ms(10_000);
    let refused = app.sms_send(json!({ "phone": PHONE })).await;
    assert_eq!(refused.status, 429);
    assert_eq!(refused.body["retry_after_secs"], 20);
    let row = &app.audit_events()[0];
    assert_eq!(
        (row.retry_after_ms, row.observed, row.window_ms),
        (Some(20_000), Some(2), Some(60_000))
    );

    clock.advance_ms(19_999);
    assert_eq!(app.sms_send(json!({ "phone": PHONE })).await.status, 429);
    clock.advance_ms(1);
    let again = app.sms_send(json!({ "phone": PHONE })).await;
    assert_eq!(again.status, 200, "one per 30 s once the burst is spent");
    assert_eq!(again.body["resend_after_secs"], 30);
}

async fn a_failed_delivery_gives_the_meter_back(backend: Backend) {
    let app = spawn_app(backend, |s| {
        s.sms.phone_limits = vec![meter(1, Duration::from_secs(3600))];
    })
    .await;

    app.sms.fail(true);
    assert_eq!(app.sms_send(json!({ "phone": PHONE })).await.status, 502);
    app.sms.fail(false);
    let sent = app.sms_send(json!({ "phone": PHONE })).await;
    assert_eq!(
        sent.status, 200,
        "the failed send did not count: {}",
        sent.body
    );
    assert_eq!(app.sms_send(json!({ "phone": PHONE })).await.status, 429);
}

async fn an_unblock_clears_the_meter(backend: Backend) {
    let app = spawn_app(backend, |s| {
        s.sms.phone_limits = vec![meter(1, Duration::from_secs(3600))];
    })
    .await;

    assert_eq!(app.sms_send(json!({ "phone": PHONE })).await.status, 200);
    assert_eq!(app.sms_send(json!({ "phone": PHONE })).await.status, 429);
    let unblocked = app
        .admin_post("/admin/api/subjects/phone/%2B8613800138000/unblock")
        .await;
    assert_eq!(unblocked.status, 200, "{}", unblocked.body);
    assert_eq!(app.sms_send(json!({ "phone": PHONE })).await.status, 200);
}

#[test]
fn a_gcra_limit_reads_from_the_file_and_too_large_a_meter_is_refused() {
    let load = crate::support::app::load_config;
    let settings = load(
        "[sms]\nglobal_limits = [{ limit = 100000, window = \"1m\", algorithm = \"gcra\" }]\n",
    )
    .unwrap();
    assert_eq!(
        settings.sms.global_limits,
        vec![meter(100_000, Duration::from_secs(60))]
    );
    assert!(settings.to_redacted_toml().contains("algorithm = \"gcra\""));

    let error = load(
        "[sms]\nglobal_limits = [{ limit = 4000000000, window = \"30d\", algorithm = \"gcra\" }]\n",
    )
    .err()
    .map(|e| e.to_string())
    .unwrap_or_default();
    assert!(error.contains("`sms.global_limits[0]`"), "{error}");
    let error = load(
        "[sms]\nglobal_limits = [{ limit = 10, window = \"1m\", algorithm = \"token_bucket\" }]\n",
    )
    .err()
    .map(|e| e.to_string())
    .unwrap_or_default();
    assert!(error.contains("sms.global_limits"), "{error}");
}

/// Every window of a request is written out as Lua on Redis: a list long
/// enough to break the script is refused at start-up, naming its key.
#[test]
fn more_than_sixteen_windows_in_one_list_are_refused() {
    let list = |n: usize| {
        let windows: Vec<String> = (1..=n)
            .map(|i| format!("{{ limit = {i}, window = \"{i}m\", algorithm = \"gcra\" }}"))
            .collect();
        format!("[sms]\nip_limits = [{}]\n", windows.join(", "))
    };
    assert!(crate::support::app::load_config(&list(16)).is_ok());
    let error = crate::support::app::config_error(&list(17));
    assert!(
        error.contains("`sms.ip_limits`: at most 16 windows (got 17)"),
        "{error}"
    );
}
