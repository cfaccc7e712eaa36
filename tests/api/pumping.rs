//! The SMS pumping guard (`[sms.pumping]`): a number prefix whose codes are
//! seldom verified is blocked; a country is judged against its normal and
//! asks for a captcha before it is blocked. Through the HTTP API on both
//! backends.

use std::time::Duration;

use serde_json::{json, Value};
use tollgate::audit::{AuditDecision, AuditEvent};
use tollgate::domain::{Action, SubjectKind};
use tollgate::settings::{Fraction, Settings};
use tollgate::store::ManualClock;

use crate::on_both_backends;
use crate::support::app::run_binary as tollgate;
use crate::support::app::{
    spawn_app, spawn_app_with_audit_db, spawn_app_with_clock, Backend, TestApp,
};
use crate::support::audit_db::{DbKind, TestDb};

on_both_backends!(
    exactly_at_the_threshold_a_prefix_is_not_blocked,
    just_below_the_threshold_the_send_is_refused_and_the_block_audited_once,
    with_fewer_than_min_sends_nothing_is_blocked,
    verifies_raise_the_conversion_back_over_the_threshold,
    an_allow_listed_phones_verifies_do_not_hide_pumping,
    a_failed_delivery_is_not_counted,
    the_block_ends_after_block_duration,
    twenty_unverified_sends_from_twenty_addresses_no_longer_block_a_country,
    a_walk_over_the_country_floor_asks_for_a_captcha_and_a_passed_one_gets_a_code,
    a_captcha_farm_in_a_challenged_country_blocks_it,
    subject_state_shows_the_block_and_the_challenge_and_unblock_lifts_them,
    in_shadow_mode_the_block_is_audited_and_sends_go_through,
    in_shadow_mode_a_country_challenge_is_audited_and_nothing_is_refused,
    the_console_lists_the_blocked_ranges_and_shows_a_countrys_normal,
    with_the_guard_off_nothing_is_counted,
    the_audit_trail_shows_the_three_figures_and_filters_by_country,
);

/// Blocks a prefix below 40 % of at least 5 sends in an hour, for 12
/// hours (a country keeps its floor of 500).
fn guard(s: &mut Settings) {
    s.sms.pumping.enabled = true;
    s.sms.pumping.min_sends = 5;
    s.sms.pumping.min_conversion = Fraction::new(0.4).expect("a fraction");
    s.sms.pumping.window = Duration::from_secs(3600);
    s.sms.pumping.block_duration = Duration::from_secs(12 * 3600);
}

/// The `i`-th number of prefix `+8613800`.
fn phone(i: usize) -> String {
    format!("+86138001380{i:02}")
}

async fn send(app: &TestApp, phone: &str) -> crate::support::app::Answer {
    app.sms_send(json!({ "phone": phone })).await
}

/// `n` codes sent to numbers `from..from + n` of the prefix, each delivered.
async fn sent(app: &TestApp, from: usize, n: usize) {
    for i in from..from + n {
        let answer = send(app, &phone(i)).await;
        assert_eq!(answer.status, 200, "send {i}: {}", answer.body);
    }
}

/// Verify the code last sent to `phone`.
async fn verify(app: &TestApp, phone: &str) {
    let code = app.sms.last_code(phone);
    let answer = app
        .sms_verify(json!({ "phone": phone, "code": code }))
        .await;
    assert_eq!(answer.body, json!({ "valid": true }));
}

fn pumping_rows(app: &TestApp) -> Vec<AuditEvent> {
    app.audit_events()
        .into_iter()
        .filter(|e| e.reason == "pumping_suspected")
        .collect()
}

async fn exactly_at_the_threshold_a_prefix_is_not_blocked(backend: Backend) {
    let app = spawn_app(backend, guard).await;
    sent(&app, 0, 5).await;
    verify(&app, &phone(0)).await;
    verify(&app, &phone(1)).await;
    let sixth = send(&app, &phone(5)).await;
    assert_eq!(sixth.status, 200, "2/5 is exactly 40%: {}", sixth.body);
    assert!(pumping_rows(&app).is_empty());
}

