//! The budget of refused captcha tokens per address
//! (`captcha.failed_token_limit`): past it a token is refused without a
//! siteverify call, on both stores, exactly under concurrency.

use std::time::Duration;

use serde_json::json;
use tollgate::audit::AuditDecision;
use tollgate::settings::{CaptchaKind, LimitSetting, Secret, Settings};
use wiremock::matchers::{body_string_contains, method, path};
use wiremock::{Mock, MockServer, ResponseTemplate};

use crate::support::app::{spawn_app, Backend, TestApp};

const IP: &str = "203.0.113.7";
const OTHER_IP: &str = "198.51.100.9";
const BACKENDS: [Backend; 2] = [Backend::Memory, Backend::Redis];

/// A token of `kind` no request has sent before (`good.7`): each is asked
/// of the provider once, and the provider answers by its kind.
fn fresh(kind: &str) -> String {
    static MADE: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let n = MADE.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    format!("{kind}.{n}")
}

/// A provider that answers by the token's kind (`good.7` is a `good`
/// token, see [`fresh`]): it passes `good`, answers 500 to `down`,
/// 400 to `e400`, 429 to `busy` (with `Retry-After: 3` to `busyfor3`),
/// 403 to `e403`, 400 blaming the secret to `e400secret`,
/// blames the secret for `badsecret`, takes two seconds over `slowgood`
/// (passed) and `slowbad` (refused), and refuses every other token.
async fn provider() -> MockServer {
    let server = MockServer::start().await;
    let passed = || ResponseTemplate::new(200).set_body_json(json!({ "success": true }));
    let refused = || {
        ResponseTemplate::new(200)
            .set_body_json(json!({ "success": false, "error-codes": ["invalid-input-response"] }))
    };
    // Long enough for every request a test sends at once to be out together.
    let slow = Duration::from_secs(2);
    for (token, answer) in [
        ("good", passed()),
        ("down", ResponseTemplate::new(500)),
        ("e400", ResponseTemplate::new(400)),
        ("busy", ResponseTemplate::new(429)),
        (
            "busyfor3",
            ResponseTemplate::new(429).insert_header("Retry-After", "3"),
        ),
        ("e403", ResponseTemplate::new(403)),
        (
            "e400secret",
            ResponseTemplate::new(400)
                .set_body_json(json!({ "error-codes": ["invalid-input-secret"] })),
        ),
        (
            "badsecret",
            ResponseTemplate::new(200).set_body_json(
                json!({ "success": false, "error-codes": ["invalid-input-secret"] }),
            ),
        ),
        ("slowgood", passed().set_delay(slow)),
        ("slowbad", refused().set_delay(slow)),
    ] {
        Mock::given(method("POST"))
            .and(path("/siteverify"))
            .and(body_string_contains(format!("response={token}.")))
            .respond_with(answer)
            .mount(&server)
            .await;
    }
    Mock::given(method("POST"))
        .and(path("/siteverify"))
        .respond_with(refused())
        .mount(&server)
        .await;
    server
}

async fn calls(server: &MockServer) -> usize {
    server.received_requests().await.expect("recording").len()
}

/// Every send and every login past its first needs a captcha; an address
/// may have `refused` tokens refused in ten minutes.
async fn app(backend: Backend, server: &MockServer, refused: u32) -> TestApp {
    app_with(backend, server, refused, |_| {}).await
}

async fn app_with(
    backend: Backend,
    server: &MockServer,
    refused: u32,
    configure: impl FnOnce(&mut Settings),
) -> TestApp {
    let verify_url = format!("{}/siteverify", server.uri());
    spawn_app(backend, move |s| {
        s.sms.captcha_after = 1;
        s.login.captcha_after = 1;
        s.login.lock_after = 1000;
        s.captcha.kind = CaptchaKind::Turnstile;
        s.captcha.secret = Secret::new("captcha-secret");
        s.captcha.verify_url = verify_url.into();
        s.captcha.failed_token_limit = LimitSetting::new(refused, Duration::from_secs(600));
        configure(s);
    })
    .await
}

