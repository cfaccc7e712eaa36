//! Admin authentication as a guesser meets it: failed tries throttled per
//! address in the store's windows (`server.admin_auth_limit`), counted,
//! logged and audited once; every admin route asks for the token before it
//! says anything else; and no admin answer may be cached.

use std::time::Duration;

use reqwest::header::{AUTHORIZATION, CACHE_CONTROL};
use reqwest::RequestBuilder;
use serde_json::json;
use tollgate::audit::AuditDecision;
use tollgate::domain::{Action, SubjectKind};
use tollgate::settings::Settings;
use tollgate::store::ManualClock;

use crate::on_both_backends;
use crate::support::app::{
    spawn_app_with_audit_db, spawn_app_with_clock, Backend, TestApp, ADMIN_TOKEN, API_KEY,
};
use crate::support::audit_db::{DbKind, TestDb};
use crate::support::process::{config_file, Tollgate};

on_both_backends!(
    twenty_wrong_tokens_throttle_that_address_and_no_other,
    the_64s_of_one_network_share_a_window_of_failures,
);

const GUESSER: &str = "198.51.100.66";
const ADMIN: &str = "198.51.100.77";

/// Behind a trusted proxy on loopback, so that each test client names its
/// address in `X-Forwarded-For`.
fn behind_a_proxy(s: &mut Settings) {
    s.server.trusted_proxies = vec!["127.0.0.1/32".parse().unwrap()];
}

fn from(app: &TestApp, method: &str, path: &str, client: &str) -> RequestBuilder {
    let url = format!("{}{path}", app.address);
    let request = match method {
        "GET" => app.client.get(url),
        "POST" => app.client.post(url),
        "DELETE" => app.client.delete(url),
        other => panic!("no {other}"),
    };
    request.header("x-forwarded-for", client)
}

fn basic(user: &str, password: &str) -> String {
    use base64::Engine as _;
    let pair = base64::engine::general_purpose::STANDARD.encode(format!("{user}:{password}"));
    format!("Basic {pair}")
}

