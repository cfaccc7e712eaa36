//! Conversion counters (the SMS pumping guard's): `conversion_hit`,
//! `conversion_undo`, `conversion_success`, `conversion_state`, their place
//! in `reserve`, and the expiring set that lists blocks.

use tollgate::store::{
    CodeToStore, ConversionHit, ConversionOutcome, ConversionPolicy, ConversionVerdict, Escalation,
    ReserveRequest, SubjectWindows, Surge, WindowSpec,
};

use super::backend::{member, StoreUnderTest};
use super::on_both_backends;

on_both_backends!(
    exactly_at_the_threshold_is_open_and_just_below_it_trips,
    fewer_than_min_events_never_trip,
    a_block_answers_with_its_figures_until_it_ends_then_counts_start_afresh,
    an_undone_event_no_longer_counts,
    counts_leave_the_window_slice_by_slice,
    a_longer_window_drops_the_counts_made_under_a_shorter,
    a_shadow_block_is_seen_only_by_forced_events,
    a_forced_send_that_trips_a_block_is_its_first_count,
    a_refusing_conversion_reserves_nothing_and_a_refused_reservation_counts_nothing,
    an_expiring_set_lists_its_live_members_latest_ending_first,
    a_surge_challenges_and_only_a_passed_captcha_reserves,
    a_surge_past_the_captcha_blocks,
    verified_slices_teach_the_normal_and_it_raises_the_bar,
);

/// Blocks below half of at least four events, for `block_ms`.
fn policy(block_ms: u64) -> ConversionPolicy {
    ConversionPolicy {
        min_events: 4,
        min_ratio_ppm: 500_000,
        window_ms: 60_000,
        block_ms,
        surge: None,
    }
}

/// `policy(block_ms)` judged as a country: twice its normal, over a
/// history of seven buckets of `bucket_ms`.
fn country(block_ms: u64, window_ms: u64, bucket_ms: u64) -> ConversionPolicy {
    ConversionPolicy {
        window_ms,
        surge: Some(Surge {
            factor_milli: 2_000,
            history_ms: 7 * bucket_ms,
            block: true,
        }),
        ..policy(block_ms)
    }
}

pub(super) async fn hit(
    b: &StoreUnderTest,
    key: &str,
    policy: &ConversionPolicy,
    force: bool,
) -> ConversionOutcome {
    b.store()
        .conversion_hit(ConversionHit { key, policy }, force)
        .await
        .expect("conversion_hit")
}

/// Count one event, as a recorded send does; answers its slice.
pub(super) async fn count(b: &StoreUnderTest, key: &str, policy: &ConversionPolicy) -> u64 {
    b.store()
        .conversion_count(key, policy)
        .await
        .expect("conversion_count")
        .expect("counted")
}

/// `events` events and `successes` successes, as sends and verifies would.
async fn record(
    b: &StoreUnderTest,
    key: &str,
    policy: &ConversionPolicy,
    events: u32,
    successes: u32,
) {
    for _ in 0..events {
        let outcome = hit(b, key, policy, false).await;
        assert_eq!(outcome.verdict, ConversionVerdict::Open);
        assert_eq!(outcome.counted_in, None, "a check counts nothing");
        count(b, key, policy).await;
    }
    for _ in 0..successes {
        b.store()
            .conversion_success(key, policy)
            .await
            .expect("conversion_success");
    }
}

