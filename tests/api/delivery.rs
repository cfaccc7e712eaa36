//! The SMS providers against a local HTTP server that checks what they send.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use tollgate::settings::{Secret, Settings, SmsProviderKind};
use wiremock::matchers::{basic_auth, body_string_contains, header, method, path};
use wiremock::{Mock, MockServer, Request, ResponseTemplate};

use crate::support::app::{
    limits, spawn_app, spawn_app_with_sms_provider, Answer, Backend, TestApp,
};

const PHONE: &str = "+8613800138000";
const TWILIO_PATH: &str = "/2010-04-01/Accounts/AC0123456789/Messages.json";

async fn webhook_app(server: &MockServer, timeout: Duration) -> TestApp {
    let url = format!("{}/hooks/sms", server.uri());
    spawn_app_with_sms_provider(Backend::Memory, move |s| {
        s.sms.phone_limits = limits(&[(1, 3_600_000)]);
        s.sms.provider.kind = SmsProviderKind::Webhook;
        s.sms.provider.url = url.into();
        s.sms.provider.headers = BTreeMap::from([
            ("X-Api-Key".to_string(), Secret::new("hook-key")),
            ("X-Tenant".to_string(), Secret::new("acme")),
        ]);
        s.sms.provider.timeout = timeout;
    })
    .await
}

async fn twilio_app(server: &MockServer, timeout: Duration) -> TestApp {
    twilio_app_on(Backend::Memory, server, |s| {
        s.sms.provider.timeout = timeout
    })
    .await
}

/// An app on `backend` texting through Twilio at `server`, one send an hour
/// per phone, then `configure`d.
async fn twilio_app_on(
    backend: Backend,
    server: &MockServer,
    configure: impl FnOnce(&mut Settings),
) -> TestApp {
    // A trailing slash on the base must not double up in the path.
    let url = format!("{}/", server.uri());
    spawn_app_with_sms_provider(backend, move |s| {
        s.sms.phone_limits = limits(&[(1, 3_600_000)]);
        s.sms.provider.kind = SmsProviderKind::Twilio;
        s.sms.provider.url = url.into();
        s.sms.provider.account_sid = "AC0123456789".into();
        s.sms.provider.auth_token = Secret::new("twilio-token");
        s.sms.provider.from = "+15005550006".into();
        configure(s);
    })
    .await
}

/// Every request the provider received.
async fn received(server: &MockServer) -> Vec<Request> {
    server
        .received_requests()
        .await
        .expect("request recording is on")
}

fn form(request: &Request) -> BTreeMap<String, String> {
    form_urlencoded::parse(&request.body).into_owned().collect()
}

fn header_of<'a>(request: &'a Request, name: &str) -> &'a str {
    request
        .headers
        .get(name)
        .and_then(|v| v.to_str().ok())
        .unwrap_or_else(|| panic!("no {name} header"))
}

/// The only run of `len` digits in an SMS body.
fn code_in(body: &str, len: usize) -> String {
    let runs: Vec<&str> = body
        .split(|c: char| !c.is_ascii_digit())
        .filter(|run| run.len() == len)
        .collect();
    assert_eq!(runs.len(), 1, "one {len}-digit code in {body:?}");
    runs[0].to_string()
}

/// Every window of `PHONE` is at 0: nothing was sent, so nothing counts.
async fn assert_the_phone_counts_nothing(app: &TestApp) {
    let state = app
        .admin_get(&format!("/admin/api/subjects/phone/{PHONE}"))
        .await;
    let windows = state.body["windows"].as_array().expect("windows").clone();
    assert!(
        !windows.is_empty() && windows.iter().all(|w| w["count"] == 0),
        "nothing was sent, so nothing counts: {windows:?}"
    );
}

async fn send_with_request_id(app: &TestApp, body: Value, request_id: &str) -> Answer {
    let request = app
        .client
        .post(format!("{}/sms/send", app.address))
        .bearer_auth(app.api_key.as_deref().unwrap())
        .header("x-request-id", request_id)
        .json(&body);
    app.send_raw(request).await
}

