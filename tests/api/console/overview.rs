//! The console's overview: the counts as each database makes them (exact
//! numbers on fixed times), the page built from them, the subjects locked
//! now with their one-click Unblock, escaping, and bad periods.

use chrono::{DateTime, Duration, DurationRound, Utc};
use reqwest::header::{CONTENT_SECURITY_POLICY, LOCATION};
use serde_json::json;
use tollgate::audit::query::EventFilter;
use tollgate::audit::stats::{BucketCount, Limits, OpenLock, Ranked, Span};
use tollgate::audit::{AuditDecision, AuditEvent};
use tollgate::domain::{Action, Subject, SubjectKind};

use super::{assert_html, db_app, get, is_locked, post_form, unescape, ADMIN};
use crate::on_both_databases;
use crate::support::audit_db::{DbKind, TestDb};

fn at(rfc3339: &str) -> DateTime<Utc> {
    DateTime::parse_from_rfc3339(rfc3339)
        .unwrap()
        .with_timezone(&Utc)
}

fn subject(kind: SubjectKind, id: &str) -> Subject {
    Subject::new(kind, id)
}

/// A row of the trail at `time`.
fn row(
    time: DateTime<Utc>,
    action: Action,
    decision: AuditDecision,
    subject: Subject,
    ip: Option<&str>,
) -> AuditEvent {
    let mut e = AuditEvent::new(action, decision, "rate_limited", &subject);
    e.occurred_at = time;
    e.ip = ip.map(str::to_string);
    e
}

/// A `lock` row at `time` lasting `minutes`.
fn lock(time: &str, subject: Subject, minutes: i64) -> AuditEvent {
    let mut e = row(
        at(time),
        Action::LoginAttempt,
        AuditDecision::Lock,
        subject,
        None,
    );
    e.retry_after_ms = Some(minutes * 60_000);
    e
}

fn unblock(time: &str, subject: Subject) -> AuditEvent {
    row(
        at(time),
        Action::Admin,
        AuditDecision::Unblock,
        subject,
        None,
    )
}

fn ranked<T: Clone>(pairs: &[(T, u64)]) -> Vec<Ranked<T>> {
    pairs
        .iter()
        .map(|(key, count)| Ranked {
            key: key.clone(),
            count: *count,
        })
        .collect()
}

const TOP_TEN: Limits = Limits { top: 10, locks: 10 };
/// `audit.read_timeout` as shipped.
const READ_BOUND: std::time::Duration = std::time::Duration::from_secs(10);

on_both_databases!(
    the_database_counts_refusals_per_hour_and_the_top_lists_exactly,
    open_locks_are_those_not_run_out_nor_unblocked_latest_first,
    the_overview_page_charts_and_ranks_the_periods_refusals,
    locked_subjects_are_listed_and_unblocked_from_the_overview,
    attacker_chosen_subjects_are_escaped_on_the_overview,
);