async fn just_below_the_threshold_the_send_is_refused_and_the_block_audited_once(backend: Backend) {
    let app = spawn_app(backend, guard).await;
    let refusals_before = app.metric("tollgate_pumping_refusals_total").await;
    sent(&app, 0, 5).await;
    verify(&app, &phone(0)).await;

    let refused = send(&app, &phone(5)).await;
    assert_eq!(refused.status, 403, "{}", refused.body);
    assert_eq!(refused.error(), "pumping_suspected");
    assert!(refused.retry_after.is_none());
    assert_eq!(app.sms.messages().len(), 5, "the refused code was not sent");
    // The alert's counter. The recorder is the test process's, shared by
    // every app in it: at least as many, as other tests refuse too.
    let refusals = "tollgate_pumping_refusals_total";
    let counted = app.metric(refusals).await - refusals_before;
    assert!(counted >= 1.0, "the alert's counter: {counted}");

    let locks = pumping_rows(&app);
    let subjects: Vec<(SubjectKind, &str, AuditDecision)> = locks
        .iter()
        .map(|e| (e.subject_kind, e.subject.as_str(), e.decision))
        .collect();
    assert_eq!(
        subjects,
        [(SubjectKind::Prefix, "+8613800", AuditDecision::Lock)],
        "the send that trips it is its lock row; five sends are nothing for a country"
    );
    let row = &locks[0];
    assert_eq!(row.action, Action::SmsSend);
    assert_eq!(
        row.rule.as_deref(),
        Some("prefix conversion 1/5 (20%) < 40% per 1h"),
        "the three figures: verified, sent, and their share"
    );
    assert_eq!(
        (row.observed, row.limit, row.window_ms, row.retry_after_ms),
        (Some(5), Some(5), Some(3_600_000), Some(12 * 3_600_000))
    );
    assert!(!row.shadow);

    // Later sends, to any number of the range: deny rows with the same figures.
    for i in [5, 6, 7] {
        let again = send(&app, &phone(i)).await;
        assert_eq!(again.error(), "pumping_suspected");
    }
    let rows = pumping_rows(&app);
    assert_eq!(rows.len(), 4);
    let counted = app.metric(refusals).await - refusals_before;
    assert!(counted >= 4.0, "{counted}");
    for deny in &rows[1..] {
        assert_eq!(deny.decision, AuditDecision::Deny);
        assert_eq!(deny.observed, Some(5));
        assert!(deny
            .rule
            .as_deref()
            .unwrap_or_default()
            .contains("1/5 (20%)"));
        let retry = deny.retry_after_ms.unwrap_or(0);
        assert!(
            retry > 12 * 3_600_000 - 60_000 && retry <= 12 * 3_600_000,
            "{retry}"
        );
    }
    assert_eq!(app.sms.messages().len(), 5);
    // Verifying is not blocked: a real user of the range can still finish.
    verify(&app, &phone(1)).await;
}

async fn with_fewer_than_min_sends_nothing_is_blocked(backend: Backend) {
    let app = spawn_app(backend, guard).await;
    sent(&app, 0, 4).await;
    let fifth = send(&app, &phone(4)).await;
    assert_eq!(
        fifth.status, 200,
        "four sends are below min_sends: {}",
        fifth.body
    );
    let sixth = send(&app, &phone(5)).await;
    assert_eq!(
        sixth.error(),
        "pumping_suspected",
        "five sent, none verified"
    );
}

async fn verifies_raise_the_conversion_back_over_the_threshold(backend: Backend) {
    let app = spawn_app(backend, guard).await;
    sent(&app, 0, 5).await;
    verify(&app, &phone(0)).await;
    // 1/5 would block; a second verify makes it 2/5.
    verify(&app, &phone(3)).await;
    let sixth = send(&app, &phone(5)).await;
    assert_eq!(sixth.status, 200, "{}", sixth.body);
    let state = app.admin_get("/admin/api/subjects/prefix/%2B8613800").await;
    assert_eq!(
        (
            &state.body["pumping"]["sends"],
            &state.body["pumping"]["verified"]
        ),
        (&json!(6), &json!(2)),
        "{}",
        state.body
    );
}

