//! The same service on a Redis Cluster (scripts/redis-cluster.sh starts one on
//! 127.0.0.1:17000-17002): every script's keys share a subject's hash slot, and
//! a request's subjects live on different nodes.

use serde_json::json;
use tollgate::audit::AuditDecision;
use tollgate::settings::SecretUrl;

use crate::support::app::{limits, spawn_app, Backend, TestApp};

fn cluster_url() -> String {
    std::env::var("TOLLGATE_TEST_REDIS_CLUSTER_URL").unwrap_or_else(|_| {
        "redis-cluster://127.0.0.1:17000,127.0.0.1:17001,127.0.0.1:17002".into()
    })
}

async fn on_cluster(configure: impl FnOnce(&mut tollgate::settings::Settings)) -> TestApp {
    let app = spawn_app(Backend::Redis, |s| {
        s.store.redis_url = SecretUrl::new(cluster_url());
        configure(s);
    })
    .await;
    let ready = app.get("/readyz").await;
    assert_eq!(
        ready.status, 200,
        "the cluster answers (scripts/redis-cluster.sh): {}",
        ready.body
    );
    app
}

#[tokio::test]
async fn sends_are_exact_under_concurrency_and_refusals_roll_back_across_nodes() {
    let app = on_cluster(|s| {
        s.sms.phone_limits = limits(&[(5, 3_600_000)]);
        s.sms.ip_limits = limits(&[(2, 3_600_000)]);
    })
    .await;
    // One phone, thirty clients: the phone's window alone decides.
    let sends = (0..30).map(|i| {
        app.sms_send(json!({ "phone": "+8613800138000", "ip": format!("198.51.100.{i}") }))
    });
    let answers = futures::future::join_all(sends).await;
    assert_eq!(answers.iter().filter(|a| a.status == 200).count(), 5);

    // Refused by the phone (another node), the IP keeps its quota of 2.
    for _ in 0..3 {
        let refused = app
            .sms_send(json!({ "phone": "+8613800138000", "ip": "203.0.113.1" }))
            .await;
        assert_eq!(refused.body["rule"], "phone 5/1h");
    }
    for phone in ["+8613900139000", "+8613600136000"] {
        let sent = app
            .sms_send(json!({ "phone": phone, "ip": "203.0.113.1" }))
            .await;
        assert_eq!(
            sent.status, 200,
            "the IP quota was rolled back: {}",
            sent.body
        );
    }
    let blocked = app
        .sms_send(json!({ "phone": "+8613700137000", "ip": "203.0.113.1" }))
        .await;
    assert_eq!(blocked.body["rule"], "ip 2/1h");

    let code = app.sms.last_code("+8613900139000");
    let verified = app
        .sms_verify(json!({ "phone": "+8613900139000", "code": code }))
        .await;
    assert_eq!(verified.body, json!({ "valid": true }));
}

/// A sender its own address refuses holds no slot in anyone else's
/// windows, not even for the moment before it would be taken back: a flood
/// of such sends to victims' phones (one send a minute each) leaves every
/// victim its code. Offered to every subject at once, the flood's sends
/// sat in the phones' windows a round trip each, and the victims met
/// `phone 1/1m`.
#[tokio::test]
async fn a_sender_its_address_refuses_holds_no_slot_in_a_victims_phone() {
    let app = on_cluster(|s| {
        s.sms.phone_limits = limits(&[(1, 60_000)]);
        s.sms.ip_limits = limits(&[(1, 3_600_000)]);
    })
    .await;
    let attacker = "198.51.100.66";
    let spent = app
        .sms_send(json!({ "phone": "+8613700137000", "ip": attacker }))
        .await;
    assert_eq!(spent.status, 200, "{}", spent.body);

    let victims: Vec<String> = (0..5).map(|i| format!("+861380013800{i}")).collect();
    // Forty connections (within the test client's address's cap), eight
    // sends each.
    let flood = futures::future::join_all((0..40).map(|c| {
        let (app, victims) = (&app, &victims);
        async move {
            let mut answers = Vec::new();
            for i in 0..8 {
                let phone = &victims[(c + i) % victims.len()];
                answers.push(
                    app.sms_send(json!({ "phone": phone, "ip": attacker }))
                        .await,
                );
            }
            answers
        }
    }));
    let owners = futures::future::join_all(victims.iter().enumerate().map(|(i, phone)| {
        let app = &app;
        async move {
            tokio::time::sleep(std::time::Duration::from_millis(10 * i as u64)).await;
            app.sms_send(json!({ "phone": phone, "ip": format!("203.0.113.{i}") }))
                .await
        }
    }));
    let (flooded, owners) = futures::future::join(flood, owners).await;
    for refused in flooded.iter().flatten() {
        assert_eq!(refused.status, 429, "{}", refused.body);
        assert_eq!(refused.body["rule"], "ip 1/1h", "the attacker's own window");
    }
    for (phone, answer) in victims.iter().zip(&owners) {
        assert_eq!(answer.status, 200, "{phone}: {}", answer.body);
    }
}