async fn twenty_wrong_tokens_throttle_that_address_and_no_other(backend: Backend) {
    let clock = ManualClock::new(1_700_000_000_000);
    let clock_for_memory = (backend == Backend::Memory).then(|| clock.clone());
    let app = spawn_app_with_clock(backend, clock_for_memory, behind_a_proxy).await;
    let events = "/admin/api/subjects/user/alice";
    for i in 0..20 {
        let wrong = from(&app, "GET", events, GUESSER).bearer_auth(format!("guess-{i:016}"));
        let answer = app.send_raw(wrong).await;
        assert_eq!(
            (answer.status.as_u16(), answer.error()),
            (401, "unauthorized"),
            "try {i}"
        );
    }
    // The 21st, wrong or right, from that address: 429 before the token is read.
    for token in ["guess-21", ADMIN_TOKEN] {
        let throttled = app
            .send_raw(from(&app, "GET", events, GUESSER).bearer_auth(token))
            .await;
        assert_eq!(
            (throttled.status.as_u16(), throttled.error()),
            (429, "rate_limited"),
            "{}",
            throttled.body
        );
        assert_eq!(throttled.body["rule"], "ip 20/10m");
        let secs = throttled.body["retry_after_secs"].as_u64().unwrap();
        assert_eq!(throttled.retry_after, Some(secs.to_string()));
        match backend {
            // The manual clock stood still: the whole window.
            Backend::Memory => assert_eq!(secs, 600),
            // Redis's clock moved a little since the first failure.
            Backend::Redis => assert!(secs > 0 && secs <= 600, "{secs}"),
        }
    }
    // The console's pages too, as HTML.
    let page = app
        .send_raw(
            from(&app, "GET", "/admin", GUESSER).header(AUTHORIZATION, basic("admin", ADMIN_TOKEN)),
        )
        .await;
    assert_eq!(page.status, 429, "{}", page.body);
    assert!(page
        .content_type
        .unwrap_or_default()
        .starts_with("text/html"));
    assert!(page.retry_after.is_some());

    // Another address is not affected, with the right token or a wrong one.
    let other = app
        .send_raw(from(&app, "GET", events, ADMIN).bearer_auth(ADMIN_TOKEN))
        .await;
    assert_eq!(other.status, 200, "{}", other.body);
    let wrong = app
        .send_raw(from(&app, "GET", events, ADMIN).bearer_auth("wrong-but-not-throttled"))
        .await;
    assert_eq!(wrong.status, 401);

    // One audit row for the crossing, however many refusals followed.
    let locks: Vec<_> = app
        .audit_events()
        .into_iter()
        .filter(|e| e.action == Action::Admin && e.decision == AuditDecision::Lock)
        .collect();
    assert_eq!(locks.len(), 1, "{locks:?}");
    let row = &locks[0];
    assert_eq!(
        (
            row.reason.as_str(),
            row.subject_kind,
            row.subject.as_str(),
            row.ip.as_deref(),
            row.rule.as_deref(),
            row.observed,
            row.limit,
            row.window_ms,
        ),
        (
            "admin_auth_failures",
            SubjectKind::Ip,
            GUESSER,
            Some(GUESSER),
            Some("ip 20/10m"),
            Some(20),
            Some(20),
            Some(600_000),
        )
    );

    // An admin elsewhere lifts it by unblocking the IP subject.
    let unblock = app
        .send_raw(
            from(
                &app,
                "POST",
                &format!("/admin/api/subjects/ip/{GUESSER}/unblock"),
                ADMIN,
            )
            .bearer_auth(ADMIN_TOKEN),
        )
        .await;
    assert_eq!(unblock.status, 200, "{}", unblock.body);
    let lifted = app
        .send_raw(from(&app, "GET", events, GUESSER).bearer_auth(ADMIN_TOKEN))
        .await;
    assert_eq!(lifted.status, 200, "{}", lifted.body);

    if backend == Backend::Memory {
        // Throttled again, then the window passes.
        for i in 0..20 {
            let wrong = from(&app, "GET", events, GUESSER).bearer_auth(format!("again-{i}"));
            assert_eq!(app.send_raw(wrong).await.status, 401);
        }
        let right = || from(&app, "GET", events, GUESSER).bearer_auth(ADMIN_TOKEN);
        assert_eq!(app.send_raw(right()).await.status, 429);
        clock.advance_ms(600_000 - 1);
        assert_eq!(app.send_raw(right()).await.status, 429);
        clock.advance_ms(1);
        assert_eq!(app.send_raw(right()).await.status, 200);
    }
}

/// One /48 holds 65,536 /64s, each with `admin_auth_limit` failures of
/// its own: `admin_auth_network_limit` bounds them together (each failure
/// a row, a log line, perhaps a provider's token call). Another network is
/// not touched; unblocking the network lifts it.
async fn the_64s_of_one_network_share_a_window_of_failures(backend: Backend) {
    let app = spawn_app_with_clock(backend, None, |s| {
        behind_a_proxy(s);
        s.server.admin_auth_network_limit =
            tollgate::settings::LimitSetting::new(3, Duration::from_secs(600));
    })
    .await;
    let events = "/admin/api/subjects/user/alice";
    for i in 1..=3 {
        let guesser = format!("2001:db8:7:{i}::1");
        let wrong = from(&app, "GET", events, &guesser).bearer_auth(format!("guess-{i:016}"));
        assert_eq!(app.send_raw(wrong).await.status, 401, "{guesser}");
    }
    let neighbour = || from(&app, "GET", events, "2001:db8:7:99::1").bearer_auth(ADMIN_TOKEN);
    let throttled = app.send_raw(neighbour()).await;
    assert_eq!(throttled.status, 429, "{}", throttled.body);
    assert_eq!(throttled.body["rule"], "network 3/10m");
    let elsewhere = from(&app, "GET", events, "2001:db8:8::1").bearer_auth(ADMIN_TOKEN);
    assert_eq!(app.send_raw(elsewhere).await.status, 200);

    let locks: Vec<_> = app
        .audit_events()
        .into_iter()
        .filter(|e| e.action == Action::Admin && e.decision == AuditDecision::Lock)
        .map(|e| (e.subject_kind, e.subject, e.rule))
        .collect();
    assert_eq!(
        locks,
        vec![(
            SubjectKind::Network,
            "2001:db8:7::/48".to_string(),
            Some("network 3/10m".to_string())
        )]
    );

    let unblock = from(
        &app,
        "POST",
        "/admin/api/subjects/network/2001:db8:7::%2F48/unblock",
        ADMIN,
    )
    .bearer_auth(ADMIN_TOKEN);
    assert_eq!(app.send_raw(unblock).await.status, 200);
    assert_eq!(app.send_raw(neighbour()).await.status, 200);
}