/// An allow-listed phone's sends are not counted, nor their verifies: a
/// QA number verified all day would otherwise let as many unverified sends
/// to the range through. An allow-listed address's sends are counted, and
/// its sends to a blocked range refused: whoever may name the client could
/// name it. The code says whether its send counted: a counted send
/// verified on the office's allow-listed network (sent on mobile data)
/// still counts.
async fn an_allow_listed_phones_verifies_do_not_hide_pumping(backend: Backend) {
    const OFFICE: &str = "192.0.2.10";
    let app = spawn_app(backend, |s| {
        guard(s);
        s.lists.allow_phones = vec![phone(0)];
        s.lists.allow_ips = vec![format!("{OFFICE}/32").parse().expect("a network")];
    })
    .await;
    let _sends = crate::support::ALLOW_LISTED_IP_SENDS.lock().await;
    // The QA rig names itself: a listed phone's send that names no client
    // is counted as any phone's.
    for _ in 0..5 {
        let answer = app
            .sms_send(json!({ "phone": phone(0), "ip": "192.0.2.40" }))
            .await;
        assert_eq!(answer.status, 200, "{}", answer.body);
        verify(&app, &phone(0)).await;
    }
    sent(&app, 1, 5).await;
    let state = app.admin_get("/admin/api/subjects/prefix/%2B8613800").await;
    assert_eq!(
        (
            &state.body["pumping"]["sends"],
            &state.body["pumping"]["verified"]
        ),
        (&json!(5), &json!(0)),
        "{}",
        state.body
    );
    let refused = send(&app, &phone(6)).await;
    assert_eq!(refused.error(), "pumping_suspected", "{}", refused.body);
    let from_the_office = app
        .sms_send(json!({ "phone": phone(10), "ip": OFFICE }))
        .await;
    assert_eq!(
        from_the_office.error(),
        "pumping_suspected",
        "the guard applies to an allow-listed address: {}",
        from_the_office.body
    );

    let code = app.sms.last_code(&phone(1));
    let from_the_office = app
        .sms_verify(json!({ "phone": phone(1), "code": code, "ip": OFFICE }))
        .await;
    assert_eq!(from_the_office.body, json!({ "valid": true }));
    let state = app.admin_get("/admin/api/subjects/prefix/%2B8613800").await;
    assert_eq!(state.body["pumping"]["verified"], 1, "{}", state.body);
}

async fn a_failed_delivery_is_not_counted(backend: Backend) {
    let app = spawn_app(backend, guard).await;
    app.sms.fail(true);
    for i in 0..6 {
        assert_eq!(send(&app, &phone(i)).await.status, 502);
    }
    app.sms.fail(false);
    sent(&app, 10, 5).await;
    let state = app.admin_get("/admin/api/subjects/prefix/%2B8613800").await;
    assert_eq!(state.body["pumping"]["sends"], 5, "{}", state.body);
}

async fn the_block_ends_after_block_duration(backend: Backend) {
    let clock = ManualClock::new(1_700_000_000_000);
    let app = spawn_app_with_clock(backend, Some(clock.clone()), |s| {
        guard(s);
        // Redis keeps its own time: a block short enough to wait for.
        if backend == Backend::Redis {
            s.sms.pumping.block_duration = Duration::from_millis(1_500);
        }
    })
    .await;
    sent(&app, 0, 5).await;
    assert_eq!(send(&app, &phone(5)).await.error(), "pumping_suspected");
    match backend {
        Backend::Memory => {
            clock.advance_ms(12 * 3_600_000 - 1);
            assert_eq!(send(&app, &phone(5)).await.error(), "pumping_suspected");
            clock.advance_ms(1);
        }
        Backend::Redis => tokio::time::sleep(Duration::from_millis(1_600)).await,
    }
    let after = send(&app, &phone(5)).await;
    assert_eq!(after.status, 200, "the block has ended: {}", after.body);
    // The counts started afresh at the block: four more pass, then it trips again.
    sent(&app, 6, 4).await;
    assert_eq!(send(&app, &phone(10)).await.error(), "pumping_suspected");
}

/// The `i`-th number of its own CN prefix (`+86139ii`), one per prefix.
fn spread(i: usize) -> String {
    format!("+86139{i:02}138000")
}

/// The `i`-th client address.
fn address(i: usize) -> String {
    format!("198.51.100.{}", i + 1)
}

/// The attack: with the defaults, twenty unverified sends to CN
/// from twenty addresses used to block every CN number for twelve hours.
/// Twenty sends are nothing for a country now; prefixes are still judged.
async fn twenty_unverified_sends_from_twenty_addresses_no_longer_block_a_country(backend: Backend) {
    let app = spawn_app(backend, |_| {}).await;
    for i in 0..20 {
        let answer = app
            .sms_send(json!({ "phone": spread(i), "ip": address(i) }))
            .await;
        assert_eq!(answer.status, 200, "send {i}: {}", answer.body);
    }
    let user = app
        .sms_send(json!({ "phone": "+8613800138000", "ip": "203.0.113.80" }))
        .await;
    assert_eq!(user.status, 200, "a real CN user: {}", user.body);
    assert_eq!(user.body["captcha_required"], false);
    for i in 0..20 {
        let again = app.sms_send(json!({ "phone": spread(i) })).await;
        assert_eq!(again.status, 200, "prefix {i}: {}", again.body);
    }
    assert!(pumping_rows(&app).is_empty());
    let country = app.admin_get("/admin/api/subjects/country/CN").await;
    let pumping = &country.body["pumping"];
    assert_eq!(
        (&pumping["sends"], &pumping["level"], &pumping["min_sends"]),
        (&json!(41), &json!("open"), &json!(500)),
        "{}",
        country.body
    );
}

