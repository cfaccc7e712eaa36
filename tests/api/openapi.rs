//! `GET /openapi.json`: the document lists every route, with its schemas and
//! security; and real answers of the running app match the schemas the
//! document declares for them (the drift check).

use std::collections::{BTreeMap, BTreeSet};

use serde_json::{json, Value};

use crate::support::app::{limits, spawn_app, spawn_app_with_audit_db, Answer, Backend, TestApp};
use crate::support::audit_db::{DbKind, TestDb};

/// Every route of DESIGN.md §3, with its methods; the subject routes once
/// per kind, as the document writes them out.
const ROUTES: [(&str, &str); 30] = [
    ("/sms/send", "post"),
    ("/sms/verify", "post"),
    ("/login/check", "post"),
    ("/login/attempt", "post"),
    ("/admin/api/events", "get"),
    ("/admin/api/events.csv", "get"),
    ("/admin/api/stats", "get"),
    ("/admin/api/lists", "get"),
    ("/admin/api/lists/ip", "post"),
    ("/admin/api/lists/phone", "post"),
    ("/admin/api/lists/user", "post"),
    ("/admin/api/lists/{id}", "delete"),
    ("/admin/api/subjects/phone/{id}", "get"),
    ("/admin/api/subjects/phone/{id}/unblock", "post"),
    ("/admin/api/subjects/prefix/{id}", "get"),
    ("/admin/api/subjects/prefix/{id}/unblock", "post"),
    ("/admin/api/subjects/user/{id}", "get"),
    ("/admin/api/subjects/user/{id}/unblock", "post"),
    ("/admin/api/subjects/ip/{id}", "get"),
    ("/admin/api/subjects/ip/{id}/unblock", "post"),
    ("/admin/api/subjects/network/{id}", "get"),
    ("/admin/api/subjects/network/{id}/unblock", "post"),
    ("/admin/api/subjects/global/{id}", "get"),
    ("/admin/api/subjects/global/{id}/unblock", "post"),
    ("/admin/api/subjects/country/{id}", "get"),
    ("/admin/api/subjects/country/{id}/unblock", "post"),
    ("/healthz", "get"),
    ("/readyz", "get"),
    ("/metrics", "get"),
    ("/openapi.json", "get"),
];

const PUBLIC: [&str; 4] = ["/sms/send", "/sms/verify", "/login/check", "/login/attempt"];

async fn document(app: &TestApp) -> Value {
    let answer = app.get("/openapi.json").await;
    assert_eq!(answer.status, 200, "{}", answer.body);
    assert!(
        answer
            .content_type
            .as_deref()
            .is_some_and(|t| t.starts_with("application/json")),
        "content type {:?}",
        answer.content_type
    );
    assert!(answer.body.is_object(), "not JSON: {}", answer.body);
    answer.body
}

fn operation<'a>(doc: &'a Value, path: &str, method: &str) -> &'a Value {
    let op = &doc["paths"][path][method];
    assert!(
        op.is_object(),
        "{} {path} is not documented",
        method.to_uppercase()
    );
    op
}

/// Follows `#/components/schemas/...` references.
fn resolve<'a>(doc: &'a Value, schema: &'a Value) -> &'a Value {
    match schema["$ref"].as_str() {
        Some(reference) => {
            let name = reference
                .strip_prefix("#/components/schemas/")
                .unwrap_or_else(|| panic!("unexpected $ref {reference}"));
            let target = &doc["components"]["schemas"][name];
            assert!(target.is_object(), "dangling $ref {reference}");
            resolve(doc, target)
        }
        None => schema,
    }
}

/// A schema with its `allOf` parts merged: the properties (each with every
/// schema that declares it), the required names, the types and the enum.
#[derive(Default)]
struct Flat<'a> {
    properties: BTreeMap<String, Vec<&'a Value>>,
    required: BTreeSet<String>,
    types: Option<BTreeSet<String>>,
    enumeration: Option<Vec<Value>>,
    items: Option<&'a Value>,
    object: bool,
}

