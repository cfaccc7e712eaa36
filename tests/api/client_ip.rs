//! The client's address behind a proxy, as an attacker sees it: only the
//! header the operator's proxy sets counts (`server.client_ip_header`),
//! read from the right, and nothing a client sends makes it uncounted or
//! charges someone else (docs/security.md).

use reqwest::RequestBuilder;
use serde_json::json;
use tollgate::domain::forwarding::ClientIpHeader;
use tollgate::settings::Settings;

use crate::support::app::{limits, spawn_app, Backend, TestApp};
use crate::support::process::{config_file, Tollgate};

/// The client as nginx saw it, appended to `X-Forwarded-For`.
const CLIENT: &str = "203.0.113.9";
/// The address an attacker would like to be charged instead.
const VICTIM: &str = "6.6.6.6";

fn phone(i: usize) -> String {
    format!("+86139001{i:05}")
}

/// Behind a trusted proxy on loopback, no API keys (the browser calls
/// through the proxy), an IP tier of 3 sends per hour.
async fn behind_a_proxy(configure: impl FnOnce(&mut Settings)) -> TestApp {
    spawn_app(Backend::Memory, |s| {
        s.server.api_keys = vec![];
        s.server.trusted_proxies = vec!["127.0.0.1/32".parse().unwrap()];
        s.sms.ip_limits = limits(&[(3, 3_600_000)]);
        configure(s);
    })
    .await
}

fn send(app: &TestApp, i: usize, headers: &[(&str, &str)]) -> RequestBuilder {
    let mut request = app
        .client
        .post(format!("{}/sms/send", app.address))
        .json(&json!({ "phone": phone(i) }));
    for (name, value) in headers {
        request = request.header(*name, *value);
    }
    request
}

/// How many sends the subject `ip` has in its window (the admin API).
async fn sends_of(app: &TestApp, ip: &str) -> u64 {
    let state = app.admin_get(&format!("/admin/api/subjects/ip/{ip}")).await;
    assert_eq!(state.status, 200, "{}", state.body);
    state.body["windows"]
        .as_array()
        .and_then(|w| w.iter().find(|w| w["action"] == "sms_send"))
        .and_then(|w| w["count"].as_u64())
        .unwrap_or_else(|| panic!("no sms_send window: {}", state.body))
}

/// Four sends with what the client wrote, as nginx's
/// `$proxy_add_x_forwarded_for` passes it on: three pass the IP tier, the
/// fourth is refused, all of them charged to the address nginx saw.
async fn the_tier_holds_and_charges(app: &TestApp, client_wrote: &[(&str, &str)]) {
    for i in 0..4 {
        let mut headers = client_wrote.to_vec();
        let appended = match client_wrote.iter().find(|(n, _)| *n == "x-forwarded-for") {
            Some((_, theirs)) => format!("{theirs}, {CLIENT}"),
            None => CLIENT.to_string(),
        };
        headers.retain(|(n, _)| *n != "x-forwarded-for");
        headers.push(("x-forwarded-for", &appended));
        let answer = app.send_raw(send(app, i, &headers)).await;
        let expected = if i < 3 { 200 } else { 429 };
        assert_eq!(
            answer.status.as_u16(),
            expected,
            "send {i} with {client_wrote:?}: {}",
            answer.body
        );
    }
    let refusal = app.audit_events().last().cloned().expect("an audit row");
    assert_eq!(
        (refusal.subject.as_str(), refusal.rule.as_deref()),
        (CLIENT, Some("ip 3/1h")),
        "{client_wrote:?}"
    );
    assert_eq!(sends_of(app, CLIENT).await, 3, "{client_wrote:?}");
    assert_eq!(sends_of(app, VICTIM).await, 0, "{client_wrote:?}");
    assert_eq!(sends_of(app, "127.0.0.1").await, 0, "{client_wrote:?}");
}