/// A brand-new deployment has no normal: the floor alone judges.
fn country_floor(floor: u32) -> impl FnOnce(&mut Settings) {
    move |s: &mut Settings| {
        guard(s);
        s.sms.pumping.country_min_sends = floor;
    }
}

async fn a_walk_over_the_country_floor_asks_for_a_captcha_and_a_passed_one_gets_a_code(
    backend: Backend,
) {
    let app = spawn_app(backend, country_floor(10)).await;
    for i in 0..10 {
        assert_eq!(send(&app, &spread(i)).await.status, 200, "send {i}");
    }
    let refused = send(&app, &spread(10)).await;
    assert_eq!(refused.status, 403, "{}", refused.body);
    assert_eq!(refused.error(), "captcha_required");
    assert_eq!(refused.body["captcha_required"], true);
    assert!(refused.retry_after.is_none());
    let rows = pumping_rows(&app);
    assert_eq!(rows.len(), 1, "{rows:?}");
    let row = &rows[0];
    assert_eq!(
        (row.subject_kind, row.subject.as_str(), row.decision),
        (SubjectKind::Country, "CN", AuditDecision::Challenge)
    );
    assert_eq!(
        row.rule.as_deref(),
        Some("country conversion 0/10 (0%) < 40% per 1h, 10 sends ≥ 5× normal 0")
    );
    assert_eq!(
        (row.observed, row.limit, row.window_ms, row.retry_after_ms),
        (Some(10), Some(10), Some(3_600_000), Some(12 * 3_600_000))
    );

    // A real user who passes a captcha gets a code, and can verify it.
    let passed = app
        .sms_send(json!({ "phone": spread(10), "captcha_passed": true }))
        .await;
    assert_eq!(passed.status, 200, "{}", passed.body);
    assert_eq!(
        passed.body["captcha_required"], true,
        "the next send needs one too"
    );
    verify(&app, &spread(10)).await;
    let again = send(&app, &spread(11)).await;
    assert_eq!(again.error(), "captcha_required");
    assert_eq!(app.sms.messages().len(), 11);
    // Another country is not asked.
    assert_eq!(send(&app, "+33612345678").await.status, 200);
    let rows = pumping_rows(&app);
    assert_eq!(rows.len(), 2, "the start, and the send refused after it");
    assert_eq!(rows[1].decision, AuditDecision::Challenge);
    assert_eq!(
        rows[1].rule, rows[0].rule,
        "the figures that set the challenge"
    );
}

async fn a_captcha_farm_in_a_challenged_country_blocks_it(backend: Backend) {
    let clock = ManualClock::new(1_700_000_000_000);
    // Redis keeps its own time: a window whose slices (a twelfth) are short
    // enough to wait for.
    let window = match backend {
        Backend::Memory => Duration::from_secs(3600),
        Backend::Redis => Duration::from_secs(6),
    };
    let app = spawn_app_with_clock(backend, Some(clock.clone()), move |s| {
        country_floor(5)(s);
        s.sms.pumping.window = window;
    })
    .await;
    for i in 0..5 {
        assert_eq!(send(&app, &spread(i)).await.status, 200);
    }
    assert_eq!(send(&app, &spread(5)).await.error(), "captcha_required");
    // The next slice: sends that passed the captcha, none verified.
    let slice = window.as_millis() as u64 / 12;
    match backend {
        Backend::Memory => clock.advance_ms(slice),
        Backend::Redis => tokio::time::sleep(Duration::from_millis(slice + 50)).await,
    }
    let farmed = |i: usize| app.sms_send(json!({ "phone": spread(i), "captcha_passed": true }));
    for i in 10..15 {
        assert_eq!(farmed(i).await.status, 200, "farmed send {i}");
    }
    let blocked = farmed(15).await;
    assert_eq!(blocked.status, 403, "{}", blocked.body);
    assert_eq!(blocked.error(), "pumping_suspected");
    let lock = pumping_rows(&app)
        .into_iter()
        .find(|e| e.decision == AuditDecision::Lock)
        .expect("a lock row");
    assert_eq!(lock.subject, "CN");
    let window_name = match backend {
        Backend::Memory => "1h",
        Backend::Redis => "6s",
    };
    assert_eq!(
        lock.rule,
        Some(format!(
            "country conversion 0/5 (0%) < 40% per {window_name} after captcha, 5 sends ≥ 5× normal 0"
        ))
    );
    assert_eq!(lock.observed, Some(5));
    let state = app.admin_get("/admin/api/subjects/country/CN").await;
    assert_eq!(state.body["pumping"]["level"], "block", "{}", state.body);
    assert!(state.body["locked_until"].is_string());
    assert_eq!(state.body["captcha_required"], false);
}