fn flatten<'a>(doc: &'a Value, schema: &'a Value, flat: &mut Flat<'a>) {
    let schema = resolve(doc, schema);
    assert!(
        schema.get("oneOf").is_none() && schema.get("anyOf").is_none(),
        "the checker does not handle oneOf/anyOf: {schema}"
    );
    for part in schema["allOf"].as_array().into_iter().flatten() {
        flatten(doc, part, flat);
    }
    if let Some(properties) = schema["properties"].as_object() {
        flat.object = true;
        for (name, property) in properties {
            flat.properties
                .entry(name.clone())
                .or_default()
                .push(property);
        }
    }
    for name in schema["required"].as_array().into_iter().flatten() {
        flat.required.insert(name.as_str().unwrap().to_string());
    }
    let types: Option<BTreeSet<String>> = match &schema["type"] {
        Value::String(t) => Some([t.clone()].into()),
        Value::Array(ts) => Some(ts.iter().map(|t| t.as_str().unwrap().to_string()).collect()),
        _ => None,
    };
    if let Some(types) = types {
        flat.object |= types.contains("object");
        flat.types = Some(match flat.types.take() {
            Some(known) => known.intersection(&types).cloned().collect(),
            None => types,
        });
    }
    if let Some(values) = schema["enum"].as_array() {
        flat.enumeration = Some(values.clone());
    }
    if schema.get("items").is_some() {
        flat.items = Some(&schema["items"]);
    }
}

fn json_type_matches(value: &Value, ty: &str) -> bool {
    match ty {
        "null" => value.is_null(),
        "boolean" => value.is_boolean(),
        "string" => value.is_string(),
        "integer" => value.is_i64() || value.is_u64(),
        "number" => value.is_number(),
        "array" => value.is_array(),
        "object" => value.is_object(),
        other => panic!("unknown schema type {other}"),
    }
}

/// Every field of `value` is declared by `schema`, every required field is
/// present, and types and enums agree, all the way down.
fn check(doc: &Value, schema: &Value, value: &Value, at: &str, errors: &mut Vec<String>) {
    let mut flat = Flat::default();
    flatten(doc, schema, &mut flat);
    if let Some(types) = &flat.types {
        if !types.iter().any(|t| json_type_matches(value, t)) {
            errors.push(format!("{at}: {value} is not of type {types:?}"));
            return;
        }
    }
    if let Some(values) = &flat.enumeration {
        if !values.contains(value) {
            errors.push(format!("{at}: {value} is not one of {values:?}"));
        }
    }
    match value {
        Value::Object(fields) => {
            assert!(flat.object, "{at}: the schema does not describe an object");
            for (name, field) in fields {
                match flat.properties.get(name) {
                    Some(schemas) => {
                        for schema in schemas {
                            check(doc, schema, field, &format!("{at}.{name}"), errors);
                        }
                    }
                    None => errors.push(format!("{at}.{name}: returned but not declared")),
                }
            }
            for name in &flat.required {
                if !fields.contains_key(name) {
                    errors.push(format!("{at}.{name}: required but missing"));
                }
            }
        }
        Value::Array(items) => {
            let schema = flat
                .items
                .unwrap_or_else(|| panic!("{at}: an array schema without items"));
            for (i, item) in items.iter().enumerate() {
                check(doc, schema, item, &format!("{at}[{i}]"), errors);
            }
        }
        _ => {}
    }
}

/// The answer matches what the document declares for `method path` and the
/// answer's status: a documented status, a JSON body matching its schema, and
/// the documented headers.
fn assert_documented(doc: &Value, method: &str, path: &str, answer: &Answer) {
    let status = answer.status.as_u16().to_string();
    let response = &operation(doc, path, method)["responses"][&status];
    assert!(
        response.is_object(),
        "{method} {path}: status {status} is not documented (body {})",
        answer.body
    );
    assert!(
        answer
            .content_type
            .as_deref()
            .is_some_and(|t| t.starts_with("application/json")),
        "{method} {path} {status}: content type {:?}",
        answer.content_type
    );
    let schema = &response["content"]["application/json"]["schema"];
    assert!(
        schema.is_object(),
        "{method} {path} {status}: no application/json schema in {response}"
    );
    let mut errors = Vec::new();
    check(doc, schema, &answer.body, "$", &mut errors);
    assert!(
        errors.is_empty(),
        "{method} {path} {status}: the answer {} does not match the document:\n{}",
        answer.body,
        errors.join("\n")
    );
    if response["headers"].get("Retry-After").is_some() {
        assert!(
            answer.retry_after.is_some(),
            "{method} {path} {status}: Retry-After is documented but missing"
        );
    }
}

