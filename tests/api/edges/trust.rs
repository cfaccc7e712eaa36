//! Who may call what: API keys, the backend's word against a browser's,
//! the client address behind proxies, request ids.

use serde_json::json;
use tollgate::domain::SubjectKind;

use crate::support::app::{limits, spawn_app, Backend, API_KEY};

const PHONE: &str = "+8613800138000";

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
                .bearer_auth(crate::support::app::API_KEY)
                .json(&body),
        )
        .await;
    assert_eq!(right.status, 200);
}

/// The API key is checked before the body is read: a caller with a wrong
/// key or none gets 401 whatever it sent (malformed JSON, an unknown field,
/// another media type, a body over the limit), never the 400, 413 or 415
/// that would tell it about the body. With `server.keyless_sms` a browser
/// without `Authorization` gets to the body on `/sms/*` only.
#[tokio::test]
async fn the_api_key_is_checked_before_the_body() {
    for keyless_sms in [false, true] {
        let app = spawn_app(Backend::Memory, |s| s.server.keyless_sms = keyless_sms).await;
        let bodies = [
            ("application/json", "{not json".to_string()),
            ("application/json", r#"{"unknown": 1}"#.to_string()),
            ("text/plain", "{}".to_string()),
            (
                "application/json",
                format!(r#"{{"user": "{}"}}"#, "a".repeat(20_000)),
            ),
        ];
        for path in ["/login/check", "/login/attempt", "/sms/send", "/sms/verify"] {
            let url = format!("{}{path}", app.address);
            let post = |kind: &str, body: &str, key: Option<&str>| {
                let mut request = app
                    .client
                    .post(&url)
                    .header("content-type", kind)
                    .body(body.to_string());
                if let Some(key) = key {
                    request = request.bearer_auth(key);
                }
                app.send_raw(request)
            };
            let browser_passes = keyless_sms && path.starts_with("/sms/");
            for (kind, body) in &bodies {
                let wrong = post(kind, body, Some("test-api-kez")).await;
                assert_eq!(
                    (wrong.status.as_u16(), wrong.error()),
                    (401, "unauthorized"),
                    "{path} {kind} with a wrong key: {}",
                    wrong.body
                );
                let none = post(kind, body, None).await;
                if browser_passes {
                    assert!(
                        [400, 413, 415].contains(&none.status.as_u16()),
                        "{path}: a keyless browser's body is read: {}",
                        none.body
                    );
                } else {
                    assert_eq!(
                        (none.status.as_u16(), none.error()),
                        (401, "unauthorized"),
                        "{path} {kind} without a key: {}",
                        none.body
                    );
                }
            }
            let read = post("application/json", "{not json", Some(API_KEY)).await;
            assert_eq!(
                (read.status.as_u16(), read.error()),
                (400, "invalid_request"),
                "{path} with the key: the body is read"
            );
        }
    }
    // Without keys, `/login/*` is the loopback backend's: a browser behind a
    // proxy is refused 403 before its body is read.
    let app = spawn_app(Backend::Memory, |s| s.server.api_keys = vec![]).await;
    for path in ["/login/check", "/login/attempt"] {
        let post = |proxied: bool| {
            let mut request = app
                .client
                .post(format!("{}{path}", app.address))
                .header("content-type", "application/json")
                .body("{not json");
            if proxied {
                request = request.header("x-forwarded-for", "198.51.100.7");
            }
            app.send_raw(request)
        };
        let browser = post(true).await;
        assert_eq!(
            (browser.status.as_u16(), browser.error()),
            (403, "forbidden"),
            "{path}: {}",
            browser.body
        );
        let backend = post(false).await;
        assert_eq!(backend.status, 400, "{path}: the backend's body is read");
    }
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

/// Without API keys no body names a client: a browser's `ip` is ignored
/// and its peer counts; a loopback backend's too, and its own address
/// (every user's) is counted in no window, though its rows name it.
#[tokio::test]
async fn without_an_api_key_the_body_ip_is_ignored_and_the_peer_counts() {
    let app = spawn_app(Backend::Memory, |s| {
        s.server.api_keys = vec![];
        s.sms.ip_limits = limits(&[(1, 3_600_000)]);
        s.sms.phone_limits = limits(&[(1, 3_600_000)]);
    })
    .await;
    let url = format!("{}/sms/send", app.address);
    let browser = |phone: &str, ip: &str| {
        app.client
            .post(&url)
            .header("x-forwarded-for", "192.0.2.1")
            .json(&json!({ "phone": phone, "ip": ip }))
    };
    assert_eq!(
        app.send_raw(browser(PHONE, "203.0.113.1")).await.status,
        200
    );
    let second = app.send_raw(browser("+8613900139000", "203.0.113.2")).await;
    assert_eq!(second.status, 429, "both came from 127.0.0.1");
    assert_eq!(app.audit_events()[0].subject, "127.0.0.1");

    for phone in ["+8613700137000", "+8613600136000"] {
        let sent = app
            .sms_send(json!({ "phone": phone, "ip": "203.0.113.3" }))
            .await;
        assert_eq!(sent.status, 200, "the backend's own address: {}", sent.body);
    }
    let again = app
        .sms_send(json!({ "phone": "+8613700137000", "ip": "203.0.113.3" }))
        .await;
    assert_eq!(again.status, 429, "{}", again.body);
    let row = app.audit_events().last().cloned().unwrap();
    assert_eq!(
        (row.subject_kind, row.ip.as_deref()),
        (SubjectKind::Phone, Some("127.0.0.1"))
    );
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
    // `unknown` counts as the proxy, 127.0.0.1: its one send, then refused.
    // The proxy's own request, with no header, is a loopback backend's:
    // its address is counted in no window.
    let unknown = app.send_raw(send(&phones[6], Some("unknown"))).await;
    assert_eq!(unknown.status, 200, "{}", unknown.body);
    let again = app.send_raw(send(&phones[7], Some("unknown"))).await;
    assert_eq!(again.status, 429, "{}", again.body);
    assert_eq!(app.audit_events().last().unwrap().subject, "127.0.0.1");
    assert_eq!(app.send_raw(send(&phones[8], None)).await.status, 200);
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
        .bearer_auth(crate::support::app::API_KEY)
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
    // A user agent past ASCII is recorded as sent, not dropped.
    let request = app
        .client
        .post(format!("{}/sms/send", app.address))
        .bearer_auth(crate::support::app::API_KEY)
        .header(
            "user-agent",
            reqwest::header::HeaderValue::from_bytes("café/2.0".as_bytes()).unwrap(),
        )
        .json(&json!({ "phone": PHONE }));
    request.send().await.unwrap();
    let rows = app.audit_events();
    assert_eq!(rows.len(), 2);
    assert!(
        rows.iter()
            .any(|r| r.user_agent.as_deref() == Some("café/2.0")),
        "{:?}",
        rows.iter().map(|r| &r.user_agent).collect::<Vec<_>>()
    );
}
