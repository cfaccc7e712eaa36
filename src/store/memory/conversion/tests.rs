use super::*;
use crate::store::Surge;

const POLICY: ConversionPolicy = ConversionPolicy {
    min_events: 3,
    min_ratio_ppm: 500_000,
    window_ms: 1_200,
    block_ms: 5_000,
    surge: None,
};

/// Slices of 100 ms, buckets of 1,000 ms (a history of 7,000 ms).
const COUNTRY: ConversionPolicy = ConversionPolicy {
    surge: Some(Surge {
        factor_milli: 2_000,
        history_ms: 7_000,
        block: true,
    }),
    ..POLICY
};

#[test]
fn old_slices_stop_counting() {
    let mut c = Conversion::default();
    for t in [0, 100, 200] {
        assert_eq!(c.hit(&POLICY, t, false).0.verdict, ConversionVerdict::Open);
        c.count(&POLICY, t);
    }
    // Slices of 100 ms, twelve summed: at 1_250 the slice of 0..100 is out.
    let state = c.state(&POLICY, 1_250);
    assert_eq!((state.events, state.successes), (2, 0));
    let (open, _) = c.hit(&POLICY, 1_250, false);
    assert_eq!(
        open.verdict,
        ConversionVerdict::Open,
        "two are below min_events"
    );
    assert_eq!(open.counted_in, None, "a check counts nothing");
}

#[test]
fn a_trip_blocks_and_starts_the_counts_afresh() {
    let mut c = Conversion::default();
    for t in [0, 100, 200] {
        c.count(&POLICY, t);
    }
    c.success(&POLICY, 300);
    let (tripped, expiry) = c.hit(&POLICY, 400, false);
    assert_eq!(
        tripped.verdict,
        ConversionVerdict::Tripped,
        "1/3 is below half"
    );
    assert_eq!(
        (tripped.events, tripped.successes, tripped.counted_in),
        (3, 1, None)
    );
    assert_eq!(expiry, Some(5_400));
    let state = c.state(&POLICY, 500);
    assert_eq!((state.events, state.successes), (0, 0));
    let (blocked, _) = c.hit(&POLICY, 500, false);
    assert_eq!(
        (blocked.verdict, blocked.events, blocked.successes),
        (
            ConversionVerdict::Blocked {
                retry_after_ms: 4_900
            },
            3,
            1
        )
    );
    assert_eq!(
        c.hit(&POLICY, 5_400, false).0.verdict,
        ConversionVerdict::Open
    );
}

#[test]
fn a_shadow_block_is_seen_only_by_forced_events() {
    let mut c = Conversion::default();
    for t in 0..3 {
        c.count(&POLICY, t);
    }
    let (tripped, _) = c.hit(&POLICY, 10, true);
    assert_eq!(tripped.verdict, ConversionVerdict::Tripped);
    c.count(&POLICY, 10);
    let (seen, _) = c.hit(&POLICY, 20, true);
    assert_eq!(
        seen.verdict,
        ConversionVerdict::Blocked {
            retry_after_ms: 4_990
        }
    );
    let (enforced, _) = c.hit(&POLICY, 30, false);
    assert_eq!(
        (enforced.verdict, enforced.events),
        (ConversionVerdict::Open, 1)
    );
    assert!(c.state(&POLICY, 30).block.is_some_and(|b| b.shadow));
}

#[test]
fn verified_slices_teach_the_normal_and_pumped_ones_do_not() {
    let mut c = Conversion::default();
    // Bucket 10 (10,000..11,000): four verified sends, then three pumped.
    for t in [10_000, 10_010, 10_020, 10_030] {
        c.count(&COUNTRY, t);
    }
    c.success(&COUNTRY, 10_040);
    c.success(&COUNTRY, 10_050);
    for t in [10_500, 10_510, 10_520] {
        c.count(&COUNTRY, t);
    }
    // At 11,700 both slices are out of the window and bucket 10 complete.
    let state = c.state(&COUNTRY, 11_700);
    assert_eq!(
        state.normal_milli, 686,
        "4 × 1,200 / 7,000 = 0.686 a window"
    );
    c.hit(&COUNTRY, 11_700, false);
    assert_eq!(c.buckets, BTreeMap::from([(10, 4)]), "folded on the hit");
    assert_eq!(c.state(&COUNTRY, 11_700).normal_milli, 686);
    // Bucket 10 is read until bucket 18 starts.
    assert_eq!(c.state(&COUNTRY, 17_999).normal_milli, 686);
    assert_eq!(c.state(&COUNTRY, 18_000).normal_milli, 0);
}

#[test]
fn a_surge_challenges_then_a_surge_past_the_captcha_blocks() {
    let mut c = Conversion::default();
    for t in [0, 10, 20] {
        c.count(&COUNTRY, t);
    }
    let (challenged, expiry) = c.hit(&COUNTRY, 30, false);
    assert_eq!(
        (challenged.verdict, challenged.events),
        (ConversionVerdict::ChallengeTripped, 3)
    );
    assert_eq!(expiry, Some(30 + 1_200 + 8_000), "the history is kept");
    // Challenged sends that passed the captcha count; the first slice
    // under the challenge is the next one (100..200).
    c.count(&COUNTRY, 40);
    let (still, _) = c.hit(&COUNTRY, 100, false);
    assert_eq!(
        still.verdict,
        ConversionVerdict::Challenged {
            retry_after_ms: 4_930
        }
    );
    for t in [110, 120, 130] {
        c.count(&COUNTRY, t);
    }
    let (blocked, _) = c.hit(&COUNTRY, 140, false);
    assert_eq!(
        (blocked.verdict, blocked.events, blocked.successes),
        (ConversionVerdict::Tripped, 3, 0),
        "three unverified sends past the captcha"
    );
    let state = c.state(&COUNTRY, 150);
    let block = state.block.expect("a block");
    assert_eq!(
        (block.level, block.retry_after_ms),
        (Escalation::Block, 4_990)
    );
    assert_eq!(state.events, 0, "the counts start afresh at the block");
}
