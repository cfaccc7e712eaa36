//! Single sign-on against a real OpenID provider (panva's oidc-provider,
//! `provider`): the console's authorization code flow with PKCE, sessions
//! and sign-out, forged and replayed callbacks, users without a role; JWT
//! access tokens on the admin API (good, expired, wrong audience, wrong
//! issuer, tampered, `alg: none`, HMAC), key rotation and bogus key ids.
//! The browser test is in `console::sso_browser`.

pub mod provider;

use std::sync::Arc;

use base64::Engine as _;
use reqwest::header::{COOKIE, LOCATION, SET_COOKIE};
use reqwest::{StatusCode, Url};
use serde_json::{json, Value};
use tollgate::audit::AuditEvent;
use tollgate::domain::admin_role::Role;
use tollgate::settings::{LimitSetting, Secret, Settings};

use crate::on_both_databases;
use crate::support::app::{free_port, spawn_app_with_audit_db, Backend, TestApp};
use crate::support::audit_db::{DbKind, TestDb};
use provider::{OidcProvider, API, CLIENT_SECRET, OTHER_API};

/// tollgate, its audit database and the provider it trusts.
pub struct SsoApp {
    pub app: TestApp,
    pub provider: OidcProvider,
    pub db: TestDb,
}

/// `[admin.oidc]` for `provider`, tollgate answering on `port`.
pub fn sso_settings(s: &mut Settings, issuer: &str, port: u16) {
    s.server.bind = format!("127.0.0.1:{port}").parse().unwrap();
    let oidc = &mut s.admin.oidc;
    oidc.issuer_url = issuer.to_string();
    oidc.client_id = "tollgate".into();
    oidc.client_secret = Secret::new(CLIENT_SECRET);
    oidc.redirect_url = format!("http://127.0.0.1:{port}/admin/oidc/callback");
    oidc.scopes = vec!["openid".into(), "email".into(), "roles".into()];
    oidc.roles_claim = "roles".into();
    oidc.role_map = [
        ("tollgate-viewer".to_string(), Role::Viewer),
        ("tollgate-operator".to_string(), Role::Operator),
        ("tollgate-auditor".to_string(), Role::Auditor),
    ]
    .into();
    oidc.api_audience = API.into();
}

/// A provider, a fresh audit database of `kind`, and tollgate signing in
/// through the one and writing to the other.
pub async fn sso_app(kind: DbKind, configure: impl FnOnce(&mut Settings)) -> SsoApp {
    let provider = OidcProvider::start().await;
    let db = TestDb::new(kind).await;
    let (url, spool) = (db.url.clone(), db.spool_dir());
    let issuer = provider.issuer.clone();
    // tollgate's callback must be registered before anyone signs in, so its
    // port is chosen first.
    let port = free_port();
    let app = spawn_app_with_audit_db(Backend::Memory, move |s| {
        s.audit.database_url = tollgate::settings::SecretUrl::new(url);
        s.audit.spool_dir = spool.display().to_string();
        sso_settings(s, &issuer, port);
        configure(s);
    })
    .await;
    provider
        .configure(&format!("{}/admin/oidc/callback", app.address))
        .await;
    SsoApp { app, provider, db }
}

/// A browser without redirects followed by itself, with a cookie jar.
pub struct Browser {
    pub client: reqwest::Client,
    pub jar: Arc<reqwest::cookie::Jar>,
}

impl Browser {
    pub fn new() -> Self {
        let jar = Arc::new(reqwest::cookie::Jar::default());
        let client = reqwest::Client::builder()
            .redirect(reqwest::redirect::Policy::none())
            .cookie_provider(jar.clone())
            .build()
            .unwrap();
        Self { client, jar }
    }

    /// GET `url`, then every redirect, until an answer that is not one or
    /// the next location starts with `stop_at`: the last answer and the
    /// location not followed, if any.
    pub async fn follow(&self, url: &str, stop_at: &str) -> (reqwest::Response, Option<String>) {
        let mut url = Url::parse(url).unwrap();
        for _ in 0..10 {
            let response = self.client.get(url.clone()).send().await.unwrap();
            let Some(location) = response.headers().get(LOCATION) else {
                return (response, None);
            };
            let next = url.join(location.to_str().unwrap()).unwrap();
            if next.as_str().starts_with(stop_at) {
                return (response, Some(next.to_string()));
            }
            url = next;
        }
        panic!("too many redirects from {url}");
    }

    /// The cookies the jar would send to `url`.
    pub fn cookies(&self, url: &str) -> Option<String> {
        use reqwest::cookie::CookieStore as _;
        self.jar
            .cookies(&Url::parse(url).unwrap())
            .map(|v| v.to_str().unwrap().to_string())
    }
}

/// The `action` of the first form of `html`, HTML entities undone.
fn form_action(html: &str) -> String {
    let start = html.find("action=\"").expect("a form") + "action=\"".len();
    let len = html[start..].find('"').unwrap();
    html[start..start + len]
        .replace("&#x2F;", "/")
        .replace("&amp;", "&")
}

