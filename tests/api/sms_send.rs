use std::time::Duration;

use serde_json::json;
use tollgate::audit::AuditDecision;
use tollgate::domain::SubjectKind;
use tollgate::settings::Settings;
use tollgate::store::ManualClock;

use crate::on_both_backends;
use crate::support::app::{
    limits, spawn_app, spawn_app_timed, spawn_app_with_clock, Backend, TestApp,
};

const PHONE: &str = "+8613800138000";
const OTHER_PHONE: &str = "+8613900139000";

on_both_backends!(
    a_send_answers_the_masked_phone_and_delivers_a_six_digit_code,
    every_window_of_a_rule_counts_exactly,
    concurrent_sends_for_one_phone_let_exactly_the_limit_through,
    a_blocked_ip_does_not_use_up_the_phone_quota,
    sends_refused_at_once_by_their_address_never_refuse_the_phone,
    the_prefix_and_global_windows_apply_across_phones,
    the_captcha_tier_refuses_until_a_captcha_is_passed,
    regions_outside_the_allow_list_or_on_the_deny_list_are_refused,
    numbers_of_no_region_are_named_001,
    a_failed_delivery_gives_the_reservation_back,
    a_failed_delivery_deletes_its_own_code_not_one_a_racing_send_put,
    failed_deliveries_past_the_address_budget_count_in_its_windows,
    an_outage_costs_no_address_its_budget,
    the_64s_of_one_network_share_one_failure_budget,
    shadow_mode_lets_everything_through_and_audits_what_it_would_refuse,
    the_64s_of_one_network_share_its_captcha_tier,
    a_network_window_refuses_every_64_of_the_network,
    a_backend_that_names_no_client_is_not_one_address_every_send_fills,
    a_backend_passing_its_loopback_address_is_not_one_address_every_send_fills,
    a_number_refused_for_a_send_naming_no_client_is_kept_by_its_phone,
    a_declined_send_naming_no_client_is_kept_by_its_phone,
    a_refused_number_is_kept_by_the_address_tier_without_address_windows,
);

async fn a_send_answers_the_masked_phone_and_delivers_a_six_digit_code(backend: Backend) {
    let app = spawn_app(backend, |s| {
        s.sms.phone_limits = limits(&[(1, 60_000), (5, 3_600_000)])
    })
    .await;

    let answer = app
        .sms_send(json!({ "phone": "+86 138 0013 8000", "locale": "zh-CN" }))
        .await;

    assert_eq!(answer.status, 200, "{}", answer.body);
    assert_eq!(
        answer.body,
        json!({
            "status": "sent",
            "phone": "+86138****8000",
            "code_ttl_secs": 300,
            "resend_after_secs": 60,
            "captcha_required": false
        })
    );
    let messages = app.sms.messages();
    assert_eq!(messages.len(), 1);
    assert_eq!(messages[0].to, PHONE);
    assert_eq!(messages[0].locale, "zh-CN");
    assert_eq!(app.sms.last_code(PHONE).len(), 6);
    assert!(
        app.audit_events().is_empty(),
        "allowed sends are not audited"
    );
}

async fn every_window_of_a_rule_counts_exactly(backend: Backend) {
    let app = spawn_app_timed(backend, |s| {
        s.sms.phone_limits = limits(&[(2, 1_000), (3, 3_000)])
    })
    .await;
    let send = || app.sms_send(json!({ "phone": PHONE }));

    assert_eq!(send().await.status, 200);
    assert_eq!(send().await.status, 200);
    let third = send().await;
    assert_eq!(third.status, 429, "{}", third.body);
    assert_eq!(third.body["rule"], "phone 2/1s");

    app.pass(Duration::from_millis(1_100)).await;
    assert_eq!(send().await.status, 200, "the 1s window has emptied");
    let fourth = send().await;
    assert_eq!(fourth.status, 429);
    assert_eq!(
        fourth.body["rule"], "phone 3/3s",
        "the 3s window still holds three"
    );
    assert_eq!(app.sms.messages().len(), 3);
}

async fn concurrent_sends_for_one_phone_let_exactly_the_limit_through(backend: Backend) {
    let app = spawn_app(backend, |s| s.sms.phone_limits = limits(&[(7, 3_600_000)])).await;

    let sends = (0..60).map(|_| app.sms_send(json!({ "phone": PHONE })));
    let answers = futures::future::join_all(sends).await;

    let sent = answers.iter().filter(|a| a.status == 200).count();
    let limited = answers.iter().filter(|a| a.status == 429).count();
    assert_eq!((sent, limited), (7, 53));
    assert_eq!(app.sms.messages().len(), 7);
}