/// The tester's attack: behind nginx appending `X-Forwarded-For`, a client
/// sent `Forwarded: for=unknown` (uncounted: 14 sends passed a tier of 3)
/// or `Forwarded: for=6.6.6.6` (charged to someone else). Neither header is
/// the proxy's, so neither is read; nor is a left-most entry the client
/// wrote into `X-Forwarded-For`, nor an `X-Real-IP` it made up.
#[tokio::test]
async fn what_a_client_writes_neither_escapes_the_ip_tier_nor_charges_someone_else() {
    let forwarded_victim = format!("for={VICTIM}");
    let attacks: [&[(&str, &str)]; 8] = [
        &[("forwarded", "for=unknown")],
        &[("forwarded", &forwarded_victim)],
        &[("forwarded", "for=garbage;proto=https")],
        &[("x-forwarded-for", VICTIM)],
        &[("x-forwarded-for", "unknown")],
        &[("x-forwarded-for", "garbage, ,")],
        // Bytes past ASCII: the line is no `to_str`, the proxy's entry in it
        // still counts.
        &[("x-forwarded-for", "\u{e9}")],
        &[("x-real-ip", VICTIM), ("cf-connecting-ip", VICTIM)],
    ];
    for attack in attacks {
        let app = behind_a_proxy(|_| {}).await;
        the_tier_holds_and_charges(&app, attack).await;
    }
}

/// A proxy that forwards nothing usable (misconfigured, or an attacker
/// inside a trusted range): the request counts under the proxy's address,
/// inside the IP windows, not outside them.
#[tokio::test]
async fn an_unusable_forwarded_address_counts_under_the_proxy() {
    let app = behind_a_proxy(|_| {}).await;
    for (i, xff) in ["unknown", "garbage", "", "_hidden"]
        .into_iter()
        .enumerate()
    {
        let answer = app
            .send_raw(send(&app, i, &[("x-forwarded-for", xff)]))
            .await;
        let expected = if i < 3 { 200 } else { 429 };
        assert_eq!(answer.status.as_u16(), expected, "{xff:?}: {}", answer.body);
    }
    assert_eq!(app.audit_events().last().unwrap().subject, "127.0.0.1");
    assert_eq!(sends_of(&app, "127.0.0.1").await, 3);
    assert_eq!(sends_of(&app, CLIENT).await, 0);
}

/// `client_ip_header = "forwarded"`: a proxy that appends RFC 7239
/// `Forwarded`; now `X-Forwarded-For` is the client's to write, and ignored.
#[tokio::test]
async fn with_forwarded_configured_only_forwarded_names_the_client() {
    let app = behind_a_proxy(|s| {
        s.server.client_ip_header = ClientIpHeader::Forwarded;
    })
    .await;
    let appended = format!("for={VICTIM}, for=\"{CLIENT}:4711\";proto=https");
    for i in 0..4 {
        let answer = app
            .send_raw(send(
                &app,
                i,
                &[("forwarded", &appended), ("x-forwarded-for", VICTIM)],
            ))
            .await;
        assert_eq!(answer.status.as_u16(), if i < 3 { 200 } else { 429 });
    }
    assert_eq!(sends_of(&app, CLIENT).await, 3);
    assert_eq!(sends_of(&app, VICTIM).await, 0);
    // `for=unknown` from the proxy counts under the proxy.
    let unknown = app
        .send_raw(send(&app, 9, &[("forwarded", "for=unknown")]))
        .await;
    assert_eq!(unknown.status, 200, "{}", unknown.body);
    assert_eq!(sends_of(&app, "127.0.0.1").await, 1);
}