/// Not a guess: a request without credentials (a browser's first visit, a
/// probe) is answered 401 and not counted. Basic passwords on the console
/// and API keys on the API are guesses.
#[tokio::test]
async fn only_presented_credentials_count_and_console_passwords_do() {
    let app = spawn_app_with_clock(Backend::Memory, None, behind_a_proxy).await;
    for _ in 0..30 {
        let bare = app.send_raw(from(&app, "GET", "/admin", "192.0.2.1")).await;
        assert_eq!(bare.status, 401);
    }
    for i in 0..20 {
        let wrong = from(&app, "GET", "/admin", "192.0.2.2")
            .header(AUTHORIZATION, basic("admin", &format!("password-{i}")));
        let page = app.send_raw(wrong).await;
        assert_eq!(page.status, 401, "try {i}");
    }
    let right = from(&app, "GET", "/admin/api/lists", "192.0.2.2").bearer_auth(ADMIN_TOKEN);
    assert_eq!(app.send_raw(right).await.status, 429);
    for _ in 0..20 {
        let key = from(&app, "GET", "/admin/api/lists", "192.0.2.3").bearer_auth(API_KEY);
        assert_eq!(app.send_raw(key).await.status, 401);
    }
    let after_keys = from(&app, "GET", "/admin/api/lists", "192.0.2.3").bearer_auth(ADMIN_TOKEN);
    assert_eq!(app.send_raw(after_keys).await.status, 429);
    let untouched = from(&app, "GET", "/admin/api/lists", "192.0.2.1").bearer_auth(ADMIN_TOKEN);
    assert_eq!(app.send_raw(untouched).await.status, 200);
}

/// Nothing checks a credential the route does not read: the console's
/// Basic credentials sent to the JSON API (Bearer only), another scheme, an
/// empty Bearer. Each is answered 401 and is not counted, so an admin's
/// script that sends them does not throttle its own address.
#[tokio::test]
async fn a_credential_the_route_does_not_read_is_refused_and_not_counted() {
    let app = spawn_app_with_clock(Backend::Memory, None, behind_a_proxy).await;
    let client = "192.0.2.4";
    let unread = [
        basic("admin", ADMIN_TOKEN),
        format!("Digest username=\"admin\", response=\"{ADMIN_TOKEN}\""),
        "Bearer".to_string(),
        "Bearer   ".to_string(),
    ];
    for round in 0..6 {
        for value in &unread {
            let request =
                from(&app, "GET", "/admin/api/lists", client).header(AUTHORIZATION, value);
            let answer = app.send_raw(request).await;
            assert_eq!(
                (answer.status.as_u16(), answer.error()),
                (401, "unauthorized"),
                "round {round}: {value}"
            );
        }
    }
    let right = from(&app, "GET", "/admin/api/lists", client).bearer_auth(ADMIN_TOKEN);
    assert_eq!(
        app.send_raw(right).await.status,
        200,
        "24 unread credentials"
    );
    // The console reads Basic: there a wrong password still counts.
    for i in 0..20 {
        let wrong = from(&app, "GET", "/admin", client)
            .header(AUTHORIZATION, basic("admin", &format!("password-{i}")));
        assert_eq!(app.send_raw(wrong).await.status, 401, "try {i}");
    }
    let throttled = from(&app, "GET", "/admin/api/lists", client).bearer_auth(ADMIN_TOKEN);
    assert_eq!(app.send_raw(throttled).await.status, 429);
}