#[tokio::test]
async fn the_webhook_provider_posts_the_message_as_json_with_the_configured_headers() {
    let server = MockServer::start().await;
    Mock::given(method("POST"))
        .and(path("/hooks/sms"))
        .respond_with(ResponseTemplate::new(204))
        .expect(1)
        .mount(&server)
        .await;
    let app = webhook_app(&server, Duration::from_secs(5)).await;

    let answer = send_with_request_id(
        &app,
        json!({ "phone": PHONE, "locale": "zh-CN" }),
        "req-webhook-1",
    )
    .await;

    assert_eq!(answer.status, 200, "{}", answer.body);
    let requests = received(&server).await;
    assert_eq!(requests.len(), 1);
    let request = &requests[0];
    assert_eq!(header_of(request, "content-type"), "application/json");
    assert_eq!(header_of(request, "x-api-key"), "hook-key");
    assert_eq!(header_of(request, "x-tenant"), "acme");
    let sent: Value = serde_json::from_slice(&request.body).unwrap();
    let body = sent["body"].as_str().expect("a text body").to_string();
    assert_eq!(
        sent,
        json!({ "to": PHONE, "body": body, "locale": "zh-CN", "request_id": "req-webhook-1" }),
        "exactly these four fields"
    );
    assert!(body.contains("验证码"), "the zh-CN template: {body}");

    let code = code_in(&body, 6);
    let verified = app
        .sms_verify(json!({ "phone": PHONE, "code": code }))
        .await;
    assert_eq!(
        verified.body,
        json!({ "valid": true }),
        "the code in the SMS is the stored one"
    );
}

#[tokio::test]
async fn the_code_in_the_sms_has_code_length_digits_and_the_locale_falls_back_to_english() {
    let server = MockServer::start().await;
    Mock::given(method("POST"))
        .respond_with(ResponseTemplate::new(200))
        .mount(&server)
        .await;
    let url = server.uri();
    let app = spawn_app_with_sms_provider(Backend::Memory, move |s| {
        s.sms.code_length = 8;
        s.sms.provider.kind = SmsProviderKind::Webhook;
        s.sms.provider.url = url.into();
    })
    .await;

    let answer = app
        .sms_send(json!({ "phone": PHONE, "locale": "fr-FR" }))
        .await;

    assert_eq!(answer.status, 200, "{}", answer.body);
    let sent: Value = serde_json::from_slice(&received(&server).await[0].body).unwrap();
    assert_eq!(sent["locale"], "en");
    let body = sent["body"].as_str().unwrap();
    assert!(body.starts_with("Your verification code is"), "{body}");
    assert_eq!(code_in(body, 8).len(), 8);
}

#[tokio::test]
async fn a_webhook_error_answers_502_and_gives_the_reservation_back() {
    let server = MockServer::start().await;
    Mock::given(method("POST"))
        .respond_with(ResponseTemplate::new(500))
        .up_to_n_times(1)
        .mount(&server)
        .await;
    Mock::given(method("POST"))
        .respond_with(ResponseTemplate::new(202))
        .mount(&server)
        .await;
    let app = webhook_app(&server, Duration::from_secs(5)).await;

    let failed = app.sms_send(json!({ "phone": PHONE })).await;
    assert_eq!(failed.status, 502, "{}", failed.body);
    assert_eq!(failed.error(), "delivery_failed");
    let failed_sms: Value = serde_json::from_slice(&received(&server).await[0].body).unwrap();
    let failed_code = code_in(failed_sms["body"].as_str().unwrap(), 6);
    let verify = app
        .sms_verify(json!({ "phone": PHONE, "code": failed_code }))
        .await;
    assert_eq!(
        verify.body,
        json!({ "valid": false, "attempts_left": 4 }),
        "the code of a failed send is not kept: a miss, as on any phone without a code"
    );

    let retried = app.sms_send(json!({ "phone": PHONE })).await;
    assert_eq!(
        retried.status, 200,
        "the failed send did not use the 1/1h quota: {}",
        retried.body
    );
    assert_eq!(
        received(&server).await.len(),
        2,
        "one call per send, none retried"
    );
}

/// A resend whose delivery fails leaves the earlier code as it was: the
/// SMS the user already has still verifies, with the tries it had left.
async fn a_failed_resend_leaves_the_earlier_code(backend: Backend) {
    let server = MockServer::start().await;
    Mock::given(method("POST"))
        .respond_with(ResponseTemplate::new(202))
        .up_to_n_times(1)
        .mount(&server)
        .await;
    Mock::given(method("POST"))
        .respond_with(ResponseTemplate::new(503))
        .mount(&server)
        .await;
    let url = format!("{}/hooks/sms", server.uri());
    let app = spawn_app_with_sms_provider(backend, move |s| {
        s.sms.phone_limits = limits(&[(5, 3_600_000)]);
        s.sms.provider.kind = SmsProviderKind::Webhook;
        s.sms.provider.url = url.into();
    })
    .await;
    let sms_code = |n: usize| {
        let server = &server;
        async move {
            let sms: Value = serde_json::from_slice(&received(server).await[n].body).unwrap();
            code_in(sms["body"].as_str().unwrap(), 6)
        }
    };

    assert_eq!(app.sms_send(json!({ "phone": PHONE })).await.status, 200);
    let first = sms_code(0).await;
    let wrong = if first == "000000" {
        "000001"
    } else {
        "000000"
    };
    let missed = app
        .sms_verify(json!({ "phone": PHONE, "code": wrong }))
        .await;
    assert_eq!(missed.body, json!({ "valid": false, "attempts_left": 4 }));

    let failed = app.sms_send(json!({ "phone": PHONE })).await;
    assert_eq!(failed.status, 502, "{}", failed.body);
    let failed_code = sms_code(1).await;
    if failed_code != first {
        let verify = app
            .sms_verify(json!({ "phone": PHONE, "code": failed_code }))
            .await;
        assert_eq!(
            verify.body,
            json!({ "valid": false, "attempts_left": 3 }),
            "the failed send's code is gone; the try counts against the earlier one's"
        );
    }
    let verify = app
        .sms_verify(json!({ "phone": PHONE, "code": first }))
        .await;
    assert_eq!(
        verify.body,
        json!({ "valid": true }),
        "the code the user already has still verifies"
    );
}

