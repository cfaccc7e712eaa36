//! The HTTP edge: bad input, body limits, content types, authentication,
//! client IPs, health, and a store that is down.

use serde_json::{json, Value};
use tollgate::settings::{OnStoreError, Secret, SecretUrl};

use crate::helpers::{limits, spawn_app, Backend};

const PHONE: &str = "+8613800138000";

#[tokio::test]
async fn bad_input_answers_a_400_with_an_error_code() {
    let app = spawn_app(Backend::Memory, |_| {}).await;
    let cases: Vec<(&str, Value, &str, &str)> = vec![
        ("/sms/send", json!({}), "invalid_request", "phone missing"),
        (
            "/sms/send",
            json!({ "phone": "" }),
            "invalid_request",
            "phone empty",
        ),
        (
            "/sms/send",
            json!({ "phone": 8613800138000u64 }),
            "invalid_request",
            "phone not a string",
        ),
        (
            "/sms/send",
            json!({ "phone": "abc" }),
            "invalid_phone",
            "phone not a number",
        ),
        (
            "/sms/send",
            json!({ "phone": "13800138000" }),
            "invalid_phone",
            "phone without country code",
        ),
        (
            "/sms/send",
            json!({ "phone": "+999123456789" }),
            "invalid_phone",
            "no such country code",
        ),
        (
            "/sms/send",
            json!({ "phone": PHONE, "extra": 1 }),
            "invalid_request",
            "unknown field",
        ),
        (
            "/sms/send",
            json!({ "phone": PHONE, "locale": "../../etc/passwd" }),
            "invalid_request",
            "bad locale",
        ),
        (
            "/sms/send",
            json!({ "phone": PHONE, "ip": "not-an-ip" }),
            "invalid_request",
            "bad ip",
        ),
        (
            "/sms/send",
            json!({ "phone": PHONE, "captcha_passed": "yes" }),
            "invalid_request",
            "captcha_passed not a bool",
        ),
        (
            "/sms/verify",
            json!({ "phone": PHONE }),
            "invalid_request",
            "code missing",
        ),
        (
            "/sms/verify",
            json!({ "phone": PHONE, "code": "" }),
            "invalid_request",
            "code empty",
        ),
        (
            "/sms/verify",
            json!({ "phone": "12", "code": "123456" }),
            "invalid_phone",
            "verify with a bad phone",
        ),
        ("/login/check", json!({}), "invalid_request", "user missing"),
        (
            "/login/check",
            json!({ "user": "   " }),
            "invalid_request",
            "user blank",
        ),
        (
            "/login/attempt",
            json!({ "user": "a" }),
            "invalid_request",
            "success missing",
        ),
        (
            "/login/attempt",
            json!({ "user": "a", "success": "no" }),
            "invalid_request",
            "success not a bool",
        ),
        (
            "/login/attempt",
            json!({ "user": "a", "success": false, "notify_email": "nope" }),
            "invalid_request",
            "bad email",
        ),
        (
            "/login/attempt",
            json!({ "user": "a\u{0}", "success": false }),
            "invalid_request",
            "control character",
        ),
        (
            "/login/attempt",
            json!([1, 2]),
            "invalid_request",
            "not an object",
        ),
    ];
    for (path, body, code, case) in cases {
        let answer = app.post(path, body).await;
        assert_eq!(answer.status, 400, "{case}: {}", answer.body);
        assert_eq!(answer.error(), code, "{case}");
        assert!(
            answer.body["message"]
                .as_str()
                .is_some_and(|m| !m.is_empty()),
            "{case}"
        );
    }
}

