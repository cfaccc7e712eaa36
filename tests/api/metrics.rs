//! `/metrics`: the per-rule counters (hits, over, near and within the limit,
//! shadowed) that SMS sends, verifies and login attempts add to, and the
//! HTTP latency histogram by route pattern.
//!
//! The recorder is process-wide and tests run in parallel, so every rule
//! asserted on here has a name no other test uses: its window differs per
//! test and per backend (`window`).

use std::time::Duration;

use serde_json::json;
use tollgate::settings::LimitSetting;

use crate::on_both_backends;
use crate::support::app::{spawn_app, Backend, TestApp};

on_both_backends!(
    sms_sends_count_a_hit_on_every_window_with_the_count_the_store_saw,
    a_section_in_shadow_counts_its_over_limit_hits_as_shadowed,
    verify_tries_count_against_the_attempts_rule,
    login_attempts_count_against_the_user_pair_and_ip_rules,
    ipv6_login_attempts_count_against_their_networks_tier,
    a_network_window_on_trial_counts_and_audits_and_refuses_nothing,
);

/// A window of about `secs` seconds that names a rule no other test (nor
/// the same test on the other backend) has.
fn window(backend: Backend, secs: u64) -> Duration {
    let offset = match backend {
        Backend::Memory => 0,
        Backend::Redis => 1,
    };
    Duration::from_secs(secs + offset)
}

/// The five counters of one rule: hits, over, near, within, shadowed.
async fn rule_counters(app: &TestApp, action: &str, rule: &str) -> [f64; 5] {
    let series = |metric: &str| {
        format!("tollgate_rule_{metric}_total{{action=\"{action}\",rule=\"{rule}\"}}")
    };
    [
        app.metric(&series("hits")).await,
        app.metric(&series("over_limit")).await,
        app.metric(&series("near_limit")).await,
        app.metric(&series("within_limit")).await,
        app.metric(&series("shadowed")).await,
    ]
}

fn name(kind: &str, limit: u32, window: Duration) -> String {
    format!("{kind} {limit}/{}s", window.as_secs())
}

async fn sms_sends_count_a_hit_on_every_window_with_the_count_the_store_saw(backend: Backend) {
    let (enforced, on_trial, meter) = (
        window(backend, 7_001),
        window(backend, 7_011),
        window(backend, 7_021),
    );
    let app = spawn_app(backend, |s| {
        s.sms.phone_limits = vec![
            LimitSetting::new(3, enforced),
            LimitSetting {
                shadow: true,
                ..LimitSetting::new(1, on_trial)
            },
        ];
        s.sms.ip_limits = vec![LimitSetting {
            algorithm: tollgate::domain::Algorithm::Gcra,
            ..LimitSetting::new(4, meter)
        }];
    })
    .await;
    let send = json!({ "phone": "+8613800138011", "ip": "198.51.100.11" });
    for expected in [200, 200, 200, 429] {
        assert_eq!(app.sms_send(send.clone()).await.status, expected);
    }

    // The counts before each send: 0, 1, 2, 3 (the fourth is refused and
    // recorded nowhere). Near the limit from 80% of it: a limit of 3 from
    // the third hit, of 1 from the first, of 4 from the fourth.
    assert_eq!(
        rule_counters(&app, "sms_send", &name("phone", 3, enforced)).await,
        [4.0, 1.0, 1.0, 3.0, 0.0],
        "the enforced phone rule: hits, over, near, within, shadowed"
    );
    assert_eq!(
        rule_counters(&app, "sms_send", &name("phone", 1, on_trial)).await,
        [4.0, 3.0, 1.0, 1.0, 3.0],
        "the rule on trial: over three times, each let through"
    );
    assert_eq!(
        rule_counters(&app, "sms_send", &name("ip", 4, meter)).await,
        [4.0, 0.0, 1.0, 4.0, 0.0],
        "the IP's GCRA meter"
    );
}

async fn a_section_in_shadow_counts_its_over_limit_hits_as_shadowed(backend: Backend) {
    let w = window(backend, 7_031);
    let app = spawn_app(backend, |s| {
        s.sms.shadow = true;
        s.sms.phone_limits = vec![LimitSetting::new(1, w)];
    })
    .await;
    for _ in 0..3 {
        let answer = app.sms_send(json!({ "phone": "+8613800138012" })).await;
        assert_eq!(
            answer.status, 200,
            "shadow refuses nothing: {}",
            answer.body
        );
    }
    assert_eq!(
        rule_counters(&app, "sms_send", &name("phone", 1, w)).await,
        [3.0, 2.0, 1.0, 1.0, 2.0],
        "recorded in shadow, the counts grow past the limit: 0, 1, 2"
    );
}