async fn exactly_at_the_threshold_is_open_and_just_below_it_trips(b: &StoreUnderTest) {
    let p = policy(60_000);
    let at = b.keys.window("prefix", "+3361000", "conversion");
    record(b, &at, &p, 4, 2).await;
    let open = hit(b, &at, &p, false).await;
    assert_eq!(
        (open.verdict, open.events, open.successes),
        (ConversionVerdict::Open, 4, 2),
        "2/4 is exactly a half: not below it"
    );

    let below = b.keys.window("prefix", "+3361001", "conversion");
    record(b, &below, &p, 4, 1).await;
    let start = b.mark();
    let tripped = hit(b, &below, &p, false).await;
    assert_eq!(
        tripped,
        ConversionOutcome {
            verdict: ConversionVerdict::Tripped,
            events: 4,
            successes: 1,
            counted_in: None,
            normal_milli: 0,
        }
    );
    let state = b.store().conversion_state(&below, &p).await.unwrap();
    assert_eq!(
        (state.events, state.successes),
        (0, 0),
        "the counts start afresh"
    );
    let block = state.block.expect("a block");
    assert_eq!((block.events, block.successes, block.shadow), (4, 1, false));
    b.assert_wait(block.retry_after_ms, 60_000, &start, "the block's end");
}

async fn fewer_than_min_events_never_trip(b: &StoreUnderTest) {
    let p = policy(60_000);
    let key = b.keys.window("country", "FR", "conversion");
    record(b, &key, &p, 3, 0).await;
    let open = hit(b, &key, &p, false).await;
    assert_eq!((open.verdict, open.events), (ConversionVerdict::Open, 3));
    count(b, &key, &p).await;
    let tripped = hit(b, &key, &p, false).await;
    assert_eq!(
        (tripped.verdict, tripped.events),
        (ConversionVerdict::Tripped, 4),
        "the fourth event counted trips it for the fifth"
    );
}

async fn a_block_answers_with_its_figures_until_it_ends_then_counts_start_afresh(
    b: &StoreUnderTest,
) {
    let p = policy(1_000);
    let key = b.keys.window("prefix", "+3361002", "conversion");
    record(b, &key, &p, 4, 0).await;
    let start = b.mark();
    assert_eq!(
        hit(b, &key, &p, false).await.verdict,
        ConversionVerdict::Tripped
    );
    b.advance(400).await;
    let blocked = hit(b, &key, &p, false).await;
    let ConversionVerdict::Blocked { retry_after_ms } = blocked.verdict else {
        panic!("still blocked: {blocked:?}");
    };
    b.assert_wait(retry_after_ms, 1_000, &start, "until the block ends");
    assert_eq!(
        (blocked.events, blocked.successes, blocked.counted_in),
        (4, 0, None),
        "a refused event is not counted; the figures are the block's"
    );
    b.advance(600).await;
    let after = hit(b, &key, &p, false).await;
    assert_eq!(
        (after.verdict, after.events),
        (ConversionVerdict::Open, 0),
        "the block has ended and the counts started afresh"
    );
    assert!(b
        .store()
        .conversion_state(&key, &p)
        .await
        .unwrap()
        .block
        .is_none());
}

async fn an_undone_event_no_longer_counts(b: &StoreUnderTest) {
    // Slices of an hour: every event of this case lands in one.
    let p = ConversionPolicy {
        window_ms: 12 * 3_600_000,
        ..policy(60_000)
    };
    let key = b.keys.window("prefix", "+3361003", "conversion");
    record(b, &key, &p, 2, 0).await;
    let slice = count(b, &key, &p).await;
    b.store().conversion_undo(&key, slice).await.unwrap();
    let state = b.store().conversion_state(&key, &p).await.unwrap();
    assert_eq!(state.events, 2);
    // Taking back more than was counted, or from nowhere, stays at zero.
    for _ in 0..3 {
        b.store().conversion_undo(&key, slice).await.unwrap();
    }
    let nowhere = b.keys.window("prefix", "+3361999", "conversion");
    b.store().conversion_undo(&nowhere, slice).await.unwrap();
    assert_eq!(
        b.store().conversion_state(&key, &p).await.unwrap().events,
        0
    );
    assert!(!b.exists(&key).await, "an emptied conversion is no key");
    assert!(!b.exists(&nowhere).await);
}