#[tokio::test]
async fn with_country_block_off_a_captcha_is_the_most_a_country_gets() {
    let clock = ManualClock::new(1_700_000_000_000);
    let app = spawn_app_with_clock(Backend::Memory, Some(clock.clone()), |s| {
        country_floor(5)(s);
        s.sms.pumping.country_block = false;
    })
    .await;
    for i in 0..5 {
        send(&app, &spread(i)).await;
    }
    assert_eq!(send(&app, &spread(5)).await.error(), "captcha_required");
    clock.advance_ms(300_000);
    for i in 10..30 {
        let farmed = app
            .sms_send(json!({ "phone": spread(i), "captcha_passed": true }))
            .await;
        assert_eq!(farmed.status, 200, "farmed send {i}: {}", farmed.body);
    }
    assert!(pumping_rows(&app)
        .iter()
        .all(|e| e.decision == AuditDecision::Challenge));
}

/// A week of verified traffic teaches a country its normal; a surge is then
/// judged against it, not against a fixed number.
#[tokio::test]
async fn a_country_is_judged_against_its_normal() {
    // On the hour, so that a bucket of the history is an hour.
    let clock = ManualClock::new(1_699_999_200_000);
    let app = spawn_app_with_clock(Backend::Memory, Some(clock.clone()), |s| {
        s.sms.pumping.country_min_sends = 10;
        s.sms.pumping.country_history = Duration::from_secs(7 * 3600);
    })
    .await;
    // Seven hours of four verified codes each: 28 sends over 7 hours.
    let mut next = 0;
    for _ in 0..7 {
        for _ in 0..4 {
            assert_eq!(send(&app, &spread(next)).await.status, 200);
            verify(&app, &spread(next)).await;
            next += 1;
        }
        clock.advance_ms(3_600_000);
    }
    clock.advance_ms(600_000);
    let state = app.admin_get("/admin/api/subjects/country/CN").await;
    assert_eq!(
        (
            &state.body["pumping"]["normal"],
            &state.body["pumping"]["surge"]
        ),
        (&json!(4.0), &json!(5.0)),
        "{}",
        state.body
    );
    // Over the floor of 10, under five times the normal: no captcha.
    for i in 0..20 {
        let answer = send(&app, &spread(next + i)).await;
        assert_eq!(answer.status, 200, "unverified send {i}: {}", answer.body);
    }
    let refused = send(&app, &spread(next + 20)).await;
    assert_eq!(refused.error(), "captcha_required", "{}", refused.body);
    let rows = pumping_rows(&app);
    assert_eq!(
        rows[0].rule.as_deref(),
        Some("country conversion 0/20 (0%) < 20% per 1h, 20 sends ≥ 5× normal 4")
    );
}