async fn the_database_counts_refusals_per_hour_and_the_top_lists_exactly(kind: DbKind) {
    use AuditDecision::{Challenge, Deny, Lock, Unblock};
    use SubjectKind::{Ip, Phone, Prefix, User};
    let db = TestDb::new(kind).await;
    let audit = db.connect().await;
    let (phone, other_phone) = (
        subject(Phone, "+8613800138000"),
        subject(Phone, "+8613800138001"),
    );
    let alice = subject(User, "alice");
    let (a, b, c) = (
        Some("203.0.113.1"),
        Some("203.0.113.2"),
        Some("198.51.100.7"),
    );
    let mut shadow = row(
        at("2026-03-01T01:10:00Z"),
        Action::SmsSend,
        Deny,
        phone.clone(),
        a,
    );
    shadow.shadow = true;
    let rows = vec![
        // Hour 0: both ends of it.
        row(
            at("2026-03-01T00:00:00Z"),
            Action::SmsSend,
            Deny,
            phone.clone(),
            a,
        ),
        row(
            at("2026-03-01T00:59:59.999Z"),
            Action::SmsSend,
            Deny,
            other_phone.clone(),
            a,
        ),
        // Hour 1.
        row(
            at("2026-03-01T01:00:00Z"),
            Action::SmsSend,
            Challenge,
            phone.clone(),
            b,
        ),
        row(
            at("2026-03-01T01:30:00Z"),
            Action::LoginAttempt,
            Challenge,
            alice.clone(),
            a,
        ),
        {
            let mut e = row(
                at("2026-03-01T01:30:00Z"),
                Action::LoginAttempt,
                Lock,
                alice.clone(),
                a,
            );
            e.retry_after_ms = Some(2 * 3_600_000);
            e
        },
        // Hour 2.
        row(
            at("2026-03-01T02:00:00Z"),
            Action::SmsVerify,
            Deny,
            phone.clone(),
            None,
        ),
        row(
            at("2026-03-01T02:15:00Z"),
            Action::LoginAttempt,
            Deny,
            subject(Ip, "198.51.100.7"),
            c,
        ),
        row(
            at("2026-03-01T02:59:59.999Z"),
            Action::SmsSend,
            Deny,
            subject(Prefix, "+8613900"),
            c,
        ),
        // Not counted: before and after the span, shadow, an unblock.
        row(
            at("2026-02-28T23:59:59.999Z"),
            Action::SmsSend,
            Deny,
            phone.clone(),
            a,
        ),
        row(
            at("2026-03-01T03:00:00Z"),
            Action::SmsSend,
            Deny,
            phone.clone(),
            a,
        ),
        shadow,
        row(
            at("2026-03-01T01:45:00Z"),
            Action::Admin,
            Unblock,
            alice.clone(),
            a,
        ),
    ];
    audit.insert(&rows, 7).await.unwrap();

    let span = Span {
        start: at("2026-03-01T00:00:00Z"),
        bucket_ms: 3_600_000,
        buckets: 3,
    };
    let now = at("2026-03-01T02:30:00Z");
    let overview = audit
        .overview(&span, now, TOP_TEN, READ_BOUND)
        .await
        .unwrap();

    let count = |bucket, action, decision, count| BucketCount {
        bucket,
        action,
        decision,
        count,
    };
    assert_eq!(
        overview.buckets,
        [
            count(0, Action::SmsSend, Deny, 2),
            count(1, Action::LoginAttempt, Challenge, 1),
            count(1, Action::LoginAttempt, Lock, 1),
            count(1, Action::SmsSend, Challenge, 1),
            count(2, Action::LoginAttempt, Deny, 1),
            count(2, Action::SmsSend, Deny, 1),
            count(2, Action::SmsVerify, Deny, 1),
        ]
    );
    assert_eq!(
        overview.subjects,
        ranked(&[(phone.clone(), 3), (alice, 2), (other_phone, 1)]),
        "IPs and prefixes have lists of their own"
    );
    assert_eq!(
        overview.ips,
        ranked(&[
            ("203.0.113.1".to_string(), 4),
            ("198.51.100.7".to_string(), 2),
            ("203.0.113.2".to_string(), 1),
        ])
    );
    assert_eq!(
        overview.prefixes,
        ranked(&[("+8613800".to_string(), 4), ("+8613900".to_string(), 1)]),
        "phones counted under their first 7 digits, prefix subjects as they are"
    );
    assert_eq!(
        overview.locks,
        [],
        "alice's two-hour lock was unblocked a quarter of an hour later"
    );

    let short = Limits { top: 1, locks: 1 };
    let top_one = audit.overview(&span, now, short, READ_BOUND).await.unwrap();
    assert_eq!(top_one.subjects, ranked(&[(phone, 3)]));
    assert_eq!(top_one.ips.len(), 1);
    assert_eq!(top_one.prefixes.len(), 1);
    assert_eq!(
        overview.errors,
        tollgate::audit::stats::TopErrors::default(),
        "a few keys are counted exactly"
    );
}

