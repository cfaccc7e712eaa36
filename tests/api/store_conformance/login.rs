//! Login failures, captcha thresholds and escalating locks.

use futures::future::join_all;
use tollgate::store::{LoginAttemptOutcome, LoginPolicy, LoginVerdict, PAIR_INDEX_KEEP};

use super::backend::{login, policy, Attempt, StoreUnderTest};
use super::on_both_backends;

on_both_backends!(
    fifty_concurrent_failures_record_exactly_lock_after_and_lock_once,
    a_locked_user_is_refused_and_nothing_is_recorded,
    the_captcha_threshold_crossing_is_reported_once,
    locks_double_up_to_the_cap_and_reset_after_a_quiet_period,
    a_success_clears_the_failures_only_with_reset_on_success,
    a_demanded_captcha_challenges_until_it_is_passed,
    a_shadow_attempt_is_recorded_but_starts_no_new_lock_while_locked,
    a_shadow_attempt_is_recorded_when_challenged,
    a_lock_a_shadow_attempt_started_holds_no_enforcing_call,
    an_enforced_locks_history_is_kept_apart_from_a_trials,
    login_state_reports_locks_and_failures_without_recording,
    a_lock_key_expires_escalation_reset_after_the_lock_ends,
    a_pair_locks_alone_and_the_account_at_its_own_threshold,
    with_both_locks_on_the_later_end_answers,
    concurrent_failures_from_one_pair_lock_it_exactly_once,
    a_success_from_a_pair_clears_its_failures,
    each_attempt_answers_the_failures_its_rules_saw_before_it,
    a_users_index_of_locked_pairs_keeps_its_newest,
);

/// Fifty copies of `attempt` for `user`, all at once.
async fn at_once(
    b: &StoreUnderTest,
    user: &'static str,
    policy: LoginPolicy,
    attempt: Attempt,
) -> Vec<LoginAttemptOutcome> {
    let tasks: Vec<_> = (0..50)
        .map(|_| {
            let (store, keys) = (b.store(), b.keys.clone());
            tokio::spawn(async move { login(&*store, &keys, user, &policy, attempt).await })
        })
        .collect();
    join_all(tasks)
        .await
        .into_iter()
        .map(|r| r.expect("task"))
        .collect()
}

async fn fifty_concurrent_failures_record_exactly_lock_after_and_lock_once(b: &StoreUnderTest) {
    let policy = policy();
    let outcomes = at_once(b, "mallory", policy, Attempt::failure()).await;

    let recorded = outcomes
        .iter()
        .filter(|o| o.verdict == LoginVerdict::Recorded)
        .count();
    let locked = outcomes
        .iter()
        .filter(|o| matches!(o.verdict, LoginVerdict::Locked { .. }))
        .count();
    let locks: Vec<u64> = outcomes.iter().filter_map(|o| o.locked_for_ms).collect();
    assert_eq!(recorded, 5);
    assert_eq!(locked, 45);
    assert_eq!(locks, [60_000], "exactly one call locked");

    let state = b.login_state("mallory", &policy).await;
    assert_eq!(state.lock_window_failures, 5);
    assert!(state.locked_retry_after_ms.is_some_and(|ms| ms <= 60_000));
}

async fn a_locked_user_is_refused_and_nothing_is_recorded(b: &StoreUnderTest) {
    let policy = LoginPolicy {
        lock_after: 2,
        lock_ms: 10_000,
        ..policy()
    };
    b.login("bob", &policy, Attempt::failure()).await;
    let start = b.mark();
    let locking = b.login("bob", &policy, Attempt::failure()).await;
    assert_eq!(locking.verdict, LoginVerdict::Recorded);
    assert_eq!(locking.locked_for_ms, Some(10_000));

    b.advance(400).await;
    for attempt in [
        Attempt::failure(),
        Attempt::success(),
        Attempt::failure().with_captcha(),
    ] {
        let refused = b.login("bob", &policy, attempt).await;
        let LoginVerdict::Locked { retry_after_ms } = refused.verdict else {
            panic!("{attempt:?} should be refused: {refused:?}");
        };
        b.assert_wait(retry_after_ms, 10_000, &start, "remaining lock");
        assert_eq!(refused.locked_for_ms, None);
        assert_eq!(refused.failures, 2);
    }
    let state = b.login_state("bob", &policy).await;
    assert_eq!(
        state.lock_window_failures, 2,
        "no attempt recorded while locked"
    );
}