async fn subject_state_shows_the_block_and_the_challenge_and_unblock_lifts_them(backend: Backend) {
    let app = spawn_app(backend, country_floor(5)).await;
    sent(&app, 0, 5).await;
    verify(&app, &phone(0)).await;
    assert_eq!(send(&app, &phone(5)).await.error(), "pumping_suspected");

    let prefix = app.admin_get("/admin/api/subjects/prefix/%2B8613800").await;
    assert_eq!(prefix.status, 200, "{}", prefix.body);
    let body = &prefix.body;
    assert!(body["locked_until"].is_string(), "{body}");
    let block = &body["pumping"]["block"];
    assert_eq!(block["until"], body["locked_until"]);
    assert_eq!(
        (&block["sends"], &block["verified"]),
        (&json!(5), &json!(1))
    );
    assert_eq!(block["rule"], "prefix conversion 1/5 (20%) < 40% per 1h");
    assert_eq!(block["shadow"], false);
    assert_eq!(
        (&body["pumping"]["sends"], &body["pumping"]["min_sends"]),
        (&json!(0), &json!(5)),
        "the counts started afresh at the block"
    );
    assert_eq!(body["pumping"]["level"], "block");
    assert!(body["pumping"].get("normal").is_none(), "a prefix has none");

    // Lower case names the same country: challenged, not blocked.
    let country = app.admin_get("/admin/api/subjects/country/cn").await;
    let body = &country.body;
    assert_eq!(body["id"], "CN", "{body}");
    assert_eq!(body["locked_until"], Value::Null);
    assert_eq!(body["captcha_required"], true);
    assert_eq!(body["windows"], json!([]));
    let pumping = &body["pumping"];
    assert_eq!(
        (&pumping["level"], &pumping["normal"], &pumping["surge"]),
        (&json!("challenge"), &json!(0.0), &json!(5.0))
    );
    assert_eq!(
        (
            &pumping["sends"],
            &pumping["verified"],
            &pumping["min_sends"]
        ),
        (&json!(5), &json!(1), &json!(5)),
        "a challenge keeps counting"
    );
    let challenge = &pumping["challenge"];
    assert_eq!(
        challenge["rule"],
        "country conversion 1/5 (20%) < 40% per 1h, 5 sends ≥ 5× normal 0"
    );
    assert!(challenge["until"].is_string());
    assert_eq!(pumping["block"], Value::Null);

    let unblocked = app
        .admin_post("/admin/api/subjects/prefix/%2B8613800/unblock")
        .await;
    assert_eq!(unblocked.status, 200, "{}", unblocked.body);
    assert_eq!(unblocked.body["locked_until"], Value::Null);
    assert_eq!(unblocked.body["pumping"]["block"], Value::Null);
    assert_eq!(
        send(&app, &phone(5)).await.error(),
        "captcha_required",
        "the country still asks for a captcha"
    );
    let unblocked = app
        .admin_post("/admin/api/subjects/country/CN/unblock")
        .await;
    assert_eq!(unblocked.body["pumping"]["challenge"], Value::Null);
    assert_eq!(unblocked.body["captcha_required"], false);
    assert_eq!(send(&app, &phone(5)).await.status, 200);

    let unblocks: Vec<(SubjectKind, String)> = app
        .audit_events()
        .into_iter()
        .filter(|e| e.decision == AuditDecision::Unblock)
        .map(|e| (e.subject_kind, e.subject))
        .collect();
    assert_eq!(
        unblocks,
        [
            (SubjectKind::Prefix, "+8613800".to_string()),
            (SubjectKind::Country, "CN".to_string())
        ]
    );
}

async fn in_shadow_mode_the_block_is_audited_and_sends_go_through(backend: Backend) {
    let app = spawn_app(backend, |s| {
        guard(s);
        s.sms.shadow = true;
    })
    .await;
    sent(&app, 0, 8).await;
    let rows = pumping_rows(&app);
    let decisions: Vec<(SubjectKind, AuditDecision, bool)> = rows
        .iter()
        .map(|e| (e.subject_kind, e.decision, e.shadow))
        .collect();
    assert_eq!(
        decisions,
        [
            (SubjectKind::Prefix, AuditDecision::Lock, true),
            (SubjectKind::Prefix, AuditDecision::Deny, true),
            (SubjectKind::Prefix, AuditDecision::Deny, true),
        ],
        "the sixth send trips it, the seventh and eighth would be refused"
    );
    assert_eq!(rows[0].observed, Some(5));
    assert_eq!(app.sms.messages().len(), 8, "every code was sent");

    let state = app.admin_get("/admin/api/subjects/prefix/%2B8613800").await;
    assert_eq!(state.body["locked_until"], Value::Null, "{}", state.body);
    assert_eq!(state.body["pumping"]["block"]["shadow"], true);
}

async fn in_shadow_mode_a_country_challenge_is_audited_and_nothing_is_refused(backend: Backend) {
    let app = spawn_app(backend, |s| {
        country_floor(5)(s);
        s.sms.shadow = true;
    })
    .await;
    for i in 0..8 {
        let answer = send(&app, &spread(i)).await;
        assert_eq!(answer.status, 200, "send {i}: {}", answer.body);
        assert_eq!(answer.body["captcha_required"], false);
    }
    let rows: Vec<(SubjectKind, AuditDecision, bool)> = pumping_rows(&app)
        .iter()
        .map(|e| (e.subject_kind, e.decision, e.shadow))
        .collect();
    let challenge = (SubjectKind::Country, AuditDecision::Challenge, true);
    assert_eq!(
        rows, [challenge; 3],
        "the sixth send starts it, the seventh and eighth would need a captcha"
    );
    let state = app.admin_get("/admin/api/subjects/country/CN").await;
    let body = &state.body;
    assert_eq!(body["captcha_required"], false, "{body}");
    assert_eq!(body["pumping"]["level"], "open");
    assert_eq!(body["pumping"]["challenge"]["shadow"], true);
}