#[tokio::test]
async fn the_document_is_openapi_3_json_without_authentication() {
    let mut app = spawn_app(Backend::Memory, |_| {}).await;
    app.api_key = None;
    app.admin_token = None;
    let doc = document(&app).await;
    let version = doc["openapi"].as_str().expect("an `openapi` version");
    assert!(version.starts_with("3."), "openapi {version}");
    assert_eq!(doc["info"]["title"], "tollgate");
    assert!(doc["info"]["version"].is_string());
}

#[tokio::test]
async fn every_route_is_documented_with_its_methods_and_nothing_else() {
    let app = spawn_app(Backend::Memory, |_| {}).await;
    let doc = document(&app).await;
    let mut expected: BTreeMap<&str, BTreeSet<&str>> = BTreeMap::new();
    for (path, method) in ROUTES {
        expected.entry(path).or_default().insert(method);
    }
    let paths = doc["paths"].as_object().expect("paths");
    let documented: BTreeMap<&str, BTreeSet<&str>> = paths
        .iter()
        .map(|(path, ops)| {
            let methods = ops
                .as_object()
                .unwrap()
                .keys()
                .map(String::as_str)
                .filter(|k| ["get", "post", "put", "patch", "delete"].contains(k))
                .collect();
            (path.as_str(), methods)
        })
        .collect();
    assert_eq!(documented, expected);

    for (path, method) in ROUTES {
        let op = operation(&doc, path, method);
        let responses = op["responses"].as_object().expect("responses");
        assert!(
            responses.keys().any(|s| s.starts_with('2')),
            "{method} {path}: no success status"
        );
        for (status, response) in responses {
            assert!(
                response["description"]
                    .as_str()
                    .is_some_and(|d| !d.is_empty()),
                "{method} {path} {status}: no description"
            );
            if !status.starts_with('2') {
                let schema = &response["content"]["application/json"]["schema"];
                assert!(
                    schema.is_object(),
                    "{method} {path} {status}: no error schema"
                );
            }
        }
        let body = &op["requestBody"]["content"]["application/json"]["schema"];
        if method == "post" && !path.ends_with("/unblock") {
            // deny_unknown_fields: unknown fields answer 400.
            let body = resolve(&doc, body);
            assert_eq!(
                body["additionalProperties"],
                json!(false),
                "{path}: request body {body}"
            );
            for status in ["400", "413", "415"] {
                assert!(responses.contains_key(status), "{path}: no {status}");
            }
        } else {
            assert!(body.is_null(), "{method} {path} takes no body");
        }
    }

    for kind in [
        "phone", "prefix", "user", "ip", "network", "global", "country",
    ] {
        let subject = operation(&doc, &format!("/admin/api/subjects/{kind}/{{id}}"), "get");
        let params: Vec<&Value> = subject["parameters"]
            .as_array()
            .expect("path parameters")
            .iter()
            .collect();
        assert_eq!(params.len(), 1, "{kind}: {params:?}");
        assert_eq!(
            (&params[0]["name"], &params[0]["in"]),
            (&json!("id"), &json!("path"))
        );
        assert!(
            params[0]["schema"].is_object(),
            "{kind}: the id has a schema of its kind"
        );
    }
    // Each kind's id is described by its own parser's form.
    let id_schema = |kind: &str| {
        operation(&doc, &format!("/admin/api/subjects/{kind}/{{id}}"), "get")["parameters"][0]
            ["schema"]
            .clone()
    };
    assert_eq!(id_schema("phone")["format"], "phone");
    assert_eq!(
        id_schema("ip")["pattern"],
        json!(*tollgate::domain::client_ip::SUBJECT_PATTERN)
    );
    assert_eq!(
        id_schema("user")["pattern"],
        json!(*tollgate::domain::username::PATTERN)
    );
    assert_eq!(id_schema("user")["maxLength"], 256);
    assert_eq!(id_schema("global")["enum"], json!(["sms_send"]));
    assert_eq!(id_schema("country")["pattern"], "^[A-Za-z]{2}$");
    assert_eq!(
        id_schema("network")["pattern"],
        json!(*tollgate::domain::client_ip::NETWORK_PATTERN)
    );

    let events = operation(&doc, "/admin/api/events", "get");
    let query: BTreeSet<&str> = events["parameters"]
        .as_array()
        .expect("query parameters")
        .iter()
        .inspect(|p| assert_eq!(p["in"], "query", "{p}"))
        .map(|p| p["name"].as_str().unwrap())
        .collect();
    let design = [
        "subject_kind",
        "subject",
        "action",
        "decision",
        "ip",
        "since",
        "until",
        "limit",
        "cursor",
        // Not in DESIGN.md: the admin who acted (issue 20).
        "actor",
    ];
    assert_eq!(query, design.into());
}