async fn the_captcha_threshold_crossing_is_reported_once(b: &StoreUnderTest) {
    let policy = LoginPolicy {
        captcha_after: 3,
        lock_after: 10,
        ..policy()
    };
    for (n, crossed) in [(1, false), (2, false), (3, true)] {
        let out = b.login("carol", &policy, Attempt::failure()).await;
        assert_eq!(out.verdict, LoginVerdict::Recorded);
        assert_eq!(out.failures, n);
        assert_eq!(out.captcha_crossed, crossed, "failure {n}");
    }

    let challenged = b.login("carol", &policy, Attempt::failure()).await;
    assert_eq!(challenged.verdict, LoginVerdict::Challenged);
    assert_eq!(challenged.failures, 3);
    assert!(!challenged.captcha_crossed);

    let passed = b
        .login("carol", &policy, Attempt::failure().with_captcha())
        .await;
    assert_eq!(passed.verdict, LoginVerdict::Recorded);
    assert_eq!(passed.failures, 4);
    assert!(!passed.captcha_crossed, "already past the threshold");
}

async fn locks_double_up_to_the_cap_and_reset_after_a_quiet_period(b: &StoreUnderTest) {
    let policy = LoginPolicy {
        lock_after: 2,
        lock_ms: 100,
        lock_max_ms: 300,
        escalation_reset_ms: 600,
        ..policy()
    };
    let fail = || b.login("dave", &policy, Attempt::failure());

    assert_eq!(fail().await.locked_for_ms, None);
    assert_eq!(fail().await.locked_for_ms, Some(100));
    // Failures stay in the lock window, so one more failure after each lock
    // locks again, for twice as long, up to the cap.
    b.advance(100).await;
    assert_eq!(fail().await.locked_for_ms, Some(200));
    b.advance(200).await;
    assert_eq!(fail().await.locked_for_ms, Some(300), "400 capped");
    b.advance(300).await;
    assert_eq!(fail().await.locked_for_ms, Some(300), "800 capped");
    if b.exact() {
        b.advance(300 + 600).await;
        assert_eq!(
            fail().await.locked_for_ms,
            Some(300),
            "a lock starting exactly escalation_reset_ms after the last one ends still escalates"
        );
    }
    b.advance(300 + 601).await;
    assert_eq!(fail().await.locked_for_ms, Some(100), "escalation reset");
}

async fn a_success_clears_the_failures_only_with_reset_on_success(b: &StoreUnderTest) {
    for (reset_on_success, left) in [(true, 0), (false, 2)] {
        let user = format!("erin-{reset_on_success}");
        let policy = LoginPolicy {
            reset_on_success,
            ..policy()
        };
        b.login(&user, &policy, Attempt::failure()).await;
        b.login(&user, &policy, Attempt::failure()).await;
        let success = b.login(&user, &policy, Attempt::success()).await;
        assert_eq!(success.verdict, LoginVerdict::Recorded);
        assert_eq!(
            success.failures, left,
            "reset_on_success = {reset_on_success}"
        );
        assert_eq!(
            b.login_state(&user, &policy).await.lock_window_failures,
            left
        );
    }
}

async fn a_demanded_captcha_challenges_until_it_is_passed(b: &StoreUnderTest) {
    let policy = policy();
    let demanded = Attempt::failure().captcha_demanded();

    let challenged = b.login("frank", &policy, demanded).await;
    assert_eq!(challenged.verdict, LoginVerdict::Challenged);
    assert_eq!(challenged.failures, 0);
    assert_eq!(
        b.login_state("frank", &policy).await.failures,
        0,
        "not recorded"
    );

    let passed = b.login("frank", &policy, demanded.with_captcha()).await;
    assert_eq!(passed.verdict, LoginVerdict::Recorded);
    assert_eq!(passed.failures, 1);
}

