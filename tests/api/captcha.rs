//! Captcha tokens checked against a local siteverify endpoint, for each provider kind.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use serde_json::json;
use tollgate::settings::{CaptchaKind, Secret, Settings};
use wiremock::matchers::{method, path};
use wiremock::{Mock, MockServer, ResponseTemplate};

use crate::support::app::{spawn_app, Backend, TestApp};

const PHONE: &str = "+8613800138000";
const IP: &str = "203.0.113.7";
const SECRET: &str = "captcha-secret";
const KINDS: [CaptchaKind; 3] = [
    CaptchaKind::Turnstile,
    CaptchaKind::Hcaptcha,
    CaptchaKind::Recaptcha,
];

/// An app whose second send to a phone needs a captcha, checked at `server`.
pub(crate) async fn app_with_captcha(
    kind: CaptchaKind,
    server: &MockServer,
    configure: impl FnOnce(&mut Settings),
) -> TestApp {
    let verify_url = format!("{}/siteverify", server.uri());
    spawn_app(Backend::Memory, move |s| {
        s.sms.captcha_after = 1;
        s.captcha.kind = kind;
        s.captcha.secret = Secret::new(SECRET);
        s.captcha.verify_url = verify_url.into();
        configure(s);
    })
    .await
}

async fn siteverify_answers(server: &MockServer, answer: ResponseTemplate) {
    Mock::given(method("POST"))
        .and(path("/siteverify"))
        .respond_with(answer)
        .mount(server)
        .await;
}

/// A siteverify endpoint that confirms every token.
async fn confirming_provider() -> MockServer {
    let server = MockServer::start().await;
    let success = json!({ "success": true });
    siteverify_answers(&server, ResponseTemplate::new(200).set_body_json(success)).await;
    server
}

/// The forms siteverify received, in order.
async fn forms(server: &MockServer) -> Vec<BTreeMap<String, String>> {
    let requests = server
        .received_requests()
        .await
        .expect("request recording is on");
    for request in &requests {
        let content_type = request
            .headers
            .get("content-type")
            .and_then(|v| v.to_str().ok());
        assert_eq!(content_type, Some("application/x-www-form-urlencoded"));
    }
    requests
        .iter()
        .map(|r| form_urlencoded::parse(&r.body).into_owned().collect())
        .collect()
}

fn expected_form(token: &str, ip: &str) -> BTreeMap<String, String> {
    BTreeMap::from([
        ("secret".to_string(), SECRET.to_string()),
        ("response".to_string(), token.to_string()),
        ("remoteip".to_string(), ip.to_string()),
    ])
}

/// Uses up the free send, so the next one to `PHONE` from `IP` needs a captcha.
async fn use_up_the_free_send(app: &TestApp) {
    let first = app.sms_send(json!({ "phone": PHONE, "ip": IP })).await;
    assert_eq!(first.status, 200, "{}", first.body);
    assert_eq!(first.body["captcha_required"], true);
}

#[tokio::test]
async fn a_token_the_provider_confirms_passes_the_sms_captcha_tier_for_each_kind() {
    for kind in KINDS {
        let server = confirming_provider().await;
        let app = app_with_captcha(kind, &server, |_| {}).await;
        use_up_the_free_send(&app).await;

        let passed = app
            .sms_send(json!({ "phone": PHONE, "ip": IP, "captcha_token": "token-ok" }))
            .await;

        assert_eq!(passed.status, 200, "{kind:?}: {}", passed.body);
        assert_eq!(
            forms(&server).await,
            vec![expected_form("token-ok", IP)],
            "{kind:?}"
        );
    }
}

#[tokio::test]
async fn a_token_the_provider_rejects_is_refused_for_each_kind() {
    for kind in KINDS {
        let server = MockServer::start().await;
        let answer = json!({ "success": false, "error-codes": ["invalid-input-response"] });
        siteverify_answers(&server, ResponseTemplate::new(200).set_body_json(answer)).await;
        let app = app_with_captcha(kind, &server, |_| {}).await;
        use_up_the_free_send(&app).await;

        let refused = app
            .sms_send(json!({ "phone": PHONE, "ip": IP, "captcha_token": "token-bad" }))
            .await;

        assert_eq!(refused.status, 403, "{kind:?}: {}", refused.body);
        assert_eq!(refused.error(), "captcha_required", "{kind:?}");
        assert_eq!(
            forms(&server).await,
            vec![expected_form("token-bad", IP)],
            "{kind:?}"
        );
    }
}