async fn counts_leave_the_window_slice_by_slice(b: &StoreUnderTest) {
    // Slices of 100 ms, twelve of them summed.
    let p = ConversionPolicy {
        window_ms: 1_200,
        ..policy(60_000)
    };
    let key = b.keys.window("prefix", "+3361004", "conversion");
    record(b, &key, &p, 2, 1).await;
    assert_eq!(
        b.store().conversion_state(&key, &p).await.unwrap().events,
        2
    );
    b.advance(1_300).await;
    let state = b.store().conversion_state(&key, &p).await.unwrap();
    assert_eq!((state.events, state.successes), (0, 0));
    b.advance(100).await;
    assert!(!b.exists(&key).await, "the key expires with its window");
}

/// Slices are numbered from the window's length: under a longer
/// `sms.pumping.window` (a reload) the counts made under the shorter one
/// read as slices after now, and were summed for decades (nothing pruned
/// them). They are dropped, teaching nothing: the counts start afresh.
async fn a_longer_window_drops_the_counts_made_under_a_shorter(b: &StoreUnderTest) {
    // Slices of 100 ms, then of an hour.
    let short = ConversionPolicy {
        window_ms: 1_200,
        ..policy(60_000)
    };
    let long = ConversionPolicy {
        window_ms: 12 * 3_600_000,
        ..policy(60_000)
    };
    let key = b.keys.window("prefix", "+3361005", "conversion");
    record(b, &key, &short, 3, 0).await;
    let store = b.store();
    let shorter = store.conversion_state(&key, &short).await.unwrap();
    assert_eq!(shorter.events, 3);
    let peeked = store.conversion_state(&key, &long).await.unwrap();
    assert_eq!(peeked.events, 0, "a peek sums none of them");
    let first = hit(b, &key, &long, false).await;
    assert_eq!((first.verdict, first.events), (ConversionVerdict::Open, 0));
    count(b, &key, &long).await;
    let counted = store.conversion_state(&key, &long).await.unwrap();
    assert_eq!(counted.events, 1, "the longer window's own count");
}

async fn a_shadow_block_is_seen_only_by_forced_events(b: &StoreUnderTest) {
    let p = policy(60_000);
    let key = b.keys.window("prefix", "+3361005", "conversion");
    record(b, &key, &p, 4, 0).await;
    let tripped = hit(b, &key, &p, true).await;
    assert_eq!(tripped.verdict, ConversionVerdict::Tripped);
    // A forced event goes through, and is counted as any recorded one.
    count(b, &key, &p).await;
    let seen = hit(b, &key, &p, true).await;
    assert!(
        matches!(seen.verdict, ConversionVerdict::Blocked { .. }),
        "{seen:?}"
    );
    assert_eq!((seen.events, seen.successes), (4, 0));
    count(b, &key, &p).await;
    let enforced = hit(b, &key, &p, false).await;
    assert_eq!(
        (enforced.verdict, enforced.events),
        (ConversionVerdict::Open, 2),
        "an enforced event does not see a shadow block; two were counted since"
    );
    let state = b.store().conversion_state(&key, &p).await.unwrap();
    assert!(state.block.is_some_and(|block| block.shadow));
}

/// A block drops the counts that tripped it; a forced send (shadow mode)
/// that trips it is still recorded, so it is the one count after it, not
/// one more on top of the counts dropped.
async fn a_forced_send_that_trips_a_block_is_its_first_count(b: &StoreUnderTest) {
    let p = policy(60_000);
    let window_key = b.keys.window("phone", "+33620000001", "sms_send");
    let key = b.keys.window("prefix", "+3362000", "conversion");
    let windows = [WindowSpec::enforce(5, 60_000)];
    record(b, &key, &p, 4, 0).await;
    let sent = b
        .store()
        .reserve(ReserveRequest {
            subjects: &[SubjectWindows {
                key: &window_key,
                windows: &windows,
                callers_own: false,
            }],
            conversions: &[ConversionHit {
                key: &key,
                policy: &p,
            }],
            member: &member(),
            gate_open: false,
            force: true,
            code: None,
        })
        .await
        .expect("reserve");
    assert!(sent.recorded, "forced");
    assert_eq!(
        (sent.conversions[0].verdict, sent.conversions[0].events),
        (ConversionVerdict::Tripped, 4)
    );
    assert!(sent.conversions[0].counted_in.is_some());
    let state = b.store().conversion_state(&key, &p).await.unwrap();
    assert_eq!(state.events, 1, "the four dropped, the forced send counted");
    assert!(state.block.is_some_and(|block| block.shadow));
}