async fn a_blocked_ip_does_not_use_up_the_phone_quota(backend: Backend) {
    let app = spawn_app(backend, |s| {
        s.sms.phone_limits = limits(&[(1, 3_600_000)]);
        s.sms.ip_limits = limits(&[(1, 3_600_000)]);
    })
    .await;

    assert_eq!(
        app.sms_send(json!({ "phone": PHONE, "ip": "203.0.113.7" }))
            .await
            .status,
        200
    );
    let blocked = app
        .sms_send(json!({ "phone": OTHER_PHONE, "ip": "203.0.113.7" }))
        .await;
    assert_eq!(blocked.status, 429);
    assert_eq!(blocked.body["rule"], "ip 1/1h");

    let victim = app
        .sms_send(json!({ "phone": OTHER_PHONE, "ip": "198.51.100.9" }))
        .await;
    assert_eq!(
        victim.status, 200,
        "the victim phone still has its quota: {}",
        victim.body
    );

    let events = app.audit_events();
    assert_eq!(events.len(), 1);
    let e = &events[0];
    assert_eq!(
        (e.decision, e.subject_kind, e.subject.as_str()),
        (AuditDecision::Deny, SubjectKind::Ip, "203.0.113.7")
    );
    assert_eq!(
        (e.rule.as_deref(), e.observed, e.limit, e.window_ms),
        (Some("ip 1/1h"), Some(1), Some(1), Some(3_600_000))
    );
    assert_eq!(e.ip.as_deref(), Some("203.0.113.7"));
    assert!(e.request_id.is_some());
}

/// A hundred sends at once from an address already at its limit, to each
/// of twelve phones with room for one: every one is refused by the
/// address, none by the phone (a slot another refused send held for a
/// moment), so no victim's phone is refused or audited as refused; its
/// owner then sends.
async fn sends_refused_at_once_by_their_address_never_refuse_the_phone(backend: Backend) {
    let app = spawn_app(backend, |s| {
        s.sms.phone_limits = limits(&[(1, 3_600_000)]);
        s.sms.ip_limits = limits(&[(1, 3_600_000)]);
    })
    .await;
    let attacker = "203.0.113.7";
    let first = app
        .sms_send(json!({ "phone": PHONE, "ip": attacker }))
        .await;
    assert_eq!(first.status, 200);
    for n in 10..22 {
        let (victim, owner) = (format!("+86139001390{n}"), format!("198.51.100.{n}"));
        let sends = (0..100).map(|_| app.sms_send(json!({ "phone": victim, "ip": attacker })));
        let answers = futures::future::join_all(sends).await;
        let rules: Vec<_> = answers.iter().map(|a| a.body["rule"].clone()).collect();
        assert!(
            answers
                .iter()
                .all(|a| a.status == 429 && a.body["rule"] == "ip 1/1h"),
            "{victim}: {rules:?}"
        );
        let owner = app.sms_send(json!({ "phone": victim, "ip": owner })).await;
        assert_eq!(owner.status, 200, "{victim}: {}", owner.body);
    }
    app.flush_audit().await;
    let refused = |kind| {
        app.audit_events()
            .iter()
            .filter(|e| e.subject_kind == kind)
            .count()
    };
    assert_eq!(
        (refused(SubjectKind::Ip), refused(SubjectKind::Phone)),
        (1200, 0)
    );
}

async fn the_prefix_and_global_windows_apply_across_phones(backend: Backend) {
    let app = spawn_app(backend, |s| {
        s.sms.prefix_limits = limits(&[(2, 3_600_000)]);
        s.sms.global_limits = limits(&[(3, 3_600_000)]);
    })
    .await;

    assert_eq!(
        app.sms_send(json!({ "phone": "+8613800138000" }))
            .await
            .status,
        200
    );
    assert_eq!(
        app.sms_send(json!({ "phone": "+8613800138001" }))
            .await
            .status,
        200
    );
    let same_range = app.sms_send(json!({ "phone": "+8613800138002" })).await;
    assert_eq!(same_range.status, 429);
    assert_eq!(same_range.body["rule"], "prefix 2/1h");
    let prefix_row = &app.audit_events()[0];
    assert_eq!(
        (prefix_row.subject_kind, prefix_row.subject.as_str()),
        (SubjectKind::Prefix, "+8613800")
    );

    assert_eq!(
        app.sms_send(json!({ "phone": "+8613900139000" }))
            .await
            .status,
        200
    );
    let global = app.sms_send(json!({ "phone": "+8613700137000" })).await;
    assert_eq!(global.status, 429);
    assert_eq!(global.body["rule"], "global 3/1h");
    assert_eq!(app.audit_events()[1].subject, "sms_send");
}

async fn the_captcha_tier_refuses_until_a_captcha_is_passed(backend: Backend) {
    let app = spawn_app(backend, |s| s.sms.captcha_after = 2).await;
    let send = |body| app.sms_send(body);

    assert_eq!(
        send(json!({ "phone": PHONE })).await.body["captcha_required"],
        false
    );
    let second = send(json!({ "phone": PHONE })).await;
    assert_eq!(
        second.body["captcha_required"], true,
        "the next send will need a captcha"
    );

    let refused = send(json!({ "phone": PHONE })).await;
    assert_eq!(refused.status, 403);
    assert_eq!(refused.error(), "captcha_required");
    assert_eq!(refused.body["captcha_required"], true);

    let not_passed = send(json!({ "phone": PHONE, "captcha_passed": false })).await;
    assert_eq!(not_passed.status, 403);

    let passed = send(json!({ "phone": PHONE, "captcha_passed": true })).await;
    assert_eq!(passed.status, 200, "{}", passed.body);
    assert_eq!(app.sms.messages().len(), 3);

    let events = app.audit_events();
    assert_eq!(events.len(), 2);
    assert!(events
        .iter()
        .all(|e| e.decision == AuditDecision::Challenge && e.reason == "captcha_required"));
    assert_eq!(events[0].rule.as_deref(), Some("phone 2/1h"));
}