/// A code guessed at while its delivery is at the provider keeps its send
/// in the phone's windows when the delivery fails: else each failed send
/// (an outage, a number the provider refuses) would give a guesser a fresh
/// code's tries on the phone, forgotten with the code. Without the guess
/// the same failure gives the send back (the control).
async fn a_failed_send_whose_code_was_tried_keeps_the_phones_window(backend: Backend) {
    for guessed in [false, true] {
        let app = spawn_app(backend, |s| {
            s.sms.phone_limits = limits(&[(1, 3_600_000)]);
        })
        .await;
        let held = app.sms.hold_next_failure();
        let failing = app.sms_send(json!({ "phone": PHONE }));
        let guess = async {
            held.arrived.await.expect("the send reaches the provider");
            if guessed {
                let verify = app
                    .sms_verify(json!({ "phone": PHONE, "code": "123456" }))
                    .await;
                assert_eq!(verify.body["valid"], false, "{}", verify.body);
            }
            let _ = held.release.send(());
        };

        let (failed, ()) = tokio::join!(failing, guess);

        assert_eq!(failed.status, 502, "{}", failed.body);
        let again = app.sms_send(json!({ "phone": PHONE })).await;
        let expected = if guessed { 429 } else { 200 };
        assert_eq!(
            again.status, expected,
            "guessed at: {guessed}; the phone's 1/1h: {}",
            again.body
        );
    }
}

#[tokio::test]
async fn a_failed_send_whose_code_was_tried_keeps_the_phones_window_on_memory() {
    a_failed_send_whose_code_was_tried_keeps_the_phones_window(Backend::Memory).await;
}

#[tokio::test]
async fn a_failed_send_whose_code_was_tried_keeps_the_phones_window_on_redis() {
    a_failed_send_whose_code_was_tried_keeps_the_phones_window(Backend::Redis).await;
}

#[tokio::test]
async fn a_failed_resend_leaves_the_earlier_code_on_memory() {
    a_failed_resend_leaves_the_earlier_code(Backend::Memory).await;
}

#[tokio::test]
async fn a_failed_resend_leaves_the_earlier_code_on_redis() {
    a_failed_resend_leaves_the_earlier_code(Backend::Redis).await;
}

#[tokio::test]
async fn a_webhook_that_does_not_answer_in_time_answers_502_and_its_send_still_counts() {
    let server = MockServer::start().await;
    Mock::given(method("POST"))
        .respond_with(ResponseTemplate::new(200).set_delay(Duration::from_secs(3)))
        .mount(&server)
        .await;
    let app = webhook_app(&server, Duration::from_millis(300)).await;
    let timed_out_before = app.metric(&deliveries("timed_out")).await;

    let started = Instant::now();
    let slow = app.sms_send(json!({ "phone": PHONE })).await;

    assert_eq!(slow.status, 502, "{}", slow.body);
    assert_eq!(slow.error(), "delivery_failed");
    assert_eq!(slow.body["may_arrive"], true, "{}", slow.body);
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "gave up after the timeout: {:?}",
        started.elapsed()
    );
    // The provider took the message and answered late: the phone may have
    // it. A slow gateway must not let every send through uncounted.
    let next = app.sms_send(json!({ "phone": PHONE })).await;
    assert_eq!(next.status, 429, "the send counted: {}", next.body);
    assert_eq!(next.body["rule"], "phone 1/1h");
    // ...but not for the pumping guard: a slow provider is no sign of
    // pumping, and would otherwise block its users' ranges.
    let range = app.admin_get("/admin/api/subjects/prefix/%2B8613800").await;
    assert_eq!(range.status, 200, "{}", range.body);
    assert_eq!(range.body["pumping"]["sends"], 0, "{}", range.body);
    let requests = received(&server).await;
    assert_eq!(requests.len(), 1, "a timed-out send is not retried");
    let sms: Value = serde_json::from_slice(&requests[0].body).unwrap();
    let code = code_in(sms["body"].as_str().unwrap(), 6);
    let verify = app
        .sms_verify(json!({ "phone": PHONE, "code": code }))
        .await;
    assert_eq!(
        verify.body,
        json!({ "valid": true }),
        "the code of a send that may have arrived stays"
    );
    let timed_out = app.metric(&deliveries("timed_out")).await - timed_out_before;
    assert!(timed_out >= 1.0, "{timed_out}");
}