/// Open the console, sign in at the provider as `user`, and stop before
/// the callback: its URL.
pub async fn to_callback(
    browser: &Browser,
    app: &TestApp,
    provider: &OidcProvider,
    user: &str,
) -> String {
    let callback = format!("{}/admin/oidc/callback", app.address);
    let (login, stopped) = browser
        .follow(&format!("{}/admin/overview", app.address), &callback)
        .await;
    assert_eq!(stopped, None, "the provider asks who signs in");
    let login_url = login.url().clone();
    let html = login.text().await.unwrap();
    assert!(html.contains("name=\"login\""), "{html}");
    let action = login_url.join(&form_action(&html)).unwrap();
    assert!(action.as_str().starts_with(&provider.issuer), "{action}");
    let posted = browser
        .client
        .post(action.clone())
        .form(&[("prompt", "login"), ("login", user), ("password", "any")])
        .send()
        .await
        .unwrap();
    let location = posted
        .headers()
        .get(LOCATION)
        .expect("a redirect after the login");
    let next = action.join(location.to_str().unwrap()).unwrap();
    let (_, at_callback) = browser.follow(next.as_str(), &callback).await;
    at_callback.expect("the provider sends the browser back with a code")
}

/// Sign in as `user` through the provider: the browser, with its session.
pub async fn sign_in(app: &TestApp, provider: &OidcProvider, user: &str) -> Browser {
    let browser = Browser::new();
    let callback = to_callback(&browser, app, provider, user).await;
    let done = browser.client.get(&callback).send().await.unwrap();
    assert_eq!(done.status(), StatusCode::SEE_OTHER, "{user} signs in");
    assert_eq!(done.headers()[LOCATION], "/admin/overview");
    browser
}

/// Press the console's Sign out as `browser` (its page's CSRF token).
async fn sign_out(browser: &Browser, app: &TestApp) -> reqwest::Response {
    let page = crate::support::text_of(browser.client.get(format!("{}/admin", app.address))).await;
    let marker = "name=\"csrf\" value=\"";
    let start = page
        .find("action=\"/admin/logout\"")
        .expect("a Sign out form");
    let token_at = page[start..].find(marker).unwrap() + start + marker.len();
    let token = &page[token_at..token_at + page[token_at..].find('"').unwrap()];
    browser
        .client
        .post(format!("{}/admin/logout", app.address))
        .form(&[("csrf", token)])
        .send()
        .await
        .unwrap()
}

fn find<'a>(rows: &'a [AuditEvent], decision: &str, reason: &str) -> Vec<&'a AuditEvent> {
    rows.iter()
        .filter(|e| e.decision.as_str() == decision && e.reason == reason)
        .collect()
}

#[tokio::test]
async fn a_browser_without_a_session_is_sent_to_the_providers_authorization_endpoint() {
    let SsoApp {
        app,
        provider,
        db: _db,
    } = sso_app(DbKind::Sqlite, |_| {}).await;
    let browser = Browser::new();
    let answer = browser
        .client
        .get(format!("{}/admin/subjects/user/alice?x=1", app.address))
        .send()
        .await
        .unwrap();
    assert_eq!(answer.status(), StatusCode::FOUND);
    assert_eq!(answer.headers()["cache-control"], "no-store");
    let to = Url::parse(answer.headers()[LOCATION].to_str().unwrap()).unwrap();
    assert_eq!(
        format!("{}{}", to.origin().ascii_serialization(), to.path()),
        format!("{}/auth", provider.issuer)
    );
    let query: std::collections::HashMap<String, String> = to.query_pairs().into_owned().collect();
    assert_eq!(query["response_type"], "code");
    assert_eq!(query["client_id"], "tollgate");
    assert_eq!(query["code_challenge_method"], "S256");
    assert_eq!(query["code_challenge"].len(), 43, "a SHA-256, base64url");
    assert_eq!(
        query["redirect_uri"],
        format!("{}/admin/oidc/callback", app.address)
    );
    assert_eq!(query["scope"], "openid email roles");
    assert!(
        query["state"].len() >= 16 && query["nonce"].len() >= 16,
        "{query:?}"
    );
    let cookie = answer.headers()[SET_COOKIE].to_str().unwrap();
    assert!(cookie.starts_with("tollgate_admin_login="), "{cookie}");
    for part in ["HttpOnly", "SameSite=Lax", "Path=/admin", "Max-Age=600"] {
        assert!(cookie.contains(part), "{part} in {cookie}");
    }
    assert!(
        !cookie.contains("Secure"),
        "served over plain HTTP: {cookie}"
    );
    assert!(
        !cookie.contains(&query["state"]),
        "the pending sign-in is encrypted"
    );
    // The JSON API never redirects: 401.
    let api = browser
        .client
        .get(format!("{}/admin/api/events", app.address))
        .send()
        .await
        .unwrap();
    assert_eq!(api.status(), StatusCode::UNAUTHORIZED);
    // Behind a TLS proxy the cookie is Secure; a client's own header is not believed.
    for (trusted, secure) in [(false, false), (true, true)] {
        // Bound, so that the provider and the database live as long as the app.
        let SsoApp {
            app: proxied,
            provider: _provider,
            db: _db,
        } = sso_app(DbKind::Sqlite, |s| {
            if trusted {
                s.server.trusted_proxies = vec!["127.0.0.1/32".parse().unwrap()];
            }
        })
        .await;
        let answer = Browser::new()
            .client
            .get(format!("{}/admin", proxied.address))
            .header("x-forwarded-proto", "https")
            .send()
            .await
            .unwrap();
        let cookie = answer.headers()[SET_COOKIE].to_str().unwrap();
        assert_eq!(
            cookie.contains("; Secure"),
            secure,
            "trusted proxy {trusted}: {cookie}"
        );
    }
}