#[tokio::test]
async fn provider_errors_unreadable_answers_and_timeouts_count_as_not_passed() {
    let cases = [
        (
            "a 500 even with success true",
            ResponseTemplate::new(500).set_body_json(json!({ "success": true })),
        ),
        (
            "a body that is not JSON",
            ResponseTemplate::new(200).set_body_string("<html>ok</html>"),
        ),
        (
            "an answer without success",
            ResponseTemplate::new(200).set_body_json(json!({ "hostname": "x" })),
        ),
        (
            "success as a string",
            ResponseTemplate::new(200).set_body_json(json!({ "success": "true" })),
        ),
        (
            "an answer over a megabyte, even with success true",
            ResponseTemplate::new(200)
                .set_body_json(json!({ "success": true, "pad": "x".repeat(2 << 20) })),
        ),
        (
            "an answer after the timeout",
            ResponseTemplate::new(200)
                .set_body_json(json!({ "success": true }))
                .set_delay(Duration::from_secs(3)),
        ),
    ];
    for (case, answer) in cases {
        let server = MockServer::start().await;
        siteverify_answers(&server, answer).await;
        let app = app_with_captcha(CaptchaKind::Turnstile, &server, |s| {
            s.captcha.timeout = Duration::from_millis(300);
        })
        .await;
        use_up_the_free_send(&app).await;

        let started = Instant::now();
        let refused = app
            .sms_send(json!({ "phone": PHONE, "ip": IP, "captcha_token": "token" }))
            .await;

        assert_eq!(refused.status, 403, "{case}: {}", refused.body);
        assert_eq!(refused.error(), "captcha_required", "{case}");
        assert!(
            started.elapsed() < Duration::from_secs(2),
            "{case}: {:?}",
            started.elapsed()
        );
        assert_eq!(
            forms(&server).await.len(),
            1,
            "{case}: one call, not retried"
        );
    }
}

#[tokio::test]
async fn captcha_passed_true_does_not_count_when_a_provider_is_configured() {
    let server = confirming_provider().await;
    let app = app_with_captcha(CaptchaKind::Hcaptcha, &server, |_| {}).await;
    use_up_the_free_send(&app).await;

    let refused = app
        .sms_send(json!({ "phone": PHONE, "ip": IP, "captcha_passed": true }))
        .await;

    assert_eq!(refused.status, 403, "{}", refused.body);
    assert_eq!(refused.error(), "captcha_required");
    assert!(
        forms(&server).await.is_empty(),
        "no token, no siteverify call"
    );
}

#[tokio::test]
async fn an_ipv6_client_sends_its_own_address_as_remoteip_not_its_64() {
    let server = confirming_provider().await;
    let app = app_with_captcha(CaptchaKind::Recaptcha, &server, |_| {}).await;
    let ip = "2001:db8:1:2::7";
    // The free send: the token is asked about only once a captcha is needed.
    let free = app.sms_send(json!({ "phone": PHONE, "ip": ip })).await;
    assert_eq!(free.status, 200, "{}", free.body);

    let answer = app
        .sms_send(json!({ "phone": PHONE, "ip": ip, "captcha_token": "token-v6" }))
        .await;

    assert_eq!(answer.status, 200, "{}", answer.body);
    assert_eq!(forms(&server).await, vec![expected_form("token-v6", ip)]);
}