/// One failed login of `user` from `ip` with no captcha: past
/// `login.captcha_after = 1`, the next one needs a captcha.
async fn challenge(app: &TestApp, user: &str, ip: &str) {
    let first = app
        .login_attempt(json!({ "user": user, "ip": ip, "success": false }))
        .await;
    assert_eq!(first.body["captcha_required"], true, "{}", first.body);
}

/// A send with a [`fresh`] token of `kind`.
fn send(phone: &str, ip: &str, kind: &str) -> serde_json::Value {
    json!({ "phone": phone, "ip": ip, "captcha_token": fresh(kind) })
}

#[tokio::test]
async fn an_address_past_its_refused_tokens_is_refused_429_without_a_provider_call() {
    for backend in BACKENDS {
        let server = provider().await;
        let app = app(backend, &server, 3).await;
        let phone = "+8613800138000";
        let first = app.sms_send(json!({ "phone": phone, "ip": IP })).await;
        assert_eq!(first.body["captcha_required"], true, "{}", first.body);

        for _ in 0..3 {
            let refused = app.sms_send(send(phone, IP, "bad")).await;
            assert_eq!(refused.status, 403, "{backend:?}: {}", refused.body);
            assert_eq!(refused.error(), "captcha_required");
        }
        assert_eq!(calls(&server).await, 3, "{backend:?}");

        // Full: any token from the address, a good one too, is refused unasked.
        for token in ["bad", "good"] {
            let throttled = app.sms_send(send(phone, IP, token)).await;
            assert_eq!(throttled.status, 429, "{backend:?}: {}", throttled.body);
            assert_eq!(throttled.error(), "rate_limited");
            assert_eq!(throttled.body["rule"], "failed_captcha 3/10m");
            let wait = throttled.body["retry_after_secs"].as_u64().unwrap();
            assert!((595..=600).contains(&wait), "{backend:?}: {wait}");
        }
        assert_eq!(
            calls(&server).await,
            3,
            "{backend:?}: the provider was not asked"
        );

        // Another address has its own budget.
        let other = app.sms_send(send(phone, OTHER_IP, "good")).await;
        assert_eq!(other.status, 200, "{backend:?}: {}", other.body);
        assert_eq!(calls(&server).await, 4, "{backend:?}");

        app.flush_audit().await;
        let rows: Vec<_> = app
            .audit_events()
            .into_iter()
            .filter(|e| e.rule.as_deref() == Some("failed_captcha 3/10m"))
            .collect();
        assert_eq!(rows.len(), 2, "{backend:?}: one row per refusal");
        for row in rows {
            assert_eq!(row.decision, AuditDecision::Deny);
            assert_eq!(row.reason, "rate_limited");
            assert_eq!(
                (row.subject_kind.as_str(), row.subject.as_str()),
                ("ip", IP)
            );
            assert_eq!((row.observed, row.limit), (Some(3), Some(3)));
            assert_eq!(row.window_ms, Some(600_000));
        }
    }
}

#[tokio::test]
async fn passed_and_unanswered_tokens_cost_nothing() {
    for backend in BACKENDS {
        let server = provider().await;
        let app = app(backend, &server, 2).await;
        let attempt = |token: &str| {
            app.login_attempt(
                json!({ "user": "alice", "ip": IP, "success": false, "captcha_token": fresh(token) }),
            )
        };
        challenge(&app, "alice", IP).await;

        // Neither a provider that does not answer nor a passed token is the
        // sender's doing: five of each, and the address keeps its two.
        for token in ["down", "good"] {
            for _ in 0..5 {
                let answer = attempt(token).await;
                let expected = if token == "good" {
                    "allow"
                } else {
                    "challenge"
                };
                assert_eq!(
                    answer.body["decision"], expected,
                    "{backend:?}: {}",
                    answer.body
                );
            }
        }
        for _ in 0..2 {
            let refused = attempt("bad").await;
            assert_eq!(
                refused.body["decision"], "challenge",
                "{backend:?}: {}",
                refused.body
            );
        }
        assert_eq!(calls(&server).await, 12, "{backend:?}");

        let throttled = attempt("good").await;
        assert_eq!(throttled.status, 200, "{backend:?}: {}", throttled.body);
        assert_eq!(throttled.body["decision"], "deny", "{}", throttled.body);
        assert_eq!(throttled.body["reason"], "rate_limited");
        assert_eq!(throttled.body["locked"], false);
        assert_eq!(throttled.body["captcha_required"], true);
        assert_eq!(
            throttled.body["failures"], 6,
            "the five passed and the first"
        );
        let wait = throttled.body["retry_after_secs"].as_u64().unwrap();
        assert!((595..=600).contains(&wait), "{backend:?}: {wait}");
        assert_eq!(calls(&server).await, 12, "{backend:?}: not asked");
    }
}