#[tokio::test]
async fn rate_limited_answers_reference_the_error_schema_and_retry_after() {
    let app = spawn_app(Backend::Memory, |_| {}).await;
    let doc = document(&app).await;
    let response = &operation(&doc, "/sms/send", "post")["responses"]["429"];
    let schema = &response["content"]["application/json"]["schema"];
    let resolved = resolve(&doc, schema);
    let references_error = schema["$ref"] == "#/components/schemas/Error"
        || resolved["allOf"]
            .as_array()
            .into_iter()
            .flatten()
            .any(|part| part["$ref"] == "#/components/schemas/Error");
    assert!(references_error, "429 schema {schema} → {resolved}");
    let mut flat = Flat::default();
    flatten(&doc, schema, &mut flat);
    for field in ["error", "message", "retry_after_secs", "rule"] {
        assert!(
            flat.required.contains(field),
            "429 does not require {field}"
        );
    }
    assert!(
        response["headers"]["Retry-After"]["schema"]["type"] == "integer",
        "Retry-After header: {response}"
    );

    let error = &doc["components"]["schemas"]["Error"];
    let codes = resolve(&doc, &error["properties"]["error"])["enum"]
        .as_array()
        .expect("the error codes as an enum")
        .clone();
    for code in [
        "invalid_request",
        "invalid_phone",
        "rate_limited",
        "captcha_required",
        "region_blocked",
        "unauthorized",
        "store_unavailable",
        "delivery_failed",
        "not_found",
        "payload_too_large",
        "unsupported_media_type",
    ] {
        assert!(codes.contains(&json!(code)), "{code} is not in {codes:?}");
    }
}

#[tokio::test]
async fn login_state_has_exactly_the_six_design_fields() {
    let app = spawn_app(Backend::Memory, |_| {}).await;
    let doc = document(&app).await;
    let schema = &operation(&doc, "/login/attempt", "post")["responses"]["200"]["content"]
        ["application/json"]["schema"];
    assert_eq!(schema["$ref"], "#/components/schemas/LoginState");
    let state = resolve(&doc, schema);
    let fields: BTreeSet<&str> = state["properties"]
        .as_object()
        .unwrap()
        .keys()
        .map(String::as_str)
        .collect();
    let design = [
        "decision",
        "captcha_required",
        "locked",
        "retry_after_secs",
        "failures",
        "reason",
    ];
    assert_eq!(fields, design.into());
    let required: BTreeSet<&str> = state["required"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r.as_str().unwrap())
        .collect();
    assert_eq!(required, design.into(), "every field is always present");
    let decision = resolve(&doc, &state["properties"]["decision"]);
    assert_eq!(decision["enum"], json!(["allow", "challenge", "deny"]));
}