/// Every admin route, JSON, CSV and HTML: a stranger gets 401 whatever the
/// query, path, method or body (not 400, 404, 405 or 415); an admin gets
/// the answer those deserve. Every one of these answers, to either, carries
/// `Cache-Control: no-store`.
#[tokio::test]
async fn every_admin_route_asks_for_the_token_first_and_is_never_cached() {
    let db = TestDb::new(DbKind::Sqlite).await;
    let (url, spool) = (db.url.clone(), db.spool_dir());
    let app = spawn_app_with_audit_db(Backend::Memory, move |s| {
        s.audit.database_url = tollgate::settings::SecretUrl::new(url);
        s.audit.spool_dir = spool.display().to_string();
    })
    .await;
    let routes: [(&str, &str, u16); 19] = [
        ("GET", "/admin/api/events", 200),
        ("GET", "/admin/api/events.csv", 200),
        ("GET", "/admin/api/lists", 200),
        ("GET", "/admin/api/subjects/user/alice", 200),
        ("GET", "/admin/api/events?limit=9999", 400),
        ("GET", "/admin/api/events.csv?bogus=1", 400),
        ("GET", "/admin/api/subjects/planet/mars", 400),
        ("DELETE", "/admin/api/lists/not-a-uuid", 400),
        ("POST", "/admin/api/lists/ip", 415),
        ("PUT", "/admin/api/events", 405),
        ("GET", "/admin/api/nowhere", 404),
        ("GET", "/admin", 200),
        ("GET", "/admin/overview?period=forever", 400),
        ("GET", "/admin/lists", 200),
        ("GET", "/admin/nowhere", 404),
        ("POST", "/admin/lists/x", 404),
        ("GET", "/admin/subjects/user", 404),
        ("DELETE", "/admin/", 405),
        // Past the API's scope, in the console's.
        ("GET", "/admin/apifoo", 404),
    ];
    for (method, path, admitted) in routes {
        let url = format!("{}{path}", app.address);
        let request = || {
            app.client
                .request(method.parse().unwrap(), &url)
                .header("content-type", "text/plain")
                .body("not json")
        };
        let stranger = app.send_raw(request()).await;
        let admin = app.send_raw(request().bearer_auth(ADMIN_TOKEN)).await;
        assert_eq!(
            (stranger.status.as_u16(), admin.status.as_u16()),
            (401, admitted),
            "{method} {path}: {} / {}",
            stranger.body,
            admin.body
        );
        for (who, answer) in [("stranger", &stranger), ("admin", &admin)] {
            assert_eq!(
                answer
                    .headers
                    .get(CACHE_CONTROL)
                    .and_then(|v| v.to_str().ok()),
                Some("no-store"),
                "{method} {path} to the {who}"
            );
        }
    }
    // The CSV is the CSV, not an error page.
    let csv = app.admin_get("/admin/api/events.csv").await;
    assert!(
        csv.content_type.unwrap_or_default().starts_with("text/csv"),
        "{}",
        csv.body
    );
}