/// `client_ip_header = "x-real-ip"` (nginx's `proxy_set_header X-Real-IP
/// $remote_addr`, which replaces what the client sent): one address in one
/// header names the client; a list, two headers or garbage name nothing and
/// count under the proxy; `X-Forwarded-For` is ignored.
#[tokio::test]
async fn a_single_address_header_names_the_client_only_as_one_address() {
    let app = behind_a_proxy(|s| {
        s.server.client_ip_header = ClientIpHeader::Single("x-real-ip".into());
        s.sms.ip_limits = limits(&[(100, 3_600_000)]);
    })
    .await;
    let sent = app
        .send_raw(send(
            &app,
            0,
            &[("x-real-ip", CLIENT), ("x-forwarded-for", VICTIM)],
        ))
        .await;
    assert_eq!(sent.status, 200, "{}", sent.body);
    let list = format!("{CLIENT}, {VICTIM}");
    for (i, headers) in [
        vec![("x-real-ip", list.as_str())],
        vec![("x-real-ip", CLIENT), ("x-real-ip", VICTIM)],
        vec![("x-real-ip", "unknown")],
    ]
    .into_iter()
    .enumerate()
    {
        let answer = app.send_raw(send(&app, i + 1, &headers)).await;
        assert_eq!(answer.status, 200, "{headers:?}: {}", answer.body);
    }
    assert_eq!(sends_of(&app, CLIENT).await, 1);
    assert_eq!(sends_of(&app, VICTIM).await, 0);
    assert_eq!(sends_of(&app, "127.0.0.1").await, 3);
}

/// `trusted_proxy_hops = 2` (Envoy's `xff_num_trusted_hops`): two load
/// balancers whose addresses are not listed; the peer and the right-most
/// entry are trusted by position, the next entry is the client.
#[tokio::test]
async fn hops_trusted_by_position_name_the_client_behind_unlisted_balancers() {
    let app = spawn_app(Backend::Memory, |s| {
        s.server.api_keys = vec![];
        s.server.trusted_proxy_hops = 2;
        s.sms.ip_limits = limits(&[(3, 3_600_000)]);
    })
    .await;
    let chain = format!("{VICTIM}, {CLIENT}, 172.16.0.1");
    for i in 0..4 {
        let answer = app
            .send_raw(send(&app, i, &[("x-forwarded-for", &chain)]))
            .await;
        assert_eq!(answer.status.as_u16(), if i < 3 { 200 } else { 429 });
    }
    assert_eq!(sends_of(&app, CLIENT).await, 3);
    assert_eq!(sends_of(&app, VICTIM).await, 0);
    assert_eq!(sends_of(&app, "172.16.0.1").await, 0);
}

/// Without API keys a loopback request is the backend, unless it came
/// through a proxy: any client-address header (nginx's default
/// `proxy_set_header X-Real-IP`, a CDN's) says it did.
#[tokio::test]
async fn a_loopback_request_with_any_client_address_header_is_a_browsers() {
    let app = spawn_app(Backend::Memory, |s| s.server.api_keys = vec![]).await;
    let wipe = json!({ "user": "alice", "success": true, "captcha_passed": true });
    for header in [
        "x-real-ip",
        "true-client-ip",
        "cf-connecting-ip",
        "x-client-ip",
        "fastly-client-ip",
    ] {
        let request = app
            .client
            .post(format!("{}/login/attempt", app.address))
            .header(header, CLIENT)
            .json(&wipe);
        let refused = app.send_raw(request).await;
        assert_eq!(
            (refused.status.as_u16(), refused.error()),
            (403, "forbidden"),
            "{header}: {}",
            refused.body
        );
    }
    // The configured header too, whatever its name.
    let app = spawn_app(Backend::Memory, |s| {
        s.server.api_keys = vec![];
        s.server.client_ip_header = ClientIpHeader::Single("x-my-client".into());
    })
    .await;
    let request = app
        .client
        .post(format!("{}/login/attempt", app.address))
        .header("x-my-client", CLIENT)
        .json(&wipe);
    assert_eq!(app.send_raw(request).await.status, 403);
    // Plain loopback is still the backend.
    let direct = app
        .client
        .post(format!("{}/login/attempt", app.address))
        .json(&wipe);
    assert_eq!(app.send_raw(direct).await.status, 200);
}

