//! One-time codes, deletes, shared secrets and reachability.

use tollgate::store::{CodeToStore, OtpOutcome, ReserveRequest, SubjectWindows, WindowSpec};

use super::backend::StoreUnderTest;
use super::on_both_backends;

on_both_backends!(
    a_code_is_valid_once_then_a_stand_in_answers,
    wrong_codes_count_down_then_burn_the_code_until_it_expires,
    without_a_code_a_stand_in_counts_down_and_burns_alike,
    putting_a_code_replaces_the_previous_one,
    a_code_says_whether_its_send_was_counted,
    a_reserved_code_over_an_exempt_one_is_counted,
    a_code_expires_after_its_ttl,
    deleted_keys_are_gone,
    get_or_init_keeps_the_first_value,
    ping_answers,
);

/// Tries per code, and a code's life.
const ATTEMPTS: u32 = 3;
const TTL_MS: u64 = 60_000;

async fn check(b: &StoreUnderTest, key: &str, mac: &str) -> OtpOutcome {
    b.store()
        .otp_check(key, mac, ATTEMPTS, TTL_MS)
        .await
        .expect("otp_check")
}

/// A code put as not counted (an allow-listed send) says so when it is
/// right, through wrong tries; a code put over it as counted says that.
async fn a_code_says_whether_its_send_was_counted(b: &StoreUnderTest) {
    let key = b.keys.otp("phone", "+33612345678");
    let store = b.store();
    store
        .otp_put(&key, "mac-a", ATTEMPTS, TTL_MS, false)
        .await
        .unwrap();
    assert_eq!(
        check(b, &key, "mac-wrong").await,
        OtpOutcome::Wrong { attempts_left: 2 }
    );
    assert_eq!(
        check(b, &key, "mac-a").await,
        OtpOutcome::Valid {
            attempts_left: 2,
            counted: false
        }
    );
    store
        .otp_put(&key, "mac-b", ATTEMPTS, TTL_MS, false)
        .await
        .unwrap();
    store
        .otp_put(&key, "mac-c", ATTEMPTS, TTL_MS, true)
        .await
        .unwrap();
    assert_eq!(
        check(b, &key, "mac-c").await,
        OtpOutcome::Valid {
            attempts_left: 3,
            counted: true
        }
    );
}

/// A counted send's code, stored by `reserve`, over an exempt one is
/// counted: nothing of the exempt code's mark is left.
async fn a_reserved_code_over_an_exempt_one_is_counted(b: &StoreUnderTest) {
    let key = b.keys.otp("phone", "+33612345679");
    let window_key = b.keys.window("phone", "+33612345679", "sms_send");
    let store = b.store();
    store
        .otp_put(&key, "mac-a", ATTEMPTS, TTL_MS, false)
        .await
        .unwrap();
    let windows = [WindowSpec::enforce(5, 60_000)];
    let subjects = [SubjectWindows {
        key: &window_key,
        windows: &windows,
    }];
    let sent = store
        .reserve(ReserveRequest {
            subjects: &subjects,
            conversions: &[],
            member: "send-1",
            gate_open: false,
            force: false,
            code: Some(CodeToStore {
                key: &key,
                mac: "mac-b",
                attempts: ATTEMPTS,
                ttl_ms: TTL_MS,
            }),
        })
        .await
        .expect("reserve");
    assert!(sent.recorded);
    assert_eq!(
        check(b, &key, "mac-b").await,
        OtpOutcome::Valid {
            attempts_left: ATTEMPTS,
            counted: true
        }
    );
}

async fn a_code_is_valid_once_then_a_stand_in_answers(b: &StoreUnderTest) {
    let key = b.keys.otp("phone", "+33612345678");
    let store = b.store();
    store.otp_put(&key, "mac-a", 3, 60_000, true).await.unwrap();
    assert_eq!(
        check(b, &key, "mac-a").await,
        OtpOutcome::Valid {
            attempts_left: 3,
            counted: true
        }
    );
    assert_eq!(
        check(b, &key, "mac-a").await,
        OtpOutcome::Wrong { attempts_left: 2 },
        "a used code is a miss on a stand-in, as a wrong code is"
    );
}

async fn wrong_codes_count_down_then_burn_the_code_until_it_expires(b: &StoreUnderTest) {
    let key = b.keys.otp("phone", "+33612345679");
    let store = b.store();
    store
        .otp_put(&key, "mac-right", 3, 2_000, true)
        .await
        .unwrap();
    for left in [2, 1, 0] {
        assert_eq!(
            check(b, &key, "mac-wrong").await,
            OtpOutcome::Wrong {
                attempts_left: left
            }
        );
    }
    b.advance(500).await;
    for offered in ["mac-right", "mac-wrong", "mac-righ"] {
        let OtpOutcome::Burnt { retry_after_ms } = check(b, &key, offered).await else {
            panic!("a burnt code answers Burnt to {offered}");
        };
        assert_eq!(
            retry_after_ms, TTL_MS,
            "a code's ttl, not this code's expiry: that would tell when it was sent"
        );
    }
    b.advance(1_501).await;
    assert!(!b.exists(&key).await, "the burnt code has expired");
    assert_eq!(
        check(b, &key, "mac-right").await,
        OtpOutcome::Wrong { attempts_left: 2 },
        "an expired code is gone: a stand-in takes the try"
    );
}

