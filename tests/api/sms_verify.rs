use serde_json::{json, Value};
use tollgate::audit::AuditDecision;
use tollgate::domain::{Action, SubjectKind};
use tollgate::settings::Settings;
use tollgate::store::ManualClock;

use crate::on_both_backends;
use crate::support::app::{
    limits, spawn_app, spawn_app_timed, spawn_app_with_clock, Backend, TestApp,
};

const PHONE: &str = "+8613800138000";

on_both_backends!(
    a_code_verifies_once_and_is_then_used_up,
    wrong_codes_count_down_and_the_last_one_burns_the_code,
    a_new_send_replaces_the_previous_code,
    a_code_never_sent_counts_down_like_a_wrong_code,
    the_answers_are_the_same_with_and_without_a_pending_code,
    the_31st_failed_try_from_one_address_is_refused_and_another_still_verifies,
    a_backend_that_names_no_client_is_not_one_address_that_every_user_fills,
    a_right_code_gives_its_try_back,
    the_64s_of_one_network_share_its_failed_tries,
    strangers_cannot_burn_the_code_of_the_address_that_asked_for_it,
    strangers_cannot_burn_a_code_the_backend_asked_for_naming_no_client,
);

fn wrong(code: &str) -> String {
    // Any six digits but the right ones.
    let first = code.as_bytes()[0];
    let swapped = if first == b'9' {
        '0'
    } else {
        char::from(first + 1)
    };
    format!("{swapped}{}", &code[1..])
}

async fn a_code_verifies_once_and_is_then_used_up(backend: Backend) {
    let app = spawn_app(backend, |_| {}).await;
    assert_eq!(app.sms_send(json!({ "phone": PHONE })).await.status, 200);
    let code = app.sms.last_code(PHONE);

    let first = app
        .sms_verify(json!({ "phone": "+86 138 0013 8000", "code": code }))
        .await;
    assert_eq!(first.status, 200);
    assert_eq!(first.body, json!({ "valid": true }));

    let again = app
        .sms_verify(json!({ "phone": PHONE, "code": code }))
        .await;
    assert_eq!(
        again.body,
        json!({ "valid": false, "attempts_left": 4 }),
        "a used code is a wrong try, as on a phone without a code"
    );
}

async fn wrong_codes_count_down_and_the_last_one_burns_the_code(backend: Backend) {
    let app = spawn_app(backend, |s| s.sms.max_verify_attempts = 3).await;
    app.sms_send(json!({ "phone": PHONE })).await;
    let code = app.sms.last_code(PHONE);

    for left in [2, 1, 0] {
        let answer = app
            .sms_verify(json!({ "phone": PHONE, "code": wrong(&code) }))
            .await;
        assert_eq!(answer.status, 200);
        assert_eq!(
            answer.body,
            json!({ "valid": false, "attempts_left": left })
        );
    }
    let burnt = app
        .sms_verify(json!({ "phone": PHONE, "code": code }))
        .await;
    assert_eq!(
        burnt.status, 429,
        "even the right code is refused once burnt"
    );
    assert_eq!(burnt.error(), "rate_limited");
    assert_eq!(burnt.body["rule"], "phone 3/5m");
    let secs: u64 = burnt.retry_after.as_deref().unwrap().parse().unwrap();
    assert!(
        (299..=300).contains(&secs),
        "until the code expires: {secs}"
    );

    let events = app.audit_events();
    assert_eq!(events[0].reason, "verify_attempts_exhausted");
    assert_eq!(events[0].decision, AuditDecision::Deny);
    assert_eq!(events[0].subject, PHONE);
    assert_eq!(events.len(), 2, "the burn and the refused try after it");

    app.sms_send(json!({ "phone": PHONE, "captcha_passed": true }))
        .await;
    let fresh = app.sms.last_code(PHONE);
    let answer = app
        .sms_verify(json!({ "phone": PHONE, "code": fresh }))
        .await;
    assert_eq!(
        answer.body,
        json!({ "valid": true }),
        "a new send starts afresh"
    );
}

async fn a_new_send_replaces_the_previous_code(backend: Backend) {
    let app = spawn_app(backend, |_| {}).await;
    app.sms_send(json!({ "phone": PHONE })).await;
    let old = app.sms.last_code(PHONE);
    app.sms_send(json!({ "phone": PHONE })).await;
    let new = app.sms.last_code(PHONE);
    if old != new {
        let answer = app.sms_verify(json!({ "phone": PHONE, "code": old })).await;
        assert_eq!(answer.body["valid"], false);
    }
    let answer = app.sms_verify(json!({ "phone": PHONE, "code": new })).await;
    assert_eq!(answer.body, json!({ "valid": true }));
}

