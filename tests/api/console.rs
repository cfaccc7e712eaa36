//! The admin HTML console: Basic and Bearer sign-in, the event table from a
//! real database (filters, pages, escaping), a subject's page and the
//! CSRF-protected Unblock form.

use chrono::Utc;
use reqwest::header::{HeaderMap, CONTENT_TYPE, LOCATION, WWW_AUTHENTICATE};
use reqwest::{RequestBuilder, StatusCode};
use serde_json::{json, Value};
use tollgate::audit::{AuditDecision, AuditEvent};
use tollgate::domain::{Action, Subject, SubjectKind};

use crate::on_both_databases;
use crate::support::app::{
    spawn_app, spawn_app_with_audit_db, Backend, TestApp, ADMIN_TOKEN, API_KEY,
};
use crate::support::audit_db::{DbKind, TestDb};

mod browser;
mod cross_site_browser;
mod overview;
mod sso_browser;

/// How the test signs in.
#[derive(Clone, Copy, Debug)]
enum Auth<'a> {
    None,
    Basic(&'a str, &'a str),
    Bearer(&'a str),
}

const ADMIN: Auth<'static> = Auth::Basic("admin", ADMIN_TOKEN);

struct Page {
    status: StatusCode,
    headers: HeaderMap,
    body: String,
}

impl Page {
    fn header(&self, name: impl reqwest::header::AsHeaderName) -> &str {
        self.headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("")
    }

    /// The value of the first `name="…" value="…"` attribute pair.
    fn input(&self, name: &str) -> String {
        let marker = format!("name=\"{name}\" value=\"");
        let start = self
            .body
            .find(&marker)
            .unwrap_or_else(|| panic!("no input {name} in {}", self.body))
            + marker.len();
        let len = self.body[start..].find('"').unwrap();
        self.body[start..start + len].to_string()
    }

    /// The `href` of the link whose text is `text`, HTML entities undone.
    fn link(&self, text: &str) -> Option<String> {
        let text_at = self.body.find(&format!(">{text}</a>"))?;
        let tag = &self.body[self.body[..text_at].rfind("<a ")?..text_at];
        let start = tag.find("href=\"")? + "href=\"".len();
        let len = tag[start..].find('"')?;
        Some(unescape(&tag[start..start + len]))
    }
}

/// Undoes askama's HTML escaping (`&#60;` and friends).
fn unescape(html: &str) -> String {
    html.replace("&#34;", "\"")
        .replace("&#39;", "'")
        .replace("&#60;", "<")
        .replace("&#62;", ">")
        .replace("&#38;", "&")
}

/// A client that does not follow redirects, so a test sees the 303.
fn client() -> reqwest::Client {
    reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap()
}

async fn send(request: RequestBuilder, auth: Auth<'_>) -> Page {
    let request = match auth {
        Auth::None => request,
        Auth::Basic(user, password) => request.basic_auth(user, Some(password)),
        Auth::Bearer(token) => request.bearer_auth(token),
    };
    let response = request.send().await.expect("the request is answered");
    Page {
        status: response.status(),
        headers: response.headers().clone(),
        body: response.text().await.expect("a readable body"),
    }
}

async fn get(app: &TestApp, path: &str, auth: Auth<'_>) -> Page {
    send(client().get(format!("{}{path}", app.address)), auth).await
}

async fn post_form(app: &TestApp, path: &str, form: &[(&str, &str)], auth: Auth<'_>) -> Page {
    let request = client().post(format!("{}{path}", app.address)).form(form);
    send(request, auth).await
}

async fn db_app(db: &TestDb, configure: impl FnOnce(&mut tollgate::settings::Settings)) -> TestApp {
    let (url, spool) = (db.url.clone(), db.spool_dir());
    spawn_app_with_audit_db(Backend::Memory, move |s| {
        s.audit.database_url = tollgate::settings::SecretUrl::new(url);
        s.audit.spool_dir = spool.display().to_string();
        configure(s);
    })
    .await
}

fn assert_html(page: &Page, status: u16, context: &str) {
    assert_eq!(page.status.as_u16(), status, "{context}: {}", page.body);
    assert!(
        page.header(CONTENT_TYPE).starts_with("text/html"),
        "{context}: {}",
        page.header(CONTENT_TYPE)
    );
}

const PAGES: [(&str, &str); 6] = [
    ("GET", "/admin"),
    ("GET", "/admin/overview"),
    ("GET", "/admin/subjects/user/alice"),
    ("POST", "/admin/subjects/user/alice/unblock"),
    // A dot segment's page and form, by the query.
    ("GET", "/admin/subjects?kind=user&id=.."),
    ("POST", "/admin/subjects/unblock?kind=user&id=.."),
];

async fn call(app: &TestApp, method: &str, path: &str, auth: Auth<'_>) -> Page {
    if method == "GET" {
        get(app, path, auth).await
    } else {
        post_form(app, path, &[], auth).await
    }
}