async fn signing_in_opens_a_session_that_names_the_admin_until_sign_out(kind: DbKind) {
    let SsoApp { app, provider, db } = sso_app(kind, |_| {}).await;
    let vera = sign_in(&app, &provider, "vera").await;
    let page = vera
        .client
        .get(format!("{}/admin/subjects/user/alice", app.address))
        .send()
        .await
        .unwrap();
    assert_eq!(page.status(), StatusCode::OK);
    let html = page.text().await.unwrap();
    assert!(html.contains("oidc:vera@example.com"), "{html}");
    assert!(html.contains("(viewer)"), "{html}");
    assert!(
        !html.contains("class=\"unblock\""),
        "a viewer sees no Unblock form"
    );
    // A viewer's unblock (the form is not shown; posted anyway) is refused and audited.
    let refused = vera
        .client
        .post(format!("{}/admin/subjects/user/alice/unblock", app.address))
        .form(&[("csrf", "none")])
        .send()
        .await
        .unwrap();
    assert_eq!(refused.status(), StatusCode::FORBIDDEN);

    let olga = sign_in(&app, &provider, "olga").await;
    let page = olga
        .client
        .get(format!("{}/admin/subjects/user/alice", app.address))
        .send()
        .await
        .unwrap();
    let html = page.text().await.unwrap();
    let marker = "name=\"csrf\" value=\"";
    let form = html
        .find("class=\"unblock\"")
        .expect("an operator's Unblock form");
    let start = html[form..].find(marker).unwrap() + form + marker.len();
    let token = html[start..start + html[start..].find('"').unwrap()].to_string();
    let unblocked = olga
        .client
        .post(format!("{}/admin/subjects/user/alice/unblock", app.address))
        .form(&[("csrf", token.as_str())])
        .send()
        .await
        .unwrap();
    assert_eq!(unblocked.status(), StatusCode::SEE_OTHER);

    let all = db.trail(&app).await;
    let sign_ins = find(&all, "sign_in", "oidc");
    let actors: Vec<_> = sign_ins
        .iter()
        .map(|e| e.actor.as_deref().unwrap())
        .collect();
    assert_eq!(actors, ["oidc:olga@example.com", "oidc:vera@example.com"]);
    assert!(sign_ins
        .iter()
        .all(|e| e.subject_kind.as_str() == "ip" && e.subject == "127.0.0.1"));
    let denied = find(&all, "deny", "forbidden");
    assert_eq!(denied.len(), 1);
    assert_eq!(denied[0].actor.as_deref(), Some("oidc:vera@example.com"));
    assert_eq!(
        (denied[0].subject_kind.as_str(), denied[0].subject.as_str()),
        ("user", "alice")
    );
    assert_eq!(denied[0].rule.as_deref(), Some("unblock needs operator"));
    let unblocks = find(&all, "unblock", "admin_unblock");
    assert_eq!(unblocks.len(), 1);
    assert_eq!(unblocks[0].actor.as_deref(), Some("oidc:olga@example.com"));

    // The API filters by actor.
    let mine = app
        .admin_get("/admin/api/events?actor=oidc%3Aolga%40example.com")
        .await;
    let decisions: Vec<&str> = mine.body["events"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["decision"].as_str().unwrap())
        .collect();
    assert_eq!(decisions, ["unblock", "sign_in"], "{}", mine.body);

    // Sign out: the session ends everywhere, a copy of the cookie included.
    let console = format!("{}/admin", app.address);
    let copied = olga.cookies(&console).expect("a session cookie");
    let out = sign_out(&olga, &app).await;
    assert_eq!(out.status(), StatusCode::OK);
    assert!(out.headers()[SET_COOKIE]
        .to_str()
        .unwrap()
        .starts_with("tollgate_admin_session=;"));
    let replayed = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap()
        .get(&console)
        .header(COOKIE, copied)
        .send()
        .await
        .unwrap();
    assert_eq!(replayed.status(), StatusCode::FOUND, "back to the provider");
    // vera's session is untouched.
    let still = vera.client.get(&console).send().await.unwrap();
    assert_eq!(still.status(), StatusCode::OK);
    // The trail says whose session ended.
    let all = db.trail(&app).await;
    let outs = find(&all, "sign_out", "oidc");
    assert_eq!(outs.len(), 1, "{outs:?}");
    assert_eq!(outs[0].actor.as_deref(), Some("oidc:olga@example.com"));
}

