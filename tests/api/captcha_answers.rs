//! What a passed token's answer must also say: reCAPTCHA v3's score
//! (`captcha.min_score`), the site's hostname (`captcha.hostnames`) and the
//! action (`captcha.actions`, or a route's own `sms_actions` and
//! `login_actions`). A token that passes the provider but not
//! these is refused, and counts against its address like any refused token.

use serde_json::json;
use tollgate::settings::{CaptchaKind, Fraction, LimitSetting, Settings};
use wiremock::matchers::{body_string_contains, method, path};
use wiremock::{Mock, MockServer, ResponseTemplate};

use crate::support::app::TestApp;

const PHONE: &str = "+8613800138000";
const IP: &str = "203.0.113.7";

/// A provider that passes every token, answering for `response=<token>`
/// with `success: true` and the fields `answers` gives it.
async fn provider(answers: &[(&str, serde_json::Value)]) -> MockServer {
    let server = MockServer::start().await;
    for (token, fields) in answers {
        let mut body = json!({ "success": true, "challenge_ts": "2026-12-01T04:00:00Z" });
        if let (Some(body), Some(fields)) = (body.as_object_mut(), fields.as_object()) {
            body.extend(fields.clone());
        }
        Mock::given(method("POST"))
            .and(path("/siteverify"))
            .and(body_string_contains(format!("response={token}&")))
            .respond_with(ResponseTemplate::new(200).set_body_json(body))
            .mount(&server)
            .await;
    }
    server
}

async fn calls(server: &MockServer) -> usize {
    server.received_requests().await.expect("recording").len()
}

/// Every send past a phone's first, and every login past a user's first
/// failure, needs a captcha checked at `server`.
async fn app(
    kind: CaptchaKind,
    server: &MockServer,
    configure: impl FnOnce(&mut Settings),
) -> TestApp {
    crate::captcha::app_with_captcha(kind, server, |s| {
        s.login.captcha_after = 1;
        s.login.lock_after = 1000;
        configure(s);
    })
    .await
}

async fn send_with(app: &TestApp, token: &str) -> crate::support::app::Answer {
    app.sms_send(json!({ "phone": PHONE, "ip": IP, "captcha_token": token }))
        .await
}

#[tokio::test]
async fn a_recaptcha_v3_token_scored_as_a_bot_is_refused_and_counted() {
    let server = provider(&[
        ("person", json!({ "score": 0.9, "action": "sms" })),
        ("edge", json!({ "score": 0.5 })),
        ("bot", json!({ "score": 0.1, "action": "sms" })),
    ])
    .await;
    let app = app(CaptchaKind::Recaptcha, &server, |s| {
        s.captcha.failed_token_limit = LimitSetting::new(1, std::time::Duration::from_secs(600));
    })
    .await;
    let free = app.sms_send(json!({ "phone": PHONE, "ip": IP })).await;
    assert_eq!(free.body["captcha_required"], true, "{}", free.body);

    for token in ["person", "edge"] {
        let passed = send_with(&app, token).await;
        assert_eq!(passed.status, 200, "{token}: {}", passed.body);
    }
    let mismatched = "tollgate_captcha_checks_total{outcome=\"mismatched\"}";
    let before = app.metric(mismatched).await;
    let bot = send_with(&app, "bot").await;
    assert_eq!(bot.status, 403, "{}", bot.body);
    assert_eq!(bot.error(), "captcha_required");
    assert_eq!(calls(&server).await, 3);
    // The recorder is process-wide: other tests may add, never take away.
    assert!(app.metric(mismatched).await > before);

    // The bot's token filled the address's budget of one refused token:
    // even a person's token is now refused without asking the provider.
    let throttled = send_with(&app, "person").await;
    assert_eq!(throttled.status, 429, "{}", throttled.body);
    assert_eq!(throttled.body["rule"], "failed_captcha 1/10m");
    assert_eq!(calls(&server).await, 3);
}

#[tokio::test]
async fn min_score_zero_or_another_kind_reads_no_score() {
    let answers = [("bot", json!({ "score": 0.1 }))];
    for (kind, min_score) in [
        (CaptchaKind::Recaptcha, 0.0),
        // hCaptcha Enterprise's score is a risk: its 0.1 is a person.
        (CaptchaKind::Hcaptcha, 0.5),
        (CaptchaKind::Turnstile, 0.9),
    ] {
        let server = provider(&answers).await;
        let app = app(kind, &server, |s| {
            s.captcha.min_score = Fraction::new(min_score).unwrap();
        })
        .await;
        let free = app.sms_send(json!({ "phone": PHONE, "ip": IP })).await;
        assert_eq!(free.status, 200, "{}", free.body);

        let passed = send_with(&app, "bot").await;
        assert_eq!(passed.status, 200, "{kind:?}: {}", passed.body);
    }
}