#[tokio::test]
async fn the_twilio_provider_posts_the_form_with_basic_auth_to_the_account_messages_url() {
    let server = MockServer::start().await;
    Mock::given(method("POST"))
        .and(path(TWILIO_PATH))
        .and(basic_auth("AC0123456789", "twilio-token"))
        .and(header("content-type", "application/x-www-form-urlencoded"))
        .respond_with(
            ResponseTemplate::new(201).set_body_json(json!({ "sid": "SM1", "status": "queued" })),
        )
        .expect(1)
        .mount(&server)
        .await;
    let app = twilio_app(&server, Duration::from_secs(5)).await;

    let answer = app.sms_send(json!({ "phone": "+86 138 0013 8000" })).await;

    assert_eq!(answer.status, 200, "{}", answer.body);
    let requests = received(&server).await;
    assert_eq!(requests.len(), 1);
    let fields = form(&requests[0]);
    let body = fields.get("Body").cloned().unwrap_or_default();
    assert_eq!(
        fields,
        BTreeMap::from([
            ("To".to_string(), PHONE.to_string()),
            ("From".to_string(), "+15005550006".to_string()),
            ("Body".to_string(), body.clone()),
        ]),
        "exactly To, From and Body"
    );
    let code = code_in(&body, 6);
    let verified = app
        .sms_verify(json!({ "phone": PHONE, "code": code }))
        .await;
    assert_eq!(verified.body, json!({ "valid": true }));
}

#[tokio::test]
async fn a_twilio_error_answers_502_and_gives_the_phone_its_send_back() {
    let server = MockServer::start().await;
    Mock::given(method("POST"))
        .and(path(TWILIO_PATH))
        .respond_with(
            ResponseTemplate::new(400)
                .set_body_json(json!({ "code": 21211, "message": "invalid To", "status": 400 })),
        )
        .up_to_n_times(1)
        .mount(&server)
        .await;
    Mock::given(method("POST"))
        .and(path(TWILIO_PATH))
        .respond_with(ResponseTemplate::new(201).set_body_json(json!({ "sid": "SM2" })))
        .mount(&server)
        .await;
    let app = twilio_app(&server, Duration::from_secs(5)).await;

    // Named by its client: a send naming none is kept by the phone's
    // window when the number is refused (sms_send.rs).
    let send = || app.sms_send(json!({ "phone": PHONE, "ip": "203.0.113.7" }));
    let failed = send().await;
    assert_eq!(failed.status, 502, "{}", failed.body);
    assert_eq!(failed.error(), "delivery_failed");

    let retried = send().await;
    assert_eq!(
        retried.status, 200,
        "the failed send did not use the 1/1h quota: {}",
        retried.body
    );
    assert_eq!(received(&server).await.len(), 2);
}

const OTHER_PHONE: &str = "+8613800138001";

/// A Twilio app on `backend` whose provider refuses `PHONE` (400, error
/// 21211, as for a number it will not text) and texts any other, with two
/// sends an hour per address, IPv6 network, prefix and everyone.
async fn refusing_twilio_app(server: &MockServer, backend: Backend) -> TestApp {
    Mock::given(method("POST"))
        .and(path(TWILIO_PATH))
        .and(body_string_contains("To=%2B8613800138000"))
        .respond_with(
            ResponseTemplate::new(400)
                .set_body_json(json!({ "code": 21211, "message": "invalid To", "status": 400 })),
        )
        .mount(server)
        .await;
    Mock::given(method("POST"))
        .and(path(TWILIO_PATH))
        .respond_with(ResponseTemplate::new(201).set_body_json(json!({ "sid": "SM2" })))
        .mount(server)
        .await;
    twilio_app_on(backend, server, |s| {
        let two_an_hour = limits(&[(2, 3_600_000)]);
        s.sms.ip_limits = two_an_hour.clone();
        s.sms.network_limits = two_an_hour.clone();
        s.sms.prefix_limits = two_an_hour.clone();
        s.sms.global_limits = two_an_hour;
    })
    .await
}