/// What the OpenAPI document says each field takes, through the API: the
/// forms around its edges are taken, the ones just past them refused.
#[tokio::test]
async fn fields_are_taken_exactly_as_the_openapi_document_says() {
    let app = spawn_app(Backend::Memory, |s| s.login.captcha_after = 1000).await;
    let refused: Vec<(&str, Value, &str)> = vec![
        (
            "/sms/send",
            json!({ "phone": "+1-800-FLOWERS" }),
            "invalid_phone",
        ),
        (
            "/sms/send",
            json!({ "phone": "\t+8613800138000" }),
            "invalid_phone",
        ),
        (
            "/sms/send",
            json!({ "phone": format!("+86 138 0013 8000{}", " ".repeat(16)) }),
            "invalid_phone",
        ),
        (
            "/sms/send",
            json!({ "phone": PHONE, "ip": "[::1]" }),
            "invalid_request",
        ),
        (
            "/sms/send",
            json!({ "phone": PHONE, "ip": "1.2.3.4:80" }),
            "invalid_request",
        ),
        (
            "/sms/send",
            json!({ "phone": PHONE, "ip": " 1.2.3.4" }),
            "invalid_request",
        ),
        (
            "/sms/send",
            json!({ "phone": PHONE, "ip": "fe80::1%eth0" }),
            "invalid_request",
        ),
        (
            "/sms/verify",
            json!({ "phone": PHONE, "code": "é".repeat(65) }),
            "invalid_request",
        ),
        (
            "/sms/verify",
            json!({ "phone": PHONE, "code": " \t " }),
            "invalid_request",
        ),
        (
            "/login/check",
            json!({ "user": "a".repeat(257) }),
            "invalid_request",
        ),
        (
            "/login/check",
            json!({ "user": "alice\n" }),
            "invalid_request",
        ),
        (
            "/login/check",
            json!({ "user": "\u{200b}\u{3000}" }),
            "invalid_request",
        ),
    ];
    for (path, body, code) in refused {
        let answer = app.post(path, body.clone()).await;
        assert_eq!(
            (answer.status.as_u16(), answer.error()),
            (400, code),
            "{path} {body}"
        );
    }
    for email in [
        "ü@example.com",
        "alice@localhost",
        "a@b@example.com",
        "a..b@example.com",
    ] {
        let body = json!({ "user": "alice", "success": false, "notify_email": email });
        let answer = app.login_attempt(body).await;
        assert_eq!(
            (answer.status.as_u16(), answer.error()),
            (400, "invalid_request"),
            "{email}"
        );
    }

    let spaced = app
        .sms_send(json!({ "phone": " +86 (138) 0013-8000 " }))
        .await;
    assert_eq!(spaced.status, 200, "{}", spaced.body);
    // 64 characters of two bytes each: a code of the right length, and wrong.
    let long = app
        .sms_verify(json!({ "phone": PHONE, "code": "é".repeat(64) }))
        .await;
    assert_eq!(long.status, 200, "{}", long.body);
    assert_eq!(long.body["valid"], false, "{}", long.body);
    let name = app.login_check(json!({ "user": "é".repeat(256) })).await;
    assert_eq!(name.status, 200, "{}", name.body);
    let mailed = app
        .login_attempt(
            json!({ "user": "bob", "success": false, "notify_email": "b.o+b@mail.example.co" }),
        )
        .await;
    assert_eq!(mailed.status, 200, "{}", mailed.body);
}

#[tokio::test]
async fn malformed_json_oversized_bodies_and_wrong_content_types_are_json_errors() {
    let app = spawn_app(Backend::Memory, |_| {}).await;
    let url = format!("{}/sms/send", app.address);
    let authed = |r: reqwest::RequestBuilder| r.bearer_auth(crate::helpers::API_KEY);

    let malformed = app
        .send_raw(authed(
            app.client
                .post(&url)
                .header("content-type", "application/json")
                .body("{\"phone\":"),
        ))
        .await;
    assert_eq!(
        (malformed.status.as_u16(), malformed.error()),
        (400, "invalid_request")
    );

    let big = json!({ "phone": PHONE, "locale": "x".repeat(17 * 1024) });
    let too_large = app.send_raw(authed(app.client.post(&url).json(&big))).await;
    assert_eq!(
        (too_large.status.as_u16(), too_large.error()),
        (413, "payload_too_large")
    );

    let text = app
        .send_raw(authed(
            app.client
                .post(&url)
                .header("content-type", "text/plain")
                .body(json!({ "phone": PHONE }).to_string()),
        ))
        .await;
    assert_eq!(
        (text.status.as_u16(), text.error()),
        (415, "unsupported_media_type")
    );

    let none = app
        .send_raw(authed(
            app.client
                .post(&url)
                .body(json!({ "phone": PHONE }).to_string()),
        ))
        .await;
    assert_eq!(
        (none.status.as_u16(), none.error()),
        (415, "unsupported_media_type")
    );
    assert_eq!(none.content_type.as_deref(), Some("application/json"));
}