async fn without_a_code_a_stand_in_counts_down_and_burns_alike(b: &StoreUnderTest) {
    let key = b.keys.otp("phone", "+33612345684");
    for left in [2, 1, 0] {
        assert_eq!(
            check(b, &key, "mac-any").await,
            OtpOutcome::Wrong {
                attempts_left: left
            }
        );
    }
    for offered in ["mac-any", "", "x"] {
        let OtpOutcome::Burnt { retry_after_ms } = check(b, &key, offered).await else {
            panic!("a burnt stand-in answers Burnt to {offered:?}");
        };
        assert_eq!(retry_after_ms, TTL_MS, "as a burnt code's");
    }
    // A send puts a real code over the burnt stand-in.
    b.store()
        .otp_put(&key, "mac-new", 3, 60_000, true)
        .await
        .unwrap();
    assert_eq!(
        check(b, &key, "mac-new").await,
        OtpOutcome::Valid {
            attempts_left: 3,
            counted: true
        }
    );
    let empty = b.keys.otp("phone", "+33612345685");
    assert_eq!(
        check(b, &empty, "").await,
        OtpOutcome::Wrong { attempts_left: 2 },
        "nothing matches a stand-in, not even an empty MAC"
    );
}

async fn putting_a_code_replaces_the_previous_one(b: &StoreUnderTest) {
    let key = b.keys.otp("phone", "+33612345680");
    let store = b.store();
    store
        .otp_put(&key, "mac-first", 3, 60_000, true)
        .await
        .unwrap();
    assert_eq!(
        check(b, &key, "mac-wrong").await,
        OtpOutcome::Wrong { attempts_left: 2 }
    );
    store
        .otp_put(&key, "mac-second", 3, 60_000, true)
        .await
        .unwrap();
    assert_eq!(
        check(b, &key, "mac-first").await,
        OtpOutcome::Wrong { attempts_left: 2 },
        "the first code is gone and the attempts start again"
    );
    assert_eq!(
        check(b, &key, "mac-second").await,
        OtpOutcome::Valid {
            attempts_left: 2,
            counted: true
        },
        "the right code after one wrong try: two tries were left"
    );
}

async fn a_code_expires_after_its_ttl(b: &StoreUnderTest) {
    let key = b.keys.otp("phone", "+33612345681");
    let store = b.store();
    store.otp_put(&key, "mac-a", 3, 600, true).await.unwrap();
    if b.exact() {
        b.advance(600).await;
        assert!(b.exists(&key).await, "still there at its TTL");
        b.advance(1).await;
    } else {
        b.advance(300).await;
        assert!(b.exists(&key).await, "there before its TTL");
        b.advance(301).await;
    }
    assert!(!b.exists(&key).await);
    assert_eq!(
        check(b, &key, "mac-a").await,
        OtpOutcome::Wrong { attempts_left: 2 }
    );
}

async fn deleted_keys_are_gone(b: &StoreUnderTest) {
    let window = b.keys.window("phone", "+33612345682", "sms_send");
    let otp = b.keys.otp("phone", "+33612345682");
    let windows = [tollgate::store::WindowSpec::enforce(5, 60_000)];
    let store = b.store();
    b.hit(&window, &windows).await;
    store.otp_put(&otp, "mac-a", 3, 60_000, true).await.unwrap();
    let unrelated = b.keys.otp("phone", "+33612345683");
    store
        .otp_put(&unrelated, "mac-b", 3, 60_000, true)
        .await
        .unwrap();

    let never = b.keys.lock("user", "nobody");
    store
        .delete(&[window.clone(), otp.clone(), never])
        .await
        .unwrap();
    store.delete(&[]).await.unwrap();

    assert!(!b.exists(&window).await && !b.exists(&otp).await);
    assert_eq!(store.peek(&window, &windows).await.unwrap().counts, [0]);
    assert_eq!(
        check(b, &otp, "mac-a").await,
        OtpOutcome::Wrong { attempts_left: 2 }
    );
    assert_eq!(
        check(b, &unrelated, "mac-b").await,
        OtpOutcome::Valid {
            attempts_left: 3,
            counted: true
        }
    );
}

async fn get_or_init_keeps_the_first_value(b: &StoreUnderTest) {
    let key = b.keys.secret("otp_hmac_key");
    let store = b.store();
    assert_eq!(store.get_or_init(&key, "first").await.unwrap(), "first");
    assert_eq!(store.get_or_init(&key, "second").await.unwrap(), "first");
    let other = b.keys.secret("other");
    assert_eq!(store.get_or_init(&other, "third").await.unwrap(), "third");
}

async fn ping_answers(b: &StoreUnderTest) {
    b.store().ping().await.unwrap();
}