/// A number the provider refuses to text still counts in the windows of
/// the address that asked for it (its IP's, its IPv6 network's): given back
/// whole, one address could make a provider call per request with a number
/// the provider will not text, and no window would see one. The phone's,
/// the prefix's and the global windows give it back, as for any failure, so
/// a retry once the number is right is not refused, and refused numbers
/// cannot fill a country's windows or everyone's.
async fn a_number_the_provider_refuses_still_counts_against_the_address(backend: Backend) {
    let server = MockServer::start().await;
    let app = refusing_twilio_app(&server, backend).await;
    let send =
        |phone: &'static str, ip: &'static str| app.sms_send(json!({ "phone": phone, "ip": ip }));
    let refused_before = app.metric(&deliveries("refused_number")).await;

    for _ in 0..2 {
        let refused = send(PHONE, "203.0.113.7").await;
        assert_eq!(refused.status, 502, "{}", refused.body);
        assert_eq!(refused.error(), "delivery_failed");
        assert_eq!(
            refused.body["number_refused"], true,
            "the page can ask the user to check the number: {}",
            refused.body
        );
    }
    let third = send(OTHER_PHONE, "203.0.113.7").await;
    assert_eq!(third.status, 429, "{}", third.body);
    assert_eq!(third.body["rule"], "ip 2/1h");
    assert_eq!(
        received(&server).await.len(),
        2,
        "the address's third send never reached the provider"
    );

    // Two /64s of one /48 (`sms.network_bits`): their network keeps both.
    for ip in ["2001:db8:1:1::1", "2001:db8:1:2::1"] {
        assert_eq!(send(PHONE, ip).await.status, 502);
    }
    let from_the_network = send(OTHER_PHONE, "2001:db8:1:3::1").await;
    assert_eq!(from_the_network.status, 429, "{}", from_the_network.body);
    assert_eq!(from_the_network.body["rule"], "network 2/1h");

    let elsewhere = send(OTHER_PHONE, "198.51.100.9").await;
    assert_eq!(
        elsewhere.status, 200,
        "four refused sends filled neither the prefix's 2/1h nor the global 2/1h: {}",
        elsewhere.body
    );
    assert_eq!(received(&server).await.len(), 5);
    let refused = app.metric(&deliveries("refused_number")).await - refused_before;
    assert!(refused >= 4.0, "four refused numbers counted: {refused}");
}

/// A webhook gateway says it will never text a number with a 422: the send
/// counts against the asking address, as with Twilio's codes above.
#[tokio::test]
async fn a_webhook_422_refuses_the_number_and_counts_against_the_address() {
    let server = MockServer::start().await;
    Mock::given(method("POST"))
        .respond_with(ResponseTemplate::new(422))
        .mount(&server)
        .await;
    let app = webhook_app_with_one_send_an_ip(&server).await;

    let refused = app
        .sms_send(json!({ "phone": PHONE, "ip": "203.0.113.7" }))
        .await;
    assert_eq!(refused.status, 502, "{}", refused.body);
    let next = app
        .sms_send(json!({ "phone": OTHER_PHONE, "ip": "203.0.113.7" }))
        .await;
    assert_eq!(next.status, 429, "{}", next.body);
    assert_eq!(next.body["rule"], "ip 1/1h");
    assert_eq!(received(&server).await.len(), 1);
}

/// A webhook provider at `server`, and one send an hour per IP.
async fn webhook_app_with_one_send_an_ip(server: &MockServer) -> TestApp {
    let url = format!("{}/hooks/sms", server.uri());
    spawn_app_with_sms_provider(Backend::Memory, move |s| {
        s.sms.ip_limits = limits(&[(1, 3_600_000)]);
        s.sms.provider.kind = SmsProviderKind::Webhook;
        s.sms.provider.url = url.into();
    })
    .await
}

/// One series of `tollgate_sms_deliveries_total`.
fn deliveries(outcome: &str) -> String {
    format!("tollgate_sms_deliveries_total{{outcome=\"{outcome}\"}}")
}

#[tokio::test]
async fn a_number_the_provider_refuses_still_counts_against_the_address_on_memory() {
    a_number_the_provider_refuses_still_counts_against_the_address(Backend::Memory).await;
}

#[tokio::test]
async fn a_number_the_provider_refuses_still_counts_against_the_address_on_redis() {
    a_number_the_provider_refuses_still_counts_against_the_address(Backend::Redis).await;
}

