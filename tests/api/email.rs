//! Lockout notices and admin alert digests, sent through a real SMTP server.

use std::time::{Duration, Instant};

use serde_json::{json, Value};
use tollgate::settings::{LockScope, SecretUrl, Settings};

use crate::on_both_backends;
use crate::support::app::{limits, spawn_app, Backend, TestApp};
use crate::support::smtp::{self, Inbox};

const IP: &str = "203.0.113.7";
const FROM: &str = "tollgate@example.org";

on_both_backends!(simultaneous_failures_that_lock_once_send_one_notice,);

/// Email on, locks after 3 failures for 15 minutes, no captcha in the way.
async fn app_with_email(
    backend: Backend,
    configure: impl FnOnce(&mut Settings),
) -> (TestApp, Inbox) {
    let (inbox, url) = smtp::start();
    let app = spawn_app(backend, move |s| {
        s.email.smtp_url = SecretUrl::new(url);
        s.email.from = FROM.parse().unwrap();
        s.login.captcha_after = 100;
        s.login.ip_captcha_after = 1000;
        s.login.ip_block_after = 1000;
        s.login.lock_after = 3;
        s.login.lock_duration = Duration::from_secs(15 * 60);
        configure(s);
    })
    .await;
    (app, inbox)
}

async fn fail(app: &TestApp, user: &str, extra: Value) -> Value {
    let mut body = json!({ "user": user, "ip": IP, "success": false });
    body.as_object_mut()
        .unwrap()
        .extend(extra.as_object().unwrap().clone());
    let answer = app.login_attempt(body).await;
    assert_eq!(answer.status, 200, "{}", answer.body);
    answer.body
}

/// Locks `user` with `lock_after` = 3 failures, each asking for a notice to `to`.
async fn lock(app: &TestApp, user: &str, to: &str) {
    for _ in 0..3 {
        fail(app, user, json!({ "notify_email": to })).await;
    }
}

#[tokio::test]
async fn the_failure_that_locks_sends_one_notice_to_notify_email() {
    let (app, inbox) = app_with_email(Backend::Memory, |s| {
        s.login.lock_scope = LockScope::User;
    })
    .await;

    let first = fail(
        &app,
        "alice",
        json!({ "notify_email": "alice@example.com" }),
    )
    .await;
    fail(
        &app,
        "alice",
        json!({ "notify_email": "alice@example.com" }),
    )
    .await;
    let locking = fail(
        &app,
        "alice",
        json!({ "notify_email": "alice@example.com" }),
    )
    .await;
    assert_eq!(first["locked"], false);
    assert_eq!(locking["locked"], true, "{locking}");
    for _ in 0..3 {
        let denied = fail(
            &app,
            "alice",
            json!({ "notify_email": "alice@example.com" }),
        )
        .await;
        assert_eq!(denied["reason"], "user_locked");
    }
    // Emails go out in order: once bob's notice is in, any other notice for
    // alice would be in too.
    lock(&app, "bob", "bob@example.com").await;
    let mails = inbox.wait_for_mail_to("bob@example.com").await;

    assert_eq!(mails.len(), 2, "one per lock: {mails:#?}");
    let notice = &mails[0];
    assert_eq!(notice.to, ["alice@example.com"]);
    assert_eq!(notice.from, FROM);
    assert_eq!(notice.from_header, FROM);
    // No vacation auto-reply answers it (RFC 3834).
    assert_eq!(notice.auto_submitted, "auto-generated");
    assert_eq!(
        notice.subject,
        "Your account alice was locked after too many failed sign-ins"
    );
    assert!(
        notice.body.contains("for the account \"alice\""),
        "{}",
        notice.body
    );
    assert!(
        notice.body.contains("(the last one from 203.0.113.7)"),
        "{}",
        notice.body
    );
    assert!(
        notice
            .body
            .contains("\nIt has been locked for 15 minutes, until 20"),
        "{}",
        notice.body
    );
    assert_eq!(mails[1].to, ["bob@example.com"]);

    let audit = serde_json::to_string(&app.audit_events()).unwrap();
    assert!(
        !audit.contains("@example.com"),
        "the address is not kept in the audit trail"
    );
}

/// `login.lock_scope = "user_ip"` (the default): the notice says only that
/// address is locked out.
#[tokio::test]
async fn the_notice_of_a_lock_from_one_address_says_so() {
    let (app, inbox) = app_with_email(Backend::Memory, |_| {}).await;
    lock(&app, "carol", "carol@example.com").await;
    let mails = inbox.wait_for_mail_to("carol@example.com").await;
    assert_eq!(mails.len(), 1, "{mails:#?}");
    assert_eq!(
        mails[0].subject,
        "Sign-ins to your account carol from one address were paused after too many failures"
    );
    assert!(
        mails[0]
            .body
            .contains("from 203.0.113.7.\nSign-ins from that address are paused for 15 minutes"),
        "{}",
        mails[0].body
    );
}