#[tokio::test]
async fn console_pages_ask_for_basic_credentials_and_refuse_wrong_ones() {
    let db = TestDb::new(DbKind::Sqlite).await;
    // 24 wrong credentials from one address: above the default throttle.
    let app = db_app(&db, |s| {
        s.server.admin_auth_limit =
            tollgate::settings::LimitSetting::new(1000, std::time::Duration::from_secs(3600));
    })
    .await;
    let mut almost = ADMIN_TOKEN.to_string();
    almost.pop();
    for (method, path) in PAGES {
        for auth in [
            Auth::None,
            Auth::Basic("admin", "wrong"),
            Auth::Basic("admin", &almost),
            Auth::Basic("root", ADMIN_TOKEN),
            Auth::Basic("admin", API_KEY),
            Auth::Bearer("wrong"),
            Auth::Bearer(API_KEY),
        ] {
            let page = call(&app, method, path, auth).await;
            assert_html(&page, 401, &format!("{method} {path} with {auth:?}"));
            assert_eq!(
                page.header(WWW_AUTHENTICATE),
                "Basic realm=\"tollgate admin\"",
                "{method} {path} with {auth:?}"
            );
        }
    }
    for auth in [ADMIN, Auth::Bearer(ADMIN_TOKEN)] {
        for path in [
            "/admin",
            "/admin/",
            "/admin/overview",
            "/admin/subjects/user/alice",
        ] {
            let page = get(&app, path, auth).await;
            assert_html(&page, 200, &format!("{path} with {auth:?}"));
            assert_eq!(page.header("cache-control"), "no-store");
            assert!(page
                .header("content-security-policy")
                .contains("frame-ancestors 'none'"));
        }
    }
}

/// A console request another site started (`Sec-Fetch-Site` neither
/// `same-origin` nor `none`) gets no Basic challenge, so that the browser
/// never sends the credentials of a URL that site chose; those it has
/// cached it sends unasked, and they work. A wrong credential so marked
/// is counted all the same: saying "cross-site" escapes no throttle.
#[tokio::test]
async fn a_request_another_site_started_is_not_challenged_but_still_counted() {
    let db = TestDb::new(DbKind::Sqlite).await;
    let app = db_app(&db, |s| {
        s.server.admin_auth_limit =
            tollgate::settings::LimitSetting::new(2, std::time::Duration::from_secs(3600));
    })
    .await;
    let from = |site: &'static str| {
        client()
            .get(format!("{}/admin/overview", app.address))
            .header("sec-fetch-site", site)
    };
    for site in ["cross-site", "same-site", "CROSS-SITE"] {
        let page = send(from(site), Auth::None).await;
        assert_html(&page, 401, site);
        assert_eq!(page.header(WWW_AUTHENTICATE), "", "{site}");
        assert!(
            page.body.contains("came from another site"),
            "{site}: {}",
            page.body
        );
        assert_eq!(
            send(from(site), ADMIN).await.status,
            200,
            "{site}, cached credentials"
        );
    }
    for site in ["same-origin", "none"] {
        let page = send(from(site), Auth::None).await;
        assert_html(&page, 401, site);
        assert_eq!(
            page.header(WWW_AUTHENTICATE),
            "Basic realm=\"tollgate admin\"",
            "{site}"
        );
    }
    for _ in 0..2 {
        let page = send(from("cross-site"), Auth::Basic("admin", "wrong")).await;
        assert_eq!(page.status, 401);
    }
    assert_eq!(send(from("cross-site"), ADMIN).await.status, 429, "counted");
}

#[tokio::test]
async fn with_no_admin_tokens_configured_the_console_always_answers_401() {
    let db = TestDb::new(DbKind::Sqlite).await;
    let app = db_app(&db, |s| s.server.admin_tokens = vec![]).await;
    for (method, path) in PAGES {
        for auth in [ADMIN, Auth::Bearer(ADMIN_TOKEN), Auth::Basic("admin", "")] {
            let page = call(&app, method, path, auth).await;
            assert_html(&page, 401, &format!("{method} {path} with {auth:?}"));
            assert!(page.header(WWW_AUTHENTICATE).starts_with("Basic"));
        }
    }
}

/// `n` events marked `evt_000`, `evt_001`, … in `request_id`, one millisecond
/// apart (newest last): every third for phone `+8613800138000`, the others for
/// `alice` (even) and `bob` (odd).
fn marked_events(n: usize) -> Vec<AuditEvent> {
    let start = tollgate::audit::now_ms() - chrono::Duration::hours(1);
    (0..n)
        .map(|i| {
            let (subject, action, decision) = if i % 3 == 0 {
                (
                    Subject::new(SubjectKind::Phone, "+8613800138000"),
                    Action::SmsSend,
                    AuditDecision::Deny,
                )
            } else {
                let user = if i % 2 == 0 { "alice" } else { "bob" };
                (
                    Subject::new(SubjectKind::User, user),
                    Action::LoginAttempt,
                    AuditDecision::Lock,
                )
            };
            let mut e = AuditEvent::new(action, decision, "rate_limited", &subject);
            e.occurred_at = start + chrono::Duration::milliseconds(i as i64);
            e.request_id = Some(format!("evt_{i:03}"));
            e.ip = Some(format!("203.0.113.{}", i % 4));
            e
        })
        .collect()
}

/// The `evt_…` markers a page shows, in order.
fn markers(page: &Page) -> Vec<usize> {
    page.body
        .match_indices("evt_")
        .map(|(at, _)| page.body[at + 4..at + 7].parse().unwrap())
        .collect()
}

on_both_databases!(
    the_event_table_lists_real_rows_newest_first_and_filters_narrow_it,
    the_next_page_link_walks_every_row_once_keeping_the_filters,
    bad_filters_answer_a_400_page_with_the_form_and_the_reason,
    user_supplied_text_is_escaped_on_every_page,
);