/// Only `application/json` (with parameters) is JSON here: `text/json`,
/// `image/json` and `+json` types answer 415 and send nothing.
#[tokio::test]
async fn only_application_json_is_accepted() {
    let app = spawn_app(Backend::Memory, |_| {}).await;
    let body = json!({ "phone": PHONE }).to_string();
    for (path, kind, expected) in [
        ("/sms/send", "text/json", 415),
        ("/sms/send", "image/json", 415),
        ("/sms/send", "application/merge-patch+json", 415),
        ("/login/check", "text/json", 415),
        ("/sms/send", "application/json; charset=utf-8", 200),
        ("/sms/send", "Application/JSON", 200),
    ] {
        let body = if path == "/login/check" {
            json!({ "user": "alice" }).to_string()
        } else {
            body.clone()
        };
        let answer = app
            .send_raw(
                app.client
                    .post(format!("{}{path}", app.address))
                    .bearer_auth(crate::helpers::API_KEY)
                    .header("content-type", kind)
                    .body(body),
            )
            .await;
        assert_eq!(
            answer.status.as_u16(),
            expected,
            "{path} {kind}: {}",
            answer.body
        );
        if expected == 415 {
            assert_eq!(answer.error(), "unsupported_media_type");
        }
    }
    assert_eq!(
        app.sms.messages().len(),
        2,
        "only the two JSON sends sent a code"
    );
}

#[tokio::test]
async fn unknown_routes_and_methods_answer_json() {
    let app = spawn_app(Backend::Memory, |_| {}).await;
    let missing = app.get("/nope").await;
    assert_eq!(
        (missing.status.as_u16(), missing.error()),
        (404, "not_found")
    );
    let wrong_method = app.get("/sms/send").await;
    assert_eq!(
        (wrong_method.status.as_u16(), wrong_method.error()),
        (405, "method_not_allowed")
    );
}

#[tokio::test]
async fn api_keys_are_required_when_configured() {
    let app = spawn_app(Backend::Memory, |_| {}).await;
    let url = format!("{}/login/check", app.address);
    let body = json!({ "user": "alice" });

    let none = app.send_raw(app.client.post(&url).json(&body)).await;
    assert_eq!((none.status.as_u16(), none.error()), (401, "unauthorized"));
    let wrong = app
        .send_raw(
            app.client
                .post(&url)
                .bearer_auth("test-api-kez")
                .json(&body),
        )
        .await;
    assert_eq!(wrong.status, 401);
    let right = app
        .send_raw(
            app.client
                .post(&url)
                .bearer_auth(crate::helpers::API_KEY)
                .json(&body),
        )
        .await;
    assert_eq!(right.status, 200);
}