#[tokio::test]
async fn global_shadow_covers_the_guard_and_a_shadow_block_is_not_enforced_after() {
    let app = spawn_app(Backend::Memory, |s| {
        guard(s);
        s.shadow.enabled = true;
    })
    .await;
    sent(&app, 0, 6).await;
    let rows = pumping_rows(&app);
    assert_eq!(rows.len(), 1);
    assert!(rows
        .iter()
        .all(|e| e.shadow && e.decision == AuditDecision::Lock));
    assert!(
        app.admin_get("/admin")
            .await
            .body
            .as_str()
            .is_some_and(|page| !page.contains("Blocked number ranges")),
        "a block in shadow is not listed as one in force"
    );
}

async fn the_console_lists_the_blocked_ranges_and_shows_a_countrys_normal(backend: Backend) {
    let app = spawn_app(backend, country_floor(5)).await;
    let page = app.admin_get("/admin").await;
    let body = page.body.as_str().unwrap_or_default();
    assert!(!body.contains("Blocked number ranges"), "none yet");

    sent(&app, 0, 5).await;
    assert_eq!(send(&app, &phone(5)).await.error(), "pumping_suspected");
    let page = app.admin_get("/admin").await;
    let body = page.body.as_str().unwrap_or_default();
    assert!(body.contains("Blocked number ranges"), "{body}");
    let href = "/admin/subjects/prefix/%2B8613800";
    assert!(body.contains(&format!("href=\"{href}\"")), "{href}: {body}");
    assert!(
        !body.contains("href=\"/admin/subjects/country/CN\""),
        "a challenged country is not blocked: {body}"
    );

    let subject = app.admin_get("/admin/subjects/prefix/%2B8613800").await;
    let body = subject.body.as_str().unwrap_or_default();
    assert!(body.contains("SMS pumping guard"), "{body}");
    assert!(
        body.contains("prefix conversion 0/5 (0%) &#60; 40% per 1h"),
        "{body}"
    );
    assert!(!body.contains("not blocked"), "{body}");

    let country = app.admin_get("/admin/subjects/country/CN").await;
    let body = country.body.as_str().unwrap_or_default();
    for shown in [
        "<dd>captcha required</dd>",
        "0 sends per 1h",
        "(a captcha from 5× that, and at least 5 sends)",
        "country conversion 0/5 (0%) &#60; 40% per 1h, 5 sends ≥ 5× normal 0",
        "not blocked",
    ] {
        assert!(body.contains(shown), "{shown}: {body}");
    }

    app.admin_post("/admin/api/subjects/prefix/%2B8613800/unblock")
        .await;
    let page = app.admin_get("/admin").await;
    let body = page.body.as_str().unwrap_or_default();
    assert!(
        !body.contains("/admin/subjects/prefix/%2B8613800"),
        "{body}"
    );
}

async fn with_the_guard_off_nothing_is_counted(backend: Backend) {
    let app = spawn_app(backend, |s| {
        guard(s);
        s.sms.pumping.enabled = false;
    })
    .await;
    sent(&app, 0, 12).await;
    assert!(pumping_rows(&app).is_empty());
    let state = app.admin_get("/admin/api/subjects/prefix/%2B8613800").await;
    assert!(state.body.get("pumping").is_none(), "{}", state.body);
}

async fn the_audit_trail_shows_the_three_figures_and_filters_by_country(backend: Backend) {
    let db = TestDb::new(DbKind::Sqlite).await;
    let (url, spool) = (db.url.clone(), db.spool_dir());
    let app = spawn_app_with_audit_db(backend, move |s| {
        country_floor(5)(s);
        s.audit.database_url = tollgate::settings::SecretUrl::new(url);
        s.audit.spool_dir = spool.display().to_string();
    })
    .await;
    sent(&app, 0, 5).await;
    verify(&app, &phone(2)).await;
    assert_eq!(send(&app, &phone(5)).await.error(), "pumping_suspected");
    // Another prefix of the country: the country's challenge answers.
    assert_eq!(send(&app, &spread(0)).await.error(), "captcha_required");
    app.flush_audit().await;

    let page = app
        .admin_get("/admin/api/events?subject_kind=country&subject=CN")
        .await;
    assert_eq!(page.status, 200, "{}", page.body);
    let rows: Vec<(Value, Value, Value, Value)> = page.body["events"]
        .as_array()
        .cloned()
        .unwrap_or_default()
        .into_iter()
        .map(|e| {
            (
                e["decision"].clone(),
                e["reason"].clone(),
                e["rule"].clone(),
                e["observed"].clone(),
            )
        })
        .collect();
    let row = (
        json!("challenge"),
        json!("pumping_suspected"),
        json!("country conversion 1/5 (20%) < 40% per 1h, 5 sends ≥ 5× normal 0"),
        json!(5),
    );
    assert_eq!(
        rows,
        [row.clone(), row],
        "newest first: the refused send, then the one that started it"
    );

    let csv = app
        .admin_get("/admin/api/events.csv?subject_kind=prefix&decision=lock")
        .await;
    let text = csv.body.as_str().unwrap_or_default();
    assert!(
        text.contains("pumping_suspected,prefix,'+8613800")
            && text.contains("prefix conversion 1/5 (20%) < 40% per 1h"),
        "{text}"
    );
}