#[tokio::test]
async fn public_and_admin_routes_use_separate_bearer_schemes() {
    let app = spawn_app(Backend::Memory, |_| {}).await;
    let doc = document(&app).await;
    let schemes = doc["components"]["securitySchemes"]
        .as_object()
        .expect("security schemes");
    assert_eq!(schemes.len(), 3, "{schemes:?}");
    for name in ["api_key", "admin_token", "oidc_jwt"] {
        assert_eq!(schemes[name]["type"], "http", "{name}");
        assert_eq!(schemes[name]["scheme"], "bearer", "{name}");
    }
    assert_eq!(schemes["oidc_jwt"]["bearerFormat"], "JWT");
    let names = |op: &Value| -> BTreeSet<String> {
        op["security"]
            .as_array()
            .into_iter()
            .flatten()
            .flat_map(|req| req.as_object().unwrap().keys().cloned())
            .collect()
    };
    for (path, method) in ROUTES {
        let op = operation(&doc, path, method);
        let expected: BTreeSet<String> = if PUBLIC.contains(&path) {
            ["api_key".to_string()].into()
        } else if path.starts_with("/admin/") {
            ["admin_token".to_string(), "oidc_jwt".to_string()].into()
        } else {
            BTreeSet::new()
        };
        assert_eq!(names(op), expected, "{method} {path}");
        if !expected.is_empty() {
            assert!(
                op["responses"]["401"].is_object(),
                "{method} {path}: no 401"
            );
        }
    }
}