/// On the real binary (its own metrics): every request whose proxy sent
/// nothing usable is counted by reason, and a warning names the header to
/// check, once a minute however many come.
#[tokio::test]
async fn unusable_forwarding_is_counted_and_warned_about_once_a_minute() {
    let dir = tempfile::tempdir().unwrap();
    let config = config_file(
        dir.path(),
        "trusted_proxies = [\"127.0.0.1\"]",
        "[sms]\ncaptcha_after = 100\n",
    );
    let server = Tollgate::start(&config).await;
    let client = reqwest::Client::new();
    for (i, xff) in [Some("unknown"), Some("garbage"), Some("_x"), None]
        .into_iter()
        .enumerate()
    {
        let mut request = client
            .post(format!("{}/sms/send", server.address))
            .json(&json!({ "phone": phone(i) }));
        if let Some(xff) = xff {
            request = request.header("x-forwarded-for", xff);
        }
        assert_eq!(request.send().await.unwrap().status(), 200);
    }
    server
        .assert_metrics(
            &client,
            &[
                "tollgate_client_ip_fallbacks_total{reason=\"unusable\"} 3",
                "tollgate_client_ip_fallbacks_total{reason=\"not_forwarded\"} 1",
            ],
        )
        .await;
    let lines = server.logged("forwarded no usable client address").await;
    assert_eq!(lines.len(), 1, "{lines:?}");
    let line: serde_json::Value = serde_json::from_str(&lines[0]).unwrap();
    assert_eq!(
        (&line["level"], &line["header"], &line["counted_as"]),
        (
            &json!("WARN"),
            &json!("x-forwarded-for"),
            &json!("127.0.0.1")
        )
    );
}

/// `client_ip_header` takes a header name, `trusted_proxy_hops` at most one
/// with a single-address header.
#[test]
fn the_header_and_the_hops_are_checked_at_start_up() {
    let load = crate::support::app::load_config;
    let defaults = load("").unwrap();
    assert_eq!(
        defaults.server.client_ip_header,
        ClientIpHeader::XForwardedFor
    );
    assert_eq!(defaults.server.trusted_proxy_hops, 0);
    let real_ip = load("[server]\nclient_ip_header = \"X-Real-IP\"\n").unwrap();
    assert_eq!(
        real_ip.server.client_ip_header,
        ClientIpHeader::Single("x-real-ip".into())
    );
    assert!(real_ip
        .to_redacted_toml()
        .contains("client_ip_header = \"x-real-ip\""));
    let error = crate::support::app::config_error;
    for name in ["x real ip", "Host", "authorization"] {
        let bad = error(&format!("[server]\nclient_ip_header = \"{name}\"\n"));
        assert!(
            bad.contains("server.client_ip_header")
                && bad.contains("is not a valid HTTP header name that a proxy sets"),
            "{bad}"
        );
    }
    let hops = error("[server]\nclient_ip_header = \"cf-connecting-ip\"\ntrusted_proxy_hops = 2\n");
    assert!(hops.contains("`server.trusted_proxy_hops`"), "{hops}");
    assert_eq!(error("[server]\ntrusted_proxy_hops = 2\n"), "");
    // A range a list entry refuses is no proxy either: each would let any
    // client behind it name its own address.
    for (range, says) in [
        ("0.0.0.0/0", "every IPv4 address"),
        ("::/0", "every IPv6 address"),
        ("203.0.113.7/2", "write 192.0.0.0/2"),
        ("64:ff9b::/96", "64:ff9b::/96"),
        ("::ffff:0:0/96", "every IPv4 address"),
    ] {
        let bad = error(&format!(
            "[server]\ntrusted_proxies = [\"10.0.0.0/8\", \"{range}\"]\n"
        ));
        assert!(
            bad.contains("server.trusted_proxies[1]") && bad.contains(says),
            "{range}: {bad}"
        );
    }
    // Read as addresses count: a mapped range is the IPv4 one it carries.
    let mapped = load("[server]\ntrusted_proxies = [\"::ffff:10.0.0.0/104\"]\n").unwrap();
    assert_eq!(
        mapped.server.trusted_proxies,
        vec!["10.0.0.0/8".parse::<ipnet::IpNet>().unwrap()]
    );
}