async fn a_shadow_attempt_is_recorded_but_starts_no_new_lock_while_locked(b: &StoreUnderTest) {
    let policy = LoginPolicy {
        lock_after: 2,
        ..policy()
    };
    b.login("grace", &policy, Attempt::failure()).await;
    let start = b.mark();
    let locking = b.login("grace", &policy, Attempt::failure()).await;
    assert_eq!(locking.locked_for_ms, Some(60_000));

    let shadow = b.login("grace", &policy, Attempt::failure().shadow()).await;
    let LoginVerdict::Locked { retry_after_ms } = shadow.verdict else {
        panic!("a shadow attempt is decided as usual: {shadow:?}");
    };
    b.assert_wait(retry_after_ms, 60_000, &start, "the first lock, unchanged");
    assert_eq!(shadow.failures, 3, "recorded");
    assert_eq!(shadow.locked_for_ms, None, "no new lock");

    let state = b.login_state("grace", &policy).await;
    assert_eq!(state.lock_window_failures, 3);
    let remaining = state.locked_retry_after_ms.expect("still locked");
    b.assert_wait(remaining, 60_000, &start, "the lock was not extended");
}

/// Shadow mode never stops a failure, so a credential-stuffing run during a
/// trial locks (and relocks, doubling) every account it touches: what would
/// have been. Those locks must not hold once shadow mode is switched off;
/// the failures still count, so the next enforced one locks at level 0.
async fn a_lock_a_shadow_attempt_started_holds_no_enforcing_call(b: &StoreUnderTest) {
    let policy = LoginPolicy {
        captcha_after: 100,
        lock_after: 2,
        reset_on_success: false,
        ..policy()
    };
    b.login("trent", &policy, Attempt::failure().shadow()).await;
    let locking = b.login("trent", &policy, Attempt::failure().shadow()).await;
    assert_eq!(locking.locked_for_ms, Some(60_000));
    let shadow = b.login("trent", &policy, Attempt::success().shadow()).await;
    assert!(
        matches!(shadow.verdict, LoginVerdict::Locked { .. }),
        "a shadow call reads its would-be lock: {shadow:?}"
    );
    assert!(b
        .login_state_as("trent", &policy, true)
        .await
        .locked_retry_after_ms
        .is_some());
    let enforced = b.login_state("trent", &policy).await;
    assert_eq!(enforced.locked_retry_after_ms, None, "{enforced:?}");
    assert_eq!(enforced.lock_window_failures, 2);

    let success = b.login("trent", &policy, Attempt::success()).await;
    assert_eq!(success.verdict, LoginVerdict::Recorded, "{success:?}");
    let failure = b.login("trent", &policy, Attempt::failure()).await;
    assert_eq!(failure.verdict, LoginVerdict::Recorded, "{failure:?}");
    assert_eq!(
        failure.locked_for_ms,
        Some(60_000),
        "level 0: the shadow's lock is no predecessor"
    );
    let locked = b.login("trent", &policy, Attempt::failure()).await;
    assert!(
        matches!(locked.verdict, LoginVerdict::Locked { .. }),
        "{locked:?}"
    );
}

/// A trial's locks are kept apart from the enforced lock: a shadow call
/// escalates from the enforced history (what would have been), and the
/// next enforced lock escalates from that history, not from the trial's.
async fn an_enforced_locks_history_is_kept_apart_from_a_trials(b: &StoreUnderTest) {
    let policy = LoginPolicy {
        captcha_after: 100,
        lock_after: 1,
        lock_ms: 200,
        lock_max_ms: 60_000,
        escalation_reset_ms: 60_000,
        reset_on_success: false,
        ..policy()
    };
    let first = b.login("uma", &policy, Attempt::failure()).await;
    assert_eq!(first.locked_for_ms, Some(200));
    b.advance(300).await;
    let trial = b.login("uma", &policy, Attempt::failure().shadow()).await;
    assert_eq!(trial.verdict, LoginVerdict::Recorded, "{trial:?}");
    assert_eq!(
        trial.locked_for_ms,
        Some(400),
        "one level above the enforced lock"
    );
    let again = b.login("uma", &policy, Attempt::failure().shadow()).await;
    assert!(
        matches!(again.verdict, LoginVerdict::Locked { .. }),
        "{again:?}"
    );
    assert_eq!(
        b.login_state("uma", &policy).await.locked_retry_after_ms,
        None
    );
    b.advance(500).await;
    let trial = b.login("uma", &policy, Attempt::failure().shadow()).await;
    assert_eq!(trial.locked_for_ms, Some(800), "one level above its own");

    let enforced = b.login("uma", &policy, Attempt::failure()).await;
    assert_eq!(enforced.verdict, LoginVerdict::Recorded, "{enforced:?}");
    assert_eq!(
        enforced.locked_for_ms,
        Some(400),
        "the enforced history's next level, not the trial's"
    );
    // Both end, the trial's later: the next shadow lock escalates from it
    // (the enforced write kept it), the enforced state shows none.
    b.advance(900).await;
    assert_eq!(
        b.login_state("uma", &policy).await.locked_retry_after_ms,
        None
    );
    let relock = b.login("uma", &policy, Attempt::failure().shadow()).await;
    assert_eq!(relock.locked_for_ms, Some(1_600), "{relock:?}");
    let state = b.login_state_as("uma", &policy, true).await;
    assert!(state.locked_retry_after_ms.is_some(), "{state:?}");
    assert_eq!(
        b.login_state("uma", &policy).await.locked_retry_after_ms,
        None
    );
}