/// Each address that locks an account out of its sign-ins is a lock of its
/// own: anyone with a few networks could have the owner mailed once a lock.
/// One address lock is told an hour per recipient; the account's lock is
/// told whatever came before.
#[tokio::test]
async fn address_locks_tell_the_owner_once_an_hour_and_the_accounts_lock_always() {
    let (app, inbox) = app_with_email(Backend::Memory, |s| {
        s.login.account_lock_after = 9;
    })
    .await;
    for ip in ["198.51.100.1", "198.51.100.2", "198.51.100.3"] {
        for _ in 0..3 {
            let body = json!({
                "user": "erin", "ip": ip, "success": false,
                "notify_email": "erin@example.com",
            });
            let answer = app.login_attempt(body).await;
            assert_eq!(answer.status, 200, "{}", answer.body);
        }
    }
    // Emails go out in order: once frank's notice is in, erin's are too.
    lock(&app, "frank", "frank@example.com").await;
    inbox.wait_for_mail_to("frank@example.com").await;
    let erins: Vec<String> = inbox
        .mails()
        .into_iter()
        .filter(|mail| mail.to == ["erin@example.com"])
        .map(|mail| mail.subject)
        .collect();
    assert_eq!(
        erins,
        [
            "Sign-ins to your account erin from one address were paused after too many failures",
            "Your account erin was locked after too many failed sign-ins",
        ],
        "the second address's lock untold, the account's told"
    );
}

/// A notice the relay never took spends no hour: the owner's next address
/// lock is told.
#[tokio::test]
async fn a_notice_that_never_arrived_does_not_silence_its_recipient() {
    let (app, inbox) = app_with_email(Backend::Memory, |_| {}).await;
    let fail_from = |ip: &'static str| {
        let body = json!({
            "user": "gina", "ip": ip, "success": false, "notify_email": "gina@example.com",
        });
        let app = &app;
        async move {
            for _ in 0..3 {
                assert_eq!(app.login_attempt(body.clone()).await.status, 200);
            }
        }
    };
    inbox.refuse_next(4);
    fail_from("198.51.100.21").await;
    let deadline = Instant::now() + Duration::from_secs(15);
    while inbox.tries() < 4 {
        assert!(Instant::now() < deadline, "the four tries were not made");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // The mail task tells the notifier after its last try.
    tokio::time::sleep(Duration::from_millis(300)).await;
    fail_from("198.51.100.22").await;
    let mails = inbox.wait_for_mail_to("gina@example.com").await;
    assert_eq!(mails.len(), 1, "{mails:#?}");
}

/// A line separator in a name would start a line of the caller's own in
/// the owner's mail: it is shown as U+FFFD.
#[tokio::test]
async fn a_name_cannot_write_lines_of_its_own_into_the_notice() {
    let (app, inbox) = app_with_email(Backend::Memory, |_| {}).await;
    lock(&app, "dave\u{2028}Call +1 555 0100 now", "dave@example.com").await;
    let mails = inbox.wait_for_mail_to("dave@example.com").await;
    assert_eq!(mails.len(), 1, "{mails:#?}");
    let body = &mails[0].body;
    assert!(!body.contains('\u{2028}'), "{body:?}");
    assert!(
        // Names are case-folded (`Username::parse`).
        body.contains("for the account \"dave\u{FFFD}call +1 555 0100 now\""),
        "{body:?}"
    );
}

async fn simultaneous_failures_that_lock_once_send_one_notice(backend: Backend) {
    let (app, inbox) = app_with_email(backend, |s| s.login.lock_after = 5).await;

    let attempts = (0..20).map(|_| {
        fail(
            &app,
            "carol",
            json!({ "notify_email": "carol@example.com" }),
        )
    });
    let answers = futures::future::join_all(attempts).await;
    assert_eq!(
        answers
            .iter()
            .filter(|a| a["locked"] == true && a["decision"] == "allow")
            .count(),
        1
    );
    for _ in 0..5 {
        fail(&app, "dave", json!({ "notify_email": "dave@example.com" })).await;
    }
    let mails = inbox.wait_for_mail_to("dave@example.com").await;

    let to: Vec<&str> = mails.iter().map(|m| m.to[0].as_str()).collect();
    assert_eq!(to, ["carol@example.com", "dave@example.com"]);
}