/// The trust boundary with no API keys: the login backend calling from
/// loopback may report outcomes; a browser behind a reverse proxy on the same
/// host (its request carries forwarding headers, trusted proxy or not) may
/// not call `/login/*` nor claim a passed captcha.
#[tokio::test]
async fn only_the_backend_may_vouch_for_a_login_or_a_captcha() {
    for trusted in [vec![], vec!["127.0.0.1/32".parse().unwrap()]] {
        let app = spawn_app(Backend::Memory, |s| {
            s.server.api_keys = vec![];
            s.server.trusted_proxies = trusted.clone();
        })
        .await;
        let post = |path: &str, body: serde_json::Value, proxied: Option<(&str, &str)>| {
            let mut request = app
                .client
                .post(format!("{}{path}", app.address))
                .json(&body);
            if let Some((name, value)) = proxied {
                request = request.header(name, value);
            }
            app.send_raw(request)
        };
        let wipe = json!({ "user": "alice", "success": true, "captcha_passed": true });
        for header in [
            ("x-forwarded-for", "198.51.100.7"),
            ("forwarded", "for=198.51.100.7"),
        ] {
            for (path, body) in [
                ("/login/attempt", wipe.clone()),
                ("/login/check", json!({ "user": "alice" })),
            ] {
                let refused = post(path, body, Some(header)).await;
                assert_eq!(
                    (refused.status.as_u16(), refused.error()),
                    (403, "forbidden"),
                    "{path} through a proxy ({header:?}, trusted {trusted:?}): {}",
                    refused.body
                );
            }
            let claimed = post(
                "/sms/send",
                json!({ "phone": PHONE, "captcha_passed": true }),
                Some(header),
            )
            .await;
            assert_eq!(
                (claimed.status.as_u16(), claimed.error()),
                (403, "forbidden")
            );
        }
        assert!(app.sms.messages().is_empty(), "nothing was sent");
        // The browser may still ask for a code, without the claim.
        let sent = post(
            "/sms/send",
            json!({ "phone": PHONE }),
            Some(("x-forwarded-for", "198.51.100.7")),
        )
        .await;
        assert_eq!(sent.status, 200, "{}", sent.body);
        // The backend on loopback, as in the README's walkthrough.
        let direct = post("/login/attempt", wipe.clone(), None).await;
        assert_eq!(direct.status, 200, "{}", direct.body);
        let claimed = post(
            "/sms/send",
            json!({ "phone": "+8613900139000", "captcha_passed": true }),
            None,
        )
        .await;
        assert_eq!(claimed.status, 200, "{}", claimed.body);
    }
}

#[tokio::test]
async fn without_an_api_key_the_body_ip_is_ignored_and_the_peer_counts() {
    let app = spawn_app(Backend::Memory, |s| {
        s.server.api_keys = vec![];
        s.sms.ip_limits = limits(&[(1, 3_600_000)]);
    })
    .await;
    assert_eq!(
        app.sms_send(json!({ "phone": PHONE, "ip": "203.0.113.1" }))
            .await
            .status,
        200
    );
    let second = app
        .sms_send(json!({ "phone": "+8613900139000", "ip": "203.0.113.2" }))
        .await;
    assert_eq!(second.status, 429, "both came from 127.0.0.1");
    assert_eq!(app.audit_events()[0].subject, "127.0.0.1");
}

#[tokio::test]
async fn a_trusted_proxy_forwards_the_right_most_untrusted_hop() {
    let app = spawn_app(Backend::Memory, |s| {
        s.server.api_keys = vec![];
        s.server.trusted_proxies = vec![
            "127.0.0.1/32".parse().unwrap(),
            "10.0.0.0/8".parse().unwrap(),
        ];
        s.sms.ip_limits = limits(&[(1, 3_600_000)]);
    })
    .await;
    let url = format!("{}/sms/send", app.address);
    let send = |phone: &str| {
        app.client
            .post(&url)
            .header("x-forwarded-for", "198.51.100.1, 203.0.113.9, 10.1.2.3")
            .json(&json!({ "phone": phone }))
    };
    assert_eq!(app.send_raw(send(PHONE)).await.status, 200);
    assert_eq!(app.send_raw(send("+8613900139000")).await.status, 429);
    let row = &app.audit_events()[0];
    assert_eq!(
        (row.subject.as_str(), row.ip.as_deref()),
        ("203.0.113.9", Some("203.0.113.9"))
    );
}