async fn verify_tries_count_against_the_attempts_rule(backend: Backend) {
    let ttl = window(backend, 7_041);
    let app = spawn_app(backend, |s| {
        s.sms.max_verify_attempts = 3;
        s.sms.code_ttl = ttl;
    })
    .await;
    let verify = |phone: &'static str, code: String| {
        let app = &app;
        async move {
            app.sms_verify(json!({ "phone": phone, "code": code }))
                .await
                .status
        }
    };
    // No code yet: a stand-in takes the try, as a code would (count 0).
    assert_eq!(verify("+8613800138013", "123456".into()).await, 200);

    // Three wrong tries burn the code (counts 0, 1, 2), the fourth is refused.
    app.sms_send(json!({ "phone": "+8613800138013" })).await;
    for expected in [200, 200, 200, 429] {
        assert_eq!(verify("+8613800138013", "wrong".into()).await, expected);
    }
    // Two wrong tries, then the right code: its count is 2, near the limit.
    app.sms_send(json!({ "phone": "+8613800138014" })).await;
    let code = app.sms.last_code("+8613800138014");
    for _ in 0..2 {
        verify("+8613800138014", "wrong".into()).await;
    }
    assert_eq!(verify("+8613800138014", code).await, 200);

    assert_eq!(
        rule_counters(&app, "sms_verify", &name("phone", 3, ttl)).await,
        [8.0, 1.0, 2.0, 7.0, 0.0]
    );
}

async fn login_attempts_count_against_the_user_pair_and_ip_rules(backend: Backend) {
    let (captcha_window, lock_window, ip_window) = (
        window(backend, 7_051),
        window(backend, 7_061),
        window(backend, 7_071),
    );
    let app = spawn_app(backend, |s| {
        s.login.captcha_after = 2;
        s.login.captcha_window = captcha_window;
        s.login.lock_after = 3;
        s.login.account_lock_after = 100;
        s.login.lock_window = lock_window;
        s.login.ip_captcha_after = 3;
        s.login.ip_block_after = 10;
        s.login.ip_window = ip_window;
    })
    .await;
    let failure = json!({
        "user": "metrics-alice", "success": false, "captcha_passed": true,
        "ip": "198.51.100.21",
    });
    // Three failures lock the pair; the fourth is refused by its lock.
    for locked in [false, false, true, true] {
        let answer = app.login_attempt(failure.clone()).await;
        assert_eq!(answer.status, 200, "{}", answer.body);
        assert_eq!(answer.body["locked"], locked, "{}", answer.body);
    }
    // A check reads the same windows and counts nothing.
    let check = app
        .login_check(json!({ "user": "metrics-alice", "ip": "198.51.100.21" }))
        .await;
    assert_eq!(check.body["decision"], "deny");

    // Every rule saw the counts 0, 1, 2, 3.
    let cases = [
        (
            "user",
            2,
            captcha_window,
            [4.0, 2.0, 1.0, 2.0, 0.0],
            "the user's captcha tier",
        ),
        (
            "user_ip",
            3,
            lock_window,
            [4.0, 1.0, 1.0, 3.0, 0.0],
            "the pair's lock: over once it refuses",
        ),
        (
            "user",
            100,
            lock_window,
            [4.0, 0.0, 0.0, 4.0, 0.0],
            "the account's lock",
        ),
        (
            "ip",
            3,
            ip_window,
            [4.0, 1.0, 1.0, 3.0, 0.0],
            "the IP's captcha tier",
        ),
        (
            "ip",
            10,
            ip_window,
            [4.0, 0.0, 0.0, 4.0, 0.0],
            "the IP's block",
        ),
    ];
    for (kind, limit, w, expected, what) in cases {
        assert_eq!(
            rule_counters(&app, "login_attempt", &name(kind, limit, w)).await,
            expected,
            "{what}"
        );
    }
}

/// An IPv6 client's attempts count against its network's captcha tier
/// (`login.network_captcha_after`, in `login.ip_window`), whatever the /64;
/// an IPv4 client's and a check count nothing there.
async fn ipv6_login_attempts_count_against_their_networks_tier(backend: Backend) {
    let ip_window = window(backend, 7_091);
    let app = spawn_app(backend, |s| {
        s.login.captcha_after = 1000;
        s.login.ip_window = ip_window;
        s.login.network_captcha_after = 3;
    })
    .await;
    for n in 1..=4 {
        let failure = json!({
            "user": format!("metrics-n{n}"), "success": false, "captcha_passed": true,
            "ip": format!("2001:db8:77:{n}::1"),
        });
        let answer = app.login_attempt(failure).await;
        assert_eq!(answer.body["decision"], "allow", "{}", answer.body);
    }
    let ipv4 = json!({ "user": "metrics-n5", "success": false, "ip": "198.51.100.22" });
    assert_eq!(app.login_attempt(ipv4).await.status, 200);
    let check = app
        .login_check(json!({ "user": "metrics-n6", "ip": "2001:db8:77:9::1" }))
        .await;
    assert_eq!(check.body["decision"], "challenge", "{}", check.body);
    // The counts 0, 1, 2, 3: the last one over the tier.
    assert_eq!(
        rule_counters(&app, "login_attempt", &name("network", 3, ip_window)).await,
        [4.0, 1.0, 1.0, 3.0, 0.0]
    );
}