async fn a_refusing_conversion_reserves_nothing_and_a_refused_reservation_counts_nothing(
    b: &StoreUnderTest,
) {
    let p = policy(60_000);
    let store = b.store();
    let window_key = b.keys.window("phone", "+33610000000", "sms_send");
    let code_key = b.keys.otp("phone", "+33610000000");
    let prefix = b.keys.window("prefix", "+3361000", "conversion");
    let country = b.keys.window("country", "FR", "conversion");
    let windows = [WindowSpec::enforce(2, 60_000)];
    let subjects = [SubjectWindows {
        key: &window_key,
        windows: &windows,
        callers_own: false,
    }];
    let conversions = [
        ConversionHit {
            key: &prefix,
            policy: &p,
        },
        ConversionHit {
            key: &country,
            policy: &p,
        },
    ];
    let reserve = |member: String| {
        let (subjects, conversions) = (&subjects, &conversions);
        let code = CodeToStore {
            key: &code_key,
            mac: "mac",
            attempts: 3,
            ttl_ms: 60_000,
            asker: "",
        };
        let store = store.clone();
        async move {
            store
                .reserve(ReserveRequest {
                    subjects,
                    conversions,
                    member: &member,
                    gate_open: false,
                    force: false,
                    code: Some(code),
                })
                .await
                .expect("reserve")
        }
    };

    // Recorded: counted in both conversions and the window.
    let sent = reserve(member()).await;
    assert!(sent.recorded);
    assert!(sent.conversions.iter().all(|c| c.counted_in.is_some()));
    // Each answers the slice it counted the event in: taken back from there
    // (a reservation rolled back), it no longer counts; counted again after.
    for (c, outcome) in conversions.iter().zip(&sent.conversions) {
        let slice = outcome.counted_in.expect("counted");
        store.conversion_undo(c.key, slice).await.unwrap();
        let state = store.conversion_state(c.key, &p).await.unwrap();
        assert_eq!(state.events, 0, "undone from the slice it was counted in");
        count(b, c.key, &p).await;
    }
    // Refused by the phone's window: counted in neither conversion.
    reserve(member()).await;
    let refused = reserve(member()).await;
    assert!(!refused.recorded);
    assert!(refused.conversions.iter().all(|c| c.counted_in.is_none()));
    let state = store.conversion_state(&prefix, &p).await.unwrap();
    assert_eq!(state.events, 2, "the refused send is not counted");
    assert_eq!(
        store.conversion_state(&country, &p).await.unwrap().events,
        2
    );

    // The country blocked: nothing is read or written, the prefix counts nothing.
    store
        .delete(std::slice::from_ref(&window_key))
        .await
        .unwrap();
    store.delete(std::slice::from_ref(&code_key)).await.unwrap();
    record(b, &country, &p, 2, 0).await;
    let blocked = reserve(member()).await;
    assert!(!blocked.recorded);
    assert_eq!(blocked.conversions[0].verdict, ConversionVerdict::Open);
    assert_eq!(blocked.conversions[1].verdict, ConversionVerdict::Tripped);
    assert_eq!(blocked.outcomes[0].counts, [0]);
    assert!(blocked.conversions.iter().all(|c| c.counted_in.is_none()));
    assert_eq!(store.conversion_state(&prefix, &p).await.unwrap().events, 2);
    assert_eq!(store.peek(&window_key, &windows).await.unwrap().counts, [0]);
    assert!(!b.exists(&code_key).await, "no code was stored");
}

