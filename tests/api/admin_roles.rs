//! Admins with names and roles, without single sign-on: named static
//! tokens act within their role, plain-string tokens keep every right as
//! `token:<position>`, each admin row names its actor (a new column on both
//! databases, old rows null), the trail filters by actor, and the console
//! hides what a role may not use and refuses it anyway.

use reqwest::StatusCode;
use serde_json::{json, Value};
use tollgate::audit::{AuditDb, AuditEvent};
use tollgate::domain::admin_role::Role;
use tollgate::domain::{Action, Subject, SubjectKind};
use tollgate::settings::{AdminToken, NamedAdminToken, Secret, SecretUrl};

use crate::on_both_databases;
use crate::support::app::{spawn_app_with_audit_db, Backend, TestApp, ADMIN_TOKEN};
use crate::support::audit_db::{DbKind, TestDb};

const ONCALL: &str = "oncall-token-0123456789";
const WATCHER: &str = "watcher-token-0123456789";
const AUDIT: &str = "audit-token-0123456789";

fn named(name: &str, token: &str, role: Role) -> AdminToken {
    AdminToken::Named(NamedAdminToken {
        name: name.into(),
        token: Secret::new(token),
        role,
    })
}

/// The first token is the plain one (`token:1`), then one per role.
async fn app_with_tokens(db: &TestDb) -> TestApp {
    let (url, spool) = (db.url.clone(), db.spool_dir());
    spawn_app_with_audit_db(Backend::Memory, move |s| {
        s.audit.database_url = SecretUrl::new(url);
        s.audit.spool_dir = spool.display().to_string();
        s.server.admin_tokens = vec![
            AdminToken::plain(ADMIN_TOKEN),
            named("oncall", ONCALL, Role::Operator),
            named("watcher", WATCHER, Role::Viewer),
            named("audit", AUDIT, Role::Auditor),
        ];
    })
    .await
}

async fn call(
    app: &TestApp,
    token: &str,
    method: &str,
    path: &str,
    body: Option<Value>,
) -> (StatusCode, String) {
    let url = format!("{}{path}", app.address);
    let mut request = match method {
        "POST" => app.client.post(url),
        "DELETE" => app.client.delete(url),
        _ => app.client.get(url),
    }
    .bearer_auth(token);
    if let Some(body) = body {
        request = request.json(&body);
    }
    let response = request.send().await.unwrap();
    (response.status(), response.text().await.unwrap())
}