#[tokio::test]
async fn a_token_solved_on_another_site_or_for_another_action_is_refused() {
    let server = provider(&[
        (
            "ours",
            json!({ "hostname": "login.example.com", "action": "login" }),
        ),
        (
            "ours-upper",
            json!({ "hostname": "LOGIN.Example.com", "action": "login" }),
        ),
        (
            "elsewhere",
            json!({ "hostname": "evil.example", "action": "login" }),
        ),
        (
            "signup",
            json!({ "hostname": "login.example.com", "action": "signup" }),
        ),
        ("bare", json!({})),
    ])
    .await;
    let app = app(CaptchaKind::Turnstile, &server, |s| {
        s.captcha.hostnames = vec!["login.example.com".into(), "app.example.com".into()];
        s.captcha.actions = vec!["login".into(), "sms".into()];
        s.captcha.failed_token_limit = LimitSetting::new(3, std::time::Duration::from_secs(600));
    })
    .await;
    let attempt = |ip: &str, token: &str| {
        app.login_attempt(
            json!({ "user": "alice", "ip": ip, "success": false, "captcha_token": token }),
        )
    };
    let first = app
        .login_attempt(json!({ "user": "alice", "ip": IP, "success": false }))
        .await;
    assert_eq!(first.body["captcha_required"], true, "{}", first.body);

    for token in ["elsewhere", "signup", "bare"] {
        let refused = attempt(IP, token).await;
        assert_eq!(refused.status, 200, "{token}: {}", refused.body);
        assert_eq!(
            refused.body["decision"], "challenge",
            "{token}: {}",
            refused.body
        );
        assert_eq!(refused.body["reason"], "captcha_required", "{token}");
    }
    // Each counted against the address, as any refused token: its budget
    // of three is spent, and even a good token is refused unasked.
    let throttled = attempt(IP, "ours").await;
    assert_eq!(
        throttled.body["reason"], "rate_limited",
        "{}",
        throttled.body
    );
    assert_eq!(calls(&server).await, 3);

    for token in ["ours", "ours-upper"] {
        let passed = attempt("198.51.100.9", token).await;
        assert_eq!(passed.body["decision"], "allow", "{token}: {}", passed.body);
    }
    assert_eq!(calls(&server).await, 5);
}

/// With each route's own list, a token made on the login page does not
/// pass a send, nor one made for a send a login: with `actions` alone,
/// which both routes share, either passes either.
#[tokio::test]
async fn a_token_made_for_one_route_does_not_pass_the_other_where_each_has_its_own_actions() {
    // Each token is asked of the provider once: a second solve on a page
    // is another token.
    let server = provider(&[
        ("for-login", json!({ "action": "login" })),
        ("for-login-again", json!({ "action": "login" })),
        ("for-sms", json!({ "action": "sms" })),
        ("for-sms-again", json!({ "action": "sms" })),
    ])
    .await;
    let split = app(CaptchaKind::Turnstile, &server, |s| {
        s.captcha.actions = vec!["login".into(), "sms".into()];
        s.captcha.sms_actions = vec!["sms".into()];
        s.captcha.login_actions = vec!["login".into()];
    })
    .await;
    let free = split.sms_send(json!({ "phone": PHONE, "ip": IP })).await;
    assert_eq!(free.body["captcha_required"], true, "{}", free.body);
    let from_login = send_with(&split, "for-login").await;
    assert_eq!(from_login.status, 403, "{}", from_login.body);
    assert_eq!(from_login.error(), "captcha_required");
    let sent = send_with(&split, "for-sms").await;
    assert_eq!(sent.status, 200, "{}", sent.body);

    let attempt = |token: &str| {
        split.login_attempt(
            json!({ "user": "alice", "ip": IP, "success": false, "captcha_token": token }),
        )
    };
    let first = split
        .login_attempt(json!({ "user": "alice", "ip": IP, "success": false }))
        .await;
    assert_eq!(first.body["captcha_required"], true, "{}", first.body);
    let from_sms = attempt("for-sms-again").await;
    assert_eq!(from_sms.body["decision"], "challenge", "{}", from_sms.body);
    let passed = attempt("for-login-again").await;
    assert_eq!(passed.body["decision"], "allow", "{}", passed.body);
    assert_eq!(calls(&server).await, 4);

    // `actions` alone: the login page's token passes a send.
    let shared = app(CaptchaKind::Turnstile, &server, |s| {
        s.captcha.actions = vec!["login".into(), "sms".into()];
    })
    .await;
    let free = shared.sms_send(json!({ "phone": PHONE, "ip": IP })).await;
    assert_eq!(free.body["captcha_required"], true, "{}", free.body);
    let from_login = send_with(&shared, "for-login").await;
    assert_eq!(from_login.status, 200, "{}", from_login.body);
}