/// A failure of the provider or of the set-up (a 400 a proxy or the gateway
/// answers for its own fault, a wrong token or URL, the provider's own
/// throttling, a 5xx) is given back to the address too: a retry may pass,
/// and a crowd behind one address retrying through a provider's outage must
/// not fill its windows, within the address's budget of failed deliveries.
/// (A guard against taking too much for a refused number: it passed before
/// that was told apart.)
#[tokio::test]
async fn a_provider_or_set_up_failure_is_given_back_to_the_address_too() {
    let server = MockServer::start().await;
    for status in [400, 401, 403, 404, 429, 500, 503] {
        Mock::given(method("POST"))
            .respond_with(ResponseTemplate::new(status))
            .up_to_n_times(1)
            .mount(&server)
            .await;
    }
    Mock::given(method("POST"))
        .respond_with(ResponseTemplate::new(202))
        .mount(&server)
        .await;
    let url = format!("{}/hooks/sms", server.uri());
    let app = spawn_app_with_sms_provider(Backend::Memory, move |s| {
        s.sms.ip_limits = limits(&[(1, 3_600_000)]);
        // Within the address's budget of failed deliveries (5 an hour by
        // default; past it they count: sms_send.rs).
        s.sms.failed_delivery_limit = limits(&[(7, 3_600_000)]).remove(0);
        s.sms.provider.kind = SmsProviderKind::Webhook;
        s.sms.provider.url = url.into();
    })
    .await;

    let failed_before = app.metric(&deliveries("failed")).await;
    let declined_before = app.metric(&deliveries("declined")).await;
    for _ in 0..7 {
        let failed = app
            .sms_send(json!({ "phone": PHONE, "ip": "203.0.113.7" }))
            .await;
        assert_eq!(failed.status, 502, "{}", failed.body);
        assert_eq!(
            failed.body.get("number_refused"),
            None,
            "not the number's fault: {}",
            failed.body
        );
    }
    // Deltas on the process's series, which tests running at once move
    // too: these show the outcomes reach the exporter; which label each
    // failure gets is the unit test's (`each_failure_is_counted_as_its_own_delivery_outcome`).
    let failed = app.metric(&deliveries("failed")).await - failed_before;
    assert!(failed >= 6.0, "six failures counted: {failed}");
    // The webhook's 400 is the request's pick, within its budget.
    let declined = app.metric(&deliveries("declined")).await - declined_before;
    assert!(declined >= 1.0, "one declined send counted: {declined}");
    let delivered_before = app.metric(&deliveries("delivered")).await;
    let delivered = app
        .sms_send(json!({ "phone": PHONE, "ip": "203.0.113.7" }))
        .await;
    assert_eq!(
        delivered.status, 200,
        "seven failures left the address's 1/1h empty: {}",
        delivered.body
    );
    assert_eq!(received(&server).await.len(), 8);
    let delivered = app.metric(&deliveries("delivered")).await - delivered_before;
    assert!(delivered >= 1.0, "{delivered}");
}

#[tokio::test]
async fn a_twilio_call_that_times_out_answers_502_without_a_retry() {
    let server = MockServer::start().await;
    Mock::given(method("POST"))
        .respond_with(ResponseTemplate::new(201).set_delay(Duration::from_secs(3)))
        .mount(&server)
        .await;
    let app = twilio_app(&server, Duration::from_millis(300)).await;

    let started = Instant::now();
    let slow = app.sms_send(json!({ "phone": PHONE })).await;

    assert_eq!(slow.status, 502, "{}", slow.body);
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "{:?}",
        started.elapsed()
    );
    assert_eq!(
        received(&server).await.len(),
        1,
        "a timed-out send is not retried"
    );
}

#[tokio::test]
async fn a_provider_that_redirects_is_a_failed_delivery_not_a_second_request() {
    let server = MockServer::start().await;
    Mock::given(method("POST"))
        .and(path("/hooks/sms"))
        .respond_with(ResponseTemplate::new(307).insert_header("location", "/elsewhere"))
        .mount(&server)
        .await;
    Mock::given(path("/elsewhere"))
        .respond_with(ResponseTemplate::new(200))
        .mount(&server)
        .await;
    let app = webhook_app(&server, Duration::from_secs(5)).await;

    let answer = app.sms_send(json!({ "phone": PHONE })).await;

    assert_eq!(answer.status, 502, "{}", answer.body);
    let paths: Vec<String> = received(&server)
        .await
        .iter()
        .map(|r| r.url.path().to_string())
        .collect();
    assert_eq!(paths, ["/hooks/sms"]);
}