async fn regions_outside_the_allow_list_or_on_the_deny_list_are_refused(backend: Backend) {
    let app = spawn_app(backend, |s| {
        s.sms.allowed_regions = vec!["CN".into(), "US".into()];
        s.sms.denied_regions = vec!["US".into()];
    })
    .await;

    assert_eq!(app.sms_send(json!({ "phone": PHONE })).await.status, 200);
    for phone in ["+14155552671", "+447400123456"] {
        let answer = app.sms_send(json!({ "phone": phone })).await;
        assert_eq!(answer.status, 403, "{phone}");
        assert_eq!(answer.error(), "region_blocked", "{phone}");
    }
    let events = app.audit_events();
    assert_eq!(events.len(), 2);
    assert!(events
        .iter()
        .all(|e| e.reason == "region_blocked" && e.decision == AuditDecision::Deny));
    assert_eq!(app.sms.messages().len(), 1);
}

async fn numbers_of_no_region_are_named_001(backend: Backend) {
    let app = spawn_app(backend, |s| s.sms.denied_regions = vec!["001".into()]).await;

    assert_eq!(app.sms_send(json!({ "phone": PHONE })).await.status, 200);
    // Global freephone and two satellite services: pumping's favourites.
    for phone in ["+80012345678", "+881612345678", "+870301234567"] {
        let answer = app.sms_send(json!({ "phone": phone })).await;
        assert_eq!(answer.status, 403, "{phone}: {}", answer.body);
        assert_eq!(answer.error(), "region_blocked", "{phone}");
    }
    assert_eq!(app.sms.messages().len(), 1);

    let only = spawn_app(backend, |s| s.sms.allowed_regions = vec!["001".into()]).await;
    assert_eq!(only.sms_send(json!({ "phone": PHONE })).await.status, 403);
    let satellite = only.sms_send(json!({ "phone": "+881612345678" })).await;
    assert_eq!(satellite.status, 200, "{}", satellite.body);
}

async fn a_failed_delivery_gives_the_reservation_back(backend: Backend) {
    let app = spawn_app(backend, |s| s.sms.phone_limits = limits(&[(1, 3_600_000)])).await;

    app.sms.fail(true);
    let failed = app.sms_send(json!({ "phone": PHONE })).await;
    assert_eq!(failed.status, 502);
    assert_eq!(failed.error(), "delivery_failed");

    app.sms.fail(false);
    let retried = app.sms_send(json!({ "phone": PHONE })).await;
    assert_eq!(
        retried.status, 200,
        "the failed send did not use the quota: {}",
        retried.body
    );
    let code = app.sms.last_code(PHONE);
    let verified = app
        .sms_verify(json!({ "phone": PHONE, "code": code }))
        .await;
    assert_eq!(verified.body, json!({ "valid": true }));
}

/// An app whose addresses may send 3 an hour, 2 of them declined and
/// given back whole, and whose IPv6 networks may have 3 given back.
async fn spawn_with_failure_budget(backend: Backend) -> TestApp {
    spawn_app(backend, |s| {
        s.sms.ip_limits = limits(&[(3, 3_600_000)]);
        s.sms.failed_delivery_limit = limits(&[(2, 3_600_000)]).remove(0);
        // Larger than the address's, as by default: a test that used the
        // address's budget for the network's would fail.
        s.sms.failed_delivery_network_limit = limits(&[(3, 3_600_000)]).remove(0);
    })
    .await
}

/// Send to `phone` from `ip`, which the provider fails.
async fn failed_send(app: &TestApp, phone: &str, ip: &str) {
    let failed = app.sms_send(json!({ "phone": phone, "ip": ip })).await;
    assert_eq!(
        failed.error(),
        "delivery_failed",
        "{phone} from {ip}: {}",
        failed.body
    );
}