async fn a_shadow_attempt_is_recorded_when_challenged(b: &StoreUnderTest) {
    let policy = LoginPolicy {
        captcha_after: 1,
        lock_after: 3,
        ..policy()
    };
    let first = b.login("heidi", &policy, Attempt::failure()).await;
    assert!(first.captcha_crossed);

    let plain = b.login("heidi", &policy, Attempt::failure()).await;
    assert_eq!(plain.verdict, LoginVerdict::Challenged);
    assert_eq!(plain.failures, 1);

    let shadow = b.login("heidi", &policy, Attempt::failure().shadow()).await;
    assert_eq!(shadow.verdict, LoginVerdict::Challenged);
    assert_eq!(shadow.failures, 2, "recorded as if allowed");
    assert_eq!(shadow.locked_for_ms, None);

    let locking = b.login("heidi", &policy, Attempt::failure().shadow()).await;
    assert_eq!(locking.verdict, LoginVerdict::Challenged);
    assert_eq!(
        locking.locked_for_ms,
        Some(60_000),
        "recorded as if allowed, lock included"
    );
}

async fn login_state_reports_locks_and_failures_without_recording(b: &StoreUnderTest) {
    let policy = LoginPolicy {
        captcha_window_ms: 1_000,
        lock_after: 3,
        ..policy()
    };
    let empty = b.login_state("ivan", &policy).await;
    assert_eq!(empty.locked_retry_after_ms, None);
    assert_eq!((empty.failures, empty.lock_window_failures), (0, 0));

    b.login("ivan", &policy, Attempt::failure()).await;
    b.advance(1_000).await;
    b.login("ivan", &policy, Attempt::failure()).await;
    for _ in 0..2 {
        let state = b.login_state("ivan", &policy).await;
        assert_eq!(state.locked_retry_after_ms, None);
        assert_eq!(state.failures, 1, "only the last second's failure");
        assert_eq!(state.lock_window_failures, 2);
    }

    let start = b.mark();
    let locking = b.login("ivan", &policy, Attempt::failure()).await;
    assert_eq!(locking.locked_for_ms, Some(60_000));
    let state = b.login_state("ivan", &policy).await;
    let remaining = state.locked_retry_after_ms.expect("locked");
    b.assert_wait(remaining, 60_000, &start, "lock");
    assert_eq!(state.lock_window_failures, 3);
}

async fn a_lock_key_expires_escalation_reset_after_the_lock_ends(b: &StoreUnderTest) {
    let policy = LoginPolicy {
        lock_after: 1,
        lock_ms: 200,
        escalation_reset_ms: 800,
        ..policy()
    };
    let lock_key = b.keys.lock("user", "judy");
    assert_eq!(
        b.login("judy", &policy, Attempt::failure())
            .await
            .locked_for_ms,
        Some(200)
    );
    b.advance(500).await;
    assert!(b.exists(&lock_key).await, "kept for escalation");
    assert_eq!(
        b.login_state("judy", &policy).await.locked_retry_after_ms,
        None
    );
    b.advance(501).await;
    assert!(
        !b.exists(&lock_key).await,
        "gone 800 ms after the lock ended"
    );
}