#[tokio::test]
async fn an_unreachable_provider_answers_502() {
    // A port that was free a moment ago: nothing listens there.
    let port = crate::support::app::free_port();
    let app = spawn_app_with_sms_provider(Backend::Memory, move |s| {
        s.sms.provider.kind = SmsProviderKind::Webhook;
        s.sms.provider.url = format!("http://127.0.0.1:{port}/sms").into();
    })
    .await;

    let answer = app.sms_send(json!({ "phone": PHONE })).await;

    assert_eq!(answer.status, 502, "{}", answer.body);
    assert_eq!(answer.error(), "delivery_failed");
    assert_the_phone_counts_nothing(&app).await;
}

/// A provider whose TLS handshake never ends (a stalled proxy, a dropped
/// packet) was sent nothing: the send is given back, unlike one whose
/// message went out unanswered.
#[tokio::test]
async fn a_connection_that_hangs_is_given_back() {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let held = tokio::spawn(async move {
        let mut open = Vec::new();
        while let Ok((socket, _)) = listener.accept().await {
            open.push(socket); // accepted, never answered
        }
    });
    let app = spawn_app_with_sms_provider(Backend::Memory, move |s| {
        s.sms.phone_limits = limits(&[(1, 3_600_000)]);
        s.sms.provider.kind = SmsProviderKind::Webhook;
        s.sms.provider.url = format!("https://127.0.0.1:{port}/sms").into();
        s.sms.provider.timeout = Duration::from_millis(600);
    })
    .await;

    for _ in 0..2 {
        let answer = app.sms_send(json!({ "phone": PHONE })).await;
        assert_eq!(answer.status, 502, "{}", answer.body);
        assert_eq!(answer.error(), "delivery_failed");
    }
    assert_the_phone_counts_nothing(&app).await;
    held.abort();
}

/// A provider behind which every connection closes unanswered, some once
/// it has read the whole request; it stops when dropped.
struct ClosingProvider {
    port: u16,
    task: tokio::task::JoinHandle<()>,
}

impl ClosingProvider {
    /// `always_read`: every connection reads the whole request first (the
    /// request went out, for sure), not every other one.
    async fn start(always_read: bool) -> Self {
        use tokio::io::AsyncReadExt;
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let task = tokio::spawn(async move {
            let mut read_first = false;
            while let Ok((mut socket, _)) = listener.accept().await {
                read_first = always_read || !read_first;
                let mut request = Vec::new();
                let mut chunk = [0u8; 4096];
                while read_first && !crate::support::whole_request(&request) {
                    match socket.read(&mut chunk).await {
                        Ok(0) | Err(_) => break,
                        Ok(n) => request.extend_from_slice(&chunk[..n]),
                    }
                }
                drop(socket); // answered nothing
            }
        });
        Self { port, task }
    }
}

/// An app whose webhook provider is a [`ClosingProvider`] (`always_read`
/// as there), with `configure`'s limits; the provider lives as long as the
/// first of the pair.
async fn app_with_closing_provider(
    always_read: bool,
    configure: impl FnOnce(&mut tollgate::settings::Settings),
) -> (ClosingProvider, TestApp) {
    let closing = ClosingProvider::start(always_read).await;
    let port = closing.port;
    let app = spawn_app_with_sms_provider(Backend::Memory, move |s| {
        configure(s);
        s.sms.provider.kind = SmsProviderKind::Webhook;
        s.sms.provider.url = format!("http://127.0.0.1:{port}/sms").into();
    })
    .await;
    (closing, app)
}