/// Hops with ports, brackets or quotes name their address, and a hop that
/// names no address counts under the proxy that passed it on: never
/// uncounted (docs/security.md).
#[tokio::test]
async fn forwarded_hops_with_ports_brackets_or_nothing_in_them() {
    let app = spawn_app(Backend::Memory, |s| {
        s.server.api_keys = vec![];
        s.server.trusted_proxies = vec!["127.0.0.1/32".parse().unwrap()];
        s.sms.ip_limits = limits(&[(1, 3_600_000)]);
    })
    .await;
    let url = format!("{}/sms/send", app.address);
    let send = |phone: &str, forwarded: Option<&str>| {
        let mut request = app.client.post(&url).json(&json!({ "phone": phone }));
        if let Some(value) = forwarded {
            request = request.header("x-forwarded-for", value);
        }
        request
    };
    let phones = (0..10)
        .map(|i| format!("+86139001390{i:02}"))
        .collect::<Vec<_>>();
    let cases = [
        ("2.2.2.2:443", "2.2.2.2", "2.2.2.2"),
        ("[2001:db8::1]:443", "2001:db8::2", "2001:db8::/64"),
        ("\"192.0.2.60:4711\"", "192.0.2.60", "192.0.2.60"),
    ];
    for (i, (first, second, subject)) in cases.into_iter().enumerate() {
        let sent = app.send_raw(send(&phones[2 * i], Some(first))).await;
        assert_eq!(sent.status, 200, "{first:?}: {}", sent.body);
        let refused = app.send_raw(send(&phones[2 * i + 1], Some(second))).await;
        assert_eq!(
            refused.status, 429,
            "{second:?} is the same client: {}",
            refused.body
        );
        let row = app.audit_events().last().cloned().unwrap();
        assert_eq!(row.subject, subject);
    }
    // `unknown` counts as the proxy, 127.0.0.1: its one send, then refused,
    // as is the proxy's own request.
    let unknown = app.send_raw(send(&phones[6], Some("unknown"))).await;
    assert_eq!(unknown.status, 200, "{}", unknown.body);
    let again = app.send_raw(send(&phones[7], Some("unknown"))).await;
    assert_eq!(again.status, 429, "{}", again.body);
    assert_eq!(app.audit_events().last().unwrap().subject, "127.0.0.1");
    assert_eq!(app.send_raw(send(&phones[8], None)).await.status, 429);
}

#[tokio::test]
async fn forwarded_for_from_an_untrusted_peer_is_ignored() {
    let app = spawn_app(Backend::Memory, |s| {
        s.server.api_keys = vec![];
        s.server.trusted_proxies = vec!["10.0.0.0/8".parse().unwrap()];
        s.sms.ip_limits = limits(&[(1, 3_600_000)]);
    })
    .await;
    let url = format!("{}/sms/send", app.address);
    for (phone, spoofed) in [(PHONE, "198.51.100.1"), ("+8613900139000", "198.51.100.2")] {
        let request = app
            .client
            .post(&url)
            .header("x-forwarded-for", spoofed)
            .json(&json!({ "phone": phone }));
        app.send_raw(request).await;
    }
    let row = &app.audit_events()[0];
    assert_eq!(
        row.subject, "127.0.0.1",
        "the peer counts, not what it claims to forward"
    );
}

#[tokio::test]
async fn a_request_id_is_echoed_and_recorded() {
    let app = spawn_app(Backend::Memory, |s| {
        s.sms.phone_limits = limits(&[(1, 3_600_000)])
    })
    .await;
    app.sms_send(json!({ "phone": PHONE })).await;
    let request = app
        .client
        .post(format!("{}/sms/send", app.address))
        .bearer_auth(crate::helpers::API_KEY)
        .header("x-request-id", "req-42")
        .header("user-agent", "tests/1.0")
        .json(&json!({ "phone": PHONE }));
    let response = request.send().await.unwrap();
    assert_eq!(response.headers()["x-request-id"], "req-42");
    let row = &app.audit_events()[0];
    assert_eq!(
        (row.request_id.as_deref(), row.user_agent.as_deref()),
        (Some("req-42"), Some("tests/1.0"))
    );
}

#[tokio::test]
async fn health_and_readiness_answer_on_both_backends() {
    for backend in [Backend::Memory, Backend::Redis] {
        let app = spawn_app(backend, |_| {}).await;
        assert_eq!(app.get("/healthz").await.status, 200, "{backend:?}");
        let ready = app.get("/readyz").await;
        assert_eq!(ready.status, 200, "{backend:?}: {}", ready.body);
    }
}