async fn a_code_never_sent_counts_down_like_a_wrong_code(backend: Backend) {
    let app = spawn_app(backend, |_| {}).await;
    let answer = app
        .sms_verify(json!({ "phone": PHONE, "code": "123456" }))
        .await;
    assert_eq!(answer.status, 200);
    assert_eq!(answer.body, json!({ "valid": false, "attempts_left": 4 }));
    assert!(app.audit_events().is_empty());
    // A send afterwards starts with every try.
    app.sms_send(json!({ "phone": PHONE })).await;
    let code = app.sms.last_code(PHONE);
    let wrong_try = app
        .sms_verify(json!({ "phone": PHONE, "code": wrong(&code) }))
        .await;
    assert_eq!(
        wrong_try.body,
        json!({ "valid": false, "attempts_left": 4 })
    );
}

/// Five wrong tries used to burn anyone's code, from any address. Now
/// the address that asked for it (an IPv6 client's /64) keeps tries of its
/// own: strangers use up only theirs, and its own last wrong try still
/// burns the code for everyone.
async fn strangers_cannot_burn_the_code_of_the_address_that_asked_for_it(backend: Backend) {
    let app = spawn_app(backend, |_| {}).await;
    let (victim, asker) = ("+8613800138010", "2001:db8:1:2::10");
    let (attacker, other_attacker) = ("203.0.113.66", "2001:db8:1:3::1");
    app.sms_send(json!({ "phone": victim, "ip": asker })).await;
    let code = app.sms.last_code(victim);
    let verify = |code: String, ip: &'static str| {
        let app = &app;
        async move {
            app.sms_verify(json!({ "phone": victim, "code": code, "ip": ip }))
                .await
        }
    };
    for left in [4, 3, 2, 1, 0] {
        let answer = verify(wrong(&code), attacker).await;
        assert_eq!(
            answer.body,
            json!({ "valid": false, "attempts_left": left })
        );
    }
    for ip in [attacker, other_attacker] {
        let refused = verify(code.clone(), ip).await;
        assert_eq!(refused.status, 429, "strangers' tries are used up: {ip}");
        assert_eq!(refused.body["rule"], "phone 5/5m");
    }
    let burns: Vec<_> = app
        .audit_events()
        .into_iter()
        .filter(|e| e.reason == "verify_attempts_exhausted")
        .map(|e| e.subject)
        .collect();
    assert_eq!(burns, [victim], "the stranger's last try is audited");

    let same_network = "2001:db8:1:2::99";
    let typo = verify(wrong(&code), same_network).await;
    assert_eq!(
        typo.body,
        json!({ "valid": false, "attempts_left": 4 }),
        "the asker's /64 has all its own tries"
    );
    let verified = verify(code.clone(), asker).await;
    assert_eq!(verified.body, json!({ "valid": true }));

    // The asker's own last wrong try burns the code for everyone.
    let phone = "+8613800138011";
    app.sms_send(json!({ "phone": phone, "ip": asker })).await;
    let code = app.sms.last_code(phone);
    for _ in 0..5 {
        app.sms_verify(json!({ "phone": phone, "code": wrong(&code), "ip": asker }))
            .await;
    }
    for ip in [asker, attacker] {
        let refused = app
            .sms_verify(json!({ "phone": phone, "code": code, "ip": ip }))
            .await;
        assert_eq!(refused.status, 429, "burnt for {ip}: {}", refused.body);
    }
}

/// A backend that sends naming no client is its code's asker: strangers
/// who use up their share cannot refuse its own tries at the user's code,
/// as they cannot an asking client's.
async fn strangers_cannot_burn_a_code_the_backend_asked_for_naming_no_client(backend: Backend) {
    let app = spawn_app(backend, |_| {}).await;
    let phone = "+8613800138012";
    let sent = app.sms_send(json!({ "phone": phone })).await;
    assert_eq!(sent.status, 200, "{}", sent.body);
    let code = app.sms.last_code(phone);
    for left in [4, 3, 2, 1, 0] {
        let answer = app
            .sms_verify(json!({ "phone": phone, "code": wrong(&code), "ip": "203.0.113.66" }))
            .await;
        assert_eq!(
            answer.body,
            json!({ "valid": false, "attempts_left": left })
        );
    }
    let stranger = app
        .sms_verify(json!({ "phone": phone, "code": code, "ip": "198.51.100.9" }))
        .await;
    assert_eq!(
        stranger.status, 429,
        "the strangers' share is used up: {}",
        stranger.body
    );
    let own = app
        .sms_verify(json!({ "phone": phone, "code": code }))
        .await;
    assert_eq!(own.body, json!({ "valid": true }), "the backend's own try");
}