/// A failure the caller picks (a Twilio 21408 for a number the account
/// may not text) is given back whole `sms.failed_delivery_limit` times an
/// address; past that each one counts in the address's windows, which
/// then refuse it: one address cannot make a provider call per request
/// without end. The phones' windows are given back all the same, and an
/// admin's unblock of the address gives it its budget back.
async fn failed_deliveries_past_the_address_budget_count_in_its_windows(backend: Backend) {
    let app = spawn_with_failure_budget(backend).await;
    let attacker = "203.0.113.66";
    let phone = |i: usize| format!("+86138001382{i:02}");
    // Declined sends until the first refused one: how many reached the provider.
    let declined_until_refused = |from: &'static str| {
        let app = &app;
        async move {
            for i in 0..10 {
                let answer = app.sms_send(json!({ "phone": phone(i), "ip": from })).await;
                if answer.status == 429 {
                    assert_eq!(answer.body["rule"], "ip 3/1h", "{}", answer.body);
                    return i;
                }
                assert_eq!(
                    answer.error(),
                    "delivery_failed",
                    "send {i}: {}",
                    answer.body
                );
            }
            panic!("ten declined sends from {from}, none refused");
        }
    };
    let over_budget = r#"tollgate_sms_deliveries_total{outcome="over_budget"}"#;
    let before = app.metric(over_budget).await;
    app.sms.decline(true);
    assert_eq!(
        declined_until_refused(attacker).await,
        5,
        "two given back, three counted"
    );
    // Other tests count in the process's series too, never down.
    assert!(app.metric(over_budget).await - before >= 3.0);
    let unblocked = app
        .admin_post(&format!("/admin/api/subjects/ip/{attacker}/unblock"))
        .await;
    assert_eq!(unblocked.status, 200, "{}", unblocked.body);
    assert_eq!(
        declined_until_refused(attacker).await,
        5,
        "the budget is back whole"
    );
    // Another address starts from nothing, and the phones owe nothing.
    app.sms.decline(false);
    let user = app
        .sms_send(json!({ "phone": phone(4), "ip": "198.51.100.7" }))
        .await;
    assert_eq!(user.status, 200, "{}", user.body);
}

/// The provider's outage is no one's pick: however many sends it fails
/// from one address (behind it, a NAT's many users), each is given back
/// whole and spends no budget.
async fn an_outage_costs_no_address_its_budget(backend: Backend) {
    let app = spawn_with_failure_budget(backend).await;
    let nat = "203.0.113.67";
    app.sms.fail(true);
    for i in 0..8 {
        failed_send(&app, &format!("+86138001383{i:02}"), nat).await;
    }
    // The budget is whole: two declined sends are given back whole...
    app.sms.fail(false);
    app.sms.decline(true);
    for i in 0..2 {
        failed_send(&app, &format!("+86138001384{i:02}"), nat).await;
    }
    // ...and the NAT's windows too: its 3/1h passes three.
    app.sms.decline(false);
    for i in 0..3 {
        let sent = app
            .sms_send(json!({ "phone": format!("+86138001385{i:02}"), "ip": nat }))
            .await;
        assert_eq!(sent.status, 200, "send {i}: {}", sent.body);
    }
}

/// An IPv6 network has one budget for all its /64s
/// (`sms.failed_delivery_network_limit`): else one /48 would have 65,536
/// of them. Past it, each /64's declined sends count in its windows at
/// once, and spend none of the /64's own budget; the network's Unblock
/// gives the budget back.
async fn the_64s_of_one_network_share_one_failure_budget(backend: Backend) {
    let app = spawn_with_failure_budget(backend).await;
    app.sms.decline(true);
    let phone = |i: usize| format!("+86138001385{i:02}");
    for (i, ip) in ["2001:db8:7:1::1", "2001:db8:7:3::1"].iter().enumerate() {
        failed_send(&app, &phone(i), ip).await;
    }
    // One more is given back whole (the /48's third), then three count.
    let other_64 = "2001:db8:7:2::1";
    for i in 2..6 {
        failed_send(&app, &phone(i), other_64).await;
    }
    let refused = app
        .sms_send(json!({ "phone": phone(6), "ip": other_64 }))
        .await;
    assert_eq!(
        (refused.status.as_u16(), refused.body["rule"].as_str()),
        (429, Some("ip 3/1h")),
        "the /48's budget was spent, each failure past it counted: {}",
        refused.body
    );
    // A /64 whose send the network's budget refused keeps its own budget:
    // once the network's Unblock clears it, two are given back whole and
    // two more fill the rest of the /64's 3/1h.
    let late_64 = "2001:db8:7:4::1";
    failed_send(&app, &phone(7), late_64).await;
    let unblocked = app
        .admin_post("/admin/api/subjects/network/2001:db8:7::%2F48/unblock")
        .await;
    assert_eq!(unblocked.status, 200, "{}", unblocked.body);
    for i in 8..21 {
        let answer = app
            .sms_send(json!({ "phone": phone(i), "ip": late_64 }))
            .await;
        if answer.status == 429 {
            assert_eq!(answer.body["rule"], "ip 3/1h", "{}", answer.body);
            assert_eq!(i - 8, 4, "two given back, two counted after the one before");
            return;
        }
        assert_eq!(
            answer.error(),
            "delivery_failed",
            "send {i}: {}",
            answer.body
        );
    }
    panic!("thirteen declined sends from {late_64}, none refused");
}

async fn a_failed_delivery_deletes_its_own_code_not_one_a_racing_send_put(backend: Backend) {
    let app = spawn_app(backend, |_| {}).await;
    let held = app.sms.hold_next_failure();

    let failing = app.sms_send(json!({ "phone": PHONE }));
    let racing = async {
        held.arrived
            .await
            .expect("the first send reaches the provider");
        let sent = app.sms_send(json!({ "phone": PHONE })).await;
        let _ = held.release.send(());
        sent
    };
    let (failed, sent) = tokio::join!(failing, racing);
    assert_eq!(failed.status, 502, "{}", failed.body);
    assert_eq!(sent.status, 200, "{}", sent.body);

    let code = app.sms.last_code(PHONE);
    let verified = app
        .sms_verify(json!({ "phone": PHONE, "code": code }))
        .await;
    assert_eq!(
        verified.body,
        json!({ "valid": true }),
        "the SMS that went out verifies after the other send failed"
    );
}