async fn the_event_table_lists_real_rows_newest_first_and_filters_narrow_it(kind: DbKind) {
    let db = TestDb::new(kind).await;
    db.connect()
        .await
        .insert(&marked_events(12), 7)
        .await
        .unwrap();
    let app = db_app(&db, |_| {}).await;

    let all = get(&app, "/admin", ADMIN).await;
    assert_html(&all, 200, "/admin");
    assert_eq!(markers(&all), (0..12).rev().collect::<Vec<_>>());
    assert!(all
        .body
        .contains("href=\"/admin/subjects/phone/%2B8613800138000\""));
    assert!(all.body.contains("href=\"/admin/subjects/user/alice\""));
    assert!(all.link("Next page »").is_none(), "one page holds 12 rows");

    type Pick = fn(usize) -> bool;
    let cases: [(&str, Pick); 5] = [
        ("subject_kind=phone", |i| i % 3 == 0),
        ("subject_kind=user&subject=alice", |i| {
            i % 3 != 0 && i % 2 == 0
        }),
        ("subject=%2B8613800138000&decision=deny", |i| i % 3 == 0),
        ("action=login_attempt&ip=203.0.113.1", |i| {
            i % 3 != 0 && i % 4 == 1
        }),
        // What an HTML form sends: every field, the unused ones empty.
        (
            "subject_kind=user&subject=bob&action=&decision=lock&ip=&since=&until=&limit=",
            |i| i % 3 != 0 && i % 2 == 1,
        ),
    ];
    for (query, pick) in cases {
        let page = get(&app, &format!("/admin?{query}"), ADMIN).await;
        assert_html(&page, 200, query);
        let expected: Vec<usize> = (0..12).rev().filter(|i| pick(*i)).collect();
        assert!(!expected.is_empty(), "{query} selects something");
        assert_eq!(markers(&page), expected, "{query}");
    }
    let subject_page = get(&app, "/admin?subject_kind=user&subject=alice", ADMIN).await;
    assert!(
        subject_page
            .body
            .contains("<option value=\"user\" selected>"),
        "the form shows the filters in use"
    );
    let nothing = get(&app, "/admin?subject=nobody", ADMIN).await;
    assert_html(&nothing, 200, "no match");
    assert!(nothing.body.contains("No events."));
}

async fn the_next_page_link_walks_every_row_once_keeping_the_filters(kind: DbKind) {
    let db = TestDb::new(kind).await;
    db.connect()
        .await
        .insert(&marked_events(30), 7)
        .await
        .unwrap();
    let app = db_app(&db, |_| {}).await;

    let mut path = "/admin?subject_kind=user&limit=4".to_string();
    let mut seen = Vec::new();
    let mut pages = 0;
    loop {
        let page = get(&app, &path, ADMIN).await;
        assert_html(&page, 200, &path);
        let rows = markers(&page);
        assert!(rows.len() <= 4, "{path}: {rows:?}");
        seen.extend(rows);
        pages += 1;
        if pages > 1 {
            let first = page
                .link("« Newest")
                .expect("a later page links to the first");
            assert_eq!(first, "/admin?subject_kind=user&limit=4");
        }
        match page.link("Next page »") {
            Some(next) => {
                assert!(
                    next.contains("subject_kind=user") && next.contains("limit=4"),
                    "{next}"
                );
                path = next;
            }
            None => break,
        }
    }
    let expected: Vec<usize> = (0..30).rev().filter(|i| i % 3 != 0).collect();
    assert_eq!(seen, expected, "every user row once, newest first");
    assert_eq!(pages, 5);
}

async fn bad_filters_answer_a_400_page_with_the_form_and_the_reason(kind: DbKind) {
    let db = TestDb::new(kind).await;
    let app = db_app(&db, |_| {}).await;
    for (query, reason) in [
        ("since=yesterday", "since must be an RFC 3339 time"),
        (
            "until=2026-13-01T00:00:00Z",
            "until must be an RFC 3339 time",
        ),
        ("limit=501", "limit must be between 1 and 500"),
        ("limit=ten", "limit must be between 1 and 500"),
        ("cursor=zz", "cursor is not one this API gave"),
        ("subject_kind=planet", "unknown subject_kind"),
        ("decision=maybe", "unknown decision"),
        ("action=fly", "unknown action"),
        (
            "colour=blue",
            "unknown field; expected one of `subject_kind`",
        ),
    ] {
        let page = get(&app, &format!("/admin?{query}"), ADMIN).await;
        assert_html(&page, 400, query);
        assert!(page.body.contains(reason), "{query}: {}", page.body);
        assert!(page.body.contains("<form class=\"filters\""), "{query}");
    }
    // A field's name is any text a link chose: not shown in the console's
    // own error box.
    let lure = "Your%20token%20leaked%3B%20rotate%20it%20at%20evil.example%60%2C%20expected%20x";
    for path in [
        format!("/admin?{lure}=1"),
        format!("/admin/overview?{lure}=1"),
    ] {
        let page = get(&app, &path, ADMIN).await;
        assert_html(&page, 400, &path);
        assert!(page.body.contains("unknown field"), "{path}: {}", page.body);
        for shown in ["evil.example", "leaked", "expected x"] {
            assert!(
                !page.body.contains(shown),
                "{path} shows {shown}: {}",
                page.body
            );
        }
    }
    // Nor a value's: a filter's or a subject's id (the form may keep what
    // was typed; the red box does not say it).
    for path in [
        format!("/admin?decision={lure}"),
        format!("/admin?subject_kind={lure}"),
        format!("/admin/subjects/ip/{lure}"),
        format!("/admin/subjects/{lure}/x"),
        format!("/admin/subjects/network/{lure}"),
        format!("/admin/subjects/prefix/{lure}"),
    ] {
        let page = get(&app, &path, ADMIN).await;
        assert_html(&page, 400, &path);
        let alert = page
            .body
            .split("role=\"alert\">")
            .nth(1)
            .and_then(|rest| rest.split("</p>").next())
            .unwrap_or_else(|| panic!("{path}: an error box: {}", page.body));
        assert!(!alert.is_empty(), "{path}");
        for shown in ["evil.example", "leaked", "expected x"] {
            assert!(!alert.contains(shown), "{path} says {shown}: {alert}");
        }
    }
    let page = get(&app, "/admin?since=yesterday&subject=alice", ADMIN).await;
    assert_eq!(
        page.input("since"),
        "yesterday",
        "the form keeps what was typed"
    );
    assert_eq!(page.input("subject"), "alice");

    for path in [
        "/admin/subjects/planet/mars",
        "/admin/subjects/phone/12",
        "/admin/subjects?kind=user",
    ] {
        let page = get(&app, path, ADMIN).await;
        assert_html(&page, 400, path);
    }
}