/// Twenty slow bad tokens at once from one address, with room for five:
/// five reach the provider, the rest are refused while those are out, and
/// then the five refusals fill the window.
#[tokio::test]
async fn tokens_in_flight_are_counted_exactly() {
    for backend in BACKENDS {
        let server = provider().await;
        let app = app(backend, &server, 5).await;
        challenge(&app, "bob", IP).await;
        let body = || json!({ "user": "bob", "ip": IP, "success": false, "captcha_token": fresh("slowbad") });
        let answers = futures::future::join_all((0..20).map(|_| app.login_attempt(body()))).await;

        let reasons: Vec<_> = answers
            .iter()
            .map(|a| a.body["reason"].as_str().unwrap_or_default().to_string())
            .collect();
        let throttled = reasons.iter().filter(|r| *r == "rate_limited").count();
        let challenged = reasons.iter().filter(|r| *r == "captcha_required").count();
        assert_eq!((challenged, throttled), (5, 15), "{backend:?}: {reasons:?}");
        assert_eq!(calls(&server).await, 5, "{backend:?}");
        let waits: Vec<_> = answers
            .iter()
            .filter(|a| a.body["reason"] == "rate_limited")
            .map(|a| a.body["retry_after_secs"].as_u64())
            .collect();
        assert!(
            waits.iter().all(|&w| w == Some(5)),
            "captcha.timeout: {waits:?}"
        );

        let after = app.login_attempt(body()).await;
        assert_eq!(after.body["reason"], "rate_limited", "{}", after.body);
        let wait = after.body["retry_after_secs"].as_u64().unwrap();
        assert!(
            (595..=600).contains(&wait),
            "{backend:?}: the refused window: {wait}"
        );
        assert_eq!(calls(&server).await, 5, "{backend:?}");
    }
}

/// One solved token passes one request: sent in ten login attempts at once
/// (the provider slow, as one may be to see a token it verified a moment
/// ago), it is asked of the provider once and passes once; the other nine
/// are refused unasked and counted as refused tokens, and so is the token
/// sent again later. A token the provider did not answer is given back:
/// the user may send it again, and it is asked again.
#[tokio::test]
async fn one_solved_token_passes_one_request() {
    for backend in BACKENDS {
        let server = provider().await;
        let app = app(backend, &server, 20).await;
        challenge(&app, "erin", IP).await;
        let solved = json!({ "user": "erin", "ip": IP, "success": false, "captcha_token": fresh("slowgood") });
        let answers =
            futures::future::join_all((0..10).map(|_| app.login_attempt(solved.clone()))).await;
        let mut decisions: Vec<&str> = answers
            .iter()
            .map(|a| a.body["decision"].as_str().unwrap_or_default())
            .collect();
        decisions.sort_unstable();
        assert_eq!(
            decisions,
            [&["allow"][..], &["challenge"; 9]].concat(),
            "{backend:?}"
        );
        assert_eq!(calls(&server).await, 1, "{backend:?}");
        let later = app.login_attempt(solved).await;
        assert_eq!(later.body["decision"], "challenge", "{}", later.body);
        assert_eq!(calls(&server).await, 1, "{backend:?}: spent");
        let state = app.admin_get(&format!("/admin/api/subjects/ip/{IP}")).await;
        assert_eq!(
            state.body["refused_captcha_tokens"]["count"], 10,
            "{backend:?}: {}",
            state.body
        );

        // A refused token can never pass: its claim is given back, and it
        // is asked (and counted) again.
        let bad =
            json!({ "user": "erin", "ip": IP, "success": false, "captcha_token": fresh("bad") });
        for _ in 0..2 {
            let answer = app.login_attempt(bad.clone()).await;
            assert_eq!(answer.body["decision"], "challenge", "{}", answer.body);
        }
        assert_eq!(
            calls(&server).await,
            3,
            "{backend:?}: the refused token asked twice"
        );

        let unanswered =
            json!({ "user": "erin", "ip": IP, "success": false, "captcha_token": fresh("down") });
        for _ in 0..3 {
            let answer = app.login_attempt(unanswered.clone()).await;
            assert_eq!(answer.body["decision"], "challenge", "{}", answer.body);
        }
        assert_eq!(calls(&server).await, 6, "{backend:?}: asked each time");
    }
}