async fn open_locks_are_those_not_run_out_nor_unblocked_latest_first(kind: DbKind) {
    use SubjectKind::{Ip, Prefix, User};
    let db = TestDb::new(kind).await;
    let audit = db.connect().await;
    let mut shadow = lock("2026-03-01T11:59:00Z", subject(User, "erin"), 15);
    shadow.shadow = true;
    let mut deny = lock("2026-03-01T11:59:00Z", subject(User, "gina"), 10);
    deny.decision = AuditDecision::Deny;
    // The admin sign-in throttle's lock, ending last: the store's state
    // never confirms it, so listed it would only push users' locks off.
    let mut throttled = lock("2026-03-01T11:59:00Z", subject(Ip, "198.51.100.1"), 20 * 60);
    throttled.action = Action::Admin;
    audit
        .insert(
            &[
                lock("2026-03-01T11:50:00Z", subject(User, "alice"), 15),
                // Ran out at 11:45.
                lock("2026-03-01T11:30:00Z", subject(User, "bob"), 15),
                // Unblocked after the lock.
                lock("2026-03-01T11:55:00Z", subject(User, "carol"), 15),
                unblock("2026-03-01T11:58:00Z", subject(User, "carol")),
                // Unblocked before this lock: still locked.
                unblock("2026-03-01T11:40:00Z", subject(User, "dave")),
                lock("2026-03-01T11:50:00Z", subject(User, "dave"), 15),
                // Two locks: the later end counts; one ending exactly now is over.
                lock("2026-03-01T11:00:00Z", subject(Ip, "203.0.113.9"), 60),
                lock("2026-03-01T11:30:00Z", subject(Ip, "203.0.113.9"), 60),
                lock("2026-03-01T11:00:00Z", subject(Ip, "203.0.113.10"), 60),
                lock("2026-03-01T06:00:00Z", subject(Prefix, "+8613900"), 12 * 60),
                shadow,
                deny,
                throttled,
            ],
            7,
        )
        .await
        .unwrap();
    let now = at("2026-03-01T12:00:00Z");
    let span = Span::ending_at(now, 3_600_000, 1);
    let open = |id: &str, kind, until: &str| OpenLock {
        subject: subject(kind, id),
        until: at(until),
    };
    let overview = audit
        .overview(&span, now, TOP_TEN, READ_BOUND)
        .await
        .unwrap();
    assert_eq!(
        overview.locks,
        [
            open("+8613900", Prefix, "2026-03-01T18:00:00Z"),
            open("203.0.113.9", Ip, "2026-03-01T12:30:00Z"),
            open("alice", User, "2026-03-01T12:05:00Z"),
            open("dave", User, "2026-03-01T12:05:00Z"),
        ]
    );
    let two = Limits { top: 10, locks: 2 };
    let overview = audit.overview(&span, now, two, READ_BOUND).await.unwrap();
    assert_eq!(overview.locks.len(), 2);
    assert_eq!(overview.locks[1].subject, subject(Ip, "203.0.113.9"));
    assert!(!overview.locks_cut);

    // One user's 4,100 pair locks, ending last: the search reads at most
    // 4,096 rows, finds only that user, and says the list is cut.
    let many: Vec<AuditEvent> = (0..4_100)
        .map(|_| lock("2026-03-01T11:59:00Z", subject(User, "mallory"), 10 * 60))
        .collect();
    audit.insert(&many, 7).await.unwrap();
    let overview = audit
        .overview(&span, now, TOP_TEN, READ_BOUND)
        .await
        .unwrap();
    assert_eq!(
        overview.locks,
        [open("mallory", User, "2026-03-01T21:59:00Z")]
    );
    assert!(overview.locks_cut, "the others run besides");
}

/// The rows of the page tests: two hours ago (in the last 24 hours, not in
/// the last hour) and three days ago (in the last 7 days only).
fn recent_rows(now: DateTime<Utc>) -> Vec<AuditEvent> {
    use AuditDecision::{Challenge, Deny};
    let earlier = now - Duration::hours(2);
    let phone = subject(SubjectKind::Phone, "+8613800138000");
    let ip = subject(SubjectKind::Ip, "198.51.100.23");
    let mallory = subject(SubjectKind::User, "mallory");
    let a = Some("203.0.113.5");
    let mut rows = vec![
        row(earlier, Action::SmsSend, Deny, phone.clone(), a),
        row(earlier, Action::SmsSend, Deny, phone.clone(), a),
        row(earlier, Action::SmsSend, Deny, phone.clone(), a),
        row(earlier, Action::LoginAttempt, Challenge, mallory.clone(), a),
        // Long over: not locked now.
        lock_at(earlier, mallory, 15, a),
        row(
            earlier,
            Action::LoginAttempt,
            Deny,
            ip.clone(),
            Some("198.51.100.23"),
        ),
        row(
            earlier,
            Action::LoginAttempt,
            Deny,
            ip,
            Some("198.51.100.23"),
        ),
        row(
            now - Duration::days(3),
            Action::SmsSend,
            Deny,
            subject(SubjectKind::Phone, "+8613900139000"),
            Some("2001:db8::1"),
        ),
    ];
    let mut shadow = row(earlier, Action::SmsSend, Deny, phone, a);
    shadow.shadow = true;
    rows.push(shadow);
    rows
}