#[tokio::test]
async fn simultaneous_failures_lock_once_and_an_admin_unblocks() {
    let app = on_cluster(|s| {
        s.login.captcha_after = 1000;
        s.login.lock_after = 5;
    })
    .await;
    let attempts = (0..25).map(|_| app.login_attempt(json!({ "user": "alice", "success": false })));
    let answers = futures::future::join_all(attempts).await;
    assert_eq!(
        answers
            .iter()
            .filter(|a| a.body["decision"] == "allow")
            .count(),
        5
    );
    let locks = app
        .audit_events()
        .iter()
        .filter(|e| e.decision == AuditDecision::Lock)
        .count();
    assert_eq!(locks, 1);

    // Every failure came from one address: that (user, IP) pair is locked.
    let state = app.admin_get("/admin/api/subjects/user/alice").await;
    assert_eq!(state.body["locked_until"], serde_json::Value::Null);
    assert_eq!(state.body["pairs"][0]["count"], 5, "{}", state.body);
    assert!(
        state.body["pairs"][0]["locked_until"].is_string(),
        "{}",
        state.body
    );
    let unblocked = app
        .admin_post("/admin/api/subjects/user/alice/unblock")
        .await;
    assert_eq!(unblocked.body.get("pairs"), None, "{}", unblocked.body);
    let after = app
        .login_attempt(json!({ "user": "alice", "success": true }))
        .await;
    assert_eq!(after.body["decision"], "allow");
}

#[tokio::test]
async fn the_ip_block_is_exact_under_concurrency_across_nodes() {
    let app = on_cluster(|s| {
        s.login.captcha_after = 1000;
        s.login.lock_after = 1000;
        s.login.ip_captcha_after = 5;
        s.login.ip_block_after = 5;
    })
    .await;
    crate::login::assert_ip_block_is_exact(&app).await;
}

/// A login's network lives in a slot of its own: its call comes before the
/// IP's and the user's, and its tier stays exact.
#[tokio::test]
async fn the_network_tier_is_exact_under_concurrency_across_nodes() {
    let app = on_cluster(|s| {
        s.login.captcha_after = 1000;
        s.login.lock_after = 1000;
        s.login.ip_captcha_after = 1000;
        s.login.network_captcha_after = 5;
    })
    .await;
    crate::login::assert_network_tier_is_exact(&app).await;
}

/// The pumping guard on a cluster: the prefix's and the country's counts live
/// in their own slots (one call each before the windows), the list of
/// blocks in a third.
#[tokio::test]
async fn the_pumping_guard_blocks_a_range_across_nodes_and_an_admin_unblocks_it() {
    let app = on_cluster(|s| {
        s.sms.pumping.min_sends = 3;
        s.sms.pumping.country_min_sends = 3;
    })
    .await;
    for i in 0..3 {
        let phone = format!("+86138001380{i:02}");
        assert_eq!(app.sms_send(json!({ "phone": phone })).await.status, 200);
    }
    let refused = app.sms_send(json!({ "phone": "+8613800138009" })).await;
    assert_eq!(refused.error(), "pumping_suspected", "{}", refused.body);
    let escalations: Vec<_> = app
        .audit_events()
        .into_iter()
        .filter(|e| e.reason == "pumping_suspected")
        .map(|e| (e.decision, e.subject, e.rule))
        .collect();
    assert_eq!(
        escalations,
        [
            (
                AuditDecision::Lock,
                "+8613800".to_string(),
                Some("prefix conversion 0/3 (0%) < 20% per 1h".to_string())
            ),
            (
                AuditDecision::Challenge,
                "CN".to_string(),
                Some("country conversion 0/3 (0%) < 20% per 1h, 3 sends ≥ 5× normal 0".to_string())
            ),
        ]
    );
    let console = app.admin_get("/admin").await;
    assert!(
        console
            .body
            .as_str()
            .is_some_and(|page| page.contains("/admin/subjects/prefix/%2B8613800")),
        "{}",
        console.body
    );
    let country = app.admin_get("/admin/api/subjects/country/CN").await;
    assert_eq!(country.body["captcha_required"], true, "{}", country.body);
    for path in ["prefix/%2B8613800", "country/CN"] {
        let unblocked = app
            .admin_post(&format!("/admin/api/subjects/{path}/unblock"))
            .await;
        assert_eq!(unblocked.body["locked_until"], serde_json::Value::Null);
    }
    let sent = app.sms_send(json!({ "phone": "+8613800138009" })).await;
    assert_eq!(sent.status, 200, "{}", sent.body);
}