/// On the real binary (its own metrics and log): 21 wrong tokens are 20
/// failures counted and one refusal throttled, the log has one line for the
/// flood and one for the throttle (not one per try), and the trail one row.
#[tokio::test]
async fn failed_admin_authentication_is_counted_logged_and_throttled_on_the_binary() {
    let dir = tempfile::tempdir().unwrap();
    let token = "process-admin-token-0123456789";
    let config = config_file(dir.path(), &format!("admin_tokens = [\"{token}\"]"), "");
    let server = Tollgate::start(&config).await;
    let client = reqwest::Client::new();
    let lists = format!("{}/admin/api/lists", server.address);
    for i in 0..21 {
        let status = client
            .get(&lists)
            .bearer_auth(format!("wrong-token-{i:08}"))
            .send()
            .await
            .unwrap()
            .status();
        assert_eq!(status.as_u16(), if i < 20 { 401 } else { 429 }, "try {i}");
    }
    server
        .assert_metrics(
            &client,
            &[
                "tollgate_admin_auth_failures_total 20",
                "tollgate_admin_auth_throttled_total 1",
            ],
        )
        .await;
    assert_eq!(server.logged("throttled for this address").await.len(), 1);
    let failed = server.lines("admin authentication failed");
    assert_eq!(failed.len(), 1, "{failed:?}");
    let line: serde_json::Value = serde_json::from_str(&failed[0]).unwrap();
    assert_eq!(
        (&line["level"], &line["ip"]),
        (&json!("WARN"), &json!("127.0.0.1"))
    );
    assert!(!server.log.lock().join("\n").contains("wrong-token-"));
    // The row reaches the audit database.
    let db = tollgate::audit::AuditDb::connect_lazy(&format!(
        "sqlite://{}/audit.db?mode=rwc",
        dir.path().display()
    ))
    .unwrap();
    let filter = tollgate::audit::query::EventFilter {
        action: Some(Action::Admin),
        ..Default::default()
    };
    let mut rows = Vec::new();
    // Up to 10 s: the writer flushes within 200 ms, later on a loaded machine.
    for _ in 0..500 {
        rows = db.page(&filter, None, 10).await.unwrap();
        if !rows.is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(rows.len(), 1, "{rows:?}");
    assert_eq!(
        (
            rows[0].decision,
            rows[0].reason.as_str(),
            rows[0].subject.as_str()
        ),
        (AuditDecision::Lock, "admin_auth_failures", "127.0.0.1")
    );
}

/// A store that cannot count failures does not lock admins out: the
/// request goes on to the token check.
#[tokio::test]
async fn with_the_store_down_admins_still_get_in_and_strangers_still_do_not() {
    let dead = format!("redis://127.0.0.1:{}", crate::support::app::free_port());
    let app = spawn_app_with_clock(Backend::Redis, None, move |s| {
        s.store.redis_url = tollgate::settings::SecretUrl::new(dead);
        s.store.timeout = Duration::from_millis(200);
    })
    .await;
    for _ in 0..25 {
        let wrong = app
            .client
            .get(format!("{}/admin/api/lists", app.address))
            .bearer_auth("wrong-wrong-wrong");
        assert_eq!(app.send_raw(wrong).await.status, 401);
    }
    let lists = app.admin_get("/admin/api/lists").await;
    assert_eq!(lists.status, 200, "{}", lists.body);
}

#[test]
fn the_admin_auth_limit_is_checked_at_start_up() {
    let load = crate::support::app::load_config;
    let defaults = load("").unwrap();
    assert_eq!(
        (
            defaults.server.admin_auth_limit.limit,
            defaults.server.admin_auth_limit.window
        ),
        (20, Duration::from_secs(600))
    );
    let error = crate::support::app::config_error;
    for (toml, key) in [
        (
            "admin_auth_limit = { limit = 0, window = \"1m\" }",
            "server.admin_auth_limit.limit",
        ),
        (
            "admin_auth_limit = { limit = 5, window = \"0s\" }",
            "server.admin_auth_limit.window",
        ),
        (
            "admin_auth_limit = { limit = 5, window = \"1m\", shadow = true }",
            "server.admin_auth_limit.shadow",
        ),
        (
            "admin_auth_limit = { limit = 5, window = \"1m\", algorithm = \"gcra\" }",
            "server.admin_auth_limit.algorithm",
        ),
    ] {
        let message = error(&format!("[server]\n{toml}\n"));
        assert!(message.contains(&format!("`{key}`")), "{toml}: {message}");
    }
}
