//! Sliding windows: `hit`, `peek`, `undo`.

use futures::future::join_all;
use tollgate::domain::Algorithm;
use tollgate::store::{HitVerdict, WindowMode, WindowSpec};

use super::backend::{denied, member, Offer, StoreUnderTest};
use super::on_both_backends;

on_both_backends!(
    each_window_refuses_in_turn_and_admits_again_once_events_slide_out,
    the_wait_is_until_the_oldest_counted_event_leaves_the_window,
    past_the_limit_the_wait_is_until_enough_events_have_left,
    a_log_too_large_to_read_whole_refuses_and_waits_the_same,
    a_gate_window_gates_unless_the_gate_is_open,
    an_observed_window_never_refuses_and_tells_its_would_be_wait,
    a_meter_admits_its_limit_at_once_then_one_per_interval,
    a_meter_beside_a_log_read_whole_admits_the_same,
    forced_events_fill_a_meter_and_no_more,
    forced_events_fill_a_meter_beside_a_log_and_no_more,
    two_meters_of_one_subject_each_count_and_the_longer_wait_answers,
    two_meters_beside_a_log_read_whole_each_count,
    a_trimmed_log_keeps_the_meters_beside_it,
    a_full_enforce_window_denies_even_when_a_gate_is_also_full,
    a_forced_event_is_recorded_even_when_refused,
    events_in_the_same_millisecond_all_count,
    only_the_newest_max_limit_events_are_kept,
    an_undone_event_no_longer_counts,
    sixty_concurrent_hits_let_exactly_the_limit_through,
    peek_counts_and_waits_without_recording,
    a_window_key_expires_after_the_longest_window,
);

async fn each_window_refuses_in_turn_and_admits_again_once_events_slide_out(b: &StoreUnderTest) {
    let key = b.keys.window("phone", "+33612345678", "sms_send");
    let windows = [WindowSpec::enforce(2, 1_000), WindowSpec::enforce(3, 3_000)];
    let start = b.mark();

    let first = b.hit(&key, &windows).await;
    assert_eq!(first.verdict, HitVerdict::Allowed);
    assert!(first.added);
    assert_eq!(first.counts, [0, 0]);
    assert_eq!(first.next_retry_after_ms, 0);

    let second = b.hit(&key, &windows).await;
    assert_eq!(second.verdict, HitVerdict::Allowed);
    assert_eq!(second.counts, [1, 1]);
    b.assert_wait(
        second.next_retry_after_ms,
        1_000,
        &start,
        "1 s window now full",
    );

    let third = b.hit(&key, &windows).await;
    let (window, retry_after_ms) = denied(&third, "the 1 s window should deny");
    assert_eq!(window, 0);
    b.assert_wait(retry_after_ms, 1_000, &start, "1 s window");
    assert!(!third.added);
    assert_eq!(third.counts, [2, 2]);

    if b.exact() {
        b.advance(999).await;
        let still = b.hit(&key, &windows).await;
        assert_eq!(
            still.verdict,
            HitVerdict::Denied {
                window: 0,
                retry_after_ms: 1
            }
        );
        b.advance(1).await;
    } else {
        b.advance(1_000).await;
    }

    let fourth = b.hit(&key, &windows).await;
    assert_eq!(fourth.verdict, HitVerdict::Allowed, "{fourth:?}");
    assert_eq!(fourth.counts, [0, 2]);

    let fifth = b.hit(&key, &windows).await;
    let (window, retry_after_ms) = denied(&fifth, "the 3 s window should deny");
    assert_eq!(window, 1);
    b.assert_wait(retry_after_ms, 3_000, &start, "3 s window");
    assert_eq!(fifth.counts, [1, 3]);

    b.advance(2_000).await;
    let sixth = b.hit(&key, &windows).await;
    assert_eq!(sixth.verdict, HitVerdict::Allowed, "{sixth:?}");
    assert_eq!(sixth.counts, [0, 1]);
}