#[test]
fn the_settings_are_printed_back_and_bad_values_are_refused_naming_the_key() {
    let (ok, stdout, stderr) = tollgate(&["check-config"], &[]);
    assert!(ok, "{stderr}");
    let printed: toml::Value = toml::from_str(&stdout).expect("TOML");
    assert_eq!(
        printed["sms"]["pumping"],
        toml::from_str::<toml::Value>(
            "enabled = true\nmin_sends = 20\nmin_conversion = 0.2\nwindow = \"1h\"\nblock_duration = \"12h\"\n\
             country_min_sends = 500\ncountry_surge = 5.0\ncountry_history = \"7d\"\ncountry_block = true"
        )
        .unwrap(),
        "{stdout}"
    );

    let (ok, stdout, stderr) = tollgate(
        &["check-config"],
        &[("TOLLGATE__SMS__PUMPING__MIN_CONVERSION", "25%")],
    );
    assert!(ok, "a percentage is taken: {stderr}");
    assert!(stdout.contains("min_conversion = 0.25"), "{stdout}");

    for (key, value) in [
        ("MIN_CONVERSION", "1.5"),
        ("MIN_CONVERSION", "150%"),
        ("MIN_CONVERSION", "-0.1"),
        ("MIN_CONVERSION", "often"),
        ("MIN_SENDS", "0"),
        ("WINDOW", "0s"),
        ("BLOCK_DURATION", "0ms"),
        ("ENABLED", "maybe"),
        ("COUNTRY_MIN_SENDS", "0"),
        ("COUNTRY_SURGE", "0.5"),
        ("COUNTRY_SURGE", "often"),
        ("COUNTRY_HISTORY", "30m"),
        ("COUNTRY_BLOCK", "maybe"),
    ] {
        let var = format!("TOLLGATE__SMS__PUMPING__{key}");
        let (ok, _, stderr) = tollgate(&["check-config"], &[(var.as_str(), value)]);
        let named = format!("`sms.pumping.{}`", key.to_lowercase());
        assert!(!ok, "{key} = {value} is refused");
        assert!(stderr.contains(&named), "{key} = {value}: {stderr}");
    }
}

/// A prefix blocked under an earlier `sms.prefix_digits` (a restart
/// changed it) stays listed until its block ends, and its unblock lifts it
/// and the listing; then, as any length no limit counts, it is refused.
#[tokio::test]
async fn a_prefix_blocked_under_an_earlier_length_can_be_unblocked() {
    let app = spawn_app(Backend::Redis, country_floor(5)).await;
    sent(&app, 0, 5).await;
    verify(&app, &phone(0)).await;
    assert_eq!(send(&app, &phone(5)).await.error(), "pumping_suspected");
    let key_prefix = app.key_prefix.clone();
    let restarted = spawn_app(Backend::Redis, move |s| {
        country_floor(5)(s);
        s.store.key_prefix = key_prefix;
        s.sms.prefix_digits = 6;
    })
    .await;
    let path = "/admin/api/subjects/prefix/%2B8613800/unblock";
    let unblocked = restarted.admin_post(path).await;
    assert_eq!(unblocked.status, 200, "{}", unblocked.body);
    assert_eq!(unblocked.body["pumping"]["block"], Value::Null);
    let again = restarted.admin_post(path).await;
    assert_eq!(
        (again.status.as_u16(), again.error()),
        (404, "not_found"),
        "no longer listed: {}",
        again.body
    );
    let counted = restarted
        .admin_post("/admin/api/subjects/prefix/%2B861380/unblock")
        .await;
    assert_eq!(counted.status, 200, "{}", counted.body);
}