/// A pair's second lock (twice as long) outlasting the account's first:
/// the account's lock refuses (its rule, its metric), with the pair's end,
/// as the state has it, not the account's earlier one, after which a retry
/// would only be refused again.
async fn with_both_locks_on_the_later_end_answers(b: &StoreUnderTest) {
    // Locks of seconds: on Redis the test's clock is the real one, and the
    // margins below leave a loaded machine a second.
    let policy = LoginPolicy {
        lock_after: 6,
        pair_lock_after: 2,
        lock_ms: 2_000,
        ..policy()
    };
    let from = |ip| b.login("gina", &policy, Attempt::failure().sent_from(ip));
    from("192.0.2.1").await;
    assert_eq!(from("192.0.2.1").await.pair_locked_for_ms, Some(2_000));
    b.advance(2_100).await;
    // The pair's two failures are still in its window: one more locks it.
    assert_eq!(from("192.0.2.1").await.pair_locked_for_ms, Some(4_000));
    from("192.0.2.2").await;
    from("192.0.2.3").await;
    assert_eq!(from("192.0.2.4").await.locked_for_ms, Some(2_000));

    let state = b.pair_state("gina", "192.0.2.1", &policy).await;
    let (own, pair) = (
        state.locked_retry_after_ms.expect("the account is locked"),
        state
            .pair_locked_retry_after_ms
            .expect("the pair is locked"),
    );
    assert!(pair > own + 1_000, "{own} {pair}");
    let refused = from("192.0.2.1").await;
    assert!(
        matches!(refused.verdict, LoginVerdict::Locked { retry_after_ms } if retry_after_ms > own && retry_after_ms <= pair),
        "{refused:?}: the account's lock ends in {own} ms, the pair's in {pair}"
    );
    // From elsewhere only the account's lock holds.
    assert!(
        matches!(from("192.0.2.9").await.verdict, LoginVerdict::Locked { retry_after_ms } if retry_after_ms <= own),
        "the account's lock ends in {own} ms"
    );
}

/// Two failures from one IP lock that (user, IP) pair and not the account:
/// the same user from another IP is recorded; the account locks at its own
/// threshold counting every IP; the index lists the pairs, newest first.
async fn a_pair_locks_alone_and_the_account_at_its_own_threshold(b: &StoreUnderTest) {
    let policy = LoginPolicy {
        lock_after: 5,
        pair_lock_after: 2,
        ..policy()
    };
    let from = |ip| b.login("frank", &policy, Attempt::failure().sent_from(ip));
    assert_eq!(from("192.0.2.1").await.pair_locked_for_ms, None);
    let locking = from("192.0.2.1").await;
    assert_eq!(locking.verdict, LoginVerdict::Recorded);
    assert_eq!(locking.pair_locked_for_ms, Some(60_000));
    assert_eq!(locking.locked_for_ms, None);

    let refused = from("192.0.2.1").await;
    assert!(
        matches!(refused.verdict, LoginVerdict::PairLocked { retry_after_ms } if retry_after_ms <= 60_000),
        "{refused:?}"
    );
    assert_eq!(refused.failures, 2, "a refused attempt is not recorded");
    let state = b.pair_state("frank", "192.0.2.1", &policy).await;
    assert!(state.pair_locked_retry_after_ms.is_some());
    assert_eq!(state.locked_retry_after_ms, None);
    let other = b.pair_state("frank", "192.0.2.2", &policy).await;
    assert_eq!(other.pair_locked_retry_after_ms, None);

    // Another IP: recorded; the third failure overall of five.
    let elsewhere = from("192.0.2.2").await;
    assert_eq!(elsewhere.verdict, LoginVerdict::Recorded);
    assert_eq!(elsewhere.failures, 3);
    assert_eq!(from("192.0.2.3").await.locked_for_ms, None);
    let account = from("192.0.2.4").await;
    assert_eq!(
        account.locked_for_ms,
        Some(60_000),
        "five failures from four IPs"
    );
    assert_eq!(account.pair_locked_for_ms, None);
    assert!(matches!(
        from("192.0.2.5").await.verdict,
        LoginVerdict::Locked { .. }
    ));
    assert_eq!(
        b.pair_ips("frank", 100).await,
        ["192.0.2.1"],
        "the index lists the locked pairs"
    );
}