async fn the_wait_is_until_the_oldest_counted_event_leaves_the_window(b: &StoreUnderTest) {
    let key = b.keys.window("ip", "192.0.2.1", "sms_send");
    let windows = [WindowSpec::enforce(3, 1_000)];
    let start = b.mark();

    // The second event is 400 ms after the first, so that on Redis, where
    // time is real, the fifth hit (just past the first's second) finds it
    // still counted even on a slow machine: it has 350 ms to spare.
    b.hit(&key, &windows).await;
    b.advance(400).await;
    b.hit(&key, &windows).await;
    b.advance(100).await;
    let third = b.hit(&key, &windows).await;
    assert_eq!(third.verdict, HitVerdict::Allowed);
    b.assert_wait(third.next_retry_after_ms, 1_000, &start, "next retry");

    b.advance(50).await;
    let fourth = b.hit(&key, &windows).await;
    let (_, retry_after_ms) = denied(&fourth, "should be denied");
    b.assert_wait(retry_after_ms, 1_000, &start, "retry after");
    b.assert_wait(fourth.next_retry_after_ms, 1_000, &start, "next retry");

    let peek = b.store().peek(&key, &windows).await.unwrap();
    assert_eq!(peek.counts, [3]);
    b.assert_wait(peek.retry_after_ms[0], 1_000, &start, "peek");

    b.advance(450).await;
    let fifth = b.hit(&key, &windows).await;
    assert_eq!(fifth.verdict, HitVerdict::Allowed, "{fifth:?}");
    assert_eq!(fifth.counts, [2]);
}

async fn past_the_limit_the_wait_is_until_enough_events_have_left(b: &StoreUnderTest) {
    let key = b.keys.window("prefix", "+336", "sms_send");
    let windows = [WindowSpec::enforce(2, 1_000)];
    let forced = [
        WindowSpec::enforce(2, 1_000),
        WindowSpec::enforce(10, 1_000),
    ];

    b.hit(&key, &windows).await;
    b.advance(100).await;
    let second = b.mark();
    b.hit(&key, &windows).await;
    b.advance(100).await;
    let third = b.hit_as(&key, &forced, &member(), Offer::forced()).await;
    assert!(third.added, "{third:?}");

    b.advance(50).await;
    let fourth = b.hit(&key, &windows).await;
    assert_eq!(fourth.counts, [3]);
    let (_, retry_after_ms) = denied(&fourth, "should be denied");
    // 3 events, limit 2: two must leave, so the wait ends with the second.
    b.assert_wait(retry_after_ms, 1_000, &second, "retry after");
}

/// Over 32 kept members, Redis counts a log per window and finds the wait's
/// member with a ZREVRANGE instead of reading the set whole: the same answers.
async fn a_log_too_large_to_read_whole_refuses_and_waits_the_same(b: &StoreUnderTest) {
    let key = b.keys.window("ip", "192.0.2.40", "sms_send");
    let windows = [
        WindowSpec::enforce(40, 2_000),
        WindowSpec::enforce(45, 60_000),
    ];
    let start = b.mark();
    b.hit(&key, &windows).await;
    b.advance(400).await;
    for _ in 0..38 {
        assert_eq!(b.hit(&key, &windows).await.verdict, HitVerdict::Allowed);
    }
    let fortieth = b.hit(&key, &windows).await;
    assert_eq!(fortieth.verdict, HitVerdict::Allowed, "{fortieth:?}");
    assert_eq!(fortieth.counts, [39, 39]);
    b.assert_wait(fortieth.next_retry_after_ms, 2_000, &start, "next retry");

    let refused = b.hit(&key, &windows).await;
    assert_eq!(refused.counts, [40, 40]);
    let (window, retry_after_ms) = denied(&refused, "the 41st should be denied");
    assert_eq!(window, 0);
    b.assert_wait(retry_after_ms, 2_000, &start, "retry after");
    let forced = b.hit_as(&key, &windows, &member(), Offer::forced()).await;
    assert!(forced.added, "{forced:?}");
    // recorded though refused: the 41st counted
    assert_eq!(
        b.store().peek(&key, &windows).await.unwrap().counts,
        [41, 41]
    );
}

async fn a_gate_window_gates_unless_the_gate_is_open(b: &StoreUnderTest) {
    let key = b.keys.window("ip", "198.51.100.7", "sms_send");
    let windows = [WindowSpec::enforce(10, 60_000), WindowSpec::gate(2, 60_000)];

    for expected in [[0, 0], [1, 1]] {
        let hit = b.hit(&key, &windows).await;
        assert_eq!(hit.verdict, HitVerdict::Allowed);
        assert_eq!(hit.counts, expected);
    }

    let gated = b.hit(&key, &windows).await;
    assert_eq!(gated.verdict, HitVerdict::Gated { window: 1 });
    assert!(!gated.added);
    assert_eq!(gated.counts, [2, 2]);
    assert_eq!(gated.next_retry_after_ms, 0, "gate windows have no wait");

    let open = b
        .hit_as(&key, &windows, &member(), Offer::gate_open())
        .await;
    assert_eq!(open.verdict, HitVerdict::Allowed);
    assert!(open.added);
    assert_eq!(open.counts, [2, 2]);

    let again = b.hit(&key, &windows).await;
    assert_eq!(again.verdict, HitVerdict::Gated { window: 1 });
    assert_eq!(again.counts, [3, 3]);
}