#[tokio::test]
async fn the_notice_is_written_in_the_locale_of_the_attempt() {
    let (app, inbox) = app_with_email(Backend::Memory, |s| {
        s.login.lock_scope = LockScope::User;
    })
    .await;

    for _ in 0..3 {
        fail(
            &app,
            "wang",
            json!({ "notify_email": "wang@example.cn", "locale": "zh-CN" }),
        )
        .await;
    }
    let mails = inbox.wait_for(1).await;

    assert_eq!(mails[0].subject, "您的账户 wang 因多次登录失败已被锁定");
    assert!(
        mails[0].body.contains("已被锁定 15 分钟"),
        "{}",
        mails[0].body
    );
    assert!(
        mails[0].body.contains("最近一次来自 203.0.113.7"),
        "{}",
        mails[0].body
    );
}

#[tokio::test]
async fn a_refused_smtp_delivery_is_retried_until_accepted() {
    let (app, inbox) = app_with_email(Backend::Memory, |_| {}).await;
    inbox.refuse_next(1);

    lock(&app, "erin", "erin@example.com").await;
    let mails = inbox.wait_for(1).await;

    assert_eq!(mails.len(), 1);
    assert_eq!(mails[0].to, ["erin@example.com"]);
    assert_eq!(inbox.tries(), 2, "refused once, then accepted");
}

#[tokio::test]
async fn a_silent_smtp_server_does_not_slow_down_the_attempt_that_locks() {
    // Accepts connections (the kernel does) but never says a word.
    let silent = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("smtp://127.0.0.1:{}", silent.local_addr().unwrap().port());
    let app = spawn_app(Backend::Memory, move |s| {
        s.email.smtp_url = SecretUrl::new(url);
        s.email.admin_alerts_to = vec!["ops@example.com".parse().unwrap()];
        s.login.captcha_after = 100;
        s.login.lock_after = 1;
    })
    .await;

    let started = Instant::now();
    let answer = app
        .login_attempt(
            json!({ "user": "frank", "success": false, "notify_email": "frank@example.com" }),
        )
        .await;

    assert_eq!(answer.body["locked"], true, "{}", answer.body);
    assert!(
        started.elapsed() < Duration::from_secs(1),
        "{:?}",
        started.elapsed()
    );
    drop(silent);
}