/// The drift check: real answers of the running app, each against the schema
/// the document declares for its route and status.
#[tokio::test]
async fn real_answers_match_the_documented_schemas() {
    let db = TestDb::new(DbKind::Sqlite).await;
    let (url, spool) = (db.url.clone(), db.spool_dir());
    let app = spawn_app_with_audit_db(Backend::Memory, move |s| {
        s.audit.database_url = tollgate::settings::SecretUrl::new(url);
        s.audit.spool_dir = spool.display().to_string();
        s.sms.phone_limits = limits(&[(1, 3_600_000)]);
        s.sms.max_verify_attempts = 2;
        s.login.captcha_after = 1;
        s.login.lock_after = 2;
    })
    .await;
    let doc = document(&app).await;
    let phone = "+8613800138000";

    // /sms/send: 200, then 429 from the phone rule; 400 for an unknown field.
    let sent = app
        .sms_send(json!({ "phone": phone, "ip": "203.0.113.7" }))
        .await;
    assert_eq!(sent.status, 200, "{}", sent.body);
    assert_documented(&doc, "post", "/sms/send", &sent);
    let denied = app.sms_send(json!({ "phone": phone })).await;
    assert_eq!(denied.status, 429, "{}", denied.body);
    assert_documented(&doc, "post", "/sms/send", &denied);
    let unknown = app.sms_send(json!({ "phone": phone, "extra": 1 })).await;
    assert_eq!(unknown.status, 400, "{}", unknown.body);
    assert_documented(&doc, "post", "/sms/send", &unknown);

    // /sms/verify: a wrong code (attempts_left), the right one, then a burnt code (429).
    let code = app.sms.last_code(phone);
    let wrong = if code == "000000" { "111111" } else { "000000" };
    let answer = app
        .sms_verify(json!({ "phone": phone, "code": wrong }))
        .await;
    assert_eq!(answer.body, json!({ "valid": false, "attempts_left": 1 }));
    assert_documented(&doc, "post", "/sms/verify", &answer);
    let answer = app
        .sms_verify(json!({ "phone": phone, "code": code }))
        .await;
    assert_eq!(answer.body, json!({ "valid": true }));
    assert_documented(&doc, "post", "/sms/verify", &answer);
    let other = "+8613900139000";
    assert_eq!(app.sms_send(json!({ "phone": other })).await.status, 200);
    for _ in 0..2 {
        let answer = app
            .sms_verify(json!({ "phone": other, "code": wrong }))
            .await;
        assert_documented(&doc, "post", "/sms/verify", &answer);
    }
    let burnt = app
        .sms_verify(json!({ "phone": other, "code": wrong }))
        .await;
    assert_eq!(burnt.status, 429, "{}", burnt.body);
    assert_documented(&doc, "post", "/sms/verify", &burnt);

    // /login/attempt and /login/check: allow (nulls), then a lock (values).
    for _ in 0..3 {
        let attempt = app
            .login_attempt(json!({ "user": "alice", "success": false, "captcha_passed": true }))
            .await;
        assert_eq!(attempt.status, 200, "{}", attempt.body);
        assert_documented(&doc, "post", "/login/attempt", &attempt);
    }
    let check = app.login_check(json!({ "user": "alice" })).await;
    assert_eq!(check.body["decision"], "deny", "{}", check.body);
    assert!(check.body["retry_after_secs"].is_u64(), "{}", check.body);
    assert_documented(&doc, "post", "/login/check", &check);
    let fresh = app.login_check(json!({ "user": "bob" })).await;
    assert!(fresh.body["reason"].is_null(), "{}", fresh.body);
    assert_documented(&doc, "post", "/login/check", &fresh);

    // Admin: a subject's state (locked and not), unblock, the events page.
    let locked = app.admin_get("/admin/api/subjects/user/alice").await;
    assert_eq!(locked.status, 200, "{}", locked.body);
    assert!(
        locked.body["pairs"][0]["locked_until"].is_string(),
        "{}",
        locked.body
    );
    assert_documented(&doc, "get", "/admin/api/subjects/user/{id}", &locked);
    let ip = app.admin_get("/admin/api/subjects/ip/203.0.113.7").await;
    assert_documented(&doc, "get", "/admin/api/subjects/ip/{id}", &ip);
    let unblocked = app
        .admin_post("/admin/api/subjects/user/alice/unblock")
        .await;
    assert_eq!(unblocked.status, 200, "{}", unblocked.body);
    assert!(
        unblocked.body["locked_until"].is_null() && unblocked.body.get("pairs").is_none(),
        "{}",
        unblocked.body
    );
    assert_documented(
        &doc,
        "post",
        "/admin/api/subjects/user/{id}/unblock",
        &unblocked,
    );
    let bad_kind = app.admin_get("/admin/api/subjects/planet/earth").await;
    assert_eq!(bad_kind.status, 400, "{}", bad_kind.body);
    let range = app.admin_get("/admin/api/subjects/ip/10.0.0.0%2F8").await;
    assert_eq!(range.status, 400, "{}", range.body);
    assert_documented(&doc, "get", "/admin/api/subjects/ip/{id}", &range);

    app.flush_audit().await;
    let page = app.admin_get("/admin/api/events?limit=1").await;
    assert_eq!(page.status, 200, "{}", page.body);
    assert!(page.body["next_cursor"].is_string(), "{}", page.body);
    assert_documented(&doc, "get", "/admin/api/events", &page);
    let all = app.admin_get("/admin/api/events?limit=500").await;
    assert!(
        all.body["events"].as_array().unwrap().len() > 1,
        "{}",
        all.body
    );
    assert!(all.body["next_cursor"].is_null(), "{}", all.body);
    assert_documented(&doc, "get", "/admin/api/events", &all);
    let bad_limit = app.admin_get("/admin/api/events?limit=501").await;
    assert_eq!(bad_limit.status, 400, "{}", bad_limit.body);
    assert_documented(&doc, "get", "/admin/api/events", &bad_limit);

    let mut anonymous = app.client.get(format!("{}/admin/api/events", app.address));
    anonymous = anonymous.bearer_auth("not-a-token");
    let refused = app.send_raw(anonymous).await;
    assert_eq!(refused.status, 401, "{}", refused.body);
    assert_documented(&doc, "get", "/admin/api/events", &refused);

    for path in ["/healthz", "/readyz"] {
        let answer = app.get(path).await;
        assert_eq!(answer.status, 200, "{path}: {}", answer.body);
        assert_documented(&doc, "get", path, &answer);
    }
}