async fn an_observed_window_never_refuses_and_tells_its_would_be_wait(b: &StoreUnderTest) {
    let key = b.keys.window("phone", "+33612345679", "sms_send");
    let observed = WindowSpec {
        mode: WindowMode::Observe,
        ..WindowSpec::enforce(1, 2_000)
    };
    let windows = [observed, WindowSpec::enforce(3, 60_000)];
    let start = b.mark();

    let first = b.hit(&key, &windows).await;
    assert_eq!(first.verdict, HitVerdict::Allowed);
    assert_eq!(first.observed_waits, [0, 0]);
    b.assert_wait(
        first.next_retry_after_ms,
        0,
        &start,
        "an observed window is not waited for",
    );

    for expected in [[1, 1], [2, 2]] {
        let hit = b.hit(&key, &windows).await;
        assert_eq!(hit.verdict, HitVerdict::Allowed, "{hit:?}");
        assert!(hit.added);
        assert_eq!(hit.counts, expected);
        assert_eq!(hit.observed_waits[1], 0);
        b.assert_wait(hit.observed_waits[0], 2_000, &start, "the would-be wait");
    }

    let denied = b.hit(&key, &windows).await;
    assert!(
        matches!(denied.verdict, HitVerdict::Denied { window: 1, .. }),
        "only the enforced window refuses: {denied:?}"
    );
}

async fn a_meter_admits_its_limit_at_once_then_one_per_interval(b: &StoreUnderTest) {
    meter_admits_its_limit_at_once_then_one_per_interval(b, 100).await;
}

/// On Redis a log read whole keeps its subject's meters as members
/// (src/store/redis/layout.rs): the same answers.
async fn a_meter_beside_a_log_read_whole_admits_the_same(b: &StoreUnderTest) {
    meter_admits_its_limit_at_once_then_one_per_interval(b, 10).await;
}

async fn meter_admits_its_limit_at_once_then_one_per_interval(b: &StoreUnderTest, log_limit: u32) {
    let key = b.keys.window("global", "sms_send", "sms_send");
    let meter = WindowSpec {
        algorithm: Algorithm::Gcra,
        ..WindowSpec::enforce(3, 3_000)
    };
    let windows = [meter, WindowSpec::enforce(log_limit, 60_000)];
    let start = b.mark();

    let last = member();
    for (expected, id) in [
        ([0, 0], member()),
        ([1, 1], member()),
        ([2, 2], last.clone()),
    ] {
        let hit = b.hit_as(&key, &windows, &id, Offer::default()).await;
        assert_eq!(hit.verdict, HitVerdict::Allowed, "{hit:?}");
        assert_eq!(hit.counts, expected);
    }
    let peek = b.store().peek(&key, &windows).await.expect("peek");
    assert_eq!(peek.counts, [3, 3]);
    b.assert_wait(peek.retry_after_ms[0], 1_000, &start, "the meter's wait");

    let refused = b.hit(&key, &windows).await;
    let (window, retry_after_ms) = denied(&refused, "the meter should deny");
    assert_eq!(window, 0);
    b.assert_wait(retry_after_ms, 1_000, &start, "one event per 1000 ms");
    assert_eq!(refused.counts, [3, 3]);

    b.store().undo(&key, &last, &windows).await.expect("undo");
    let after_undo = b.store().peek(&key, &windows).await.expect("peek");
    assert_eq!(
        after_undo.counts,
        [2, 2],
        "the meter and the log each gave one back"
    );

    if b.exact() {
        b.advance(1_000).await;
        let hit = b.hit(&key, &windows).await;
        assert_eq!(hit.verdict, HitVerdict::Allowed);
        assert_eq!(
            hit.counts,
            [1, 2],
            "9000 - 3000 taken back - 3000 drained: one event's worth of 3000 left"
        );
    }
}