fn unreachable_redis(on_error: OnStoreError) -> impl FnOnce(&mut tollgate::settings::Settings) {
    move |s| {
        s.store.redis_url = SecretUrl::new("redis://127.0.0.1:1");
        s.store.on_error = on_error;
        s.store.timeout = std::time::Duration::from_millis(200);
    }
}

#[tokio::test]
async fn an_unreachable_store_fails_closed_by_default() {
    let app = spawn_app(Backend::Redis, unreachable_redis(OnStoreError::Deny)).await;
    assert_eq!(app.get("/healthz").await.status, 200, "the process is up");
    let ready = app.get("/readyz").await;
    assert_eq!(
        (ready.status.as_u16(), ready.error()),
        (503, "not_ready"),
        "the public /readyz says not ready, not why"
    );
    let send = app.sms_send(json!({ "phone": PHONE })).await;
    assert_eq!(
        (send.status.as_u16(), send.error()),
        (503, "store_unavailable")
    );
    let login = app
        .login_attempt(json!({ "user": "a", "success": false, "ip": "203.0.113.1" }))
        .await;
    assert_eq!(
        (login.status.as_u16(), login.error()),
        (503, "store_unavailable")
    );
    assert!(app.sms.messages().is_empty());
}

#[tokio::test]
async fn an_unreachable_store_fails_open_for_counters_when_told_to() {
    let app = spawn_app(Backend::Redis, |s| {
        unreachable_redis(OnStoreError::Allow)(s);
        s.sms.phone_limits = limits(&[(1, 3_600_000)]);
    })
    .await;
    let login = app
        .login_attempt(json!({ "user": "a", "success": false, "ip": "203.0.113.1" }))
        .await;
    assert_eq!(login.status, 200);
    assert_eq!(login.body["decision"], "allow");
    // Codes keep flowing: they are kept in the process meanwhile.
    let send = app.sms_send(json!({ "phone": PHONE })).await;
    assert_eq!(send.status, 200, "{}", send.body);
    let code = app.sms.last_code(PHONE);
    let wrong = app
        .sms_verify(json!({ "phone": PHONE, "code": "000000" }))
        .await;
    assert_eq!(wrong.body, json!({ "valid": false, "attempts_left": 4 }));
    let right = app
        .sms_verify(json!({ "phone": PHONE, "code": code }))
        .await;
    assert_eq!(right.body, json!({ "valid": true }));
    // Counters stay open: the phone's 1/1h window does not refuse a resend.
    let resend = app.sms_send(json!({ "phone": PHONE })).await;
    assert_eq!(resend.status, 200, "{}", resend.body);
}

#[tokio::test]
async fn an_unreachable_store_falls_back_to_the_local_one() {
    let app = spawn_app(Backend::Redis, |s| {
        unreachable_redis(OnStoreError::Local)(s);
        s.sms.phone_limits = limits(&[(1, 3_600_000)]);
        s.sms.code_secret = Secret::new("a-configured-secret");
    })
    .await;
    assert_eq!(app.sms_send(json!({ "phone": PHONE })).await.status, 200);
    assert_eq!(
        app.sms_send(json!({ "phone": PHONE })).await.status,
        429,
        "the local store counts"
    );
    let code = app.sms.last_code(PHONE);
    assert_eq!(
        app.sms_verify(json!({ "phone": PHONE, "code": code }))
            .await
            .body,
        json!({ "valid": true })
    );
}

#[tokio::test]
async fn metrics_count_decisions_and_store_calls_in_prometheus_text() {
    let app = spawn_app(Backend::Memory, |s| {
        s.sms.phone_limits = limits(&[(1, 3_600_000)])
    })
    .await;
    app.sms_send(json!({ "phone": PHONE })).await;
    app.sms_send(json!({ "phone": PHONE })).await;
    app.login_check(json!({ "user": "metrics-user" })).await;

    let metrics = app.get("/metrics").await;
    assert_eq!(metrics.status, 200);
    let text = metrics
        .body
        .as_str()
        .expect("Prometheus text, not JSON")
        .to_string();
    // The recorder is process-wide: other tests add to the same counters.
    let value = |series: &str| -> f64 {
        text.lines()
            .find(|l| l.starts_with(series))
            .and_then(|l| l.rsplit(' ').next())
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| panic!("{series} missing from\n{text}"))
    };
    assert!(value("tollgate_requests_total{route=\"sms_send\",decision=\"allow\"}") >= 1.0);
    assert!(value("tollgate_requests_total{route=\"sms_send\",decision=\"deny\"}") >= 1.0);
    assert!(value("tollgate_requests_total{route=\"login_check\",decision=\"allow\"}") >= 1.0);
    assert!(value("tollgate_store_seconds_count") >= 3.0);
    assert!(text.contains("# HELP tollgate_requests_total"));
}