#[tokio::test]
async fn no_notice_is_sent_in_shadow_mode() {
    let (app, inbox) = app_with_email(Backend::Memory, |s| {
        s.shadow.enabled = true;
        s.email.admin_alerts_to = vec!["ops@example.com".parse().unwrap()];
        s.email.alert_interval = Duration::from_millis(100);
    })
    .await;

    lock(&app, "grace", "grace@example.com").await;
    // The would-be locks still reach the admins. A notice is queued before
    // its attempt answers, so any notice to grace is queued before the digest
    // that tells of heidi, whose attempts come after grace's.
    lock(&app, "heidi", "heidi@example.com").await;
    let deadline = Instant::now() + Duration::from_secs(10);
    let mails = loop {
        let mails = inbox.mails();
        if mails.iter().any(|m| m.body.contains("user heidi")) {
            break mails;
        }
        assert!(
            Instant::now() < deadline,
            "no digest told of heidi: {mails:#?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    };

    assert!(
        mails.iter().all(|m| m.to == ["ops@example.com"]),
        "only digests: {mails:#?}"
    );
    assert!(mails[0].body.contains("user grace"), "{}", mails[0].body);
    assert!(
        mails[0].body.contains("[shadow: not enforced]"),
        "{}",
        mails[0].body
    );
}

/// Locks after a digest wait up to `alert_interval` for the next: a stop
/// (a deploy) sends them at once rather than losing them.
#[tokio::test]
async fn a_stop_sends_the_locks_waiting_for_the_next_digest() {
    let (app, inbox) = app_with_email(Backend::Memory, |s| {
        s.email.admin_alerts_to = vec!["ops@example.com".parse().unwrap()];
        s.email.alert_interval = Duration::from_secs(3600);
    })
    .await;
    lock(&app, "alice", "alice@example.com").await;
    inbox.wait_for_mail_to("ops@example.com").await;
    lock(&app, "bob", "bob@example.com").await;
    inbox.wait_for_mail_to("bob@example.com").await;
    let digests = || {
        inbox
            .mails()
            .into_iter()
            .filter(|m| m.to == ["ops@example.com"])
            .collect::<Vec<_>>()
    };
    assert_eq!(digests().len(), 1, "bob's lock waits for the hour");

    app.stop(true).await;
    let deadline = Instant::now() + Duration::from_secs(10);
    while digests().len() < 2 {
        assert!(
            Instant::now() < deadline,
            "no digest at the stop: {:#?}",
            inbox.mails()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let last = &digests()[1];
    assert!(last.body.contains("user bob"), "{}", last.body);
    assert!(!last.body.contains("user alice"), "{}", last.body);
}

#[tokio::test]
async fn admins_get_a_digest_at_the_first_lock_then_at_most_one_per_interval() {
    let interval = Duration::from_secs(2);
    let (app, inbox) = app_with_email(Backend::Memory, |s| {
        s.email.admin_alerts_to = vec![
            "ops@example.com".parse().unwrap(),
            "security@example.com".parse().unwrap(),
        ];
        s.email.alert_interval = interval;
    })
    .await;

    lock(&app, "alice", "alice@example.com").await;
    inbox.wait_for_mail_to("ops@example.com").await;
    lock(&app, "bob", "bob@example.com").await;
    lock(&app, "carol", "carol@example.com").await;
    // Two digests, a copy to each admin, and three notices.
    let mails = inbox.wait_for(7).await;

    let to = |address: &str| -> Vec<&smtp::Mail> {
        mails.iter().filter(|m| m.to == [address]).collect()
    };
    let digests = to("ops@example.com");
    assert_eq!(digests.len(), 2, "{mails:#?}");
    assert_eq!(to("security@example.com").len(), 2, "{mails:#?}");
    let (one, two) = (digests[0], digests[1]);
    assert_eq!(
        one.subject,
        "[tollgate] 1 lock(s), 0 SMS rule(s) over threshold"
    );
    assert!(
        one.body
            .contains("user alice: too_many_failures (user_ip 3/1h), 15 min"),
        "{}",
        one.body
    );
    assert_eq!(
        two.subject,
        "[tollgate] 2 lock(s), 0 SMS rule(s) over threshold"
    );
    assert!(
        two.body.contains("user bob") && two.body.contains("user carol"),
        "{}",
        two.body
    );
    assert!(
        !two.body.contains("alice"),
        "only what happened since the last digest: {}",
        two.body
    );
    // Less the first digest's own time in the queue and on the wire.
    let gap = two.received_at - one.received_at;
    assert!(
        gap >= interval - Duration::from_millis(500),
        "the second digest waited for the interval: {gap:?}"
    );
    let notices: Vec<&str> = mails
        .iter()
        .map(|m| m.to[0].as_str())
        .filter(|to| !["ops@example.com", "security@example.com"].contains(to))
        .collect();
    assert_eq!(
        notices.len(),
        3,
        "the owners' notices are separate: {notices:?}"
    );
}

/// Each admin gets a copy of their own: a server that refuses one
/// address (a mistyped or departed admin's, `550`) refuses only that copy,
/// where one envelope for all was refused whole.
#[tokio::test]
async fn an_admin_address_the_server_refuses_costs_no_other_admin_the_digest() {
    let (app, inbox) = app_with_email(Backend::Memory, |s| {
        s.email.admin_alerts_to = vec![
            "gone@example.com".parse().unwrap(),
            "ops@example.com".parse().unwrap(),
        ];
    })
    .await;
    inbox.refuse_recipient("gone@example.com");

    lock(&app, "alice", "alice@example.com").await;
    let mails = inbox.wait_for_mail_to("ops@example.com").await;

    let digest = mails
        .iter()
        .find(|m| m.to == ["ops@example.com"])
        .expect("the digest");
    assert!(digest.body.contains("user alice"), "{}", digest.body);
    assert!(
        mails
            .iter()
            .all(|m| !m.to.contains(&"gone@example.com".into())),
        "{mails:#?}"
    );
}

/// A digest the server would not take on any try (4, over 3.5 s) is not
/// lost: the next one, an interval later, tells its locks.
#[tokio::test]
async fn a_digest_no_admin_got_is_told_by_the_next_one() {
    let interval = Duration::from_secs(1);
    let (app, inbox) = app_with_email(Backend::Memory, |s| {
        s.email.admin_alerts_to = vec!["ops@example.com".parse().unwrap()];
        s.email.alert_interval = interval;
    })
    .await;
    // Every try of the first digest is refused for now (451).
    inbox.refuse_next(4);

    for _ in 0..3 {
        fail(&app, "alice", json!({})).await;
    }
    let mails = inbox.wait_for(1).await;

    assert_eq!(inbox.tries(), 5, "four refused tries, then the next digest");
    assert_eq!(mails.len(), 1, "{mails:#?}");
    assert_eq!(mails[0].to, ["ops@example.com"]);
    assert!(
        mails[0].body.contains("user alice: too_many_failures"),
        "{}",
        mails[0].body
    );
}

#[tokio::test]
async fn an_sms_rule_denying_more_than_the_threshold_within_the_window_alerts_the_admins() {
    let interval = Duration::from_millis(300);
    let (app, inbox) = app_with_email(Backend::Memory, |s| {
        s.email.admin_alerts_to = vec!["ops@example.com".parse().unwrap()];
        s.email.alert_threshold = 3;
        s.email.alert_window = Duration::from_secs(60);
        s.email.alert_interval = interval;
        s.sms.phone_limits = limits(&[(1, 3_600_000)]);
    })
    .await;
    let send = || app.sms_send(json!({ "phone": "+8613800138000" }));

    assert_eq!(send().await.status, 200);
    for _ in 0..3 {
        assert_eq!(send().await.status, 429);
    }
    // A lock after the three denials: its digest must not name the rule yet.
    for _ in 0..3 {
        fail(&app, "ivan", json!({})).await;
    }
    let first = inbox.wait_for(1).await;
    assert_eq!(
        first[0].subject, "[tollgate] 1 lock(s), 0 SMS rule(s) over threshold",
        "{}",
        first[0].body
    );

    assert_eq!(
        send().await.status,
        429,
        "the fourth denial within the window"
    );
    let mails = inbox.wait_for(2).await;

    let digest = &mails[1];
    assert_eq!(digest.to, ["ops@example.com"]);
    assert_eq!(
        digest.subject,
        "[tollgate] 0 lock(s), 1 SMS rule(s) over threshold"
    );
    assert!(
        digest.body.contains(
            "sms_send \"phone 1/1h\": more than 3 denials within 1m; 1 since the last alert"
        ),
        "{}",
        digest.body
    );
}

/// `tollgate_emails_total{kind, outcome}` once it reaches `at_least` (the
/// mail task counts a copy just after the server's answer), or as it is
/// after 10 s.
async fn emails_counted(app: &TestApp, kind: &str, outcome: &str, at_least: f64) -> f64 {
    let series = format!("tollgate_emails_total{{kind=\"{kind}\",outcome=\"{outcome}\"}}");
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let counted = app.metric(&series).await;
        if counted >= at_least || Instant::now() > deadline {
            return counted;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Each copy's fate is in `/metrics` (other tests in this process send
/// email too: at least this test's): the owner's notice and one admin's
/// digest sent, the departed admin's copy refused (550).
#[tokio::test]
async fn every_email_copy_is_counted_by_what_became_of_it() {
    let (app, inbox) = app_with_email(Backend::Memory, |s| {
        s.login.lock_scope = LockScope::User;
        s.email.admin_alerts_to = vec![
            "gone@example.com".parse().unwrap(),
            "ops@example.com".parse().unwrap(),
        ];
    })
    .await;
    inbox.refuse_recipient("gone@example.com");
    let notices = emails_counted(&app, "lock_notice", "sent", 0.0).await;
    let digests = emails_counted(&app, "alert_digest", "sent", 0.0).await;
    let refused = emails_counted(&app, "alert_digest", "refused", 0.0).await;

    lock(&app, "alice", "alice@example.com").await;
    inbox.wait_for_mail_to("ops@example.com").await;
    inbox.wait_for_mail_to("alice@example.com").await;

    let counted = emails_counted(&app, "lock_notice", "sent", notices + 1.0).await;
    assert!(counted >= notices + 1.0, "{notices} then {counted}");
    let counted = emails_counted(&app, "alert_digest", "sent", digests + 1.0).await;
    assert!(counted >= digests + 1.0, "{digests} then {counted}");
    let counted = emails_counted(&app, "alert_digest", "refused", refused + 1.0).await;
    assert!(counted >= refused + 1.0, "{refused} then {counted}");
}

/// A notice the server would not take on any try (4 refused for now) is
/// counted as failed: the series `TollgateEmailUndelivered` watches.
#[tokio::test]
async fn a_notice_no_try_delivered_is_counted_as_failed() {
    let (app, inbox) = app_with_email(Backend::Memory, |s| {
        s.login.lock_scope = LockScope::User;
    })
    .await;
    let failed = emails_counted(&app, "lock_notice", "failed", 0.0).await;
    inbox.refuse_next(4);

    lock(&app, "alice", "alice@example.com").await;

    let counted = emails_counted(&app, "lock_notice", "failed", failed + 1.0).await;
    assert!(counted >= failed + 1.0, "{failed} then {counted}");
    assert_eq!(inbox.tries(), 4, "every try refused");
}