/// Every answer of one phone, from its first wrong try to the first refused
/// one: status, body and Retry-After.
async fn burn(app: &TestApp, phone: &str) -> Vec<(u16, Value, Option<String>)> {
    let mut answers = Vec::new();
    for _ in 0..6 {
        let answer = app
            .sms_verify(json!({ "phone": phone, "code": "000000" }))
            .await;
        answers.push((answer.status.as_u16(), answer.body, answer.retry_after));
    }
    answers
}

/// `attempts_left` used to tell whether a code was pending (n, or 0). A
/// prober now reads the same answers either way, to the burnt code's 429
/// and its Retry-After (which, as the code's expiry, told when it was sent).
async fn the_answers_are_the_same_with_and_without_a_pending_code(backend: Backend) {
    let app = spawn_app_timed(backend, |_| {}).await;
    let (pending, none) = ("+8613800138000", "+8613800138001");
    app.sms_send(json!({ "phone": pending })).await;
    let code = app.sms.last_code(pending);
    assert_ne!(code, "000000", "a code of six zeros would be right");
    app.pass(std::time::Duration::from_millis(1_500)).await;
    let (with, without) = (burn(&app, pending).await, burn(&app, none).await);
    let bodies = |answers: &[(u16, Value, Option<String>)]| {
        answers
            .iter()
            .map(|(status, body, _)| (*status, body.clone()))
            .collect::<Vec<_>>()
    };
    assert_eq!(bodies(&with), bodies(&without));
    let expected: Vec<(u16, Value)> = [4, 3, 2, 1, 0]
        .into_iter()
        .map(|left| (200, json!({ "valid": false, "attempts_left": left })))
        .chain([(
            429,
            json!({
                "error": "rate_limited",
                "message": with[5].1["message"].clone(),
                "retry_after_secs": with[5].1["retry_after_secs"].clone(),
                "rule": "phone 5/5m"
            }),
        )])
        .collect();
    assert_eq!(bodies(&with), expected);
    assert_eq!(with[5].2, without[5].2, "the same Retry-After");
    assert_eq!(with[5].2.as_deref(), Some("300"), "a code's life");
    // Both burns are audited alike.
    let burnt: Vec<&str> = app
        .audit_events()
        .iter()
        .filter(|e| e.reason == "verify_attempts_exhausted")
        .map(|e| e.subject.as_str())
        .collect::<Vec<_>>()
        .into_iter()
        .map(|s| if s == pending { "pending" } else { "none" })
        .collect();
    assert_eq!(burnt, ["pending", "none"]);
}