/// Backend-independent: the HTTP layer times every answer by route
/// pattern, on the public and the admin listener.
#[tokio::test]
async fn requests_are_timed_by_route_pattern_never_by_path() {
    let app = spawn_app(Backend::Memory, |s| {
        s.server.admin_bind = Some("127.0.0.1:0".parse().unwrap());
    })
    .await;
    let admin = app.admin_address.clone().expect("an admin listener");
    // A method no other test sends to /sms/verify: the series is this test's.
    for _ in 0..3 {
        let answer = app
            .send_raw(app.client.patch(format!("{}/sms/verify", app.address)))
            .await;
        assert_eq!(answer.status, 405);
    }
    let phone_path = "/admin/api/subjects/phone/%2B8613800138015";
    let token = app.admin_token.clone().expect("an admin token");
    let state = app
        .send_raw(
            app.client
                .get(format!("{admin}{phone_path}"))
                .bearer_auth(token),
        )
        .await;
    assert_eq!(state.status, 200, "{}", state.body);
    let unknown = app
        .send_raw(
            app.client
                .get(format!("{}/no/such/route/8613800138015", app.address)),
        )
        .await;
    assert_eq!(unknown.status, 404);

    let text = app
        .send_raw(app.client.get(format!("{admin}/metrics")))
        .await
        .body;
    let text = text.as_str().expect("Prometheus text");
    let series = |name: &str| {
        text.lines()
            .find(|l| l.starts_with(name) && l[name.len()..].starts_with(' '))
            .and_then(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .unwrap_or(0.0)
    };
    let h = "tollgate_http_request_duration_seconds";
    assert_eq!(
        series(&format!(
            r#"{h}_count{{route="/sms/verify",method="PATCH",status="405"}}"#
        )),
        3.0
    );
    assert!(
        series(&format!(
            r#"{h}_count{{route="/admin/api/subjects/{{kind}}/{{id:.+}}",method="GET",status="200"}}"#
        )) >= 1.0,
        "the admin listener's requests are timed under their pattern"
    );
    assert!(
        series(&format!(
            r#"{h}_count{{route="unmatched",method="GET",status="404"}}"#
        )) >= 1.0
    );
    for le in ["0.0005", "0.001", "5"] {
        let bucket =
            format!(r#"{h}_bucket{{route="/sms/verify",method="PATCH",status="405",le="{le}"}}"#);
        assert!(
            text.lines().any(|l| l.starts_with(&bucket)),
            "buckets from half a millisecond to the providers' timeout: {le}"
        );
    }
    assert!(
        !text.contains("8613800138015"),
        "no path (nor the phone in it) becomes a label"
    );
}

/// The series the shipped alerts (`deploy/monitoring/prometheus/alerts.yml`)
/// take a `rate` or `increase` of are there from the start, not from their
/// first failure.
#[tokio::test]
async fn the_alerted_failure_counters_are_exported_before_any_failure() {
    let app = spawn_app(Backend::Memory, |_| {}).await;
    let text = app.get("/metrics").await.body;
    let text = text.as_str().expect("Prometheus text");
    for series in [
        "tollgate_store_errors_total{kind=\"timeout\"} ",
        "tollgate_store_errors_total{kind=\"unavailable\"} ",
        "tollgate_store_errors_total{kind=\"refused\"} ",
        "tollgate_pumping_refusals_total ",
        "tollgate_audit_events_total{outcome=\"spooled\"} ",
        "tollgate_audit_events_total{outcome=\"unjournaled\"} ",
        "tollgate_audit_journal_errors_total{op=\"read\"} ",
        "tollgate_config_last_reload_successful ",
    ] {
        assert!(
            text.lines().any(|l| l.starts_with(series)),
            "{series} missing from /metrics"
        );
    }
}

/// An IPv6 network's window (`sms.network_limits`) on trial: each send of
/// the network is a hit, the one past the limit is over and shadowed, is
/// audited as what it would have been, and goes through.
async fn a_network_window_on_trial_counts_and_audits_and_refuses_nothing(backend: Backend) {
    let w = window(backend, 7_081);
    let app = spawn_app(backend, |s| {
        s.sms.network_captcha_after = 0;
        s.sms.network_limits = vec![LimitSetting {
            shadow: true,
            ..LimitSetting::new(1, w)
        }];
    })
    .await;
    for (phone, ip) in [
        ("+8613800138021", "2001:db8:5:1::1"),
        ("+8613800138022", "2001:db8:5:2::1"),
    ] {
        let answer = app.sms_send(json!({ "phone": phone, "ip": ip })).await;
        assert_eq!(answer.status, 200, "on trial: {}", answer.body);
    }

    assert_eq!(
        rule_counters(&app, "sms_send", &name("network", 1, w)).await,
        [2.0, 1.0, 1.0, 1.0, 1.0],
        "hits, over, near, within, shadowed"
    );
    let events = app.audit_events();
    assert_eq!(events.len(), 1, "{events:?}");
    assert!(events[0].shadow, "{events:?}");
    assert_eq!(
        (events[0].subject_kind, events[0].subject.as_str()),
        (tollgate::domain::SubjectKind::Network, "2001:db8:5::/48")
    );
    assert_eq!(
        events[0].rule.as_deref(),
        Some(name("network", 1, w).as_str())
    );
}
