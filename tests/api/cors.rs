//! `server.cors_origins`: browsers on the configured origins may call
//! `/sms/send` and `/sms/verify`; nobody else gets CORS headers. And the
//! `RateLimit` headers of a send.

use reqwest::Method;
use serde_json::json;

use crate::support::app::{limits, spawn_app, Answer, Backend, TestApp};

async fn preflight(app: &TestApp, path: &str, origin: &str) -> Answer {
    let request = app
        .client
        .request(Method::OPTIONS, format!("{}{path}", app.address))
        .header("origin", origin)
        .header("access-control-request-method", "POST")
        .header("access-control-request-headers", "content-type");
    app.send_raw(request).await
}

async fn send_from(app: &TestApp, origin: &str) -> Answer {
    let request = app
        .client
        .post(format!("{}/sms/send", app.address))
        .header("origin", origin)
        .bearer_auth(app.api_key.as_deref().unwrap_or_default())
        .json(&json!({ "phone": "+8613800138000" }));
    app.send_raw(request).await
}

fn header<'a>(answer: &'a Answer, name: &str) -> Option<&'a str> {
    answer.headers.get(name).and_then(|v| v.to_str().ok())
}

const APP: &str = "https://app.example.com";

#[tokio::test]
async fn configured_origins_get_preflights_and_headers_and_others_do_not() {
    let app = spawn_app(Backend::Memory, |s| {
        s.server.cors_origins = vec![APP.into()];
        s.sms.phone_limits = limits(&[(1, 3_600_000)]);
    })
    .await;
    for path in ["/sms/send", "/sms/verify"] {
        let ok = preflight(&app, path, APP).await;
        assert_eq!(ok.status, 200, "{path}");
        assert_eq!(header(&ok, "access-control-allow-origin"), Some(APP));
        assert!(header(&ok, "access-control-allow-methods").is_some_and(|m| m.contains("POST")));
        assert_eq!(
            header(&ok, "access-control-allow-credentials"),
            None,
            "never credentials"
        );
        let evil = preflight(&app, path, "https://evil.example").await;
        assert_eq!(header(&evil, "access-control-allow-origin"), None, "{path}");
        // Refused as every API error is: JSON with a code, not plain text.
        assert_eq!(
            (evil.status.as_u16(), evil.error()),
            (400, "invalid_request"),
            "{path}: {}",
            evil.body
        );
        assert!(evil.body["message"]
            .as_str()
            .is_some_and(|m| m.starts_with("CORS: ")));
        let put = app
            .send_raw(
                app.client
                    .request(Method::OPTIONS, format!("{}{path}", app.address))
                    .header("origin", APP)
                    .header("access-control-request-method", "PUT"),
            )
            .await;
        assert_eq!(
            (put.status.as_u16(), put.error()),
            (400, "invalid_request"),
            "{path}: {}",
            put.body
        );
    }
    let sent = send_from(&app, APP).await;
    assert_eq!(sent.status, 200, "{}", sent.body);
    assert_eq!(header(&sent, "access-control-allow-origin"), Some(APP));
    let limited = send_from(&app, APP).await;
    assert_eq!(limited.status, 429);
    assert!(
        header(&limited, "access-control-expose-headers")
            .is_some_and(|h| h.contains("retry-after")),
        "a page can read Retry-After"
    );
    // Logins are the backend's: no CORS there.
    let login = preflight(&app, "/login/attempt", APP).await;
    assert_eq!(header(&login, "access-control-allow-origin"), None);
}

#[tokio::test]
async fn a_star_allows_every_origin_and_no_origins_means_no_cors() {
    let star = spawn_app(Backend::Memory, |s| {
        s.server.cors_origins = vec!["*".into()]
    })
    .await;
    let ok = preflight(&star, "/sms/send", "https://anywhere.example").await;
    assert_eq!(header(&ok, "access-control-allow-origin"), Some("*"));

    let none = spawn_app(Backend::Memory, |_| {}).await;
    let refused = preflight(&none, "/sms/send", APP).await;
    assert_eq!(refused.status, 405, "unchanged without origins");
    assert_eq!(header(&refused, "access-control-allow-origin"), None);
    let sent = send_from(&none, APP).await;
    assert_eq!(sent.status, 200);
    assert_eq!(header(&sent, "access-control-allow-origin"), None);
}

#[test]
fn a_bad_origin_is_refused_naming_its_key() {
    let error = crate::support::app::config_error(
        "[server]\ncors_origins = [\"https://ok.example\", \"https://app.example.com/login\"]\n",
    );
    assert!(error.contains("server.cors_origins[1]"), "{error}");
    // Browsers send the host in lower case and no default port; CORS
    // compares as written, so these would never match a browser.
    for (entry, form) in [
        ("https://SHOP.example.com", "https://shop.example.com"),
        ("https://shop2.example.com:443", "https://shop2.example.com"),
    ] {
        let error =
            crate::support::app::config_error(&format!("[server]\ncors_origins = [{entry:?}]\n"));
        assert!(error.contains("server.cors_origins[0]"), "{error}");
        assert!(error.contains(&format!("{form:?}")), "{error}");
    }
    // Beside named origins, `*` meant every origin or only the named ones
    // by the list's order (actix-cors keeps the last call's).
    for (list, at) in [
        (r#"["*", "https://ok.example"]"#, 0),
        (r#"["https://ok.example", "*"]"#, 1),
    ] {
        let error =
            crate::support::app::config_error(&format!("[server]\ncors_origins = {list}\n"));
        assert!(
            error.contains(&format!("server.cors_origins[{at}]")),
            "{error}"
        );
        assert!(error.contains("list it alone"), "{error}");
    }
}

/// `/sms/send` answers the phone's tightest window in the IETF `RateLimit`
/// headers, so a page can show a countdown; a browser on an allowed origin
/// may read them.
#[tokio::test]
async fn a_send_tells_its_quota_in_ratelimit_headers() {
    let app = spawn_app(Backend::Memory, |s| {
        s.server.cors_origins = vec![APP.into()];
        s.sms.phone_limits = limits(&[(2, 60_000), (5, 3_600_000)]);
    })
    .await;
    let first = send_from(&app, APP).await;
    assert_eq!(first.status, 200, "{}", first.body);
    assert_eq!(
        header(&first, "ratelimit-policy"),
        Some("\"phone\";q=2;w=60")
    );
    assert_eq!(header(&first, "ratelimit"), Some("\"phone\";r=1;t=0"));
    let second = send_from(&app, APP).await;
    assert_eq!(header(&second, "ratelimit"), Some("\"phone\";r=0;t=60"));
    assert_eq!(second.body["resend_after_secs"], 60);
    assert!(header(&second, "access-control-expose-headers")
        .is_some_and(|h| h.contains("ratelimit-policy")));

    let shadow = spawn_app(Backend::Memory, |s| s.sms.shadow = true).await;
    let sent = shadow.sms_send(json!({ "phone": "+8613800138000" })).await;
    assert_eq!(sent.status, 200);
    assert_eq!(
        header(&sent, "ratelimit"),
        None,
        "nothing is enforced in shadow mode"
    );
}