fn lock_at(time: DateTime<Utc>, who: Subject, minutes: i64, ip: Option<&str>) -> AuditEvent {
    let mut e = row(time, Action::LoginAttempt, AuditDecision::Lock, who, ip);
    e.retry_after_ms = Some(minutes * 60_000);
    e
}

async fn the_overview_page_charts_and_ranks_the_periods_refusals(kind: DbKind) {
    let db = TestDb::new(kind).await;
    let now = tollgate::audit::now_ms();
    db.connect()
        .await
        .insert(&recent_rows(now), 7)
        .await
        .unwrap();
    let app = db_app(&db, |_| {}).await;

    let day = get(&app, "/admin/overview", ADMIN).await;
    assert_html(&day, 200, "the default period");
    let events = get(&app, "/admin", ADMIN).await;
    assert_eq!(
        day.header(CONTENT_SECURITY_POLICY),
        events.header(CONTENT_SECURITY_POLICY),
        "the console's CSP, unchanged"
    );
    assert_eq!(day.header("cache-control"), "no-store");
    let body = unescape(&day.body);
    assert!(body.contains("Overview <span class=\"muted\">· last 24 hours"));
    assert!(body.contains("<a href=\"/admin/overview?period=24h\" aria-current=\"page\">24h</a>"));
    assert!(body.contains("· 7 in all ·"), "3 + 2 + 2 rows: {body}");

    // The column holding the rows, in each chart.
    let hour = (now - Duration::hours(2))
        .duration_trunc(Duration::hours(1))
        .unwrap();
    let column = format!(
        "{}–{} UTC",
        hour.format("%H:%M"),
        (hour + Duration::hours(1)).format("%H:%M")
    );
    for (series, n) in [
        ("deny", 5),
        ("challenge", 1),
        ("lock", 1),
        ("sms_send", 3),
        ("login_attempt", 4),
    ] {
        assert!(
            body.contains(&format!("<title>{column} · {series}: {n}</title>")),
            "{series}: {n} in {column}: {body}"
        );
        assert!(
            body.contains(&format!("</svg> {series} <span class=\"muted\">{n}</span>")),
            "{series} in the legend"
        );
    }
    assert_eq!(
        body.matches("<rect x=").count(),
        5,
        "one segment per series in that one column"
    );
    assert!(!body.contains("sms_verify <span"), "no sms_verify refusals");
    assert!(body.contains("role=\"img\" aria-labelledby=\"by-decision-title by-decision-desc\""));

    for link in [
        "<a href=\"/admin/subjects/phone/%2B8613800138000\">+8613800138000</a>",
        "<a href=\"/admin/subjects/user/mallory\">mallory</a>",
        "<a href=\"/admin/subjects/ip/203.0.113.5\">203.0.113.5</a>",
        "<a href=\"/admin/subjects/ip/198.51.100.23\">198.51.100.23</a>",
        "<a href=\"/admin/subjects/prefix/%2B8613800\">+8613800</a>",
    ] {
        assert!(body.contains(link), "{link}: {body}");
    }
    let since = "&since=";
    assert!(body.contains(&format!(
        "href=\"/admin?subject_kind=phone&subject=%2B8613800138000{since}"
    )));
    assert!(body.contains(&format!("href=\"/admin?ip=203.0.113.5{since}")));
    assert!(!body.contains("+8613900139000"), "three days ago");
    assert!(body.contains("Nobody is locked or blocked."), "{body}");

    let hour_page = get(&app, "/admin/overview?period=1h", ADMIN).await;
    assert_html(&hour_page, 200, "1h");
    assert!(hour_page.body.contains("No refusals in the last hour."));
    assert!(!hour_page.body.contains("<svg viewBox"));

    let week = unescape(&get(&app, "/admin/overview?period=7d", ADMIN).await.body);
    assert!(week.contains("· 8 in all ·"), "{week}");
    assert!(
        week.contains("<a href=\"/admin/subjects/ip/2001%3Adb8%3A%3A%2F64\">2001:db8::1</a>"),
        "an IPv6 address links to its /64: {week}"
    );
    assert!(week.contains("href=\"/admin?ip=2001%3Adb8%3A%3A1&since="));
    assert!(week.contains("<a href=\"/admin/subjects/prefix/%2B8613900\">+8613900</a>"));
}