on_both_databases!(signing_in_opens_a_session_that_names_the_admin_until_sign_out);

/// Another tollgate on `db` trusting `provider`, its `role_map` as
/// `configure` leaves it: the same deployment restarted with new settings.
async fn restarted(
    db: &TestDb,
    provider: &OidcProvider,
    configure: impl FnOnce(&mut Settings) + Send + 'static,
) -> (TestApp, tempfile::TempDir) {
    let spool = tempfile::tempdir().unwrap();
    let (url, spool_path, issuer) = (
        db.url.clone(),
        spool.path().to_path_buf(),
        provider.issuer.clone(),
    );
    let port = free_port();
    let app = spawn_app_with_audit_db(Backend::Memory, move |s| {
        s.audit.database_url = tollgate::settings::SecretUrl::new(url);
        s.audit.spool_dir = spool_path.display().to_string();
        sso_settings(s, &issuer, port);
        configure(s);
    })
    .await;
    (app, spool)
}

/// The console page of alice as `browser` sees it on `app`: its status and
/// whether it offers an Unblock form.
async fn unblock_offered(browser: &Browser, app: &TestApp) -> (StatusCode, bool) {
    let page = browser
        .client
        .get(format!("{}/admin/subjects/user/alice", app.address))
        .send()
        .await
        .unwrap();
    let status = page.status();
    (
        status,
        page.text().await.unwrap().contains("class=\"unblock\""),
    )
}

/// A session holds what today's `role_map` grants to the claim values it
/// signed in with: an operator lowered to viewer loses Unblock at once and
/// gets it back when raised again, one taken out of the map (or read from
/// another claim) is sent to sign in again, and a row from before the
/// values were kept holds nothing.
#[tokio::test]
async fn a_session_loses_the_roles_its_admin_was_taken_out_of() {
    let SsoApp { app, provider, db } = sso_app(DbKind::Sqlite, |_| {}).await;
    let olga = sign_in(&app, &provider, "olga").await;
    assert_eq!(unblock_offered(&olga, &app).await, (StatusCode::OK, true));

    let (lowered, _spool) = restarted(&db, &provider, |s| {
        s.admin.oidc.role_map = [
            ("tollgate-viewer".to_string(), Role::Viewer),
            ("tollgate-operator".to_string(), Role::Viewer),
        ]
        .into();
    })
    .await;
    assert_eq!(
        unblock_offered(&olga, &lowered).await,
        (StatusCode::OK, false),
        "lowered to viewer"
    );
    let (raised, _spool) = restarted(&db, &provider, |s| {
        s.admin.oidc.role_map = [
            ("tollgate-viewer".to_string(), Role::Viewer),
            ("tollgate-operator".to_string(), Role::Operator),
        ]
        .into();
    })
    .await;
    assert_eq!(
        unblock_offered(&olga, &raised).await,
        (StatusCode::OK, true)
    );
    let (removed, _spool) = restarted(&db, &provider, |s| {
        s.admin.oidc.role_map = [("tollgate-viewer".to_string(), Role::Viewer)].into();
    })
    .await;
    assert_eq!(
        unblock_offered(&olga, &removed).await,
        (StatusCode::FOUND, false),
        "taken out: sent to sign in again"
    );
    let (other_claim, _spool) = restarted(&db, &provider, |s| {
        s.admin.oidc.roles_claim = "groups".into();
        s.admin.oidc.role_map = [("tollgate-operator".to_string(), Role::Operator)].into();
    })
    .await;
    assert_eq!(
        unblock_offered(&olga, &other_claim).await,
        (StatusCode::FOUND, false),
        "another claim grants nothing"
    );

    // The same session as a row written before the values were kept.
    let audit = db.connect().await;
    match &audit {
        tollgate::audit::AuditDb::Sqlite(pool) => {
            sqlx::query("UPDATE admin_sessions SET grants = NULL")
                .execute(pool)
                .await
                .unwrap();
        }
        tollgate::audit::AuditDb::Postgres(_) => unreachable!("a SQLite test"),
    }
    assert_eq!(
        unblock_offered(&olga, &app).await,
        (StatusCode::FOUND, false),
        "a row from before signs in again"
    );
}