/// 403 `captcha_required` carries `captcha_required: true`, which the error
/// schema declares.
#[tokio::test]
async fn a_captcha_refusal_matches_the_documented_error() {
    let app = spawn_app(Backend::Memory, |s| s.sms.captcha_after = 1).await;
    let doc = document(&app).await;
    let phone = "+8613800138000";
    assert_eq!(app.sms_send(json!({ "phone": phone })).await.status, 200);
    let refused = app.sms_send(json!({ "phone": phone })).await;
    assert_eq!(refused.status, 403, "{}", refused.body);
    assert_eq!(refused.error(), "captcha_required");
    assert_documented(&doc, "post", "/sms/send", &refused);
}

/// 403 `pumping_suspected`, and the state of a blocked prefix and a
/// challenged country (the `pumping` object), as the document declares them.
#[tokio::test]
async fn a_pumping_refusal_and_a_blocked_range_match_the_document() {
    let app = spawn_app(Backend::Memory, |s| {
        s.sms.pumping.min_sends = 2;
        s.sms.pumping.country_min_sends = 2;
    })
    .await;
    let doc = document(&app).await;
    for phone in ["+8613800138000", "+8613800138001"] {
        assert_eq!(app.sms_send(json!({ "phone": phone })).await.status, 200);
    }
    let refused = app.sms_send(json!({ "phone": "+8613800138002" })).await;
    assert_eq!(refused.status, 403, "{}", refused.body);
    assert_eq!(refused.error(), "pumping_suspected");
    assert_documented(&doc, "post", "/sms/send", &refused);
    for (path, kind, level) in [
        ("/admin/api/subjects/prefix/%2B8613800", "prefix", "block"),
        ("/admin/api/subjects/country/CN", "country", "challenge"),
    ] {
        let state = app.admin_get(path).await;
        assert!(state.body["pumping"][level].is_object(), "{}", state.body);
        assert_documented(
            &doc,
            "get",
            &format!("/admin/api/subjects/{kind}/{{id}}"),
            &state,
        );
        let unblocked = app.admin_post(&format!("{path}/unblock")).await;
        assert_documented(
            &doc,
            "post",
            &format!("/admin/api/subjects/{kind}/{{id}}/unblock"),
            &unblocked,
        );
    }
}

/// The checker itself: it does catch an undeclared field, a missing required
/// field, a wrong type and a value outside an enum.
#[tokio::test]
async fn the_drift_checker_catches_mismatches() {
    let app = spawn_app(Backend::Memory, |_| {}).await;
    let doc = document(&app).await;
    let schema = json!({ "$ref": "#/components/schemas/LoginState" });
    let good = json!({
        "decision": "allow", "captcha_required": false, "locked": false,
        "retry_after_secs": null, "failures": 0, "reason": null
    });
    let errors_for = |value: &Value| {
        let mut errors = Vec::new();
        check(&doc, &schema, value, "$", &mut errors);
        errors
    };
    assert_eq!(errors_for(&good), Vec::<String>::new());
    let mut extra = good.clone();
    extra["surprise"] = json!(1);
    let mut missing = good.clone();
    missing.as_object_mut().unwrap().remove("failures");
    let mut wrong_type = good.clone();
    wrong_type["locked"] = json!("no");
    let mut wrong_enum = good.clone();
    wrong_enum["decision"] = json!("maybe");
    for (bad, expected) in [
        (extra, "$.surprise: returned but not declared"),
        (missing, "$.failures: required but missing"),
        (wrong_type, "$.locked: \"no\" is not of type"),
        (wrong_enum, "$.decision: \"maybe\" is not one of"),
    ] {
        let errors = errors_for(&bad);
        assert!(
            errors.iter().any(|e| e.starts_with(expected)),
            "{expected}: {errors:?}"
        );
    }
    // Through allOf: the 429 schema requires `rule`.
    let schema = json!({ "$ref": "#/components/schemas/RateLimitedError" });
    let mut errors = Vec::new();
    let no_rule = json!({ "error": "rate_limited", "message": "m", "retry_after_secs": 1 });
    check(&doc, &schema, &no_rule, "$", &mut errors);
    assert_eq!(errors, vec!["$.rule: required but missing".to_string()]);
}