async fn shadow_mode_lets_everything_through_and_audits_what_it_would_refuse(backend: Backend) {
    let app = spawn_app(backend, |s| {
        s.shadow.enabled = true;
        s.sms.phone_limits = limits(&[(1, 3_600_000)]);
        s.sms.denied_regions = vec!["US".into()];
    })
    .await;

    for _ in 0..3 {
        let answer = app.sms_send(json!({ "phone": PHONE })).await;
        assert_eq!(answer.status, 200, "{}", answer.body);
        assert_eq!(answer.body["resend_after_secs"], 0);
    }
    assert_eq!(
        app.sms_send(json!({ "phone": "+14155552671" }))
            .await
            .status,
        200
    );
    assert_eq!(app.sms.messages().len(), 4);

    let events = app.audit_events();
    assert_eq!(
        events.len(),
        3,
        "two would-be rate limits and one region block"
    );
    assert!(events
        .iter()
        .all(|e| e.shadow && e.decision == AuditDecision::Deny));
    assert_eq!(events[0].rule.as_deref(), Some("phone 1/1h"));
    assert_eq!(
        events[1].observed,
        Some(2),
        "shadow sends are recorded as allowed"
    );
}

#[tokio::test]
async fn retry_after_is_exact_to_the_second_and_rounded_up() {
    let clock = ManualClock::new(1_700_000_000_000);
    let app = spawn_app_with_clock(Backend::Memory, Some(clock.clone()), |s| {
        s.sms.phone_limits = limits(&[(1, 60_000), (3, 3_600_000)]);
    })
    .await;

    assert_eq!(
        app.sms_send(json!({ "phone": PHONE })).await.body["resend_after_secs"],
        60
    );
    clock.advance_ms(15_500);
    let limited = app.sms_send(json!({ "phone": PHONE })).await;
    assert_eq!(limited.status, 429);
    assert_eq!(limited.error(), "rate_limited");
    assert_eq!(limited.body["retry_after_secs"], 45);
    assert_eq!(limited.body["rule"], "phone 1/1m");
    assert_eq!(limited.retry_after.as_deref(), Some("45"));
    let row = &app.audit_events()[0];
    assert_eq!(
        (row.retry_after_ms, row.observed, row.limit),
        (Some(44_500), Some(1), Some(1))
    );

    clock.advance_ms(44_500);
    let second = app.sms_send(json!({ "phone": PHONE })).await;
    assert_eq!(second.status, 200);
    assert_eq!(second.body["resend_after_secs"], 60);
    clock.advance_ms(60_000);
    let third = app.sms_send(json!({ "phone": PHONE })).await;
    assert_eq!(third.status, 200);
    assert_eq!(
        third.body["resend_after_secs"], 3_480,
        "the hourly window is full until the first send leaves it"
    );
}

#[tokio::test]
async fn retry_after_on_redis_is_within_the_denying_window() {
    let app = spawn_app(Backend::Redis, |s| {
        s.sms.phone_limits = limits(&[(1, 60_000)])
    })
    .await;
    assert_eq!(app.sms_send(json!({ "phone": PHONE })).await.status, 200);
    let limited = app.sms_send(json!({ "phone": PHONE })).await;
    assert_eq!(limited.status, 429);
    let secs = limited.body["retry_after_secs"].as_u64().unwrap();
    assert!((59..=60).contains(&secs), "retry_after_secs = {secs}");
    assert_eq!(limited.retry_after, Some(secs.to_string()));
}