/// A request whose client resets its connection while its token is at the
/// provider still ends (its decision finishes on a task of its own): the
/// token passes and is used by it, so the same token sent again is not
/// asked again and buys nothing. (Before, the dropped request gave the
/// claim back, and counted no attempt for the solved captcha.)
#[tokio::test]
async fn a_dropped_requests_token_is_used_by_it() {
    let server = provider().await;
    let app = app(Backend::Redis, &server, 5).await;
    challenge(&app, "fay", IP).await;
    let body =
        json!({ "user": "fay", "ip": IP, "success": false, "captcha_token": fresh("slowgood") });
    let text = body.to_string();
    let mut ask = format!(
        "POST /login/attempt HTTP/1.1\r\nHost: tollgate\r\ncontent-type: application/json\r\n\
         content-length: {}\r\n",
        text.len()
    );
    if let Some(key) = &app.api_key {
        ask.push_str(&format!("authorization: Bearer {key}\r\n"));
    }
    ask.push_str("\r\n");
    ask.push_str(&text);
    let asked = app.ask_and_reset(ask.as_bytes(), Duration::from_millis(500));
    let at_the_provider = async {
        tokio::time::sleep(Duration::from_millis(400)).await;
        calls(&server).await
    };
    let ((), calls_then) = tokio::join!(asked, at_the_provider);
    assert_eq!(calls_then, 1, "at the provider");
    tokio::time::sleep(Duration::from_millis(300)).await;

    let again = app.login_attempt(body).await;
    assert_eq!(again.body["decision"], "challenge", "{}", again.body);
    assert_eq!(calls(&server).await, 1, "not asked again: used");
}

/// Six people behind one address solve captchas while the provider is slow
/// (two seconds a call), with room for three: three wait for a token to come
/// back, for seconds, not for the window; nothing counts as refused.
#[tokio::test]
async fn a_crowd_behind_one_address_waits_for_the_provider_not_the_window() {
    for backend in BACKENDS {
        let server = provider().await;
        let app = app(backend, &server, 3).await;
        let first = app
            .sms_send(json!({ "phone": "+8613800138010", "ip": IP }))
            .await;
        assert_eq!(first.status, 200, "{}", first.body);
        let sends = (0..6).map(|i| {
            let phone = format!("+86138001381{i:02}");
            app.sms_send(send(&phone, IP, "slowgood"))
        });
        let answers = futures::future::join_all(sends).await;

        let mut statuses: Vec<_> = answers.iter().map(|a| a.status.as_u16()).collect();
        statuses.sort_unstable();
        assert_eq!(statuses, [200, 200, 200, 429, 429, 429], "{backend:?}");
        for waited in answers.iter().filter(|a| a.status == 429) {
            assert_eq!(
                waited.body["rule"], "captcha_in_flight 3/5s",
                "{}",
                waited.body
            );
            assert_eq!(waited.body["retry_after_secs"], 5);
        }
        assert_eq!(calls(&server).await, 3, "{backend:?}");
        let again = app.sms_send(send("+8613800138199", IP, "good")).await;
        assert_eq!(again.status, 200, "{backend:?}: {}", again.body);
        app.flush_audit().await;
        assert!(
            !app.audit_events().iter().any(|e| e
                .rule
                .as_deref()
                .is_some_and(|r| r.starts_with("failed_captcha"))),
            "{backend:?}: nothing was refused"
        );
    }
}