async fn an_expiring_set_lists_its_live_members_latest_ending_first(b: &StoreUnderTest) {
    let store = b.store();
    let key = b.keys.conversion_blocks();
    let start = b.mark();
    store
        .expiring_add(&key, "prefix:+3361", 5_000)
        .await
        .unwrap();
    store.expiring_add(&key, "country:FR", 1_000).await.unwrap();
    store
        .expiring_add(&key, "prefix:+3362", 3_000)
        .await
        .unwrap();
    let listed = store.expiring_members(&key, 10).await.unwrap();
    let names: Vec<&str> = listed.members.iter().map(|(m, _)| m.as_str()).collect();
    assert_eq!(names, ["prefix:+3361", "prefix:+3362", "country:FR"]);
    assert_eq!(listed.total, 3);
    b.assert_wait(listed.members[0].1, 5_000, &start, "the first ends last");

    store.expiring_remove(&key, "prefix:+3362").await.unwrap();
    let cut = store.expiring_members(&key, 1).await.unwrap();
    assert_eq!((cut.members.len(), cut.total), (1, 2));

    b.advance(1_000).await;
    let left = store.expiring_members(&key, 10).await.unwrap();
    assert_eq!(left.total, 1, "country:FR has expired: {left:?}");
    b.advance(4_001).await;
    assert_eq!(store.expiring_members(&key, 10).await.unwrap().total, 0);
    assert!(
        !b.exists(&key).await,
        "the set expires with its last member"
    );
}

async fn a_surge_challenges_and_only_a_passed_captcha_reserves(b: &StoreUnderTest) {
    let p = country(60_000, 60_000, 60_000);
    let store = b.store();
    let window_key = b.keys.window("phone", "+33620000000", "sms_send");
    let code_key = b.keys.otp("phone", "+33620000000");
    let key = b.keys.window("country", "FR", "conversion");
    let windows = [WindowSpec::enforce(5, 60_000)];
    b.hit(&window_key, &windows).await;
    let subjects = [SubjectWindows {
        key: &window_key,
        windows: &windows,
        callers_own: false,
    }];
    let conversions = [ConversionHit {
        key: &key,
        policy: &p,
    }];
    let reserve = |gate_open: bool| {
        let (subjects, conversions, code_key) = (&subjects, &conversions, &code_key);
        let store = store.clone();
        async move {
            let code = CodeToStore {
                key: code_key,
                mac: "mac",
                attempts: 3,
                ttl_ms: 60_000,
                asker: "",
            };
            store
                .reserve(ReserveRequest {
                    subjects,
                    conversions,
                    member: &member(),
                    gate_open,
                    force: false,
                    code: Some(code),
                })
                .await
                .expect("reserve")
        }
    };
    // No history: the floor alone. Four sends, none verified, at 0× a normal of 0.
    for _ in 0..4 {
        count(b, &key, &p).await;
    }
    let challenged = reserve(false).await;
    assert_eq!(
        (challenged.conversions[0].verdict, challenged.recorded),
        (ConversionVerdict::ChallengeTripped, false)
    );
    assert_eq!(
        (
            challenged.conversions[0].events,
            challenged.conversions[0].normal_milli
        ),
        (4, 0)
    );
    assert_eq!(
        challenged.outcomes[0].counts,
        [1],
        "a challenge lets the windows be read: a rate limit answers first"
    );
    assert!(!b.exists(&code_key).await, "no code without the captcha");

    let passed = reserve(true).await;
    assert!(
        passed.recorded,
        "a passed captcha goes through the challenge"
    );
    let ConversionVerdict::Challenged { retry_after_ms } = passed.conversions[0].verdict else {
        panic!("still challenged: {:?}", passed.conversions[0]);
    };
    assert!(
        retry_after_ms <= 60_000 && retry_after_ms > 50_000,
        "{retry_after_ms}"
    );
    assert_eq!(
        (
            passed.conversions[0].events,
            passed.conversions[0].successes
        ),
        (4, 0),
        "the challenge's figures"
    );
    assert!(passed.conversions[0].counted_in.is_some());
    assert!(b.exists(&code_key).await);

    let again = reserve(false).await;
    assert!(!again.recorded);
    let state = store.conversion_state(&key, &p).await.unwrap();
    assert_eq!(
        (state.events, state.successes),
        (5, 0),
        "the counts go on under a challenge: the four, and the one past the captcha"
    );
    let level = state.block.expect("a challenge");
    assert_eq!(
        (level.level, level.events, level.shadow),
        (Escalation::Challenge, 4, false)
    );
}