/// A browser that signs in again gives up the session it held: a copy of
/// the old cookie no longer opens the console.
#[tokio::test]
async fn signing_in_again_ends_the_browsers_previous_session() {
    let SsoApp { app, provider, db } = sso_app(DbKind::Sqlite, |_| {}).await;
    let olga = sign_in(&app, &provider, "olga").await;
    let console = format!("{}/admin", app.address);
    let before = olga.cookies(&console).expect("a session cookie");
    let with = |cookie: String| {
        let console = console.clone();
        async move {
            reqwest::Client::builder()
                .redirect(reqwest::redirect::Policy::none())
                .build()
                .unwrap()
                .get(&console)
                .header(COOKIE, cookie)
                .send()
                .await
                .unwrap()
                .status()
        }
    };
    assert_eq!(with(before.clone()).await, StatusCode::OK);
    let callback = format!("{}/admin/oidc/callback", app.address);
    let (_, again) = olga
        .follow(&format!("{}/admin/login", app.address), &callback)
        .await;
    let again = again.expect("the provider's session signs olga in at once");
    let done = olga.client.get(&again).send().await.unwrap();
    assert_eq!(done.status(), StatusCode::SEE_OTHER);
    let after = olga.cookies(&console).expect("a session cookie");
    assert_ne!(after, before);
    assert_eq!(with(after).await, StatusCode::OK);
    assert_eq!(with(before).await, StatusCode::FOUND, "the old one ended");
    // The trail says the earlier session ended, and whose it was.
    let all = db.trail(&app).await;
    let outs = find(&all, "sign_out", "oidc");
    assert_eq!(outs.len(), 1, "{outs:?}");
    assert_eq!(outs[0].actor.as_deref(), Some("oidc:olga@example.com"));
}

/// Someone sharing a signed-in admin's address (a NAT) cannot lock the
/// admin out with wrong passwords: a live session is let in, Sign out
/// included, while the address is throttled for everything else.
#[tokio::test]
async fn a_throttled_address_keeps_its_live_session() {
    let SsoApp { app, provider, db } = sso_app(DbKind::Sqlite, |s| {
        s.server.admin_auth_limit = LimitSetting::new(3, std::time::Duration::from_secs(600));
    })
    .await;
    let olga = sign_in(&app, &provider, "olga").await;
    let stranger = reqwest::Client::new();
    for _ in 0..4 {
        stranger
            .get(format!("{}/admin", app.address))
            .basic_auth("admin", Some("a guess"))
            .send()
            .await
            .unwrap();
    }
    let throttled = stranger
        .get(format!("{}/admin", app.address))
        .basic_auth("admin", Some("another guess"))
        .send()
        .await
        .unwrap();
    assert_eq!(throttled.status(), StatusCode::TOO_MANY_REQUESTS);
    let console = format!("{}/admin", app.address);
    let page = olga.client.get(&console).send().await.unwrap();
    assert_eq!(page.status(), StatusCode::OK, "the session is let in");
    let out = sign_out(&olga, &app).await;
    assert_eq!(out.status(), StatusCode::OK, "signed out");
    let after = olga.client.get(&console).send().await.unwrap();
    assert_eq!(
        after.status(),
        StatusCode::TOO_MANY_REQUESTS,
        "signed out, the address is throttled as any other"
    );
    let all = db.trail(&app).await;
    assert_eq!(find(&all, "sign_out", "oidc").len(), 1);
}