/// An IPv6 client also counts in its network (a /48 by default): the /64s
/// of one site or one tunnel, each under its own captcha tier, cannot
/// together send past the network's tier without a captcha, so they cannot
/// fill the global window for free (docs/security.md).
async fn the_64s_of_one_network_share_its_captcha_tier(backend: Backend) {
    let defaults = Settings::defaults()
        .expect("the embedded defaults are valid")
        .sms;
    let app = spawn_app(backend, |s| {
        s.sms.captcha_after = defaults.captcha_after;
        s.sms.network_bits = defaults.network_bits;
        s.sms.network_captcha_after = defaults.network_captcha_after;
        // Many numbers of one range, none verified: not pumping here.
        s.sms.pumping.enabled = false;
    })
    .await;
    let tier = defaults.network_captcha_after;
    assert_eq!((defaults.network_bits, tier), (48, 100));
    let phone = |n: u32| format!("+86138{n:08}");
    let send = |n: u32, ip: &str, extra: serde_json::Value| {
        let mut body = json!({ "phone": phone(n), "ip": ip });
        if let (Some(body), Some(extra)) = (body.as_object_mut(), extra.as_object()) {
            body.extend(extra.clone());
        }
        app.sms_send(body)
    };

    // One send from each of `tier` /64s of 2001:db8:1::/48: each /64 is far
    // below its own tier (3), and the last one reaches the network's.
    for n in 0..tier {
        let answer = send(n, &format!("2001:db8:1:{n:x}::1"), json!({})).await;
        assert_eq!(answer.status, 200, "send {n}: {}", answer.body);
        let last = n + 1 == tier;
        assert_eq!(answer.body["captcha_required"], last, "send {n}");
    }
    let fresh_64 = send(tier, "2001:db8:1:ffff::1", json!({})).await;
    assert_eq!(fresh_64.status, 403, "{}", fresh_64.body);
    assert_eq!(fresh_64.error(), "captcha_required");
    let events = app.audit_events();
    assert_eq!(events.len(), 1, "{events:?}");
    let row = &events[0];
    assert_eq!(
        (row.decision, row.subject_kind, row.subject.as_str()),
        (
            AuditDecision::Challenge,
            SubjectKind::Network,
            "2001:db8:1::/48"
        )
    );
    assert_eq!(row.rule.as_deref(), Some("network 100/1h"));
    assert_eq!(row.ip.as_deref(), Some("2001:db8:1:ffff::1"));

    // Another network, and an IPv4 client, are not asked.
    let elsewhere = send(tier + 1, "2001:db8:2::1", json!({})).await;
    assert_eq!(elsewhere.status, 200, "{}", elsewhere.body);
    let ipv4 = send(tier + 2, "203.0.113.7", json!({})).await;
    assert_eq!(ipv4.status, 200, "{}", ipv4.body);
    // A passed captcha lets a send of the network through, and counts.
    let passed = send(
        tier + 3,
        "2001:db8:1:ffff::1",
        json!({ "captcha_passed": true }),
    )
    .await;
    assert_eq!(passed.status, 200, "{}", passed.body);

    // The admin sees the network's window (its log keeps no more than the
    // largest limit needs) and lifts its tier, naming it by any address in
    // it.
    let state = app
        .admin_get("/admin/api/subjects/network/2001:db8:1::%2F48")
        .await;
    assert_eq!(state.status, 200, "{}", state.body);
    assert_eq!(state.body["id"], "2001:db8:1::/48");
    assert_eq!(state.body["captcha_required"], true);
    // Its failed verifies and login failures are windows of their own
    // (none here).
    assert_eq!(
        state.body["windows"],
        json!([{ "action": "sms_send", "rule": "network 100/1h", "count": tier,
                 "limit": tier, "window_ms": 3_600_000 },
               { "action": "sms_verify", "rule": "network 10000/1h", "count": 0,
                 "limit": 10_000, "window_ms": 3_600_000 },
               { "action": "login_attempt", "rule": "network 100/1h", "count": 0,
                 "limit": 100, "window_ms": 3_600_000 }])
    );
    let unblocked = app
        .admin_post("/admin/api/subjects/network/2001:db8:1:5::9%2F48/unblock")
        .await;
    assert_eq!(unblocked.status, 200, "{}", unblocked.body);
    assert_eq!(unblocked.body["captcha_required"], false);
    let after = send(tier + 4, "2001:db8:1:ffff::2", json!({})).await;
    assert_eq!(after.status, 200, "{}", after.body);

    let malformed = app
        .admin_get("/admin/api/subjects/network/2001:db8:1::%2F65")
        .await;
    assert_eq!(malformed.status, 400, "{}", malformed.body);
}

/// `sms.network_limits` refuses every /64 of a full network, and
/// `sms.network_bits` says how large a network is; with
/// `network_captcha_after = 0` the network has no captcha tier.
async fn a_network_window_refuses_every_64_of_the_network(backend: Backend) {
    let app = spawn_app(backend, |s| {
        s.sms.network_bits = 56;
        s.sms.network_captcha_after = 0;
        s.sms.network_limits = limits(&[(2, 3_600_000)]);
    })
    .await;
    let send =
        |phone: &'static str, ip: &'static str| app.sms_send(json!({ "phone": phone, "ip": ip }));

    for (phone, ip) in [
        ("+8613800138001", "2001:db8:1:100::1"),
        ("+8613800138002", "2001:db8:1:1ff::1"),
    ] {
        let answer = send(phone, ip).await;
        assert_eq!(answer.status, 200, "{ip}: {}", answer.body);
        assert_eq!(answer.body["captcha_required"], false, "{ip}");
    }
    let full = send("+8613800138003", "2001:db8:1:1aa::1").await;
    assert_eq!(full.status, 429, "{}", full.body);
    assert_eq!(full.body["rule"], "network 2/1h");
    let with_captcha = app
        .sms_send(
            json!({ "phone": "+8613800138005", "ip": "2001:db8:1:1ab::1",
                          "captcha_passed": true }),
        )
        .await;
    assert_eq!(
        (with_captcha.status.as_u16(), with_captcha.error()),
        (429, "rate_limited"),
        "a captcha does not lift an enforced window: {}",
        with_captcha.body
    );
    let next_56 = send("+8613800138004", "2001:db8:1:200::1").await;
    assert_eq!(next_56.status, 200, "{}", next_56.body);

    let events = app.audit_events();
    assert_eq!(events.len(), 2, "{events:?}");
    for event in &events {
        assert_eq!(
            (event.decision, event.subject.as_str()),
            (AuditDecision::Deny, "2001:db8:1:100::/56")
        );
    }
}