/// A failed login of `user` sent with a user agent.
async fn fail_with_agent(app: &TestApp, user: &str, agent: &str) -> Value {
    let request = app
        .client
        .post(format!("{}/login/attempt", app.address))
        .bearer_auth(API_KEY)
        .header("user-agent", agent)
        .json(
            &json!({ "user": user, "ip": "203.0.113.9", "success": false, "captcha_passed": true }),
        );
    app.send_raw(request).await.body
}

async fn user_supplied_text_is_escaped_on_every_page(kind: DbKind) {
    let db = TestDb::new(kind).await;
    let app = db_app(&db, |s| {
        s.login.captcha_after = 1;
        s.login.lock_after = 2;
        s.login.lock_scope = tollgate::settings::LockScope::User;
    })
    .await;
    let user = "<script>alert(1)</script>";
    let agent = "Mozilla <b>bold</b> & \"quoted\"";
    fail_with_agent(&app, user, agent).await;
    assert_eq!(fail_with_agent(&app, user, agent).await["locked"], true);
    app.flush_audit().await;

    let subject_href = "/admin/subjects/user/%3Cscript%3Ealert%281%29%3C%2Fscript%3E";
    let events = get(&app, "/admin?subject_kind=user", ADMIN).await;
    let subject = get(&app, subject_href, ADMIN).await;
    let filtered = get(
        &app,
        "/admin?subject=%3Cscript%3Ealert(1)%3C%2Fscript%3E&ip=%22%3E%3Cb%3E",
        ADMIN,
    )
    .await;
    for (name, page) in [
        ("events", &events),
        ("subject", &subject),
        ("filtered", &filtered),
    ] {
        assert_html(page, 200, name);
        assert!(!page.body.contains("<script"), "{name}: {}", page.body);
        assert!(!page.body.contains("<b>"), "{name}: {}", page.body);
    }
    assert!(
        events
            .body
            .contains("&#60;script&#62;alert(1)&#60;/script&#62;"),
        "the user name is shown, escaped: {}",
        events.body
    );
    assert!(
        events
            .body
            .contains("Mozilla &#60;b&#62;bold&#60;/b&#62; &#38; &#34;quoted&#34;"),
        "the user agent is shown, escaped: {}",
        events.body
    );
    assert!(events.body.contains(&format!("href=\"{subject_href}\"")));
    assert!(
        subject.body.contains("Locked until") && !subject.body.contains("not locked"),
        "{}",
        subject.body
    );
    assert_eq!(unescape(&filtered.input("ip")), "\"><b>");
}

/// Two failed logins of `alice` lock her (captcha after 1, lock after 2).
async fn locked_alice(configure: impl FnOnce(&mut tollgate::settings::Settings)) -> TestApp {
    let app = spawn_app(Backend::Memory, |s| {
        s.login.captcha_after = 1;
        s.login.lock_after = 2;
        s.login.lock_scope = tollgate::settings::LockScope::User;
        configure(s);
    })
    .await;
    for _ in 0..2 {
        app.login_attempt(json!({ "user": "alice", "ip": "203.0.113.1", "success": false, "captcha_passed": true }))
            .await;
    }
    assert!(is_locked(&app, "alice").await, "alice is locked");
    app
}

async fn is_locked(app: &TestApp, user: &str) -> bool {
    let state = app
        .admin_get(&format!("/admin/api/subjects/user/{user}"))
        .await;
    assert_eq!(state.status, 200, "{}", state.body);
    state.body["locked_until"].is_string()
}

fn unblock_rows(app: &TestApp) -> Vec<AuditEvent> {
    app.audit_events()
        .into_iter()
        .filter(|e| e.decision == AuditDecision::Unblock)
        .collect()
}