async fn a_surge_past_the_captcha_blocks(b: &StoreUnderTest) {
    // Slices of 100 ms.
    let p = country(60_000, 1_200, 1_200);
    let key = b.keys.window("country", "DE", "conversion");
    for _ in 0..4 {
        count(b, &key, &p).await;
    }
    assert_eq!(
        hit(b, &key, &p, false).await.verdict,
        ConversionVerdict::ChallengeTripped
    );
    let before = hit(b, &key, &p, false).await;
    assert!(
        matches!(before.verdict, ConversionVerdict::Challenged { .. }),
        "nothing was counted since the challenge began: {before:?}"
    );
    // Four sends past the captcha, in the slices after the one it began in.
    b.advance(100).await;
    for _ in 0..4 {
        count(b, &key, &p).await;
    }
    let start = b.mark();
    let blocked = hit(b, &key, &p, false).await;
    assert_eq!(
        (blocked.verdict, blocked.events, blocked.successes),
        (ConversionVerdict::Tripped, 4, 0),
        "their figures: four since the challenge, none verified"
    );
    let state = b.store().conversion_state(&key, &p).await.unwrap();
    let block = state.block.expect("a block");
    assert_eq!((block.level, block.events), (Escalation::Block, 4));
    b.assert_wait(block.retry_after_ms, 60_000, &start, "the block's end");
    assert_eq!(state.events, 0, "the counts start afresh at the block");
    let ConversionVerdict::Blocked { .. } = hit(b, &key, &p, false).await.verdict else {
        panic!("blocked");
    };
}

async fn verified_slices_teach_the_normal_and_it_raises_the_bar(b: &StoreUnderTest) {
    // Slices of 50 ms, buckets of 600 ms. min_ratio_ppm 0 lets every slice
    // teach (no verify to time into the slice of its send); the country's
    // own policy then reads the same buckets.
    let judged = country(60_000, 600, 600);
    let teaching = ConversionPolicy {
        min_ratio_ppm: 0,
        ..judged
    };
    let key = b.keys.window("country", "IT", "conversion");
    for _ in 0..70 {
        count(b, &key, &teaching).await;
    }
    // Pumped sends (none verified) teach nothing.
    let pumped = b.keys.window("country", "ES", "conversion");
    for _ in 0..70 {
        count(b, &pumped, &judged).await;
    }
    b.advance(700).await;
    hit(b, &key, &teaching, false).await;
    hit(b, &pumped, &judged, false).await;
    b.advance(600).await;
    // 70 × 600 / (7 × 600): 10 sends a window.
    let state = b.store().conversion_state(&key, &judged).await.unwrap();
    assert_eq!((state.events, state.normal_milli), (0, 10_000));
    let none = b.store().conversion_state(&pumped, &judged).await.unwrap();
    assert_eq!(none.normal_milli, 0, "unverified slices do not teach");

    // Twice the normal is 20: nineteen unverified sends are not a surge.
    for _ in 0..19 {
        count(b, &key, &judged).await;
    }
    let under = hit(b, &key, &judged, false).await;
    assert_eq!(
        (under.verdict, under.events, under.normal_milli),
        (ConversionVerdict::Open, 19, 10_000)
    );
    count(b, &key, &judged).await;
    let surge = hit(b, &key, &judged, false).await;
    assert_eq!(
        (surge.verdict, surge.events, surge.normal_milli),
        (ConversionVerdict::ChallengeTripped, 20, 10_000)
    );
}