/// Locks on `user_ip` scope: `lock_after` failures lock the pair.
async fn lock_user(app: &crate::support::app::TestApp, user: &str, ip: &str) {
    for _ in 0..2 {
        let answer = app
            .login_attempt(
                json!({ "user": user, "ip": ip, "success": false, "captcha_passed": true }),
            )
            .await;
        assert_eq!(answer.status, 200, "{}", answer.body);
    }
}

/// The page's table of subjects locked now.
fn locks_table(body: &str) -> &str {
    let start = body
        .find("<table class=\"locks\">")
        .unwrap_or_else(|| panic!("a table of locks: {body}"));
    &body[start..start + body[start..].find("</table>").unwrap()]
}

/// The Unblock form of `id`'s row: where it posts and its fields.
fn unblock_form(body: &str, id: &str) -> (String, Vec<(String, String)>) {
    let body = locks_table(body);
    let row_at = body
        .find(&format!(">{id}</a></td>"))
        .unwrap_or_else(|| panic!("{id} is listed: {body}"));
    let form_at = row_at + body[row_at..].find("<form").expect("a form");
    let form = &body[form_at..form_at + body[form_at..].find("</form>").unwrap()];
    let attribute = |tag: &str, name: &str| {
        let start = tag.find(&format!("{name}=\"")).unwrap() + name.len() + 2;
        unescape(&tag[start..start + tag[start..].find('"').unwrap()])
    };
    let action = attribute(form, "action");
    let fields = form
        .match_indices("<input ")
        .map(|(i, _)| {
            let tag = &form[i..i + form[i..].find('>').unwrap()];
            (attribute(tag, "name"), attribute(tag, "value"))
        })
        .collect();
    (action, fields)
}