/// A 400 refuses what the token made of the call (too long, malformed): it
/// counts as a refused token. The provider's own throttling, a proxy's 403
/// and a secret the provider refuses do not: no one's token is at fault.
#[tokio::test]
async fn a_token_the_provider_will_not_take_counts_as_refused() {
    let server = provider().await;
    let app = app(Backend::Memory, &server, 2).await;
    let phone = "+8613800138020";
    app.sms_send(json!({ "phone": phone, "ip": IP })).await;
    // A 429 leaves the provider alone for a second (the next test).
    let busy = app.sms_send(send(phone, IP, "busy")).await;
    assert_eq!(busy.status, 403, "{}", busy.body);
    tokio::time::sleep(Duration::from_millis(1100)).await;
    for token in ["e403", "badsecret", "e400secret"] {
        for _ in 0..3 {
            let answer = app.sms_send(send(phone, IP, token)).await;
            assert_eq!(answer.status, 403, "{token}: {}", answer.body);
        }
    }
    for _ in 0..2 {
        let refused = app.sms_send(send(phone, IP, "e400")).await;
        assert_eq!(refused.status, 403, "{}", refused.body);
    }
    let throttled = app.sms_send(send(phone, IP, "e400")).await;
    assert_eq!(throttled.status, 429, "{}", throttled.body);
    assert_eq!(throttled.body["rule"], "failed_captcha 2/10m");
    assert_eq!(calls(&server).await, 12);
}

/// A Turnstile token is at most 2048 characters: a longer one is refused
/// without a call, counted as refused, so made-up tokens cost the provider
/// nothing however long.
#[tokio::test]
async fn a_token_longer_than_the_provider_makes_is_refused_unasked() {
    let server = provider().await;
    let app = app(Backend::Memory, &server, 2).await;
    let phone = "+8613800138050";
    app.sms_send(json!({ "phone": phone, "ip": IP })).await;
    let longest = format!("{}{}", fresh("good"), "x".repeat(2048))
        .split_at(2048)
        .0
        .to_string();
    let passed = app
        .sms_send(json!({ "phone": phone, "ip": IP, "captcha_token": longest }))
        .await;
    assert_eq!(passed.status, 200, "2048 characters: {}", passed.body);
    for _ in 0..2 {
        let long = format!("{}{}", fresh("good"), "x".repeat(2048));
        let refused = app
            .sms_send(json!({ "phone": "+8613800138051", "ip": IP, "captcha_token": long }))
            .await;
        assert_eq!(refused.status, 403, "{}", refused.body);
    }
    assert_eq!(calls(&server).await, 1, "only the 2048 characters asked");
    let throttled = app.sms_send(send(phone, IP, "good")).await;
    assert_eq!(throttled.status, 429, "{}", throttled.body);
    assert_eq!(throttled.body["rule"], "failed_captcha 2/10m");
}

/// While the provider throttles, no token is sent to it: each would keep
/// its throttle on, at no cost to the sender. A 429 leaves it alone for its
/// `Retry-After`, else 1 s, then twice as long after each 429 in a row;
/// the tokens meanwhile are unanswered (a challenge, not counted).
#[tokio::test]
async fn a_throttling_provider_is_left_alone_until_it_asked_to_be_called_again() {
    let server = provider().await;
    let app = app(Backend::Memory, &server, 1).await;
    let attempt = |token: &str| {
        app.login_attempt(
            json!({ "user": "carol", "ip": IP, "success": false, "captcha_token": fresh(token) }),
        )
    };
    challenge(&app, "carol", IP).await;
    let challenged = |answer: &crate::support::app::Answer| {
        assert_eq!(answer.body["decision"], "challenge", "{}", answer.body);
    };

    let paused = "tollgate_captcha_checks_total{outcome=\"paused\"}";
    let paused_before = app.metric(paused).await;
    // Retry-After: 3, from the answer on (margins of a second and more).
    challenged(&attempt("busyfor3").await);
    let start = std::time::Instant::now();
    assert_eq!(calls(&server).await, 1);
    tokio::time::sleep(Duration::from_millis(1500)).await;
    challenged(&attempt("good").await);
    assert_eq!(calls(&server).await, 1, "asked during the pause");
    tokio::time::sleep(Duration::from_millis(3100).saturating_sub(start.elapsed())).await;
    // The second 429 in a row, without Retry-After: two seconds.
    challenged(&attempt("busy").await);
    let start = std::time::Instant::now();
    assert_eq!(calls(&server).await, 2);
    tokio::time::sleep(Duration::from_millis(1000)).await;
    challenged(&attempt("good").await);
    assert_eq!(calls(&server).await, 2, "asked during the doubled pause");
    // The recorder is process-wide: other tests may add, never take away.
    assert!(app.metric(paused).await >= paused_before + 2.0);
    tokio::time::sleep(Duration::from_millis(2100).saturating_sub(start.elapsed())).await;

    let passed = attempt("good").await;
    assert_eq!(passed.body["decision"], "allow", "{}", passed.body);
    assert_eq!(calls(&server).await, 3);
    // None of it was the sender's refused token: its budget of one is whole.
    challenged(&attempt("bad").await);
    let throttled = attempt("bad").await;
    assert_eq!(
        throttled.body["reason"], "rate_limited",
        "{}",
        throttled.body
    );
    assert_eq!(
        calls(&server).await,
        4,
        "the second bad token is refused unasked"
    );
}