#[tokio::test]
async fn a_locked_user_shows_its_state_and_windows_on_the_subject_page() {
    let app = locked_alice(|_| {}).await;
    let page = get(&app, "/admin/subjects/user/Alice", ADMIN).await;
    assert_html(&page, 200, "subject page");
    let body = &page.body;
    assert!(
        body.contains("<h1><span class=\"muted\">user</span> alice</h1>"),
        "{body}"
    );
    // The lock's end as the API gives it, in the page's format (not today's
    // date, which the lock's end passes near midnight).
    let state = app.admin_get("/admin/api/subjects/user/alice").await;
    let until: chrono::DateTime<Utc> = state.body["locked_until"]
        .as_str()
        .expect("alice is locked")
        .parse()
        .unwrap();
    assert!(!body.contains("not locked"), "{body}");
    let marker = "<dt>Locked until</dt>\n  <dd>";
    let at = body.find(marker).expect("a Locked until row") + marker.len();
    let shown = &body[at..at + "2026-01-01 00:00:00.000".len()];
    let shown = chrono::NaiveDateTime::parse_from_str(shown, "%Y-%m-%d %H:%M:%S%.3f")
        .unwrap_or_else(|e| panic!("{shown:?}: {e}"))
        .and_utc();
    // Each answer adds its own now to the time left: a millisecond or two apart.
    assert!(
        (shown - until).num_milliseconds().abs() < 1_000,
        "locked_until {until} is shown: {body}"
    );
    assert!(
        body.contains("<dt>Captcha required</dt>\n  <dd>yes</dd>"),
        "{body}"
    );
    for rule in ["user 1/15m", "user 2/1h"] {
        assert!(body.contains(rule), "{rule}: {body}");
    }
    assert!(body.contains("<strong>full</strong>"), "{body}");
    assert!(body.contains(
        "<form class=\"unblock\" method=\"post\" action=\"/admin/subjects/user/alice/unblock\">"
    ));
    assert!(!page.input("csrf").is_empty());

    let unlocked = get(&app, "/admin/subjects/user/bob", ADMIN).await;
    assert_html(&unlocked, 200, "bob");
    assert!(unlocked.body.contains("not locked"));
    // The header's look-up form.
    let found = get(&app, "/admin/subjects?kind=user&id=+ALICE+", ADMIN).await;
    assert_eq!(found.status, 303);
    assert_eq!(found.header(LOCATION), "/admin/subjects/user/alice");
    // A number typed with its `+` arrives with a space for it.
    for (query, page) in [
        (
            "kind=phone&id=+8613800138000",
            "/admin/subjects/phone/%2B8613800138000",
        ),
        (
            "kind=prefix&id=+8613800",
            "/admin/subjects/prefix/%2B8613800",
        ),
        // A space pasted before an address or a name is no lost `+`.
        ("kind=ip&id=+203.0.113.7", "/admin/subjects/ip/203.0.113.7"),
        ("kind=user&id=+42", "/admin/subjects/user/42"),
    ] {
        let found = get(&app, &format!("/admin/subjects?{query}"), ADMIN).await;
        assert_eq!(found.status, 303, "{query}: {}", found.body);
        assert_eq!(found.header(LOCATION), page, "{query}");
    }
}

/// An IPv6 network is looked up from the header's form by any address of
/// it and shown with its captcha tier, like any other kind.
#[tokio::test]
async fn a_network_past_its_captcha_tier_shows_on_its_subject_page() {
    let app = spawn_app(Backend::Memory, |s| s.sms.network_captcha_after = 1).await;
    let sent = app
        .sms_send(json!({ "phone": "+8613800138000", "ip": "2001:db8:1:2::5" }))
        .await;
    assert_eq!(sent.status, 200, "{}", sent.body);

    let found = get(
        &app,
        "/admin/subjects?kind=network&id=2001:db8:1:9::1/48",
        ADMIN,
    )
    .await;
    assert_eq!(found.status, 303);
    let href = found.header(LOCATION).to_string();
    assert_eq!(href, "/admin/subjects/network/2001%3Adb8%3A1%3A%3A%2F48");
    let page = get(&app, &href, ADMIN).await;
    assert_html(&page, 200, "network page");
    let body = &page.body;
    assert!(
        body.contains("<h1><span class=\"muted\">network</span> 2001:db8:1::/48</h1>"),
        "{body}"
    );
    assert!(body.contains("network 1/1h"), "{body}");
    assert!(
        body.contains("<dt>Captcha required</dt>\n  <dd>yes</dd>"),
        "{body}"
    );
    assert!(
        body.contains("Unblock clears every window of this network."),
        "{body}"
    );
}

#[tokio::test]
async fn unblock_with_the_pages_csrf_token_unblocks_audits_and_redirects_back() {
    let app = locked_alice(|_| {}).await;
    let page = get(&app, "/admin/subjects/user/alice", ADMIN).await;
    let csrf = page.input("csrf");

    let answer = post_form(
        &app,
        "/admin/subjects/user/alice/unblock",
        &[("csrf", &csrf)],
        ADMIN,
    )
    .await;
    assert_eq!(answer.status, 303, "{}", answer.body);
    assert_eq!(
        answer.header(LOCATION),
        "/admin/subjects/user/alice?unblocked=1"
    );
    assert!(!is_locked(&app, "alice").await);
    let rows = unblock_rows(&app);
    assert_eq!(rows.len(), 1, "one unblock audited");
    assert_eq!(
        (
            rows[0].action,
            rows[0].subject_kind,
            rows[0].subject.as_str()
        ),
        (Action::Admin, SubjectKind::User, "alice")
    );
    let again = app
        .login_attempt(json!({ "user": "alice", "ip": "203.0.113.1", "success": true }))
        .await;
    assert_eq!(again.status, 200, "{}", again.body);
    assert_eq!(again.body["decision"], "allow", "alice can log in again");

    let back = get(&app, "/admin/subjects/user/alice?unblocked=1", ADMIN).await;
    assert_html(&back, 200, "after unblock");
    assert!(back.body.contains("Unblocked: every window"));
    assert!(back.body.contains("not locked"));

    // Bearer credentials work the same way, with the token they were issued for.
    let bearer = Auth::Bearer(ADMIN_TOKEN);
    let csrf = get(&app, "/admin/subjects/user/alice", bearer)
        .await
        .input("csrf");
    let answer = post_form(
        &app,
        "/admin/subjects/user/alice/unblock",
        &[("csrf", &csrf)],
        bearer,
    )
    .await;
    assert_eq!(answer.status, 303, "{}", answer.body);
}