async fn locked_subjects_are_listed_and_unblocked_from_the_overview(kind: DbKind) {
    let db = TestDb::new(kind).await;
    let app = db_app(&db, |s| {
        s.login.captcha_after = 1;
        s.login.lock_after = 2;
        s.login.ip_block_after = 4;
    })
    .await;
    // alice is locked from one address; bob's failures, from the same one,
    // lock him there and block the address (4 failures).
    lock_user(&app, "alice", "203.0.113.7").await;
    lock_user(&app, "bob", "203.0.113.7").await;
    // The trail says carol is locked, but the store holds no such lock.
    let ghost = lock_at(
        tollgate::audit::now_ms(),
        subject(SubjectKind::User, "carol"),
        15,
        None,
    );
    db.connect().await.insert(&[ghost], 7).await.unwrap();
    app.flush_audit().await;

    let page = get(&app, "/admin/overview?period=7d", ADMIN).await;
    assert_html(&page, 200, "overview");
    let body = &page.body;
    let locks = locks_table(body);
    for (id, scope) in [
        ("alice", "from 203.0.113.7"),
        ("bob", "from 203.0.113.7"),
        ("203.0.113.7", "login block"),
    ] {
        let at = locks
            .find(&format!(">{id}</a></td>"))
            .unwrap_or_else(|| panic!("{id} is listed: {locks}"));
        let cell = &locks[at..at + 60];
        assert!(cell.contains(&format!("<td>{scope}")), "{id}: {cell}");
    }
    assert!(
        !locks.contains(">carol</a>"),
        "the store has no lock of carol: {locks}"
    );
    assert!(
        body.contains(">carol</a>"),
        "her lock row is a refusal, in the top subjects"
    );
    assert!(!locks.contains("unconfirmed"));

    let (action, fields) = unblock_form(body, "alice");
    assert_eq!(action, "/admin/subjects/user/alice/unblock");
    let names: Vec<&str> = fields.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(names, ["csrf", "back", "period"]);
    let form: Vec<(&str, &str)> = fields
        .iter()
        .map(|(n, v)| (n.as_str(), v.as_str()))
        .collect();

    // A form naming another page to return to changes nothing.
    let mut elsewhere = form.clone();
    elsewhere[1].1 = "https://evil.example";
    let refused = post_form(&app, &action, &elsewhere, ADMIN).await;
    assert_html(&refused, 400, "back elsewhere");
    assert!(is_locked_pair(&app, "alice").await, "still locked");

    let done = post_form(&app, &action, &form, ADMIN).await;
    assert_eq!(done.status, 303, "{}", done.body);
    assert_eq!(
        done.header(LOCATION),
        "/admin/overview?period=7d&unblocked=1"
    );
    let after = get(&app, done.header(LOCATION), ADMIN).await;
    assert_html(&after, 200, "after the unblock");
    assert!(
        after.body.contains("Unblocked: the subject"),
        "{}",
        after.body
    );
    let locks = locks_table(&after.body);
    assert!(!locks.contains(">alice</a>"), "{locks}");
    assert!(locks.contains(">bob</a>"), "bob is still locked: {locks}");
    assert!(!is_locked_pair(&app, "alice").await);
    assert!(!is_locked(&app, "alice").await);
    let from_blocked = app
        .login_attempt(json!({ "user": "alice", "ip": "203.0.113.7", "success": true }))
        .await;
    assert_eq!(
        from_blocked.body["reason"], "ip_blocked",
        "the address itself is still blocked: {}",
        from_blocked.body
    );
    let allowed = app
        .login_attempt(json!({ "user": "alice", "ip": "198.51.100.1", "success": true }))
        .await;
    assert_eq!(allowed.body["decision"], "allow", "{}", allowed.body);

    app.flush_audit().await;
    let filter = EventFilter {
        decision: Some(AuditDecision::Unblock),
        ..EventFilter::default()
    };
    let unblocks = db.connect().await.page(&filter, None, 10).await.unwrap();
    let unblocked: Vec<(SubjectKind, &str)> = unblocks
        .iter()
        .map(|e| (e.subject_kind, e.subject.as_str()))
        .collect();
    assert_eq!(
        unblocked,
        [(SubjectKind::User, "alice")],
        "one unblock audited"
    );
}

/// Whether `user` has a locked (user, IP) pair.
async fn is_locked_pair(app: &crate::support::app::TestApp, user: &str) -> bool {
    let state = app
        .admin_get(&format!("/admin/api/subjects/user/{user}"))
        .await;
    state.body["pairs"]
        .as_array()
        .is_some_and(|pairs| pairs.iter().any(|p| p["locked_until"].is_string()))
}

async fn attacker_chosen_subjects_are_escaped_on_the_overview(kind: DbKind) {
    let db = TestDb::new(kind).await;
    let app = db_app(&db, |s| {
        s.login.captcha_after = 1;
        s.login.lock_after = 2;
    })
    .await;
    let user = "<script>alert(1)</script>\"'&";
    lock_user(&app, user, "203.0.113.8").await;
    app.flush_audit().await;

    let page = get(&app, "/admin/overview", ADMIN).await;
    assert_html(&page, 200, "overview");
    assert!(!page.body.contains("<script"), "{}", page.body);
    let shown = "&#60;script&#62;alert(1)&#60;/script&#62;&#34;&#39;&#38;";
    assert!(
        page.body.matches(shown).count() >= 3,
        "in the top subjects, the locks and the button's label: {}",
        page.body
    );
    let (action, fields) = unblock_form(&page.body, shown);
    assert_eq!(
        action,
        "/admin/subjects/user/%3Cscript%3Ealert%281%29%3C%2Fscript%3E%22%27%26/unblock"
    );
    let form: Vec<(&str, &str)> = fields
        .iter()
        .map(|(n, v)| (n.as_str(), v.as_str()))
        .collect();
    let done = post_form(&app, &action, &form, ADMIN).await;
    assert_eq!(done.status, 303, "{}", done.body);
}