/// With Redis down and `store.on_error = "local"`, passed and unanswered
/// tokens still cost nothing: the tokens in flight are held in the process,
/// not in a store whose give-back goes to Redis.
#[tokio::test]
async fn with_the_store_down_passed_tokens_are_not_throttled() {
    let server = provider().await;
    let app = app_with(Backend::Redis, &server, 2, |s| {
        s.store.redis_url = tollgate::settings::SecretUrl::new("redis://127.0.0.1:1");
        s.store.on_error = tollgate::settings::OnStoreError::Local;
        s.store.timeout = Duration::from_millis(200);
    })
    .await;
    let phone = "+8613800138030";
    let first = app.sms_send(json!({ "phone": phone, "ip": IP })).await;
    assert_eq!(first.status, 200, "{}", first.body);
    for token in ["down", "down", "down", "good", "good", "good"] {
        let sent = app.sms_send(send(phone, IP, token)).await;
        let expected = if token == "good" { 200 } else { 403 };
        assert_eq!(sent.status, expected, "{token}: {}", sent.body);
    }
    assert_eq!(calls(&server).await, 6);
}

/// With Redis down and `store.on_error = "allow"` a token cannot be
/// claimed, and is asked of the provider all the same (here in shadow
/// mode, where a send's token is checked first), not refused as reused.
#[tokio::test]
async fn with_the_store_down_and_allow_a_token_is_still_asked() {
    let server = provider().await;
    let app = app_with(Backend::Redis, &server, 2, |s| {
        s.store.redis_url = tollgate::settings::SecretUrl::new("redis://127.0.0.1:1");
        s.store.on_error = tollgate::settings::OnStoreError::Allow;
        s.store.timeout = Duration::from_millis(200);
        s.shadow.enabled = true;
    })
    .await;
    let sent = app.sms_send(send("+8613800138040", IP, "good")).await;
    assert_eq!(sent.status, 200, "{}", sent.body);
    assert_eq!(calls(&server).await, 1);
}

#[tokio::test]
async fn an_admins_unblock_of_the_address_gives_its_tokens_back() {
    for backend in BACKENDS {
        let server = provider().await;
        let app = app(backend, &server, 1).await;
        let phone = "+8613800138001";
        app.sms_send(json!({ "phone": phone, "ip": IP })).await;
        let subject = format!("/admin/api/subjects/ip/{IP}");
        let refused = |state: &crate::support::app::Answer| {
            state.body["refused_captcha_tokens"]["count"].as_u64()
        };
        assert_eq!(refused(&app.admin_get(&subject).await), Some(0));
        assert_eq!(app.sms_send(send(phone, IP, "bad")).await.status, 403);
        assert_eq!(app.sms_send(send(phone, IP, "good")).await.status, 429);
        let state = app.admin_get(&subject).await;
        assert_eq!(
            state.body["refused_captcha_tokens"],
            json!({ "rule": "failed_captcha 1/10m", "count": 1, "limit": 1, "window_ms": 600000 }),
            "{backend:?}: {}",
            state.body
        );

        let unblocked = app.admin_post(&format!("{subject}/unblock")).await;
        assert_eq!(unblocked.status, 200, "{}", unblocked.body);
        assert_eq!(refused(&app.admin_get(&subject).await), Some(0));

        let passed = app.sms_send(send(phone, IP, "good")).await;
        assert_eq!(passed.status, 200, "{backend:?}: {}", passed.body);
    }
}