#[tokio::test]
async fn forged_replayed_and_refused_callbacks_fail_are_audited_and_throttled() {
    let SsoApp { app, provider, db } = sso_app(DbKind::Sqlite, |s| {
        s.server.admin_auth_limit = LimitSetting::new(4, std::time::Duration::from_secs(600));
    })
    .await;
    let callback = format!("{}/admin/oidc/callback", app.address);
    let plain = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap();

    // 1. Forged: no sign-in was started by this browser. Refused, but not
    //    counted: a page on another site can make an admin's browser send
    //    it (an image), and must not throttle the admin's address by it.
    for (i, query) in ["code=abc&state=xyz", "error=access_denied&state=s"]
        .iter()
        .cycle()
        .take(6)
        .enumerate()
    {
        let forged = plain
            .get(format!("{callback}?{query}"))
            .send()
            .await
            .unwrap();
        assert_eq!(forged.status(), StatusCode::UNAUTHORIZED, "forged {i}");
        assert!(forged.text().await.unwrap().contains("invalid_callback"));
    }

    // 2. Another state than the browser's sign-in: refused, and not counted
    //    either (a page on another site can open /admin/login in a popup,
    //    then the callback with any state).
    let browser = Browser::new();
    let real = to_callback(&browser, &app, &provider, "olga").await;
    let with_cookie = browser.cookies(&callback).expect("the pending sign-in");
    let mut wrong = Url::parse(&real).unwrap();
    let pairs: Vec<(String, String)> = wrong
        .query_pairs()
        .map(|(k, v)| {
            (
                k.to_string(),
                if k == "state" {
                    "other".to_string()
                } else {
                    v.to_string()
                },
            )
        })
        .collect();
    let real_state = Url::parse(&real)
        .unwrap()
        .query_pairs()
        .find(|(k, _)| k == "state")
        .map(|(_, v)| v.into_owned())
        .expect("the callback carries a state");
    wrong.query_pairs_mut().clear().extend_pairs(pairs);
    for _ in 0..6 {
        let answer = plain
            .get(wrong.as_str())
            .header(COOKIE, &with_cookie)
            .send()
            .await
            .unwrap();
        assert_eq!(answer.status(), StatusCode::UNAUTHORIZED);
        // The pending sign-in is kept: a page on another site can send the
        // browser here (a top-level navigation carries the cookie), and
        // must not end the admin's sign-in under way.
        assert!(
            answer.headers().get(reqwest::header::SET_COOKIE).is_none(),
            "{:?}",
            answer.headers()
        );
        assert!(answer.text().await.unwrap().contains("invalid_callback"));
    }

    // 3. The real callback works once; replayed with the same cookie, the
    //    provider refuses the used code.
    let first = plain
        .get(&real)
        .header(COOKIE, &with_cookie)
        .send()
        .await
        .unwrap();
    assert_eq!(first.status(), StatusCode::SEE_OTHER);
    let replay = plain
        .get(&real)
        .header(COOKIE, &with_cookie)
        .send()
        .await
        .unwrap();
    assert_eq!(replay.status(), StatusCode::UNAUTHORIZED);
    assert!(replay.text().await.unwrap().contains("idp_error"));

    // 4. The provider's error for this sign-in, three times: the fourth
    //    failure of this address fills its window: 429 from then on, before
    //    anything is checked or audited, a forged callback's included.
    let provider_error = format!("{callback}?error=access_denied&state={real_state}");
    for url in [&provider_error; 3] {
        let refused = plain
            .get(url.as_str())
            .header(COOKIE, &with_cookie)
            .send()
            .await
            .unwrap();
        assert_eq!(refused.status(), StatusCode::UNAUTHORIZED, "{url}");
    }
    let throttled = plain
        .get(format!("{callback}?code=abc&state=xyz"))
        .send()
        .await
        .unwrap();
    assert_eq!(throttled.status(), StatusCode::TOO_MANY_REQUESTS);
    assert!(throttled.headers().contains_key("retry-after"));

    let all = db.trail(&app).await;
    let failed: Vec<&str> = all
        .iter()
        .filter(|e| e.decision.as_str() == "sign_in_failed")
        .map(|e| e.reason.as_str())
        .collect();
    assert_eq!(failed, ["idp_error", "idp_error", "idp_error", "idp_error"]);
    assert_eq!(find(&all, "sign_in", "oidc").len(), 1);
    assert_eq!(
        find(&all, "lock", "admin_auth_failures").len(),
        1,
        "the window filled once"
    );
}

#[tokio::test]
async fn a_user_whose_claims_map_to_no_role_is_refused_and_audited_by_name() {
    let SsoApp { app, provider, db } = sso_app(DbKind::Sqlite, |_| {}).await;
    let browser = Browser::new();
    let callback = to_callback(&browser, &app, &provider, "nora").await;
    let answer = browser.client.get(&callback).send().await.unwrap();
    assert_eq!(answer.status(), StatusCode::FORBIDDEN);
    assert!(answer.text().await.unwrap().contains("no_role"));
    let again = browser
        .client
        .get(format!("{}/admin", app.address))
        .send()
        .await
        .unwrap();
    assert_eq!(again.status(), StatusCode::FOUND, "no session was opened");
    let all = db.trail(&app).await;
    let failed = find(&all, "sign_in_failed", "no_role");
    assert_eq!(failed.len(), 1);
    assert_eq!(failed[0].actor.as_deref(), Some("oidc:nora@example.com"));
}

/// `token` with its payload's JSON changed by `edit`, the signature kept.
fn tampered(token: &str, edit: impl FnOnce(&mut Value)) -> String {
    let b64 = base64::engine::general_purpose::URL_SAFE_NO_PAD;
    let parts: Vec<&str> = token.split('.').collect();
    let mut claims: Value = serde_json::from_slice(&b64.decode(parts[1]).unwrap()).unwrap();
    edit(&mut claims);
    format!(
        "{}.{}.{}",
        parts[0],
        b64.encode(claims.to_string()),
        parts[2]
    )
}

fn unsigned(header: Value, claims: Value) -> String {
    let b64 = base64::engine::general_purpose::URL_SAFE_NO_PAD;
    format!(
        "{}.{}.",
        b64.encode(header.to_string()),
        b64.encode(claims.to_string())
    )
}

async fn with_bearer(app: &TestApp, method: &str, path: &str, token: &str) -> (StatusCode, Value) {
    let url = format!("{}{path}", app.address);
    let request = match method {
        "POST" => app.client.post(url),
        _ => app.client.get(url),
    };
    let answer = app.send_raw(request.bearer_auth(token)).await;
    (answer.status, answer.body)
}