async fn concurrent_failures_from_one_pair_lock_it_exactly_once(b: &StoreUnderTest) {
    let policy = LoginPolicy {
        lock_after: 1_000,
        pair_lock_after: 5,
        ..policy()
    };
    let attempt = Attempt::failure().sent_from("198.51.100.9");
    let outcomes = at_once(b, "grace", policy, attempt).await;
    let recorded = outcomes
        .iter()
        .filter(|o| o.verdict == LoginVerdict::Recorded)
        .count();
    let pair_locked = outcomes
        .iter()
        .filter(|o| matches!(o.verdict, LoginVerdict::PairLocked { .. }))
        .count();
    let locks: Vec<u64> = outcomes
        .iter()
        .filter_map(|o| o.pair_locked_for_ms)
        .collect();
    assert_eq!((recorded, pair_locked), (5, 45));
    assert_eq!(locks, [60_000], "exactly one call locked the pair");
    assert_eq!(
        b.login_state("grace", &policy).await.lock_window_failures,
        5
    );
}

async fn a_success_from_a_pair_clears_its_failures(b: &StoreUnderTest) {
    let policy = LoginPolicy {
        pair_lock_after: 2,
        ..policy()
    };
    let attempt = |a: Attempt| b.login("heidi", &policy, a.sent_from("203.0.113.5"));
    attempt(Attempt::failure()).await;
    let ok = attempt(Attempt::success()).await;
    assert_eq!(ok.failures, 0);
    // One failure after the reset does not lock a pair that locks at two.
    assert_eq!(attempt(Attempt::failure()).await.pair_locked_for_ms, None);
    assert!(attempt(Attempt::failure())
        .await
        .pair_locked_for_ms
        .is_some());
}

/// Each attempt answers what the rules' metrics count against: the user's
/// failures in the captcha window and in the lock window, and its pair's,
/// before the attempt, recorded or refused alike.
async fn each_attempt_answers_the_failures_its_rules_saw_before_it(b: &StoreUnderTest) {
    let policy = LoginPolicy {
        captcha_window_ms: 300,
        lock_window_ms: 60_000,
        lock_after: 100,
        pair_lock_after: 3,
        ..policy()
    };
    let seen = |o: LoginAttemptOutcome| {
        o.before
            .map(|before| (before.captcha_window, before.lock_window, before.pair))
    };
    let from = |ip| b.login("olga", &policy, Attempt::failure().sent_from(ip));
    assert_eq!(seen(from("192.0.2.1").await), Some((0, 0, Some(0))));
    assert_eq!(seen(from("192.0.2.1").await), Some((1, 1, Some(1))));
    assert_eq!(seen(from("192.0.2.2").await), Some((2, 2, Some(0))));
    b.advance(301).await;
    assert_eq!(
        seen(from("192.0.2.1").await),
        Some((0, 3, Some(2))),
        "out of the captcha window, still in the lock window"
    );
    let refused = from("192.0.2.1").await;
    assert!(matches!(refused.verdict, LoginVerdict::PairLocked { .. }));
    assert_eq!(seen(refused), Some((1, 4, Some(3))));
    let no_pair = b.login("olga", &policy, Attempt::failure()).await;
    assert_eq!(seen(no_pair), Some((1, 4, None)));
}

/// The index of a user's locked pairs keeps its newest `PAIR_INDEX_KEEP`,
/// however many IPs a credential-stuffing run locks (the Redis script has the
/// number rendered in, the memory store trims to it).
async fn a_users_index_of_locked_pairs_keeps_its_newest(b: &StoreUnderTest) {
    let policy = LoginPolicy {
        captcha_after: 10_000,
        lock_after: 10_000,
        pair_lock_after: 1,
        ..policy()
    };
    let ips: Vec<&'static str> = (0..PAIR_INDEX_KEEP + 2)
        // Zero-padded, so that failures within one millisecond sort by name
        // as they came: the order the stores break ties in.
        .map(|i| &*Box::leak(format!("10.9.{:03}.{:03}", i / 256, i % 256).into_boxed_str()))
        .collect();
    for ip in &ips {
        let out = b
            .login("heidi", &policy, Attempt::failure().sent_from(ip))
            .await;
        assert!(
            out.pair_locked_for_ms.is_some(),
            "{ip}'s first failure locks its pair"
        );
    }
    let listed = b.pair_ips("heidi", 2 * PAIR_INDEX_KEEP).await;
    assert_eq!(listed.len(), PAIR_INDEX_KEEP);
    assert_eq!(listed[0], ips[ips.len() - 1], "the newest first");
    assert!(
        !listed.iter().any(|ip| ip == ips[0] || ip == ips[1]),
        "the two oldest are gone"
    );
}