/// A Redis of the test's own, so that it can be frozen without freezing the
/// other tests' shared one.
struct PrivateRedis {
    port: u16,
    child: std::process::Child,
}

impl PrivateRedis {
    async fn start() -> Self {
        let port = crate::helpers::free_port();
        let child = std::process::Command::new("redis-server")
            .args([
                "--port",
                &port.to_string(),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
            ])
            .stdout(std::process::Stdio::null())
            .spawn()
            .expect("redis-server is installed (scripts/services.sh)");
        for _ in 0..100 {
            if tokio::net::TcpStream::connect(("127.0.0.1", port))
                .await
                .is_ok()
            {
                break;
            }
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        }
        Self { port, child }
    }

    fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// Freeze the server (SIGSTOP): connections stay open, nothing answers.
    fn freeze(&self) {
        self.signal("-STOP");
    }

    fn thaw(&self) {
        self.signal("-CONT");
    }

    fn signal(&self, signal: &str) {
        let status = std::process::Command::new("kill")
            .args([signal, &self.child.id().to_string()])
            .status()
            .expect("kill runs");
        assert!(status.success());
    }
}

impl Drop for PrivateRedis {
    fn drop(&mut self) {
        self.thaw();
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[tokio::test]
async fn a_slow_redis_is_cut_off_at_the_store_timeout() {
    let redis = PrivateRedis::start().await;
    let url = redis.url();
    let app = spawn_app(Backend::Redis, move |s| {
        s.store.redis_url = SecretUrl::new(url);
        s.store.timeout = std::time::Duration::from_millis(200);
        s.sms.code_secret = Secret::new("a-configured-secret");
    })
    .await;
    assert_eq!(app.login_check(json!({ "user": "a" })).await.status, 200);
    let errors_before = app.metric("tollgate_store_errors_total").await;

    redis.freeze();
    let started = std::time::Instant::now();
    let answer = app
        .login_attempt(json!({ "user": "a", "success": false }))
        .await;
    let took = started.elapsed();
    assert_eq!(
        (answer.status.as_u16(), answer.error()),
        (503, "store_unavailable")
    );
    assert!(
        took < std::time::Duration::from_millis(1_500),
        "answered after {took:?}, not after the stall"
    );
    assert!(
        app.metric("tollgate_store_errors_total").await > errors_before,
        "the timeout is counted"
    );
}

#[tokio::test]
async fn a_slow_redis_falls_back_to_the_local_store_when_told_to() {
    let redis = PrivateRedis::start().await;
    let url = redis.url();
    let app = spawn_app(Backend::Redis, move |s| {
        s.store.redis_url = SecretUrl::new(url);
        s.store.timeout = std::time::Duration::from_millis(200);
        s.store.on_error = OnStoreError::Local;
        s.login.captcha_after = 1000;
        s.login.lock_after = 2;
    })
    .await;
    assert_eq!(app.login_check(json!({ "user": "a" })).await.status, 200);

    redis.freeze();
    let started = std::time::Instant::now();
    let first = app
        .login_attempt(json!({ "user": "a", "success": false }))
        .await;
    assert_eq!(first.status, 200, "{}", first.body);
    let second = app
        .login_attempt(json!({ "user": "a", "success": false }))
        .await;
    assert_eq!(
        second.body["locked"], true,
        "the local store counts while Redis is frozen: {}",
        second.body
    );
    assert!(
        started.elapsed() < std::time::Duration::from_secs(3),
        "each call gave up at the timeout"
    );
    redis.thaw();
}