#[tokio::test]
async fn a_confirmed_token_lets_a_login_attempt_through_the_captcha_tier() {
    let server = MockServer::start().await;
    Mock::given(method("POST"))
        .and(path("/siteverify"))
        .and(wiremock::matchers::body_string_contains("response=good"))
        .respond_with(ResponseTemplate::new(200).set_body_json(json!({ "success": true })))
        .mount(&server)
        .await;
    siteverify_answers(
        &server,
        ResponseTemplate::new(200).set_body_json(json!({ "success": false })),
    )
    .await;
    let app = app_with_captcha(CaptchaKind::Turnstile, &server, |s| {
        s.login.captcha_after = 1
    })
    .await;
    let attempt = |token: &str| {
        app.login_attempt(
            json!({ "user": "alice", "ip": IP, "success": false, "captcha_token": token }),
        )
    };

    let first = app
        .login_attempt(json!({ "user": "alice", "ip": IP, "success": false }))
        .await;
    assert_eq!(first.body["captcha_required"], true, "{}", first.body);

    let rejected = attempt("bad").await;
    assert_eq!(rejected.body["decision"], "challenge", "{}", rejected.body);
    assert_eq!(
        rejected.body["failures"], 1,
        "a refused attempt is not counted"
    );

    let passed = attempt("good").await;
    assert_eq!(passed.body["decision"], "allow", "{}", passed.body);
    assert_eq!(passed.body["failures"], 2, "the attempt was counted");

    assert_eq!(
        forms(&server).await,
        vec![expected_form("bad", IP), expected_form("good", IP)]
    );
}

/// A token from a blocked IP, or one an attempt does not need, never reaches
/// the provider: only a challenged attempt asks it.
#[tokio::test]
async fn a_token_is_checked_only_when_the_attempt_is_challenged() {
    let server = confirming_provider().await;
    let app = app_with_captcha(CaptchaKind::Turnstile, &server, |s| {
        s.login.captcha_after = 5;
        s.login.ip_captcha_after = 100;
        s.login.ip_block_after = 2;
    })
    .await;
    let attempt = |user: &str| {
        app.login_attempt(
            json!({ "user": user, "ip": IP, "success": false, "captcha_token": "good" }),
        )
    };

    // Not challenged: the token is not needed, so not checked.
    for user in ["u1", "u2"] {
        let recorded = attempt(user).await;
        assert_eq!(recorded.body["decision"], "allow", "{}", recorded.body);
    }
    // The IP is blocked now: refused without asking the provider.
    let blocked = attempt("u3").await;
    assert_eq!(blocked.body["reason"], "ip_blocked", "{}", blocked.body);
    assert!(
        forms(&server).await.is_empty(),
        "{:?}",
        forms(&server).await
    );
}

/// A token goes to the provider only when the send's answer hangs on it: a
/// send that needs no captcha, or that a limit refuses anyway, costs no
/// siteverify call.
#[tokio::test]
async fn an_sms_token_is_checked_only_when_the_send_needs_a_captcha() {
    let server = confirming_provider().await;
    let app = app_with_captcha(CaptchaKind::Turnstile, &server, |s| {
        s.sms.phone_limits = crate::support::app::limits(&[(1, 3_600_000)]);
    })
    .await;
    let send = |phone: &'static str| {
        app.sms_send(json!({ "phone": phone, "ip": IP, "captcha_token": "token-ok" }))
    };

    let free = send(PHONE).await;
    assert_eq!(free.status, 200, "no captcha needed yet: {}", free.body);
    let limited = send(PHONE).await;
    assert_eq!(
        (limited.status.as_u16(), limited.error()),
        (429, "rate_limited"),
        "the phone's 1/1h answers before its captcha tier: {}",
        limited.body
    );
    assert!(
        forms(&server).await.is_empty(),
        "neither send asked the provider: {:?}",
        forms(&server).await
    );

    // Another phone from the same address: the IP's captcha tier asks.
    let gated = send("+8613800138001").await;
    assert_eq!(gated.status, 200, "{}", gated.body);
    assert_eq!(forms(&server).await, vec![expected_form("token-ok", IP)]);
}