#[tokio::test]
async fn bad_periods_answer_400_with_the_consoles_error_page() {
    let db = TestDb::new(DbKind::Sqlite).await;
    let app = db_app(&db, |_| {}).await;
    for (query, reason) in [
        ("period=2h", "period must be one of 1h, 24h, 7d"),
        ("period=", "period must be one of 1h, 24h, 7d"),
        ("period=24H", "period must be one of 1h, 24h, 7d"),
        ("colour=blue", "unknown field"),
    ] {
        let page = get(&app, &format!("/admin/overview?{query}"), ADMIN).await;
        assert_html(&page, 400, query);
        assert!(
            page.body.contains("<h1>Bad request</h1>"),
            "{query}: {}",
            page.body
        );
        assert!(page.body.contains(reason), "{query}: {}", page.body);
    }
    for query in ["", "?period=1h", "?period=24h&unblocked=1", "?period=7d"] {
        let page = get(&app, &format!("/admin/overview{query}"), ADMIN).await;
        assert_html(&page, 200, query);
    }
}

#[tokio::test]
async fn the_overview_is_the_first_link_of_the_consoles_navigation() {
    let db = TestDb::new(DbKind::Sqlite).await;
    let app = db_app(&db, |_| {}).await;
    for path in ["/admin", "/admin/lists", "/admin/subjects/user/alice"] {
        let page = get(&app, path, ADMIN).await;
        let nav = &page.body[page.body.find("<nav>").expect("a nav")..];
        assert!(
            nav.starts_with("<nav><a href=\"/admin/overview\">Overview</a>"),
            "{path}: {nav}"
        );
    }
}

#[tokio::test]
async fn when_the_store_does_not_answer_the_trails_locks_are_shown_unconfirmed() {
    let db = TestDb::new(DbKind::Sqlite).await;
    let alice = subject(SubjectKind::User, "alice");
    let row = lock_at(tollgate::audit::now_ms(), alice, 15, None);
    db.connect().await.insert(&[row], 7).await.unwrap();
    let app = db_app(&db, |s| {
        s.store.backend = tollgate::settings::StoreBackend::Redis;
        s.store.redis_url = tollgate::settings::SecretUrl::new("redis://127.0.0.1:1");
        s.store.timeout = std::time::Duration::from_millis(200);
        s.sms.code_secret = tollgate::settings::Secret::new("test-code-secret-0123456789");
    })
    .await;

    let page = get(&app, "/admin/overview", ADMIN).await;
    assert_html(&page, 200, "the overview, without its store");
    // In the console's words; the store's own go to the log.
    assert!(
        page.body
            .contains("The store did not answer: these locks are the audit trail"),
        "{}",
        page.body
    );
    let locks = locks_table(&page.body);
    assert!(locks.contains(">alice</a>"), "{locks}");
    assert!(locks.contains("unconfirmed"), "{locks}");
    let (action, _) = unblock_form(&page.body, "alice");
    assert_eq!(action, "/admin/subjects/user/alice/unblock");
}

#[tokio::test]
async fn past_25_open_locks_the_overview_says_its_list_is_cut() {
    let db = TestDb::new(DbKind::Sqlite).await;
    let now = tollgate::audit::now_ms();
    let users = |n: usize| -> Vec<AuditEvent> {
        (0..n)
            .map(|i| {
                let who = subject(SubjectKind::User, &format!("user{i:02}"));
                lock_at(now, who, 15, None)
            })
            .collect()
    };
    db.connect().await.insert(&users(25), 7).await.unwrap();
    let app = db_app(&db, |_| {}).await;
    let page = get(&app, "/admin/overview", ADMIN).await;
    assert_html(&page, 200, "25 open locks");
    assert!(!page.body.contains("more open locks"), "25 are all checked");

    db.connect()
        .await
        .insert(
            &[lock_at(now, subject(SubjectKind::User, "user25"), 15, None)],
            7,
        )
        .await
        .unwrap();
    let page = get(&app, "/admin/overview", ADMIN).await;
    let body = unescape(&page.body);
    assert!(
        body.contains("The audit trail has more open locks: the 25 that end last were checked"),
        "{body}"
    );
    assert!(
        body.contains("href=\"/admin?decision=lock&since="),
        "{body}"
    );
}