/// With one route's own list and not the other's, the other route reads
/// `actions`: start-up warns where that takes the first route's tokens.
#[test]
fn a_half_split_of_the_action_lists_is_found_where_the_other_route_takes_its_tokens() {
    let with = |kind: &str, lists: &str| {
        let toml = format!("[captcha]\nkind = \"{kind}\"\nsecret = \"s\"\n{lists}\n");
        crate::support::app::load_config(&toml)
            .unwrap()
            .captcha
            .route_open_to_the_others_tokens()
    };
    let turnstile = |lists| with("turnstile", lists);
    assert_eq!(turnstile(""), None);
    assert_eq!(turnstile("actions = [\"login\", \"sms\"]"), None);
    let split = "sms_actions = [\"sms\"]\nlogin_actions = [\"login\"]";
    assert_eq!(turnstile(split), None);
    assert_eq!(
        turnstile("actions = [\"login\"]\nsms_actions = [\"sms\"]"),
        None
    );
    assert_eq!(
        turnstile("actions = [\"login\", \"sms\"]\nsms_actions = [\"sms\"]"),
        Some(("captcha.login_actions", "captcha.sms_actions"))
    );
    assert_eq!(
        turnstile("login_actions = [\"login\"]"),
        Some(("captcha.sms_actions", "captcha.login_actions"))
    );
    assert_eq!(with("none", "login_actions = [\"login\"]"), None);
}

#[test]
fn the_answer_checks_are_read_at_start_up() {
    let defaults = crate::support::app::load_config("").unwrap();
    assert_eq!(defaults.captcha.min_score.get(), 0.5);
    assert!(defaults.captcha.hostnames.is_empty());
    assert!(defaults.captcha.actions.is_empty());
    let taken = crate::support::app::load_config(
        "[captcha]\nmin_score = \"70%\"\nhostnames = [\"www.example.com\"]\nactions = [\"login\"]\n",
    )
    .unwrap();
    assert_eq!(taken.captcha.min_score.get(), 0.7);
    let punycode = crate::support::app::load_config(
        "[captcha]\nhostnames = [\"xn--bcher-kva.example\"]\nactions = [\"sign-up/step_2\"]\n",
    );
    assert!(punycode.is_ok(), "{:?}", punycode.err());
    let per_route = crate::support::app::load_config(
        "[captcha]\nsms_actions = [\"sms\"]\nlogin_actions = [\"login\", \"sign-in\"]\n",
    )
    .unwrap();
    assert_eq!(per_route.captcha.sms_actions, ["sms"]);
    assert_eq!(per_route.captcha.login_actions, ["login", "sign-in"]);
    assert!(defaults.captcha.sms_actions.is_empty());
    assert!(defaults.captcha.login_actions.is_empty());
    for (toml, key) in [
        ("min_score = 1.5", "captcha.min_score"),
        ("min_score = -0.1", "captcha.min_score"),
        (
            "hostnames = [\"https://www.example.com\"]",
            "captcha.hostnames",
        ),
        (
            "hostnames = [\"www.example.com/login\"]",
            "captcha.hostnames",
        ),
        ("hostnames = [\"\"]", "captcha.hostnames"),
        ("hostnames = [\"*.example.com\"]", "captcha.hostnames"),
        ("hostnames = [\"www.example.com.\"]", "captcha.hostnames"),
        ("hostnames = [\"bücher.example\"]", "captcha.hostnames"),
        ("hostnames = [\"a,b\"]", "captcha.hostnames"),
        ("hostnames = [\"a-.example.com\"]", "captcha.hostnames"),
        ("hostnames = [\"xn--\"]", "captcha.hostnames"),
        ("actions = [\"log in\"]", "captcha.actions"),
        ("actions = [\"log.in\"]", "captcha.actions"),
        ("actions = [\"\"]", "captcha.actions"),
        (
            "kind = \"hcaptcha\"\nsecret = \"s\"\nactions = [\"login\"]",
            "captcha.actions",
        ),
        ("sms_actions = [\"s m s\"]", "captcha.sms_actions"),
        ("login_actions = [\"\"]", "captcha.login_actions"),
        (
            "kind = \"hcaptcha\"\nsecret = \"s\"\nlogin_actions = [\"login\"]",
            "captcha.login_actions",
        ),
    ] {
        let message = crate::support::app::config_error(&format!("[captcha]\n{toml}\n"));
        assert!(message.contains(key), "{toml}: {message}");
    }
    let long_label = format!(
        "[captcha]\nhostnames = [\"{}.example.com\"]\n",
        "a".repeat(64)
    );
    let message = crate::support::app::config_error(&long_label);
    assert!(message.contains("captcha.hostnames"), "{message}");
}