/// Without API keys a body `ip` is ignored altogether (DESIGN.md §3: the
/// peer counts), even one that is no address: a browser's placeholder must
/// not fail its send. With a key it is the address that counts, and must be
/// one.
#[tokio::test]
async fn a_body_ip_without_keys_is_ignored_even_when_malformed() {
    let app = spawn_app(Backend::Memory, |s| s.server.api_keys = vec![]).await;
    for (path, body) in [
        (
            "/login/attempt",
            json!({ "user": "t1", "success": false, "ip": "not an ip" }),
        ),
        ("/login/check", json!({ "user": "t1", "ip": "1.2.3.4:80" })),
        ("/sms/send", json!({ "phone": "+8613800138000", "ip": "" })),
    ] {
        let request = app
            .client
            .post(format!("{}{path}", app.address))
            .json(&body);
        let answer = app.send_raw(request).await;
        assert_eq!(answer.status.as_u16(), 200, "{path}: {}", answer.body);
    }
    let keyed = spawn_app(Backend::Memory, |_| {}).await;
    let refused = keyed
        .login_attempt(json!({ "user": "t1", "success": false, "ip": "not an ip" }))
        .await;
    assert_eq!(
        (refused.status.as_u16(), refused.error()),
        (400, "invalid_request")
    );
}

/// With API keys and `server.keyless_sms`, a browser may still call
/// `/sms/*` without any key: its own address counts (the body's `ip` is
/// not its to give), it may not vouch for a captcha, and a wrong key is
/// still refused, as is `/login/*` without one.
#[tokio::test]
async fn with_keyless_sms_browsers_send_without_a_key_and_count_as_themselves() {
    let app = spawn_app(Backend::Memory, |s| {
        s.server.keyless_sms = true;
        s.sms.ip_limits = limits(&[(3, 3_600_000)]);
    })
    .await;
    let keyless = |body: serde_json::Value, path: &str| {
        app.client
            .post(format!("{}{path}", app.address))
            .json(&body)
    };
    for i in 0..4 {
        let answer = app
            .send_raw(keyless(
                json!({ "phone": phone(i), "ip": VICTIM }),
                "/sms/send",
            ))
            .await;
        assert_eq!(
            answer.status.as_u16(),
            if i < 3 { 200 } else { 429 },
            "{}",
            answer.body
        );
    }
    assert_eq!(sends_of(&app, "127.0.0.1").await, 3);
    assert_eq!(
        sends_of(&app, VICTIM).await,
        0,
        "the body's ip is not a browser's"
    );

    let vouched = json!({ "phone": phone(9), "captcha_passed": true });
    let refused = app.send_raw(keyless(vouched, "/sms/send")).await;
    assert_eq!(
        (refused.status.as_u16(), refused.error()),
        (403, "forbidden")
    );
    let verify = json!({ "phone": phone(0), "code": "000000" });
    let tried = app.send_raw(keyless(verify.clone(), "/sms/verify")).await;
    assert_ne!(tried.status.as_u16(), 401, "{}", tried.body);

    let wrong_key = keyless(verify, "/sms/verify").bearer_auth("not-a-key-0123456789");
    assert_eq!(app.send_raw(wrong_key).await.status.as_u16(), 401);
    let login = keyless(json!({ "user": "alice" }), "/login/check");
    assert_eq!(app.send_raw(login).await.status.as_u16(), 401);
}

/// Without `server.keyless_sms`, keys mean every `/sms/*` call needs one
/// (DESIGN.md §3).
#[tokio::test]
async fn without_keyless_sms_a_keyless_send_is_refused_where_keys_are_set() {
    let app = spawn_app(Backend::Memory, |_| {}).await;
    let answer = app
        .send_raw(
            app.client
                .post(format!("{}/sms/send", app.address))
                .json(&json!({ "phone": phone(0) })),
        )
        .await;
    assert_eq!(
        (answer.status.as_u16(), answer.error()),
        (401, "unauthorized")
    );
}