async fn two_meters_of_one_subject_each_count_and_the_longer_wait_answers(b: &StoreUnderTest) {
    two_meters_each_count_and_the_longer_wait_answers(b, 50).await;
}

async fn two_meters_beside_a_log_read_whole_each_count(b: &StoreUnderTest) {
    two_meters_each_count_and_the_longer_wait_answers(b, 5).await;
}

async fn two_meters_each_count_and_the_longer_wait_answers(b: &StoreUnderTest, gate: u32) {
    let key = b.keys.window("prefix", "+3361234", "sms_send");
    let meter = |limit, window_ms| WindowSpec {
        algorithm: Algorithm::Gcra,
        ..WindowSpec::enforce(limit, window_ms)
    };
    // a gate log between the two meters: the meters' fields are not its
    let windows = [
        meter(2, 2_000),
        WindowSpec::gate(gate, 60_000),
        meter(3, 60_000),
    ];
    let start = b.mark();
    for expected in [[0, 0, 0], [1, 1, 1]] {
        let hit = b.hit(&key, &windows).await;
        assert_eq!(hit.verdict, HitVerdict::Allowed, "{hit:?}");
        assert_eq!(hit.counts, expected);
    }
    let refused = b.hit(&key, &windows).await;
    let (window, retry_after_ms) = denied(&refused, "the short meter is full");
    assert_eq!((window, refused.counts), (0, vec![2, 2, 2]));
    b.assert_wait(retry_after_ms, 1_000, &start, "one per 1000 ms");

    b.advance(1_000).await;
    let third = b.hit(&key, &windows).await;
    assert_eq!(third.verdict, HitVerdict::Allowed, "{third:?}");
    let (window, _) = denied(&b.hit(&key, &windows).await, "both meters are full now");
    assert_eq!(window, 2, "the long meter's wait (20 s) is the longer");
}

async fn forced_events_fill_a_meter_and_no_more(b: &StoreUnderTest) {
    forced_events_fill_a_meter(b, &[]).await;
}

async fn forced_events_fill_a_meter_beside_a_log_and_no_more(b: &StoreUnderTest) {
    forced_events_fill_a_meter(b, &[WindowSpec::enforce(3, 60_000)]).await;
}

/// Five forced events on a meter of 2, and on `logs` beside it.
async fn forced_events_fill_a_meter(b: &StoreUnderTest, logs: &[WindowSpec]) {
    let key = b.keys.window("global", "forced", "sms_send");
    let mut windows = vec![WindowSpec {
        algorithm: Algorithm::Gcra,
        ..WindowSpec::enforce(2, 2_000)
    }];
    windows.extend_from_slice(logs);
    let start = b.mark();
    for _ in 0..5 {
        let hit = b.hit_as(&key, &windows, &member(), Offer::forced()).await;
        assert!(hit.added);
    }
    let peek = b.store().peek(&key, &windows).await.expect("peek");
    assert_eq!(
        peek.counts[0], 2,
        "a shadow burst fills the meter, as a log keeps its limit"
    );
    for (log, count) in logs.iter().zip(&peek.counts[1..]) {
        assert_eq!(*count, log.limit, "the log keeps its limit");
    }
    b.assert_wait(
        peek.retry_after_ms[0],
        1_000,
        &start,
        "one interval, not five",
    );
}

async fn a_full_enforce_window_denies_even_when_a_gate_is_also_full(b: &StoreUnderTest) {
    let key = b.keys.window("ip", "203.0.113.9", "sms_send");
    let windows = [WindowSpec::gate(1, 60_000), WindowSpec::enforce(2, 60_000)];

    assert_eq!(b.hit(&key, &windows).await.verdict, HitVerdict::Allowed);
    let gated = b.hit(&key, &windows).await;
    assert_eq!(gated.verdict, HitVerdict::Gated { window: 0 });
    let open = b
        .hit_as(&key, &windows, &member(), Offer::gate_open())
        .await;
    assert_eq!(open.verdict, HitVerdict::Allowed);

    for offer in [Offer::default(), Offer::gate_open()] {
        let hit = b.hit_as(&key, &windows, &member(), offer).await;
        assert!(
            matches!(hit.verdict, HitVerdict::Denied { window: 1, .. }),
            "{offer:?}: {hit:?}"
        );
    }
}