/// The probe: one address trying codes on phone after phone. Its
/// 31st failed try in the hour is refused before any code is looked at, so
/// it burns nothing: the victim still verifies from its own address. The
/// limit is the shipped default (the test settings loosen it), so that a
/// default turned off or changed fails here.
async fn the_31st_failed_try_from_one_address_is_refused_and_another_still_verifies(
    backend: Backend,
) {
    let app = spawn_app(backend, |s| {
        let defaults = Settings::defaults().expect("the embedded defaults are valid");
        s.sms.verify_ip_limits = defaults.sms.verify_ip_limits;
    })
    .await;
    let victim = "+8613800138099";
    app.sms_send(json!({ "phone": victim })).await;
    let code = app.sms.last_code(victim);
    let attacker = "203.0.113.66";
    for i in 0..30 {
        let phone = format!("+86138001380{i:02}");
        let probe = app
            .sms_verify(json!({ "phone": phone, "code": "000000", "ip": attacker }))
            .await;
        assert_eq!(
            probe.body,
            json!({ "valid": false, "attempts_left": 4 }),
            "probe {i}"
        );
    }
    let throttled = app
        .sms_verify(json!({ "phone": victim, "code": code, "ip": attacker }))
        .await;
    assert_eq!(throttled.status, 429, "{}", throttled.body);
    assert_eq!(throttled.error(), "rate_limited");
    assert_eq!(throttled.body["rule"], "ip 30/1h");
    assert!(
        throttled.body.get("valid").is_none(),
        "nothing about the code"
    );
    let secs: u64 = throttled.retry_after.as_deref().unwrap().parse().unwrap();
    assert!((3_599..=3_600).contains(&secs), "{secs}");

    let row = app
        .audit_events()
        .into_iter()
        .find(|e| e.action == Action::SmsVerify && e.subject_kind == SubjectKind::Ip)
        .expect("the refusal is audited");
    assert_eq!(
        (row.decision, row.reason.as_str(), row.subject.as_str()),
        (AuditDecision::Deny, "rate_limited", attacker)
    );
    assert_eq!(
        (row.rule.as_deref(), row.observed, row.limit),
        (Some("ip 30/1h"), Some(30), Some(30))
    );

    // The victim's code was not looked at: all its tries are left.
    let victim_ip = "198.51.100.7";
    let typo = app
        .sms_verify(json!({ "phone": victim, "code": wrong(&code), "ip": victim_ip }))
        .await;
    assert_eq!(typo.body, json!({ "valid": false, "attempts_left": 4 }));
    let verified = app
        .sms_verify(json!({ "phone": victim, "code": code, "ip": victim_ip }))
        .await;
    assert_eq!(verified.body, json!({ "valid": true }));

    // Subject state shows the window; unblock clears it.
    let state = app
        .admin_get(&format!("/admin/api/subjects/ip/{attacker}"))
        .await;
    let window = state.body["windows"]
        .as_array()
        .and_then(|w| w.iter().find(|w| w["action"] == "sms_verify"))
        .cloned()
        .unwrap_or_else(|| panic!("{}", state.body));
    assert_eq!(
        (&window["rule"], &window["count"], &window["limit"]),
        (&json!("ip 30/1h"), &json!(30), &json!(30))
    );
    app.admin_post(&format!("/admin/api/subjects/ip/{attacker}/unblock"))
        .await;
    let after = app
        .sms_verify(json!({ "phone": "+8613800138050", "code": "000000", "ip": attacker }))
        .await;
    assert_eq!(after.status, 200, "{}", after.body);
}

/// DESIGN.md §3's verify body has no `ip`: a backend built to it names no
/// client, and its users' tries must not add up under its own address
/// (thirty typos an hour, anyone's, would refuse every verify, right codes
/// too). A browser calling from the same address still counts as itself.
async fn a_backend_that_names_no_client_is_not_one_address_that_every_user_fills(backend: Backend) {
    let app = spawn_app(backend, |s| {
        let defaults = Settings::defaults().expect("the embedded defaults are valid");
        s.sms.verify_ip_limits = defaults.sms.verify_ip_limits;
        s.server.keyless_sms = true;
    })
    .await;
    let uncounted = "tollgate_sms_verify_without_client_ip_total";
    let before = app.metric(uncounted).await;
    let user = "+8613800138099";
    app.sms_send(json!({ "phone": user })).await;
    let code = app.sms.last_code(user);
    for i in 0..31 {
        let typo = app
            .sms_verify(json!({ "phone": format!("+86138001380{i:02}"), "code": "000000" }))
            .await;
        assert_eq!(typo.status, 200, "typo {i}: {}", typo.body);
    }
    let verified = app.sms_verify(json!({ "phone": user, "code": code })).await;
    assert_eq!(verified.body, json!({ "valid": true }));
    assert!(app.metric(uncounted).await - before >= 32.0);

    // The same address without a key is a browser: its own tries count.
    let keyless = |phone: String| {
        app.client
            .post(format!("{}/sms/verify", app.address))
            .json(&json!({ "phone": phone, "code": "000000" }))
    };
    for i in 0..30 {
        let probe = app.send_raw(keyless(format!("+86138001381{i:02}"))).await;
        assert_eq!(probe.status, 200, "probe {i}: {}", probe.body);
    }
    let throttled = app.send_raw(keyless("+8613800138150".into())).await;
    assert_eq!(throttled.status, 429, "{}", throttled.body);
    assert_eq!(throttled.body["rule"], "ip 30/1h");
}

/// A user who mistypes pays for it; one who types the code right does not.
async fn a_right_code_gives_its_try_back(backend: Backend) {
    let app = spawn_app(backend, |s| {
        s.sms.verify_ip_limits = limits(&[(2, 3_600_000)]);
    })
    .await;
    let ip = "198.51.100.8";
    let verify = |phone: &'static str, code: String| {
        app.sms_verify(json!({ "phone": phone, "code": code, "ip": ip }))
    };
    for phone in ["+8613800138001", "+8613800138002", "+8613800138003"] {
        app.sms_send(json!({ "phone": phone })).await;
        let code = app.sms.last_code(phone);
        assert_eq!(
            verify(phone, code).await.body,
            json!({ "valid": true }),
            "{phone}"
        );
    }
    app.sms_send(json!({ "phone": "+8613800138004" })).await;
    let code = app.sms.last_code("+8613800138004");
    assert_eq!(verify("+8613800138004", wrong(&code)).await.status, 200);
    assert_eq!(verify("+8613800138004", wrong(&code)).await.status, 200);
    let refused = verify("+8613800138004", code).await;
    assert_eq!(
        refused.status, 429,
        "two failed tries fill 2/1h: {}",
        refused.body
    );
    assert_eq!(refused.body["rule"], "ip 2/1h");
}