#[tokio::test]
async fn jwt_access_tokens_of_the_issuer_are_accepted_by_role_and_bad_ones_answer_401() {
    let SsoApp { app, provider, db } = sso_app(DbKind::Sqlite, |s| {
        s.server.admin_auth_limit = LimitSetting::new(10, std::time::Duration::from_secs(600));
    })
    .await;
    let operator = provider.access_token("robot-operator", API).await;
    let viewer = provider.access_token("robot-viewer", API).await;
    let auditor = provider.access_token("robot-auditor", API).await;

    assert_eq!(
        with_bearer(&app, "GET", "/admin/api/events", &viewer)
            .await
            .0,
        StatusCode::OK
    );
    let (status, body) = with_bearer(
        &app,
        "POST",
        "/admin/api/subjects/user/alice/unblock",
        &viewer,
    )
    .await;
    assert_eq!(
        (status, body["error"].as_str()),
        (StatusCode::FORBIDDEN, Some("forbidden")),
        "{body}"
    );
    let (status, _) = with_bearer(
        &app,
        "POST",
        "/admin/api/subjects/user/alice/unblock",
        &operator,
    )
    .await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(
        with_bearer(&app, "GET", "/admin/api/events.csv", &operator)
            .await
            .0,
        StatusCode::FORBIDDEN
    );
    assert_eq!(
        with_bearer(
            &app,
            "GET",
            "/admin/api/events.csv?decision=unblock",
            &auditor
        )
        .await
        .0,
        StatusCode::OK
    );

    let now = chrono::Utc::now().timestamp();
    let claims = |iss: &str, aud: &str, exp: i64| {
        json!({"sub": "robot-operator", "iss": iss, "aud": aud, "iat": now - 7200, "exp": exp,
               "roles": ["tollgate-operator"]})
    };
    let issuer = provider.issuer.clone();
    let bad = [
        ("no role", provider.access_token("robot-none", API).await),
        (
            "another audience",
            provider.access_token("robot-operator", OTHER_API).await,
        ),
        (
            "expired",
            provider
                .sign(json!({}), claims(&issuer, API, now - 3600))
                .await,
        ),
        ("not yet valid", {
            let mut later = claims(&issuer, API, now + 7200);
            later["nbf"] = json!(now + 3600);
            provider.sign(json!({}), later).await
        }),
        (
            "another issuer",
            provider
                .sign(json!({}), claims("https://evil.example", API, now + 300))
                .await,
        ),
        (
            "tampered",
            tampered(&viewer, |c| c["roles"] = json!(["tollgate-operator"])),
        ),
        (
            "alg none",
            unsigned(json!({"alg": "none"}), claims(&issuer, API, now + 300)),
        ),
        ("HS256", {
            let t = unsigned(
                json!({"alg": "HS256", "kid": "k"}),
                claims(&issuer, API, now + 300),
            );
            format!("{t}c2lnbmVk")
        }),
        ("garbage", "a.b.c".to_string()),
    ];
    for (case, token) in &bad {
        let (status, body) = with_bearer(&app, "GET", "/admin/api/events", token).await;
        assert_eq!(status, StatusCode::UNAUTHORIZED, "{case}: {body}");
        assert_eq!(body["error"], "unauthorized", "{case}");
    }
    // Each was a failed authentication: the tenth fills the window.
    let (status, _) = with_bearer(&app, "GET", "/admin/api/events", "x.y.z").await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    let (status, _) = with_bearer(&app, "GET", "/admin/api/events", &operator).await;
    assert_eq!(
        status,
        StatusCode::TOO_MANY_REQUESTS,
        "every failure was counted"
    );

    let all = db.trail(&app).await;
    let unblock = find(&all, "unblock", "admin_unblock");
    assert_eq!(unblock[0].actor.as_deref(), Some("oidc:robot-operator"));
    let denied = find(&all, "deny", "forbidden");
    let who: Vec<(&str, &str)> = denied
        .iter()
        .map(|e| (e.actor.as_deref().unwrap(), e.rule.as_deref().unwrap()))
        .collect();
    assert_eq!(
        who,
        [
            ("oidc:robot-operator", "export_csv needs auditor"),
            ("oidc:robot-viewer", "unblock needs operator")
        ]
    );
    let export = find(&all, "export", "csv_export");
    assert_eq!(export[0].actor.as_deref(), Some("oidc:robot-auditor"));
    assert_eq!(export[0].rule.as_deref(), Some("decision=unblock"));
}