/// A country's captcha (the pumping guard's challenge) takes a token like a
/// captcha tier: checked once it is needed, and a passed one gets a code.
#[tokio::test]
async fn a_token_passes_a_countrys_captcha() {
    let server = confirming_provider().await;
    let app = app_with_captcha(CaptchaKind::Hcaptcha, &server, |s| {
        s.sms.captcha_after = 1000;
        s.sms.pumping.country_min_sends = 3;
    })
    .await;
    for i in 0..3 {
        let phone = format!("+86139{i:02}138000");
        let sent = app
            .sms_send(json!({ "phone": phone, "ip": IP, "captcha_token": "token-ok" }))
            .await;
        assert_eq!(sent.status, 200, "{}", sent.body);
    }
    assert!(forms(&server).await.is_empty(), "no captcha was needed");
    let refused = app
        .sms_send(json!({ "phone": "+8613903138000", "ip": IP }))
        .await;
    assert_eq!(refused.error(), "captcha_required", "{}", refused.body);

    let passed = app
        .sms_send(json!({ "phone": "+8613904138000", "ip": IP, "captcha_token": "token-ok" }))
        .await;
    assert_eq!(passed.status, 200, "{}", passed.body);
    assert_eq!(app.sms.messages().len(), 4);
    assert_eq!(forms(&server).await, vec![expected_form("token-ok", IP)]);
}

/// An IPv6 network's captcha tier takes a token like the phone's and the
/// IP's: a fresh /64 of a network past its tier is asked, and its
/// confirmed token gets the code; the token goes to the provider only then.
#[tokio::test]
async fn a_token_passes_a_networks_captcha_tier() {
    let server = confirming_provider().await;
    let app = app_with_captcha(CaptchaKind::Turnstile, &server, |s| {
        // Only the network asks here.
        s.sms.captcha_after = 1000;
        s.sms.network_captcha_after = 1;
    })
    .await;
    let send = |phone: &'static str, ip: &'static str, token: Option<&str>| {
        let body = match token {
            Some(token) => json!({ "phone": phone, "ip": ip, "captcha_token": token }),
            None => json!({ "phone": phone, "ip": ip }),
        };
        app.sms_send(body)
    };

    let free = send(PHONE, "2001:db8:7:1::1", Some("token-early")).await;
    assert_eq!(free.status, 200, "{}", free.body);
    assert_eq!(free.body["captcha_required"], true);
    assert!(
        forms(&server).await.is_empty(),
        "the free send asked nobody"
    );

    let asked = send("+8613800138001", "2001:db8:7:2::1", None).await;
    assert_eq!(
        (asked.status.as_u16(), asked.error()),
        (403, "captcha_required"),
        "{}",
        asked.body
    );
    let passed = send("+8613800138001", "2001:db8:7:2::1", Some("token-v6")).await;
    assert_eq!(passed.status, 200, "{}", passed.body);
    assert_eq!(
        forms(&server).await,
        vec![expected_form("token-v6", "2001:db8:7:2::1")]
    );
}

/// A login's network tier (`login.network_captcha_after`) is passed with a
/// provider's token like the IP's, on both stores: the first call finds
/// the attempt challenged, the provider confirms the token, the second
/// call records it; a later attempt without a token is still challenged.
#[tokio::test]
async fn a_token_passes_a_login_networks_captcha_tier() {
    for backend in [Backend::Memory, Backend::Redis] {
        let server = confirming_provider().await;
        let verify_url = format!("{}/siteverify", server.uri());
        let app = spawn_app(backend, move |s| {
            s.captcha.kind = CaptchaKind::Turnstile;
            s.captcha.secret = Secret::new(SECRET);
            s.captcha.verify_url = verify_url.into();
            // Only the network asks here.
            s.login.captcha_after = 1000;
            s.login.ip_captcha_after = 1000;
            s.login.network_captcha_after = 2;
        })
        .await;
        let attempt = |user: &'static str, ip: &'static str, token: Option<&str>| {
            let mut body = json!({ "user": user, "ip": ip, "success": false });
            if let Some(token) = token {
                body["captcha_token"] = json!(token);
            }
            app.login_attempt(body)
        };

        let first = attempt("u1", "2001:db8:8:1::1", Some("token-early")).await;
        assert_eq!(first.body["captcha_required"], false, "{}", first.body);
        let filling = attempt("u2", "2001:db8:8:2::1", None).await;
        assert_eq!(filling.body["captcha_required"], true, "{}", filling.body);
        assert!(
            forms(&server).await.is_empty(),
            "{backend:?}: nothing asked"
        );

        let asked = attempt("u3", "2001:db8:8:3::1", None).await;
        assert_eq!(asked.body["decision"], "challenge", "{}", asked.body);
        let passed = attempt("u3", "2001:db8:8:3::1", Some("token-v6")).await;
        assert_eq!(passed.body["decision"], "allow", "{}", passed.body);
        assert_eq!(passed.body["failures"], 1, "{}", passed.body);
        assert_eq!(
            forms(&server).await,
            vec![expected_form("token-v6", "2001:db8:8:3::1")],
            "{backend:?}"
        );
        let after = attempt("u4", "2001:db8:8:4::1", None).await;
        assert_eq!(after.body["decision"], "challenge", "{}", after.body);
    }
}