/// A login name anyone can type, `.` or `..`, is a dot segment a browser
/// drops from a URL's path (as reqwest's URL parser does here): its page,
/// its links and its Unblock form go by the query, which is kept.
#[tokio::test]
async fn a_user_named_dot_or_dot_dot_has_a_page_and_an_unblock_form() {
    // A database, for the event table's links.
    let db = TestDb::new(DbKind::Sqlite).await;
    let app = db_app(&db, |s| {
        s.login.captcha_after = 1;
        s.login.lock_after = 2;
        s.login.lock_scope = tollgate::settings::LockScope::User;
    })
    .await;
    for user in [".", ".."] {
        for _ in 0..2 {
            app.login_attempt(json!({ "user": user, "ip": "203.0.113.1", "success": false, "captcha_passed": true }))
                .await;
        }
        let query = format!("kind=user&id={user}");
        // The event table links to the page by its query.
        app.flush_audit().await;
        let events = get(&app, "/admin?subject_kind=user", ADMIN).await;
        assert_html(&events, 200, "events");
        let link = format!("href=\"/admin/subjects?kind=user&#38;id={user}\"");
        assert!(events.body.contains(&link), "{link}: {}", events.body);

        // The header's look-up shows it in place: a redirect to a path
        // would lose the name.
        let page = get(&app, &format!("/admin/subjects?{query}"), ADMIN).await;
        assert_html(&page, 200, user);
        let heading = format!("<h1><span class=\"muted\">user</span> {user}</h1>");
        assert!(page.body.contains(&heading), "{}", page.body);
        assert!(page.body.contains("Locked until"), "{}", page.body);
        let action = format!("action=\"/admin/subjects/unblock?kind=user&#38;id={user}\"");
        assert!(page.body.contains(&action), "{action}: {}", page.body);
        // The overview's list of locks posts its Unblock there too.
        let overview = get(&app, "/admin/overview", ADMIN).await;
        assert_html(&overview, 200, "overview");
        assert!(
            overview.body.contains(&action),
            "{action}: {}",
            overview.body
        );

        let answer = post_form(
            &app,
            &format!("/admin/subjects/unblock?{query}"),
            &[("csrf", &page.input("csrf"))],
            ADMIN,
        )
        .await;
        assert_eq!(answer.status, 303, "{}", answer.body);
        let back = format!("/admin/subjects?{query}&unblocked=1");
        assert_eq!(answer.header(LOCATION), back);
        let after = get(&app, &back, ADMIN).await;
        assert_html(&after, 200, "after unblock");
        assert!(
            after.body.contains("Unblocked: every window"),
            "{}",
            after.body
        );
        assert!(after.body.contains("not locked"), "{}", after.body);
    }
    app.flush_audit().await;
    let rows = app.admin_get("/admin/api/events?decision=unblock").await;
    assert_eq!(rows.status, 200, "{}", rows.body);
    let mut unblocked: Vec<&str> = rows.body["events"]
        .as_array()
        .expect("events")
        .iter()
        .filter_map(|e| e["subject"].as_str())
        .collect();
    unblocked.sort_unstable();
    assert_eq!(unblocked, [".", ".."], "{}", rows.body);
    // The query form checks its CSRF token as the path form does.
    let forged = post_form(
        &app,
        "/admin/subjects/unblock?kind=user&id=..",
        &[("csrf", "forged")],
        ADMIN,
    )
    .await;
    assert_eq!(forged.status, 403, "{}", forged.body);
    let nameless = post_form(&app, "/admin/subjects/unblock?kind=user", &[], ADMIN).await;
    assert_eq!(nameless.status, 400, "{}", nameless.body);
}

#[tokio::test]
async fn unblock_without_or_with_a_wrong_csrf_token_is_forbidden_and_leaves_the_lock() {
    const OTHER_TOKEN: &str = "second-admin-token";
    let app = locked_alice(|s| {
        s.server
            .admin_tokens
            .push(tollgate::settings::AdminToken::plain(OTHER_TOKEN))
    })
    .await;
    let alice = get(&app, "/admin/subjects/user/alice", ADMIN)
        .await
        .input("csrf");
    let bob = get(&app, "/admin/subjects/user/bob", ADMIN)
        .await
        .input("csrf");
    let other_admin = get(
        &app,
        "/admin/subjects/user/alice",
        Auth::Basic("admin", OTHER_TOKEN),
    )
    .await
    .input("csrf");
    let (issued, tag) = alice.split_once('.').unwrap();
    let mut flipped = tag.to_string();
    let last = if flipped.pop() == Some('0') { '1' } else { '0' };
    flipped.push(last);
    let tampered = format!("{issued}.{flipped}");
    let stale = format!("{}.{tag}", issued.parse::<i64>().unwrap() - 13 * 3600);

    let cases: Vec<(&str, Vec<(&str, &str)>)> = vec![
        ("no token", vec![]),
        ("empty token", vec![("csrf", "")]),
        ("garbage", vec![("csrf", "not-a-token")]),
        ("tampered", vec![("csrf", &tampered)]),
        ("expired", vec![("csrf", &stale)]),
        ("another subject's token", vec![("csrf", &bob)]),
        ("another admin token's form", vec![("csrf", &other_admin)]),
        ("wrong field name", vec![("token", &alice)]),
    ];
    for (name, form) in &cases {
        let answer = post_form(&app, "/admin/subjects/user/alice/unblock", form, ADMIN).await;
        assert_html(&answer, 403, name);
        assert!(answer.body.contains("CSRF"), "{name}");
    }
    let cross_site = client()
        .post(format!("{}/admin/subjects/user/alice/unblock", app.address))
        .header("sec-fetch-site", "cross-site")
        .form(&[("csrf", alice.as_str())]);
    assert_html(&send(cross_site, ADMIN).await, 403, "a cross-site request");
    let as_bob = post_form(
        &app,
        "/admin/subjects/user/bob/unblock",
        &[("csrf", &alice)],
        ADMIN,
    )
    .await;
    assert_html(&as_bob, 403, "alice's token on bob's form");

    assert!(is_locked(&app, "alice").await, "the lock is still in place");
    assert!(unblock_rows(&app).is_empty(), "nothing audited as unblock");
    let refused = app
        .login_attempt(json!({ "user": "alice", "ip": "203.0.113.1", "success": true }))
        .await;
    assert_eq!(refused.body["locked"], true, "{}", refused.body);

    // The same token is still good for its own subject and credentials.
    let answer = post_form(
        &app,
        "/admin/subjects/user/alice/unblock",
        &[("csrf", &alice)],
        ADMIN,
    )
    .await;
    assert_eq!(answer.status, 303, "{}", answer.body);
    assert!(!is_locked(&app, "alice").await);
}