async fn a_forced_event_is_recorded_even_when_refused(b: &StoreUnderTest) {
    let key = b.keys.window("phone", "+4915112345678", "sms_send");
    let windows = [WindowSpec::enforce(1, 60_000)];
    let gated = [WindowSpec::gate(1, 60_000)];

    b.hit(&key, &windows).await;
    let start = b.mark();
    let denied = b.hit_as(&key, &windows, &member(), Offer::forced()).await;
    assert!(
        matches!(denied.verdict, HitVerdict::Denied { .. }),
        "{denied:?}"
    );
    assert!(denied.added);
    assert_eq!(denied.counts, [1]);
    // Two events, limit 1: the window admits again when the forced one leaves.
    b.assert_wait(denied.next_retry_after_ms, 60_000, &start, "next retry");

    let gated_hit = b.hit_as(&key, &gated, &member(), Offer::forced()).await;
    assert_eq!(gated_hit.verdict, HitVerdict::Gated { window: 0 });
    assert!(gated_hit.added);

    // Trimmed to max(limit) = 1 by the last call, whose only window has limit 1.
    let peek = b
        .store()
        .peek(&key, &[WindowSpec::enforce(5, 60_000)])
        .await
        .unwrap();
    assert_eq!(peek.counts, [1]);
}

async fn events_in_the_same_millisecond_all_count(b: &StoreUnderTest) {
    let key = b.keys.window("global", "all", "sms_send");
    let windows = [WindowSpec::enforce(100, 60_000)];

    // On the manual clock all 50 share one millisecond; on Redis they are
    // pipelined on one connection, so many do.
    let hits = join_all((0..50).map(|_| b.hit(&key, &windows))).await;
    assert!(hits
        .iter()
        .all(|h| h.verdict == HitVerdict::Allowed && h.added));
    let mut counts: Vec<u32> = hits.iter().map(|h| h.counts[0]).collect();
    counts.sort_unstable();
    assert_eq!(counts, (0..50).collect::<Vec<u32>>());

    let peek = b.store().peek(&key, &windows).await.unwrap();
    assert_eq!(peek.counts, [50]);
}

async fn only_the_newest_max_limit_events_are_kept(b: &StoreUnderTest) {
    let key = b.keys.window("phone", "+447700900123", "sms_send");
    let windows = [
        WindowSpec::enforce(3, 60_000),
        WindowSpec::enforce(5, 60_000),
    ];
    let members: Vec<String> = (0..8).map(|i| format!("event-{i}")).collect();

    let mut last = None;
    for m in &members {
        last = Some(b.hit_as(&key, &windows, m, Offer::forced()).await);
        b.advance(1).await;
    }
    let last = last.unwrap();
    assert!(last.added);
    assert_eq!(last.counts, [5, 5], "kept at most 5 before the 8th event");

    let peek = b.store().peek(&key, &windows).await.unwrap();
    assert_eq!(peek.counts, [5, 5]);

    // The oldest were dropped: removing one changes nothing...
    b.store().undo(&key, &members[0], &windows).await.unwrap();
    assert_eq!(b.store().peek(&key, &windows).await.unwrap().counts, [5, 5]);
    // ...while the newest were kept.
    b.store().undo(&key, &members[7], &windows).await.unwrap();
    assert_eq!(b.store().peek(&key, &windows).await.unwrap().counts, [4, 4]);
}

/// A log trimmed to its largest limit keeps the meters beside it (on Redis
/// its lowest members: a trim that counted ranks from the oldest would
/// drop them first).
async fn a_trimmed_log_keeps_the_meters_beside_it(b: &StoreUnderTest) {
    let key = b.keys.window("ip", "198.51.100.23", "sms_send");
    let meter = WindowSpec {
        algorithm: Algorithm::Gcra,
        ..WindowSpec::enforce(20, 3_600_000)
    };
    let windows = [WindowSpec::gate(3, 3_600_000), meter];
    for expected in 0..8u32 {
        let hit = b
            .hit_as(&key, &windows, &member(), Offer::gate_open())
            .await;
        assert_eq!(hit.verdict, HitVerdict::Allowed, "{hit:?}");
        assert_eq!(hit.counts, [expected.min(3), expected], "{hit:?}");
    }
    let peek = b.store().peek(&key, &windows).await.expect("peek");
    assert_eq!(peek.counts, [3, 8], "3 events kept, the meter's 8 sends");
    assert_eq!(peek.retry_after_ms[1], 0, "the meter is not full");
}