/// An app whose country (CN) is challenged from its fourth send, asking
/// `server` about tokens; the three free sends made.
async fn app_one_send_from_a_country_challenge(
    server: &MockServer,
    configure: impl FnOnce(&mut Settings),
) -> TestApp {
    let app = app_with_captcha(CaptchaKind::Hcaptcha, server, |s| {
        s.sms.captcha_after = 1000;
        s.sms.pumping.country_min_sends = 3;
        s.captcha.timeout = Duration::from_secs(5);
        configure(s);
    })
    .await;
    for i in 0..3 {
        let phone = format!("+86139{i:02}138000");
        let sent = app.sms_send(json!({ "phone": phone, "ip": IP })).await;
        assert_eq!(sent.status, 200, "{}", sent.body);
    }
    app
}

/// The audit rows that challenge the country.
fn country_challenges(app: &TestApp) -> usize {
    let challenge = tollgate::audit::AuditDecision::Challenge;
    let rows = app.audit_events();
    rows.iter()
        .filter(|e| e.decision == challenge && e.subject == "CN")
        .count()
}

/// The country's challenge a send starts is audited before its token goes
/// to the provider: a send cut short while the provider thinks (a shutdown
/// past `server.shutdown_timeout` drops it) leaves the row all the same.
#[tokio::test]
async fn a_countrys_challenge_is_audited_even_if_the_send_is_cut_during_the_token_check() {
    let server = MockServer::start().await;
    let slow_refusal = ResponseTemplate::new(200)
        .set_body_json(json!({ "success": false }))
        .set_delay(Duration::from_millis(3000));
    siteverify_answers(&server, slow_refusal).await;
    let app = app_one_send_from_a_country_challenge(&server, |s| {
        s.server.shutdown_timeout = Duration::from_millis(200);
    })
    .await;

    let cut = tokio::spawn({
        let (client, address, key) = (app.client.clone(), app.address.clone(), app.api_key.clone());
        async move {
            let mut request = client
                .post(format!("{address}/sms/send"))
                .json(&json!({ "phone": "+8613903138000", "ip": IP, "captcha_token": "t" }));
            if let Some(key) = key {
                request = request.bearer_auth(key);
            }
            request.send().await
        }
    });
    let asked = || async { !forms(&server).await.is_empty() };
    crate::support::wait::eventually("the provider asked", Duration::from_secs(5), asked).await;
    app.stop(true).await;
    let answer = cut.await.expect("the request task ends");
    assert!(
        answer.is_err(),
        "the send was cut, not answered: {answer:?}"
    );
    assert_eq!(country_challenges(&app), 1, "{:?}", app.audit_events());
}

/// A token refused after the send started the challenge: the challenge is
/// audited once, not once before the check and again with the refusal.
#[tokio::test]
async fn a_countrys_challenge_refused_a_token_is_audited_once() {
    let server = MockServer::start().await;
    let refusal = ResponseTemplate::new(200).set_body_json(json!({ "success": false }));
    siteverify_answers(&server, refusal).await;
    let app = app_one_send_from_a_country_challenge(&server, |_| {}).await;

    let refused = app
        .sms_send(json!({ "phone": "+8613903138000", "ip": IP, "captcha_token": "t" }))
        .await;
    assert_eq!(refused.error(), "captcha_required", "{}", refused.body);
    assert_eq!(forms(&server).await.len(), 1);
    assert_eq!(country_challenges(&app), 1, "{:?}", app.audit_events());
}