/// One /48 holds 65,536 /64s, each with its own 30 failed tries an hour:
/// the network's window bounds them together (and the stand-in codes
/// their probes write). A right code gives its try back to both; another
/// network and IPv4 clients are not touched; unblock clears the window.
async fn the_64s_of_one_network_share_its_failed_tries(backend: Backend) {
    let app = spawn_app(backend, |s| {
        s.sms.verify_network_limits = limits(&[(3, 3_600_000)]);
    })
    .await;
    let verify = |phone: &str, code: &str, ip: &str| {
        app.sms_verify(json!({ "phone": phone, "code": code, "ip": ip }))
    };
    let user = "+8613800138070";
    app.sms_send(json!({ "phone": user })).await;
    let code = app.sms.last_code(user);
    assert_eq!(
        verify(user, &code, "2001:db8:77:9::1").await.body,
        json!({ "valid": true })
    );
    for i in 1..=3 {
        let probe = verify(
            &format!("+86138001380{i:02}"),
            "000000",
            &format!("2001:db8:77:{i}::1"),
        )
        .await;
        assert_eq!(probe.status, 200, "probe {i}: {}", probe.body);
    }
    let refused = verify("+8613800138004", "000000", "2001:db8:77:4::1").await;
    assert_eq!(refused.status, 429, "{}", refused.body);
    assert_eq!(refused.body["rule"], "network 3/1h");
    for (ip, what) in [
        ("2001:db8:78:1::1", "another /48"),
        ("203.0.113.70", "IPv4"),
    ] {
        let other = verify("+8613800138005", "000000", ip).await;
        assert_eq!(other.status, 200, "{what}: {}", other.body);
    }
    let row = app
        .audit_events()
        .into_iter()
        .find(|e| e.action == Action::SmsVerify && e.subject_kind == SubjectKind::Network)
        .expect("the refusal is audited");
    assert_eq!(
        (
            row.subject.as_str(),
            row.rule.as_deref(),
            row.reason.as_str()
        ),
        ("2001:db8:77::/48", Some("network 3/1h"), "rate_limited")
    );
    app.admin_post("/admin/api/subjects/network/2001:db8:77::/48/unblock")
        .await;
    let after = verify("+8613800138006", "000000", "2001:db8:77:5::1").await;
    assert_eq!(after.status, 200, "{}", after.body);
}

#[tokio::test]
async fn an_expired_code_is_invalid_like_a_wrong_one() {
    let clock = ManualClock::new(1_700_000_000_000);
    let app = spawn_app_with_clock(Backend::Memory, Some(clock.clone()), |_| {}).await;
    app.sms_send(json!({ "phone": PHONE })).await;
    let code = app.sms.last_code(PHONE);
    clock.advance_ms(300_001);
    let answer = app
        .sms_verify(json!({ "phone": PHONE, "code": code }))
        .await;
    assert_eq!(answer.body, json!({ "valid": false, "attempts_left": 4 }));
}

/// So many tries that one code falls to a guesser more often than one time
/// in 1,000 are refused at start-up, naming the key and the bound.
#[test]
fn more_tries_than_a_code_can_bear_are_refused() {
    for (lines, expected) in [
        (
            "code_length = 4\nmax_verify_attempts = 11",
            "invalid setting `sms.max_verify_attempts`: must be at most 10 with \
             sms.code_length = 4: more tries guess one code in 1,000",
        ),
        (
            "max_verify_attempts = 1001",
            "invalid setting `sms.max_verify_attempts`: must be at most 1000 with \
             sms.code_length = 6: more tries guess one code in 1,000",
        ),
    ] {
        let error = crate::support::app::config_error(&format!("[sms]\n{lines}\n"));
        assert_eq!(error, expected, "{lines}");
    }
    for lines in [
        "code_length = 4\nmax_verify_attempts = 10",
        "max_verify_attempts = 1000",
    ] {
        let loaded = crate::support::app::load_config(&format!("[sms]\n{lines}\n"));
        assert!(loaded.is_ok(), "{lines}: {loaded:?}");
    }
}