/// The IP's subject view reads the budget's own key: an IPv6 /64's
/// refusals show on any address of it, with subject ids hashed or not.
#[tokio::test]
async fn an_ipv6_networks_refused_tokens_show_on_any_of_its_addresses() {
    for (backend, hashed) in [(Backend::Memory, false), (Backend::Redis, true)] {
        let server = provider().await;
        let app = app_with(backend, &server, 5, |s| s.store.hash_subject_ids = hashed).await;
        let sender = "2001:db8:1:2::9";
        challenge(&app, "dave", sender).await;
        let refused = app
            .login_attempt(
                json!({ "user": "dave", "ip": sender, "success": false, "captcha_token": fresh("bad") }),
            )
            .await;
        assert_eq!(refused.body["decision"], "challenge", "{}", refused.body);

        let state = app
            .admin_get("/admin/api/subjects/ip/2001:db8:1:2::5")
            .await;
        assert_eq!(state.body["id"], "2001:db8:1:2::/64", "{}", state.body);
        assert_eq!(
            state.body["refused_captcha_tokens"]["count"], 1,
            "{backend:?}, hashed {hashed}: {}",
            state.body
        );
    }
}

/// In shadow mode nothing is refused: a throttled token is not passed, and
/// its would-be refusal is audited as shadow.
#[tokio::test]
async fn in_shadow_mode_a_throttled_token_refuses_nothing() {
    let server = provider().await;
    let app = app_with(Backend::Memory, &server, 1, |s| s.shadow.enabled = true).await;
    let phone = "+8613800138002";
    for token in ["bad", "bad", "good"] {
        let sent = app.sms_send(send(phone, IP, token)).await;
        assert_eq!(sent.status, 200, "{}", sent.body);
    }
    assert_eq!(calls(&server).await, 1, "only the first token was asked");
    app.flush_audit().await;
    let throttled: Vec<_> = app
        .audit_events()
        .into_iter()
        .filter(|e| e.rule.as_deref() == Some("failed_captcha 1/10m"))
        .collect();
    assert_eq!(throttled.len(), 2);
    assert!(throttled.iter().all(|e| e.shadow));
}

#[tokio::test]
async fn throttled_tokens_are_counted_in_metrics() {
    let server = provider().await;
    let app = app(Backend::Memory, &server, 1).await;
    let series = |outcome| format!("tollgate_captcha_checks_total{{outcome=\"{outcome}\"}}");
    let before = [
        app.metric(&series("refused")).await,
        app.metric(&series("throttled")).await,
    ];
    let phone = "+8613800138003";
    app.sms_send(json!({ "phone": phone, "ip": IP })).await;
    app.sms_send(send(phone, IP, "bad")).await;
    app.sms_send(send(phone, IP, "bad")).await;
    let after = [
        app.metric(&series("refused")).await,
        app.metric(&series("throttled")).await,
    ];
    // The recorder is process-wide: other tests may add, never take away.
    assert!(
        after[0] > before[0] && after[1] > before[1],
        "{before:?} {after:?}"
    );
}

#[test]
fn the_failed_token_limit_is_checked_at_start_up() {
    let defaults = crate::support::app::load_config("").unwrap();
    let limit = defaults.captcha.failed_token_limit;
    assert_eq!((limit.limit, limit.window), (20, Duration::from_secs(600)));
    for (toml, key) in [
        (
            "{ limit = 0, window = \"1m\" }",
            "captcha.failed_token_limit.limit",
        ),
        (
            "{ limit = 5, window = \"0s\" }",
            "captcha.failed_token_limit.window",
        ),
        (
            "{ limit = 5, window = \"1m\", shadow = true }",
            "captcha.failed_token_limit.shadow",
        ),
        (
            "{ limit = 5, window = \"1m\", algorithm = \"gcra\" }",
            "captcha.failed_token_limit.algorithm",
        ),
    ] {
        let message =
            crate::support::app::config_error(&format!("[captcha]\nfailed_token_limit = {toml}\n"));
        assert!(message.contains(&format!("`{key}`")), "{toml}: {message}");
    }
}