async fn each_token_acts_within_its_role_and_its_rows_name_it(kind: DbKind) {
    let db = TestDb::new(kind).await;
    // A row from before admins had names.
    let old = AuditEvent::new(
        Action::Admin,
        tollgate::audit::AuditDecision::Unblock,
        "admin_unblock",
        &Subject::new(SubjectKind::User, "bob"),
    );
    db.connect()
        .await
        .insert(std::slice::from_ref(&old), 7)
        .await
        .unwrap();
    let app = app_with_tokens(&db).await;
    let unblock = "/admin/api/subjects/user/alice/unblock";
    let entry = json!({"list": "block", "value": "198.51.100.0/24", "note": "abuse"});

    // What each may do; every refusal is a 403 `forbidden`.
    let cases: [(&str, &str, &str, Option<Value>, StatusCode); 13] = [
        (WATCHER, "GET", "/admin/api/events", None, StatusCode::OK),
        (
            WATCHER,
            "GET",
            "/admin/api/subjects/user/alice",
            None,
            StatusCode::OK,
        ),
        (WATCHER, "GET", "/admin/api/lists", None, StatusCode::OK),
        (WATCHER, "POST", unblock, None, StatusCode::FORBIDDEN),
        (
            WATCHER,
            "POST",
            "/admin/api/lists/ip",
            Some(entry.clone()),
            StatusCode::FORBIDDEN,
        ),
        (
            WATCHER,
            "GET",
            "/admin/api/events.csv",
            None,
            StatusCode::FORBIDDEN,
        ),
        (ONCALL, "POST", unblock, None, StatusCode::OK),
        (
            ONCALL,
            "POST",
            "/admin/api/lists/ip",
            Some(entry.clone()),
            StatusCode::CREATED,
        ),
        (
            ONCALL,
            "GET",
            "/admin/api/events.csv",
            None,
            StatusCode::FORBIDDEN,
        ),
        (
            AUDIT,
            "GET",
            "/admin/api/events.csv?action=admin&limit=7",
            None,
            StatusCode::OK,
        ),
        (AUDIT, "POST", unblock, None, StatusCode::FORBIDDEN),
        // The plain-string token: everything, as before roles.
        (ADMIN_TOKEN, "POST", unblock, None, StatusCode::OK),
        (
            ADMIN_TOKEN,
            "GET",
            "/admin/api/events.csv",
            None,
            StatusCode::OK,
        ),
    ];
    for (token, method, path, body, expected) in cases {
        let (status, text) = call(&app, token, method, path, body).await;
        assert_eq!(status, expected, "{method} {path} as {token}: {text}");
        if status == StatusCode::FORBIDDEN {
            let body: Value = serde_json::from_str(&text).unwrap();
            assert_eq!(body["error"], "forbidden", "{text}");
        }
    }

    let rows = db.trail(&app).await;
    let seen: Vec<(&str, &str, &str, Option<&str>)> = rows
        .iter()
        .filter(|e| e.action == Action::Admin)
        .map(|e| {
            (
                e.decision.as_str(),
                e.reason.as_str(),
                e.actor.as_deref().unwrap_or("-"),
                e.rule.as_deref(),
            )
        })
        .collect();
    assert_eq!(
        seen,
        [
            ("export", "csv_export", "token:1", Some("all")),
            ("unblock", "admin_unblock", "token:1", None),
            (
                "deny",
                "forbidden",
                "token:audit",
                Some("unblock needs operator")
            ),
            (
                "export",
                "csv_export",
                "token:audit",
                Some("action=admin&limit=7")
            ),
            (
                "deny",
                "forbidden",
                "token:oncall",
                Some("export_csv needs auditor")
            ),
            ("list_add", "block_list", "token:oncall", None),
            ("unblock", "admin_unblock", "token:oncall", None),
            (
                "deny",
                "forbidden",
                "token:watcher",
                Some("export_csv needs auditor")
            ),
            (
                "deny",
                "forbidden",
                "token:watcher",
                Some("edit_lists needs operator")
            ),
            (
                "deny",
                "forbidden",
                "token:watcher",
                Some("unblock needs operator")
            ),
            ("unblock", "admin_unblock", "-", None),
        ]
    );

    // The API: the actor in each event, null on the old row, and a filter.
    let (_, text) = call(
        &app,
        WATCHER,
        "GET",
        "/admin/api/events?actor=token%3Aoncall",
        None,
    )
    .await;
    let body: Value = serde_json::from_str(&text).unwrap();
    let theirs: Vec<(&str, &str)> = body["events"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| {
            (
                e["decision"].as_str().unwrap(),
                e["actor"].as_str().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        theirs,
        [
            ("deny", "token:oncall"),
            ("list_add", "token:oncall"),
            ("unblock", "token:oncall")
        ]
    );
    let (_, text) = call(
        &app,
        WATCHER,
        "GET",
        "/admin/api/events?subject_kind=user&subject=bob",
        None,
    )
    .await;
    let body: Value = serde_json::from_str(&text).unwrap();
    assert_eq!(body["events"][0]["id"], old.id.to_string());
    assert_eq!(body["events"][0]["actor"], Value::Null, "{body}");
    for bad in ["actor=", "actor=a%0Ab"] {
        let (status, _) = call(
            &app,
            WATCHER,
            "GET",
            &format!("/admin/api/events?{bad}"),
            None,
        )
        .await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{bad}");
    }
    // CSV: the actor is the last column, and filters too.
    let (_, csv) = call(
        &app,
        AUDIT,
        "GET",
        "/admin/api/events.csv?actor=token%3Awatcher",
        None,
    )
    .await;
    let lines: Vec<&str> = csv.lines().collect();
    assert!(lines[0].ends_with(",shadow,actor"), "{}", lines[0]);
    assert_eq!(lines.len(), 4, "{csv}");
    assert!(
        lines[1..]
            .iter()
            .all(|l| l.ends_with(",false,token:watcher")),
        "{csv}"
    );
}

/// A database of the version before the `actor` column: its rows stay,
/// with no actor, once migrated.
async fn rows_written_before_the_actor_column_read_back_without_one(kind: DbKind) {
    let db = TestDb::new(kind).await;
    let first = match kind {
        DbKind::Postgres => {
            include_str!("../../migrations/postgres/20261122000001_audit_events.sql")
        }
        DbKind::Sqlite => include_str!("../../migrations/sqlite/20261122000001_audit_events.sql"),
    };
    let id = uuid::Uuid::now_v7();
    let insert = "INSERT INTO audit_events (id, occurred_at, action, decision, reason, subject_kind, subject, shadow) \
                  VALUES ($1, $2, 'admin', 'unblock', 'admin_unblock', 'user', 'carol', false)";
    match AuditDb::connect_lazy(&db.url).unwrap() {
        AuditDb::Postgres(pool) => {
            sqlx::raw_sql(first).execute(&pool).await.unwrap();
            sqlx::query(insert)
                .bind(id)
                .bind(chrono::Utc::now())
                .execute(&pool)
                .await
                .unwrap();
        }
        AuditDb::Sqlite(pool) => {
            sqlx::raw_sql(first).execute(&pool).await.unwrap();
            let at = chrono::Utc::now()
                .format("%Y-%m-%dT%H:%M:%S%.3fZ")
                .to_string();
            sqlx::query(insert)
                .bind(id.to_string())
                .bind(at)
                .execute(&pool)
                .await
                .unwrap();
        }
    }
    let migrated = db.connect().await;
    let rows = migrated.page(&Default::default(), None, 10).await.unwrap();
    assert_eq!(rows.len(), 1);
    assert_eq!((rows[0].id, rows[0].actor.clone()), (id, None));
    // And new rows keep theirs.
    let mut named = AuditEvent::new(
        Action::Admin,
        tollgate::audit::AuditDecision::Unblock,
        "admin_unblock",
        &Subject::new(SubjectKind::User, "dan"),
    );
    named.actor = Some("oidc:ann@example.com".into());
    migrated.insert(&[named.clone()], 7).await.unwrap();
    let filter = tollgate::audit::query::EventFilter {
        actor: Some("oidc:ann@example.com".into()),
        ..Default::default()
    };
    let found = migrated.page(&filter, None, 10).await.unwrap();
    assert_eq!(found, [named]);
}

on_both_databases!(
    each_token_acts_within_its_role_and_its_rows_name_it,
    rows_written_before_the_actor_column_read_back_without_one,
);

async fn page(app: &TestApp, token: &str, path: &str) -> (StatusCode, String) {
    let response = app
        .client
        .get(format!("{}{path}", app.address))
        .basic_auth("admin", Some(token))
        .send()
        .await
        .unwrap();
    (response.status(), response.text().await.unwrap())
}

/// The events page's "Export these events as CSV" link, unescaped.
fn export_link(events: &str) -> Option<String> {
    let start = events.find("href=\"/admin/events.csv")? + "href=\"".len();
    let end = start + events[start..].find('"')?;
    Some(
        events[start..end]
            .replace("&#38;", "&")
            .replace("&amp;", "&"),
    )
}

#[tokio::test]
async fn the_console_hides_what_a_role_may_not_use_and_refuses_it_anyway() {
    let db = TestDb::new(DbKind::Sqlite).await;
    let app = app_with_tokens(&db).await;
    let (status, subject) = page(&app, WATCHER, "/admin/subjects/user/alice").await;
    assert_eq!(status, StatusCode::OK, "{subject}");
    assert!(
        subject.contains("token:watcher"),
        "the header names the admin"
    );
    assert!(
        !subject.contains("class=\"unblock\""),
        "no Unblock form for a viewer"
    );
    assert!(subject.contains("Unblocking needs the operator role."));
    let (status, subject) = page(&app, ONCALL, "/admin/subjects/user/alice").await;
    assert_eq!(status, StatusCode::OK, "{subject}");
    assert!(
        subject.contains("class=\"unblock\""),
        "an operator's Unblock form"
    );
    let (status, lists) = page(&app, WATCHER, "/admin/lists").await;
    assert_eq!(status, StatusCode::OK, "{lists}");
    assert!(
        !lists.contains("action=\"/admin/lists\""),
        "no Add form for a viewer"
    );
    let (status, lists) = page(&app, ONCALL, "/admin/lists").await;
    assert_eq!(status, StatusCode::OK, "{lists}");
    assert!(lists.contains("action=\"/admin/lists\""));
    let mut links = Vec::new();
    for (token, export) in [
        (WATCHER, false),
        (ONCALL, false),
        (AUDIT, true),
        (ADMIN_TOKEN, true),
    ] {
        // A page size of one: the export is the whole filter all the same.
        let (status, events) = page(&app, token, "/admin?decision=lock&limit=1").await;
        assert_eq!(status, StatusCode::OK, "{events}");
        let link = export_link(&events);
        assert_eq!(link.is_some(), export, "{token}");
        links.extend(link.map(|link| (token, link)));
    }
    let audit_link = &links[0].1;
    assert!(
        audit_link.starts_with("/admin/events.csv?decision=lock&csrf="),
        "{audit_link}"
    );
    let (status, csv) = page(&app, AUDIT, &format!("{audit_link}&subject=")).await;
    assert_eq!(status, StatusCode::OK);
    assert!(csv.starts_with("id,occurred_at,"), "{csv}");
    // Without the link's token, or with another admin's, a browser that
    // sends no `Sec-Fetch-Site` cannot tell the link from another site's:
    // refused, and nothing is exported in the admin's name.
    let others_link = &links[1].1;
    for path in [
        "/admin/events.csv?decision=lock".to_string(),
        "/admin/events.csv?decision=lock&csrf=1.00".to_string(),
        others_link.clone(),
    ] {
        let (status, body) = page(&app, AUDIT, &path).await;
        assert_eq!(status, StatusCode::FORBIDDEN, "{path}");
        assert!(body.contains("CSRF token"), "{body}");
    }
    let (status, _) = page(&app, WATCHER, "/admin/events.csv").await;
    assert_eq!(status, StatusCode::FORBIDDEN);

    // Posted anyway: 403, nothing changes, the refusal is audited as theirs.
    let posted = app
        .client
        .post(format!("{}/admin/subjects/user/alice/unblock", app.address))
        .basic_auth("admin", Some(WATCHER))
        .form(&[("csrf", "none")])
        .send()
        .await
        .unwrap();
    assert_eq!(posted.status(), StatusCode::FORBIDDEN);
    assert!(posted
        .text()
        .await
        .unwrap()
        .contains("your role may not unblock"));
    // From another origin, another site's or a sibling subdomain's:
    // refused without a row in the admin's name.
    for origin in ["cross-site", "same-site"] {
        let cross = app
            .client
            .post(format!("{}/admin/lists", app.address))
            .basic_auth("admin", Some(WATCHER))
            .header("sec-fetch-site", origin)
            .form(&[
                ("csrf", "none"),
                ("list", "block"),
                ("kind", "ip"),
                ("value", "192.0.2.1"),
            ])
            .send()
            .await
            .unwrap();
        assert_eq!(cross.status(), StatusCode::FORBIDDEN, "{origin}");
    }
    // An export is audited in the admin's name, so another origin's link
    // or image may not fetch one either, whatever the role.
    for token in [AUDIT, WATCHER] {
        for origin in ["cross-site", "same-site"] {
            let cross = app
                .client
                .get(format!("{}/admin/events.csv?decision=deny", app.address))
                .basic_auth("admin", Some(token))
                .header("sec-fetch-site", origin)
                .send()
                .await
                .unwrap();
            assert_eq!(cross.status(), StatusCode::FORBIDDEN, "{token} {origin}");
        }
    }
    let rows = db.trail(&app).await;
    let refusals: Vec<(&str, &str, Option<&str>)> = rows
        .iter()
        .filter(|e| e.reason == "forbidden")
        .map(|e| {
            (
                e.actor.as_deref().unwrap(),
                e.subject.as_str(),
                e.rule.as_deref(),
            )
        })
        .collect();
    assert_eq!(
        refusals,
        [
            ("token:watcher", "alice", Some("unblock needs operator")),
            (
                "token:watcher",
                "events.csv",
                Some("export_csv needs auditor")
            ),
        ]
    );
    let exports: Vec<_> = rows.iter().filter(|e| e.reason == "csv_export").collect();
    assert_eq!(exports.len(), 1, "only the export from the console itself");
    assert_eq!(
        (exports[0].actor.as_deref(), exports[0].rule.as_deref()),
        (Some("token:audit"), Some("decision=lock"))
    );
}

#[test]
fn named_tokens_load_from_a_file_and_from_the_environment() {
    let file = crate::support::app::load_config(
        r#"
[server]
admin_tokens = ["plain-token-0123456789", { name = "oncall", token = "oncall-token-0123456789", role = "operator" }]
"#,
    )
    .expect("loads");
    assert_eq!(
        file.server.admin_tokens[1],
        named("oncall", ONCALL, Role::Operator)
    );
    let (ok, stdout, stderr) = crate::support::app::run_binary(
        &["check-config"],
        &[(
            "TOLLGATE__SERVER__ADMIN_TOKENS",
            r#"[{ name = "watcher", token = "watcher-token-0123456789", role = "viewer" }, plain-token-0123456789]"#,
        )],
    );
    assert!(ok, "{stderr}");
    assert!(
        !stdout.contains("0123456789"),
        "tokens are masked: {stdout}"
    );
    assert!(
        stdout.contains("name = \"watcher\"") && stdout.contains("role = \"viewer\""),
        "{stdout}"
    );
    for (toml, key) in [
        (
            r#"admin_tokens = [{ name = "a b", token = "x-token-0123456789", role = "viewer" }]"#,
            "`server.admin_tokens[0].name`",
        ),
        (
            r#"admin_tokens = ["plain-token-0123456789", { name = "1", token = "x-token-0123456789", role = "viewer" }]"#,
            "`server.admin_tokens[1].name`",
        ),
        (
            r#"admin_tokens = [{ name = "a", token = "short", role = "viewer" }]"#,
            "`server.admin_tokens[0]`",
        ),
        (
            r#"admin_tokens = [{ name = "a", token = "x-token-0123456789", role = "root" }]"#,
            "server.admin_tokens[0]",
        ),
        // One secret under two names: whoever holds it would be the second
        // admin, with its roles, for the first's token.
        (
            r#"admin_tokens = [{ name = "dash", token = "x-token-0123456789", role = "viewer" }, { name = "ops", token = "x-token-0123456789", role = "operator" }]"#,
            "`server.admin_tokens[1]`: is the same secret as server.admin_tokens[0]",
        ),
    ] {
        let error = crate::support::app::config_error(&format!("[server]\n{toml}\n"));
        assert!(error.contains(key), "{toml}: {error}");
    }
}
