//! Bad input at the edge: error codes, the fields the OpenAPI document
//! allows, body limits, content types, unknown routes and methods.

use serde_json::{json, Value};

use crate::support::app::{spawn_app, Backend};

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
    let authed = |r: reqwest::RequestBuilder| r.bearer_auth(crate::support::app::API_KEY);

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
/// `image/json` and `+json` types answer 415 and send nothing, on every
/// public POST route; the 415 carries the request's id like any answer.
#[tokio::test]
async fn only_application_json_is_accepted() {
    let app = spawn_app(Backend::Memory, |_| {}).await;
    let body = json!({ "phone": PHONE }).to_string();
    for (path, kind, expected) in [
        ("/sms/send", "text/json", 415),
        ("/sms/send", "image/json", 415),
        ("/sms/send", "application/merge-patch+json", 415),
        ("/sms/verify", "text/json", 415),
        ("/login/check", "text/json", 415),
        ("/login/attempt", "text/plain", 415),
        ("/sms/send", "application/json; charset=utf-8", 200),
        ("/sms/send", "Application/JSON", 200),
        // White space around the `;` is allowed (RFC 9110 §8.3).
        ("/login/check", "application/json ; charset=utf-8", 200),
        ("/login/check", "application/json\t;x=y", 200),
        ("/login/check", "application/json ", 200),
        ("/login/check", "application/jsonx", 415),
        ("/login/check", "application/json-seq", 415),
    ] {
        let body = match path {
            "/login/check" => json!({ "user": "alice" }).to_string(),
            "/login/attempt" => json!({ "user": "alice", "success": false }).to_string(),
            "/sms/verify" => json!({ "phone": PHONE, "code": "123456" }).to_string(),
            _ => body.clone(),
        };
        let answer = app
            .send_raw(
                app.client
                    .post(format!("{}{path}", app.address))
                    .bearer_auth(crate::support::app::API_KEY)
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
            assert!(
                answer.headers.contains_key("x-request-id"),
                "{path} {kind}: a 415 without its request id"
            );
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
    // The console's routes too, once the admin is let in.
    for (method, path, allow) in [
        ("GET", "/admin/logout", "POST"),
        ("PUT", "/admin", "GET"),
        ("GET", "/admin/subjects/user/alice/unblock", "POST"),
        ("DELETE", "/admin/lists", "GET, POST"),
        ("PUT", "/admin/overview", "GET"),
        ("POST", "/admin/events.csv", "GET"),
        ("GET", "/admin/lists/1/delete", "POST"),
        ("POST", "/admin/login", "GET"),
        ("PUT", "/admin/oidc/callback", "GET"),
    ] {
        let method = reqwest::Method::from_bytes(method.as_bytes()).unwrap();
        let answer = app
            .send_raw(
                app.client
                    .request(method.clone(), format!("{}{path}", app.address))
                    .basic_auth("admin", Some(crate::support::app::ADMIN_TOKEN)),
            )
            .await;
        assert_eq!(
            (answer.status.as_u16(), answer.error()),
            (405, "method_not_allowed"),
            "{method} {path}"
        );
        assert_eq!(
            answer.headers.get("allow").and_then(|v| v.to_str().ok()),
            Some(allow),
            "{method} {path}"
        );
    }
}

/// POST `chunks` to `path` as a chunked body, each chunk its own write a
/// little apart (so the server reads them one by one), with `extra` head
/// lines, and the last chunk's terminator only when `finish`; the answer,
/// read to the close the head asks for (or the server's own close, after
/// a refusal). Writes stop at the first the server refuses.
async fn post_in_chunks(
    app: &crate::support::app::TestApp,
    path: &str,
    extra: &str,
    chunks: &[&[u8]],
    finish: bool,
) -> crate::connections::Raw {
    use tokio::io::AsyncWriteExt;
    let to = crate::connections::socket_addr(&app.address);
    let stream = crate::connections::connect_from("127.0.0.1", to, None).await;
    let (mut read, mut write) = stream.into_split();
    let head = format!(
        "POST {path} HTTP/1.1\r\nHost: tollgate\r\nAuthorization: Bearer {}\r\n\
         Content-Type: application/json\r\nTransfer-Encoding: chunked\r\n{extra}\
         Connection: close\r\n\r\n",
        crate::support::app::API_KEY
    );
    let mut frames = vec![head.into_bytes()];
    for chunk in chunks {
        let mut framed = format!("{:x}\r\n", chunk.len()).into_bytes();
        framed.extend_from_slice(chunk);
        framed.extend_from_slice(b"\r\n");
        frames.push(framed);
    }
    if finish {
        frames.push(b"0\r\n\r\n".to_vec());
    }
    // The writer stays open until the answer is read: an unfinished body
    // is the server's to cut short, not a half-closed socket's.
    let writer = tokio::spawn(async move {
        for frame in frames {
            if write.write_all(&frame).await.is_err() || write.flush().await.is_err() {
                break;
            }
            tokio::time::sleep(std::time::Duration::from_millis(30)).await;
        }
        write
    });
    let answer = crate::connections::read_to_close(&mut read).await;
    writer.abort();
    answer
}

/// A login check's body, padded with spaces to `len` bytes.
fn padded_check(len: usize) -> Vec<u8> {
    let mut body = br#"{"user":"padded"}"#.to_vec();
    body.resize(len, b' ');
    body
}

/// A JSON body is read whole whatever its chunks (the extractor parses a
/// one-chunk body in place and joins the others), up to 16 KiB and not a
/// byte more, is refused 413 as soon as its chunks pass the limit without
/// a declared length, and is refused 415 unread when it is compressed.
#[tokio::test]
async fn a_body_in_chunks_or_compressed_reads_as_one_and_keeps_its_limit() {
    use std::io::Write;
    let app = spawn_app(Backend::Memory, |_| {}).await;

    // Each way of cutting it a user of its own: three failures of one
    // would ask the fourth for a captcha.
    let failure = |user: &str| format!(r#"{{"user":"{user}","success":false}}"#).into_bytes();
    for (user, size) in [("whole", 64), ("halves", 17), ("threes", 3)] {
        let body = failure(user);
        let pieces: Vec<&[u8]> = body.chunks(size).collect();
        let answer = post_in_chunks(&app, "/login/attempt", "", &pieces, true).await;
        assert_eq!(answer.status(), Some(200), "{user}: {answer:?}");
        assert_eq!(answer.json()["failures"], 1, "{user}: {answer:?}");
        let state = app.login_check(json!({ "user": user })).await;
        assert_eq!(state.body["failures"], 1, "{user}: {}", state.body);
    }

    // The limit, in chunks of 4 KiB and no Content-Length: 16,384 bytes
    // pass, one more is refused.
    let limit = 16 * 1024;
    for (len, status) in [(limit, 200), (limit + 1, 413)] {
        let padded = padded_check(len);
        let chunks: Vec<&[u8]> = padded.chunks(4096).collect();
        let answer = post_in_chunks(&app, "/login/check", "", &chunks, true).await;
        assert_eq!(answer.status(), Some(status), "{len} bytes: {answer:?}");
    }
    // Refused once past it, without waiting for a body that never ends.
    let padded = padded_check(limit + 1);
    let chunks: Vec<&[u8]> = padded.chunks(4096).collect();
    let answer = post_in_chunks(&app, "/login/check", "", &chunks, false).await;
    assert_eq!(answer.status(), Some(413), "{answer:?}");
    assert_eq!(answer.json()["error"], "payload_too_large", "{answer:?}");

    // A compressed body is refused unread, however small its JSON: inflated,
    // 16 KiB of gzip would hold some 16 MB before a limit saw it. `identity`
    // is no compression.
    let mut gzip = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    gzip.write_all(&failure("gzipped")).unwrap();
    let packed = gzip.finish().unwrap();
    for (encoding, body) in [
        ("gzip", &packed[..]),
        ("deflate", &b"not deflate"[..]),
        ("br", &b"x"[..]),
    ] {
        let head = format!("Content-Encoding: {encoding}\r\n");
        let answer = post_in_chunks(&app, "/login/attempt", &head, &[body], true).await;
        assert_eq!(answer.status(), Some(415), "{encoding}: {answer:?}");
        assert_eq!(
            answer.json()["error"],
            "unsupported_media_type",
            "{answer:?}"
        );
    }
    let state = app.login_check(json!({ "user": "gzipped" })).await;
    assert_eq!(state.body["failures"], 0, "nothing counted: {}", state.body);
    let plain = failure("identity");
    let answer = post_in_chunks(
        &app,
        "/login/attempt",
        "Content-Encoding: identity\r\n",
        &[&plain],
        true,
    )
    .await;
    assert_eq!(answer.status(), Some(200), "{answer:?}");
    assert_eq!(answer.json()["failures"], 1, "{answer:?}");
}