async fn an_undone_event_no_longer_counts(b: &StoreUnderTest) {
    let key = b.keys.window("phone", "+12025550123", "sms_send");
    let windows = [WindowSpec::enforce(1, 60_000)];
    let reserved = member();

    let first = b.hit_as(&key, &windows, &reserved, Offer::default()).await;
    assert_eq!(first.verdict, HitVerdict::Allowed);
    assert!(matches!(
        b.hit(&key, &windows).await.verdict,
        HitVerdict::Denied { .. }
    ));

    b.store().undo(&key, &reserved, &windows).await.unwrap();
    assert_eq!(b.store().peek(&key, &windows).await.unwrap().counts, [0]);
    assert_eq!(b.hit(&key, &windows).await.verdict, HitVerdict::Allowed);

    // Undoing what is not there is fine.
    b.store().undo(&key, &reserved, &windows).await.unwrap();
    let nowhere = b.keys.window("phone", "+12025550199", "sms_send");
    b.store()
        .undo(&nowhere, "never-recorded", &windows)
        .await
        .unwrap();
    assert_eq!(b.store().peek(&key, &windows).await.unwrap().counts, [1]);
}

async fn sixty_concurrent_hits_let_exactly_the_limit_through(b: &StoreUnderTest) {
    let key = b.keys.window("phone", "+33699999999", "sms_send");
    let windows = [
        WindowSpec::enforce(7, 60_000),
        WindowSpec::enforce(20, 3_600_000),
    ];

    let tasks: Vec<_> = (0..60)
        .map(|_| {
            let store = b.store();
            let key = key.clone();
            tokio::spawn(async move {
                let m = member();
                store
                    .hit(tollgate::store::HitRequest {
                        key: &key,
                        windows: &windows,
                        member: &m,
                        gate_open: false,
                        force: false,
                    })
                    .await
                    .expect("hit")
            })
        })
        .collect();
    let outcomes: Vec<_> = join_all(tasks)
        .await
        .into_iter()
        .map(|r| r.expect("task"))
        .collect();

    let mut allowed: Vec<u32> = outcomes
        .iter()
        .filter(|o| o.verdict == HitVerdict::Allowed)
        .map(|o| o.counts[0])
        .collect();
    allowed.sort_unstable();
    assert_eq!(
        allowed,
        (0..7).collect::<Vec<u32>>(),
        "each slot taken once"
    );
    let denied = outcomes
        .iter()
        .filter(|o| matches!(o.verdict, HitVerdict::Denied { window: 0, .. }) && !o.added)
        .count();
    assert_eq!(denied, 53);
    assert_eq!(b.store().peek(&key, &windows).await.unwrap().counts, [7, 7]);
}

async fn peek_counts_and_waits_without_recording(b: &StoreUnderTest) {
    let key = b.keys.window("user", "alice", "sms_send");
    let windows = [
        WindowSpec::enforce(2, 1_000),
        WindowSpec::enforce(5, 60_000),
    ];

    let empty = b.store().peek(&key, &windows).await.unwrap();
    assert_eq!(empty.counts, [0, 0]);
    assert_eq!(empty.retry_after_ms, [0, 0]);

    let start = b.mark();
    b.hit(&key, &windows).await;
    b.hit(&key, &windows).await;
    for _ in 0..3 {
        let peek = b.store().peek(&key, &windows).await.unwrap();
        assert_eq!(peek.counts, [2, 2]);
        b.assert_wait(peek.retry_after_ms[0], 1_000, &start, "full window");
        assert_eq!(peek.retry_after_ms[1], 0, "window below its limit");
    }
    let hit = b.hit(&key, &windows).await;
    assert_eq!(hit.counts, [2, 2], "peeks recorded nothing");
}

async fn a_window_key_expires_after_the_longest_window(b: &StoreUnderTest) {
    let key = b.keys.window("ip", "192.0.2.200", "sms_send");
    let windows = [WindowSpec::enforce(5, 400), WindowSpec::enforce(5, 800)];

    b.hit(&key, &windows).await;
    b.advance(600).await;
    assert!(
        b.exists(&key).await,
        "kept while the longest window counts it"
    );
    assert_eq!(b.store().peek(&key, &windows).await.unwrap().counts, [0, 1]);
    b.advance(201).await;
    assert!(!b.exists(&key).await, "gone after the longest window");
}