impl Drop for ClosingProvider {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// A connection that closes before an answer, whether or not the message
/// was read, is given back within the asking address's budget of failed
/// deliveries: a proxy in TCP mode before a provider that is down closes
/// every connection so, and counting those at once would refuse every
/// user's retry for the phone's windows.
#[tokio::test]
async fn a_connection_closed_before_an_answer_is_given_back() {
    let (_closing, app) = app_with_closing_provider(false, |s| {
        s.sms.phone_limits = limits(&[(1, 3_600_000)]);
    })
    .await;

    // Within the address's budget (5 an hour by default). A send naming
    // no client has none: its phone's windows keep it (sms_send.rs).
    for _ in 0..2 {
        let closed = app
            .sms_send(json!({ "phone": PHONE, "ip": "203.0.113.7" }))
            .await;
        assert_eq!(closed.status, 502, "{}", closed.body);
        assert_eq!(closed.error(), "delivery_failed");
        assert_eq!(closed.body.get("may_arrive"), None, "{}", closed.body);
    }
    assert_the_phone_counts_nothing(&app).await;
}

/// A provider that takes the message and then drops the connection (it
/// may text the phone each time): past the address's budget of failed
/// deliveries, its sends count in the address's windows, which then
/// refuse it, so one address cannot text a phone through it without
/// limit; the phone's windows still give each back.
#[tokio::test]
async fn connections_dropped_past_the_failure_budget_count_against_the_address() {
    let (_closing, app) = app_with_closing_provider(true, |s| {
        s.sms.phone_limits = limits(&[(1, 3_600_000)]);
        s.sms.ip_limits = limits(&[(1, 3_600_000)]);
        s.sms.failed_delivery_limit = limits(&[(2, 3_600_000)]).remove(0);
    })
    .await;

    // Two within the budget, the third past it: each answers 502.
    for _ in 0..3 {
        let closed = app
            .sms_send(json!({ "phone": PHONE, "ip": "203.0.113.7" }))
            .await;
        assert_eq!(closed.status, 502, "{}", closed.body);
    }
    let refused = app
        .sms_send(json!({ "phone": PHONE, "ip": "203.0.113.7" }))
        .await;
    assert_eq!(
        refused.status, 429,
        "the third send counted: {}",
        refused.body
    );
    assert_eq!(refused.body["rule"], "ip 1/1h", "{}", refused.body);
    // The phone's window gave every one back: another address reaches the
    // provider again.
    let other = app
        .sms_send(json!({ "phone": PHONE, "ip": "198.51.100.9" }))
        .await;
    assert_eq!(other.status, 502, "{}", other.body);
}

/// A send naming no client has no budget of failures: a dropped
/// connection is kept by the phone's windows alone, not by the prefix's
/// or the global ones, which every user's sends fill while a proxy drops
/// them all during an outage.
#[tokio::test]
async fn a_dropped_connection_naming_no_client_is_kept_by_its_phone_alone() {
    let (_closing, app) = app_with_closing_provider(true, |s| {
        s.sms.phone_limits = limits(&[(1, 3_600_000)]);
        s.sms.prefix_limits = limits(&[(1, 3_600_000)]);
        s.sms.global_limits = limits(&[(2, 3_600_000)]);
    })
    .await;

    for phone in [PHONE, OTHER_PHONE, "+8613800138002"] {
        let closed = app.sms_send(json!({ "phone": phone })).await;
        assert_eq!(
            closed.status, 502,
            "the prefix's and global windows gave it back: {}",
            closed.body
        );
    }
    let again = app.sms_send(json!({ "phone": PHONE })).await;
    assert_eq!(
        again.status, 429,
        "the phone's window kept it: {}",
        again.body
    );
    assert_eq!(again.body["rule"], "phone 1/1h", "{}", again.body);
}

#[test]
fn bad_delivery_captcha_email_and_proxy_settings_fail_naming_the_key() {
    let cases = [
        (
            "server.trusted_proxies[1]",
            "[server]\ntrusted_proxies = [\"10.0.0.0/8\", \"10.0.0.0/33\"]",
        ),
        ("sms.provider.timeout", "[sms.provider]\ntimeout = \"0s\""),
        (
            "sms.provider.url",
            "[sms.provider]\nkind = \"webhook\"\nurl = \"ftp://x\"",
        ),
        (
            "sms.provider.auth_token",
            "[sms.provider]\nkind = \"twilio\"\naccount_sid = \"AC1\"\nfrom = \"+15005550006\"",
        ),
        ("captcha.timeout", "[captcha]\ntimeout = \"0ms\""),
        ("captcha.secret", "[captcha]\nkind = \"turnstile\""),
        ("email.smtp_url", "[email]\nsmtp_url = \"http://mail:25\""),
        // A login sent in clear (plain SMTP, or STARTTLS anyone can strip).
        (
            "email.smtp_url",
            "[email]\nsmtp_url = \"smtp://u:p@mail.example:587\"",
        ),
        (
            "email.smtp_url",
            "[email]\nsmtp_url = \"smtp://u:p@mail.example:587?tls=opportunistic\"",
        ),
        ("email.from", "[email]\nfrom = \"tollgate at example\""),
        (
            "email.admin_alerts_to[1]",
            "[email]\nadmin_alerts_to = [\"ops@example.com\", \"nobody\"]",
        ),
    ];
    for (key, toml) in cases {
        let path =
            std::env::temp_dir().join(format!("tollgate-{}.toml", uuid::Uuid::new_v4().simple()));
        std::fs::write(&path, toml).unwrap();
        let result = tollgate::settings::Settings::load(Some(&path));
        std::fs::remove_file(&path).unwrap();
        let message = result.err().map(|e| e.to_string()).unwrap_or_default();
        assert!(message.contains(&format!("`{key}`")), "{key}: {message:?}");
    }
}