/// With the default `lock_scope = "user_ip"`, the subject page lists the
/// user's locks per IP, each IP linking to its own page, and an unblock
/// clears them.
#[tokio::test]
async fn a_users_locks_per_ip_are_listed_and_link_to_the_ip() {
    let app = spawn_app(Backend::Memory, |s| {
        s.login.captcha_after = 100;
        s.login.lock_after = 2;
    })
    .await;
    for ip in ["203.0.113.1", "203.0.113.1", "198.51.100.4"] {
        app.login_attempt(json!({ "user": "alice", "ip": ip, "success": false }))
            .await;
    }
    let page = get(&app, "/admin/subjects/user/alice", ADMIN).await;
    assert_html(&page, 200, "subject page");
    let body = &page.body;
    assert!(body.contains("<h2>Locks per IP</h2>"), "{body}");
    assert_eq!(
        page.link("203.0.113.1").as_deref(),
        Some("/admin/subjects/ip/203.0.113.1")
    );
    assert!(page.link("198.51.100.4").is_some(), "{body}");
    assert_eq!(body.matches("user_ip 2/1h").count(), 2, "{body}");
    assert_eq!(
        body.matches("not locked").count(),
        2,
        "the account and 198.51.100.4: {body}"
    );

    let csrf = page.input("csrf");
    let posted = post_form(
        &app,
        "/admin/subjects/user/alice/unblock",
        &[("csrf", &csrf)],
        ADMIN,
    )
    .await;
    assert_eq!(posted.status, StatusCode::SEE_OTHER, "{}", posted.body);
    let after = get(&app, "/admin/subjects/user/alice", ADMIN).await;
    assert!(!after.body.contains("Locks per IP"), "{}", after.body);
}

fn gzip(body: &[u8]) -> Vec<u8> {
    use std::io::Write;
    let mut gzip = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    gzip.write_all(body).unwrap();
    gzip.finish().unwrap()
}

/// Nothing on the admin port inflates a body: a compressed console form,
/// token and all, reaches the form parser as it came and is refused for
/// its unreadable CSRF token (the half that fails if actix's decompressor
/// comes back: inflated, 16 KiB of gzip held some 16 MB). Compressed admin
/// JSON answers 415, before the role is checked: a viewer's is no audited
/// 403. The same form and JSON sent plain are taken, so the refusals are
/// the encoding's.
#[tokio::test]
async fn compressed_admin_bodies_are_never_inflated() {
    const VIEWER: &str = "viewer-token-0123456789";
    let db = TestDb::new(DbKind::Sqlite).await;
    let app = db_app(&db, |s| {
        s.server.admin_tokens = vec![
            tollgate::settings::AdminToken::plain(ADMIN_TOKEN),
            tollgate::settings::AdminToken::Named(tollgate::settings::NamedAdminToken {
                name: "viewer".into(),
                token: tollgate::settings::Secret::new(VIEWER),
                role: tollgate::domain::admin_role::Role::Viewer,
            }),
        ];
    })
    .await;
    let csrf = get(&app, "/admin/lists", ADMIN).await.input("csrf");
    let form = |value: &str| {
        form_urlencoded::Serializer::new(String::new())
            .extend_pairs([
                ("csrf", csrf.as_str()),
                ("list", "block"),
                ("kind", "user"),
                ("value", value),
            ])
            .finish()
    };
    let post = |path: &str, content_type: &str, body: Vec<u8>, encoding: Option<&str>| {
        let mut request = client()
            .post(format!("{}{path}", app.address))
            .header(CONTENT_TYPE, content_type)
            .body(body);
        if let Some(encoding) = encoding {
            request = request.header("content-encoding", encoding);
        }
        request
    };
    let urlencoded = "application/x-www-form-urlencoded";

    let zipped = post(
        "/admin/lists",
        urlencoded,
        gzip(form("zipped").as_bytes()),
        Some("gzip"),
    );
    assert_html(&send(zipped, ADMIN).await, 403, "a gzipped form");
    let json_body = |value: &str| json!({ "list": "block", "value": value }).to_string();
    for token in [ADMIN_TOKEN, VIEWER] {
        let zipped = post(
            "/admin/api/lists/user",
            "application/json",
            gzip(json_body("zipped").as_bytes()),
            Some("gzip"),
        );
        let refused = send(zipped, Auth::Bearer(token)).await;
        assert_eq!(refused.status, 415, "{token}: {}", refused.body);
        let error: Value = serde_json::from_str(&refused.body).unwrap();
        assert_eq!(error["error"], "unsupported_media_type", "{}", refused.body);
    }
    let free = app
        .login_attempt(json!({ "user": "zipped", "success": false }))
        .await;
    assert_eq!(free.status, 200, "nothing was added: {}", free.body);

    let plain = post("/admin/lists", urlencoded, form("formed").into(), None);
    let added = send(plain, ADMIN).await;
    assert_eq!(added.status, StatusCode::SEE_OTHER, "{}", added.body);
    let plain = post(
        "/admin/api/lists/user",
        "application/json",
        json_body("posted").into(),
        Some("identity"),
    );
    let added = send(plain, Auth::Bearer(ADMIN_TOKEN)).await;
    assert_eq!(added.status, 201, "{}", added.body);
    for user in ["formed", "posted"] {
        let blocked = app
            .login_attempt(json!({ "user": user, "success": false }))
            .await;
        assert_eq!(blocked.status, 403, "{user}: {}", blocked.body);
    }
    // The two entries added, and no refusal for the role: the viewer's
    // compressed body was refused before its role was asked about.
    app.flush_audit().await;
    let trail = app.admin_get("/admin/api/events?action=admin").await.body;
    let decisions: Vec<&str> = trail["events"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|e| e["decision"].as_str())
        .collect();
    assert_eq!(decisions, ["list_add", "list_add"], "{trail}");
}