/// With `roles_claim = "email"` (Google's way), an address the provider
/// has not verified grants nothing: on a provider where people edit their
/// own profile, anyone could type an operator's address. A verified one
/// grants its role whatever its case, and Cognito's `"true"` is verified.
#[tokio::test]
async fn an_email_maps_to_a_role_only_when_the_provider_verified_it() {
    let SsoApp { app, provider, .. } = sso_app(DbKind::Sqlite, |s| {
        s.admin.oidc.roles_claim = "email".into();
        s.admin.oidc.role_map = [("ann@example.com".to_string(), Role::Operator)].into();
    })
    .await;
    let now = chrono::Utc::now().timestamp();
    let token = |email: &str, verified: Value| {
        let mut claims = json!({"sub": "someone", "iss": provider.issuer, "aud": API,
                                "iat": now, "exp": now + 300, "email": email});
        if !verified.is_null() {
            claims["email_verified"] = verified;
        }
        provider.sign(json!({}), claims)
    };
    for (email, claim) in [
        ("ann@example.com", json!(true)),
        ("Ann@Example.COM", json!(true)),
        ("ann@example.com", json!("true")),
    ] {
        let verified = token(email, claim.clone()).await;
        let (status, body) = with_bearer(
            &app,
            "POST",
            "/admin/api/subjects/user/alice/unblock",
            &verified,
        )
        .await;
        assert_eq!(
            status,
            StatusCode::OK,
            "{email} email_verified {claim}: {body}"
        );
    }
    for claim in [json!(false), Value::Null, json!("false"), json!(1)] {
        let unverified = token("ann@example.com", claim.clone()).await;
        let (status, body) = with_bearer(&app, "GET", "/admin/api/events", &unverified).await;
        assert_eq!(
            status,
            StatusCode::UNAUTHORIZED,
            "email_verified {claim}: {body}"
        );
    }
}

#[tokio::test]
async fn a_rotated_key_is_fetched_once_and_made_up_key_ids_cost_one_fetch() {
    let provider = OidcProvider::start().await;
    let start = |provider: &OidcProvider| {
        let issuer = provider.issuer.clone();
        async move {
            let db = TestDb::new(DbKind::Sqlite).await;
            let (url, spool) = (db.url.clone(), db.spool_dir());
            let app = spawn_app_with_audit_db(Backend::Memory, move |s| {
                s.audit.database_url = tollgate::settings::SecretUrl::new(url);
                s.audit.spool_dir = spool.display().to_string();
                sso_settings(s, &issuer, free_port());
            })
            .await;
            (db, app)
        }
    };
    let (_db, app) = start(&provider).await;
    let before = provider.access_token("robot-viewer", API).await;
    assert_eq!(
        with_bearer(&app, "GET", "/admin/api/lists", &before)
            .await
            .0,
        StatusCode::OK
    );
    assert_eq!(provider.stats().await.0, 1, "discovery fetched the keys");
    let old_kid = provider.stats().await.1;
    let new_kid = provider.rotate().await;
    assert_ne!(old_kid, new_kid);
    let after = provider.access_token("robot-viewer", API).await;
    assert_eq!(
        with_bearer(&app, "GET", "/admin/api/lists", &after).await.0,
        StatusCode::OK
    );
    assert_eq!(
        provider.stats().await.0,
        2,
        "the unknown key id fetched the keys again"
    );
    assert_eq!(
        with_bearer(&app, "GET", "/admin/api/lists", &after).await.0,
        StatusCode::OK
    );
    assert_eq!(provider.stats().await.0, 2, "then they are held");

    // Another instance: a stream of made-up key ids costs the provider one fetch.
    let (_db2, other) = start(&provider).await;
    assert_eq!(
        with_bearer(&other, "GET", "/admin/api/lists", &after)
            .await
            .0,
        StatusCode::OK
    );
    assert_eq!(provider.stats().await.0, 3);
    let now = chrono::Utc::now().timestamp();
    for i in 0..5 {
        let claims = json!({"sub": "x", "iss": provider.issuer, "aud": API, "exp": now + 300, "roles": ["tollgate-operator"]});
        let token = provider
            .sign(json!({"kid": format!("made-up-{i}")}), claims)
            .await;
        assert_eq!(
            with_bearer(&other, "GET", "/admin/api/lists", &token)
                .await
                .0,
            StatusCode::UNAUTHORIZED
        );
    }
    assert_eq!(
        provider.stats().await.0,
        4,
        "one fetch for five made-up key ids"
    );
}

#[tokio::test]
async fn a_provider_that_is_down_leaves_static_tokens_working() {
    let db = TestDb::new(DbKind::Sqlite).await;
    let (url, spool) = (db.url.clone(), db.spool_dir());
    let nobody = format!("http://127.0.0.1:{}", free_port());
    let app = spawn_app_with_audit_db(Backend::Memory, move |s| {
        s.audit.database_url = tollgate::settings::SecretUrl::new(url);
        s.audit.spool_dir = spool.display().to_string();
        sso_settings(s, &nobody, free_port());
    })
    .await;
    let page = Browser::new()
        .client
        .get(format!("{}/admin", app.address))
        .send()
        .await
        .unwrap();
    assert_eq!(page.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert!(page.text().await.unwrap().contains("Sign-in unavailable"));
    let jwt = unsigned(json!({"alg": "RS256", "kid": "k"}), json!({"sub": "x"}));
    let (status, body) = with_bearer(&app, "GET", "/admin/api/events", &jwt).await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{body}");
    assert_eq!(body["error"], "identity_provider_unavailable");
    assert_eq!(
        app.admin_get("/admin/api/events").await.status,
        StatusCode::OK
    );
}