/// `ip` is optional in DESIGN.md: a backend that leaves it out sends for
/// every user from its own address. That address must be neither one IP
/// window every user fills (two strangers' sends here, twenty by default,
/// would refuse everyone's) nor an allow-listed address that takes every
/// user past every limit. A client the backend names counts as itself.
async fn a_backend_that_names_no_client_is_not_one_address_every_send_fills(backend: Backend) {
    let app = spawn_app(backend, |s| {
        s.sms.ip_limits = limits(&[(2, 3_600_000)]);
        s.sms.phone_limits = limits(&[(1, 3_600_000)]);
        // Loopback is the backend's own address, no client's: no send here
        // matches it, so none takes `ALLOW_LISTED_IP_SENDS`.
        s.lists.allow_ips = vec!["127.0.0.0/8".parse().unwrap()];
    })
    .await;
    let uncounted = r#"tollgate_backend_without_client_ip_total{route="sms_send"}"#;
    let before = app.metric(uncounted).await;
    for phone in [PHONE, OTHER_PHONE, "+8613700137000"] {
        let sent = app.sms_send(json!({ "phone": phone })).await;
        assert_eq!(sent.status, 200, "{phone}: {}", sent.body);
    }
    let again = app.sms_send(json!({ "phone": PHONE })).await;
    assert_eq!(again.status, 429, "the phone's own window: {}", again.body);
    assert_eq!(again.body["rule"], "phone 1/1h");
    assert!(app.metric(uncounted).await - before >= 4.0);

    let named = |phone: &'static str| app.sms_send(json!({ "phone": phone, "ip": "198.51.100.7" }));
    assert_eq!(named("+8613600136001").await.status, 200);
    assert_eq!(named("+8613600136002").await.status, 200);
    let third = named("+8613600136003").await;
    assert_eq!(third.status, 429, "{}", third.body);
    assert_eq!(third.body["rule"], "ip 2/1h");
}

/// A backend behind a proxy on its own host that passes what it reads as
/// the client's address (loopback) names no client: its users' sends do
/// not fill one IP window (two strangers' would refuse everyone's here).
async fn a_backend_passing_its_loopback_address_is_not_one_address_every_send_fills(
    backend: Backend,
) {
    let app = spawn_app(backend, |s| {
        s.sms.ip_limits = limits(&[(2, 3_600_000)]);
        s.sms.phone_limits = limits(&[(1, 3_600_000)]);
    })
    .await;
    let uncounted = r#"tollgate_backend_without_client_ip_total{route="sms_send"}"#;
    let before = app.metric(uncounted).await;
    let own = ["127.0.0.1", "::1", "0.0.0.0", "::ffff:127.0.0.1"];
    let phones = [PHONE, OTHER_PHONE, "+8613700137000", "+8613600136009"];
    for (ip, phone) in own.into_iter().zip(phones) {
        let sent = app.sms_send(json!({ "phone": phone, "ip": ip })).await;
        assert_eq!(sent.status, 200, "{ip}, {phone}: {}", sent.body);
    }
    let again = app
        .sms_send(json!({ "phone": PHONE, "ip": "127.0.0.1" }))
        .await;
    assert_eq!(again.status, 429, "the phone's own window: {}", again.body);
    assert_eq!(again.body["rule"], "phone 1/1h");
    assert!(app.metric(uncounted).await - before >= 5.0);
}

/// A number the provider refuses is kept by its asker's windows; a send
/// that names no client has none, and its phone's, prefix's and global
/// windows keep it instead, or a backend relaying no address would make a
/// provider call per request for a number it will never text.
async fn a_number_refused_for_a_send_naming_no_client_is_kept_by_its_phone(backend: Backend) {
    let app = spawn_app(backend, |s| {
        s.sms.phone_limits = limits(&[(1, 3_600_000)]);
        s.lists.allow_ips = vec!["127.0.0.0/8".parse().unwrap()];
    })
    .await;
    app.sms.refuse(true);
    let refused = kept_by_the_phone(&app).await;
    assert_eq!(refused["number_refused"], true, "{refused}");
    // A send that names its client leaves the phone's window to it.
    given_back_to_a_named_client(&app, || app.sms.refuse(false)).await;
}

/// Send to `PHONE` naming no client, the provider failing it: the failed
/// send's answer, once a second send shows the phone's 1/1h kept it.
async fn kept_by_the_phone(app: &TestApp) -> serde_json::Value {
    let failed = app.sms_send(json!({ "phone": PHONE })).await;
    assert_eq!(failed.error(), "delivery_failed", "{}", failed.body);
    let again = app.sms_send(json!({ "phone": PHONE })).await;
    assert_eq!(
        (again.status.as_u16(), again.body["rule"].as_str()),
        (429, Some("phone 1/1h")),
        "the failed send kept by the phone's window: {}",
        again.body
    );
    failed.body
}