/// The lists page shows the config file's entries; an admin adds an entry
/// with the form (it is then in force) and deletes it again.
#[tokio::test]
async fn the_lists_page_adds_and_deletes_entries() {
    let db = TestDb::new(DbKind::Sqlite).await;
    let app = db_app(&db, |s| s.lists.allow_users = vec!["ops".into()]).await;
    let page = get(&app, "/admin/lists", ADMIN).await;
    assert_html(&page, 200, "lists page");
    assert!(page.body.contains("<code>ops</code>"), "{}", page.body);
    assert!(page.body.contains("config file"), "{}", page.body);
    let csrf = page.input("csrf");

    let refused = post_form(
        &app,
        "/admin/lists",
        &[
            ("csrf", "1.bad"),
            ("list", "block"),
            ("kind", "user"),
            ("value", "mallory"),
        ],
        ADMIN,
    )
    .await;
    assert_eq!(refused.status, StatusCode::FORBIDDEN);
    let added = post_form(
        &app,
        "/admin/lists",
        &[
            ("csrf", &csrf),
            ("list", "block"),
            ("kind", "user"),
            ("value", "Mallory"),
            ("note", "<b>spam</b>"),
        ],
        ADMIN,
    )
    .await;
    assert_eq!(added.status, StatusCode::SEE_OTHER, "{}", added.body);
    let blocked = app
        .login_attempt(json!({ "user": "mallory", "success": false }))
        .await;
    assert_eq!(blocked.status, 403, "{}", blocked.body);

    let page = get(&app, "/admin/lists?added=1", ADMIN).await;
    assert!(page.body.contains("Entry added."), "{}", page.body);
    assert!(page.body.contains("<code>mallory</code>"), "{}", page.body);
    assert!(
        page.body.contains("&#60;b&#62;spam&#60;/b&#62;"),
        "the note is escaped"
    );
    let marker = "action=\"/admin/lists/";
    let start = page.body.find(marker).expect("a delete form") + "action=\"".len();
    let len = page.body[start..].find('"').unwrap();
    let delete = page.body[start..start + len].to_string();
    let deleted = post_form(&app, &delete, &[("csrf", &csrf)], ADMIN).await;
    assert_eq!(deleted.status, StatusCode::SEE_OTHER, "{}", deleted.body);
    let allowed = app
        .login_attempt(json!({ "user": "mallory", "success": false }))
        .await;
    assert_eq!(allowed.status, 200, "{}", allowed.body);
    let long = "x".repeat(5_000);
    for (kind, value, note, status, what) in [
        ("ip", "nope", "", 400, "a bad value"),
        (
            "user",
            "mallory",
            "a\u{0}b",
            400,
            "a control character in the note",
        ),
        ("user", "mallory", &long, 413, "a form over its 4 KB"),
    ] {
        let refused = post_form(
            &app,
            "/admin/lists",
            &[
                ("csrf", &csrf),
                ("list", "block"),
                ("kind", kind),
                ("value", value),
                ("note", note),
            ],
            ADMIN,
        )
        .await;
        assert_html(&refused, status, what);
    }

    // Both changes are audited, the block list as the reason.
    app.flush_audit().await;
    let trail: serde_json::Value = app
        .client
        .get(format!("{}/admin/api/events?action=admin", app.address))
        .bearer_auth(crate::support::app::ADMIN_TOKEN)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let rows: Vec<(&str, &str, &str)> = trail["events"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| {
            (
                e["decision"].as_str().unwrap(),
                e["reason"].as_str().unwrap(),
                e["subject"].as_str().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        rows,
        [
            ("list_remove", "block_list", "mallory"),
            ("list_add", "block_list", "mallory"),
        ]
    );
}