/// Send to `OTHER_PHONE` naming a client, the provider failing it, then,
/// once `mend` stops the failures, from another client: the phone's 1/1h
/// gave the failed send back.
async fn given_back_to_a_named_client(app: &TestApp, mend: impl FnOnce()) {
    let named = app
        .sms_send(json!({ "phone": OTHER_PHONE, "ip": "198.51.100.8" }))
        .await;
    assert_eq!(named.error(), "delivery_failed", "{}", named.body);
    mend();
    let sent = app
        .sms_send(json!({ "phone": OTHER_PHONE, "ip": "198.51.100.9" }))
        .await;
    assert_eq!(
        sent.status, 200,
        "the phone's window gave it back: {}",
        sent.body
    );
}

/// A declined send (a region the account may not text) is given back
/// whole within its address's budget; a send that names no client has no
/// address to budget, and one budget for its backend would be every
/// user's: its phone's, prefix's and global windows keep it (the phone's
/// and global checked here), or a backend
/// relaying no `ip` would make one provider call per request. So for a
/// backend with an API key and for a keyless one on loopback.
async fn a_declined_send_naming_no_client_is_kept_by_its_phone(backend: Backend) {
    for keyless in [false, true] {
        let app = spawn_app(backend, |s| {
            s.sms.phone_limits = limits(&[(1, 3_600_000)]);
            s.sms.global_limits = limits(&[(3, 3_600_000)]);
            // The backend's own address allow-listed, as many set it: a
            // send it makes for no named client is not exempt by it.
            s.lists.allow_ips = vec!["127.0.0.0/8".parse().unwrap()];
            if keyless {
                s.server.api_keys.clear();
            }
        })
        .await;
        app.sms.decline(true);
        let declined = kept_by_the_phone(&app).await;
        assert_eq!(declined.get("number_refused"), None, "{declined}");
        if keyless {
            // A keyless backend's `ip` names no one (security.md): the rest
            // is the keyed backend's.
            continue;
        }
        // A send that names its client spends its address's budget instead.
        given_back_to_a_named_client(&app, || app.sms.decline(false)).await;
        // The global window holds the declined send and this one; the
        // named declined send was given back.
        let third = app
            .sms_send(json!({ "phone": "+8613700137000", "ip": "198.51.100.9" }))
            .await;
        assert_eq!(third.status, 200, "{}", third.body);
        let fourth = app
            .sms_send(json!({ "phone": "+8613600136000", "ip": "198.51.100.9" }))
            .await;
        assert_eq!(
            (fourth.status.as_u16(), fourth.body["rule"].as_str()),
            (429, Some("global 3/1h")),
            "the declined send kept by the global window: {}",
            fourth.body
        );
    }
}

/// With no address windows (`sms.ip_limits = []`) an address still counts
/// for its captcha tier, and a number the provider refuses is kept there
/// alone: the address soon needs a captcha, and the phone's windows owe
/// nothing.
async fn a_refused_number_is_kept_by_the_address_tier_without_address_windows(backend: Backend) {
    let app = spawn_app(backend, |s| {
        s.sms.ip_limits = Vec::new();
        s.sms.captcha_after = 2;
        s.sms.phone_limits = limits(&[(1, 3_600_000)]);
    })
    .await;
    let sender = "203.0.113.71";
    app.sms.refuse(true);
    for round in 0..2 {
        let refused = app.sms_send(json!({ "phone": PHONE, "ip": sender })).await;
        assert_eq!(
            (refused.error(), &refused.body["number_refused"]),
            ("delivery_failed", &json!(true)),
            "round {round}, the phone's window given back: {}",
            refused.body
        );
    }
    app.sms.refuse(false);
    let challenged = app
        .sms_send(json!({ "phone": OTHER_PHONE, "ip": sender }))
        .await;
    assert_eq!(
        (challenged.status.as_u16(), challenged.error()),
        (403, "captcha_required"),
        "the address's tier kept both refused sends: {}",
        challenged.body
    );
    let owner = app
        .sms_send(json!({ "phone": PHONE, "ip": "198.51.100.71" }))
        .await;
    assert_eq!(owner.status, 200, "the phone owes nothing: {}", owner.body);
}

#[test]
fn the_failed_delivery_budgets_are_checked_at_start_up() {
    let defaults = crate::support::app::load_config("").unwrap();
    let (address, network) = (
        defaults.sms.failed_delivery_limit,
        defaults.sms.failed_delivery_network_limit,
    );
    assert_eq!(
        (address.limit, address.window),
        (5, Duration::from_secs(3600))
    );
    assert_eq!(
        (network.limit, network.window),
        (1280, Duration::from_secs(3600))
    );
    for budget in ["failed_delivery_limit", "failed_delivery_network_limit"] {
        for (toml, field) in [
            ("{ limit = 0, window = \"1h\" }", "limit"),
            ("{ limit = 5, window = \"0s\" }", "window"),
            ("{ limit = 5, window = \"1h\", shadow = true }", "shadow"),
            (
                "{ limit = 5, window = \"1h\", algorithm = \"gcra\" }",
                "algorithm",
            ),
        ] {
            let message = crate::support::app::config_error(&format!("[sms]\n{budget} = {toml}\n"));
            let key = format!("`sms.{budget}.{field}`");
            assert!(message.contains(&key), "{budget} = {toml}: {message}");
        }
    }
}
