//! One-time codes, deletes, shared secrets and reachability.

use tollgate::store::OtpOutcome;

use super::backend::Backend;
use super::on_both_backends;

on_both_backends!(
    a_code_is_valid_once_then_missing,
    wrong_codes_count_down_then_burn_the_code_until_it_expires,
    putting_a_code_replaces_the_previous_one,
    a_code_expires_after_its_ttl,
    deleted_keys_are_gone,
    get_or_init_keeps_the_first_value,
    ping_answers,
);

async fn a_code_is_valid_once_then_missing(b: &Backend) {
    let key = b.keys.otp("phone", "+33612345678");
    let store = b.store();
    assert_eq!(
        store.otp_check(&key, "mac-a").await.unwrap(),
        OtpOutcome::Missing
    );
    store.otp_put(&key, "mac-a", 3, 60_000).await.unwrap();
    assert_eq!(
        store.otp_check(&key, "mac-a").await.unwrap(),
        OtpOutcome::Valid { attempts_left: 3 }
    );
    assert_eq!(
        store.otp_check(&key, "mac-a").await.unwrap(),
        OtpOutcome::Missing
    );
}

async fn wrong_codes_count_down_then_burn_the_code_until_it_expires(b: &Backend) {
    let key = b.keys.otp("phone", "+33612345679");
    let store = b.store();
    let start = b.mark();
    store.otp_put(&key, "mac-right", 3, 2_000).await.unwrap();
    for left in [2, 1, 0] {
        assert_eq!(
            store.otp_check(&key, "mac-wrong").await.unwrap(),
            OtpOutcome::Wrong {
                attempts_left: left
            }
        );
    }
    b.advance(500).await;
    for offered in ["mac-right", "mac-wrong", "mac-righ"] {
        let OtpOutcome::Burnt { retry_after_ms } = store.otp_check(&key, offered).await.unwrap()
        else {
            panic!("a burnt code answers Burnt to {offered}");
        };
        b.assert_wait(retry_after_ms, 2_000, &start, "until the code expires");
    }
    b.advance(1_501).await;
    assert_eq!(
        store.otp_check(&key, "mac-right").await.unwrap(),
        OtpOutcome::Missing
    );
}

async fn putting_a_code_replaces_the_previous_one(b: &Backend) {
    let key = b.keys.otp("phone", "+33612345680");
    let store = b.store();
    store.otp_put(&key, "mac-first", 3, 60_000).await.unwrap();
    assert_eq!(
        store.otp_check(&key, "mac-wrong").await.unwrap(),
        OtpOutcome::Wrong { attempts_left: 2 }
    );
    store.otp_put(&key, "mac-second", 3, 60_000).await.unwrap();
    assert_eq!(
        store.otp_check(&key, "mac-first").await.unwrap(),
        OtpOutcome::Wrong { attempts_left: 2 },
        "the first code is gone and the attempts start again"
    );
    assert_eq!(
        store.otp_check(&key, "mac-second").await.unwrap(),
        OtpOutcome::Valid { attempts_left: 2 },
        "the right code after one wrong try: two tries were left"
    );
}

async fn a_code_expires_after_its_ttl(b: &Backend) {
    let key = b.keys.otp("phone", "+33612345681");
    let store = b.store();
    store.otp_put(&key, "mac-a", 3, 600).await.unwrap();
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
        store.otp_check(&key, "mac-a").await.unwrap(),
        OtpOutcome::Missing
    );
}

async fn deleted_keys_are_gone(b: &Backend) {
    let window = b.keys.window("phone", "+33612345682", "sms_send");
    let otp = b.keys.otp("phone", "+33612345682");
    let windows = [tollgate::store::WindowSpec::enforce(5, 60_000)];
    let store = b.store();
    b.hit(&window, &windows).await;
    store.otp_put(&otp, "mac-a", 3, 60_000).await.unwrap();
    let unrelated = b.keys.otp("phone", "+33612345683");
    store.otp_put(&unrelated, "mac-b", 3, 60_000).await.unwrap();

    let never = b.keys.lock("user", "nobody");
    store
        .delete(&[window.clone(), otp.clone(), never])
        .await
        .unwrap();
    store.delete(&[]).await.unwrap();

    assert!(!b.exists(&window).await && !b.exists(&otp).await);
    assert_eq!(store.peek(&window, &windows).await.unwrap().counts, [0]);
    assert_eq!(
        store.otp_check(&otp, "mac-a").await.unwrap(),
        OtpOutcome::Missing
    );
    assert_eq!(
        store.otp_check(&unrelated, "mac-b").await.unwrap(),
        OtpOutcome::Valid { attempts_left: 3 }
    );
}

async fn get_or_init_keeps_the_first_value(b: &Backend) {
    let key = b.keys.secret("otp_hmac_key");
    let store = b.store();
    assert_eq!(store.get_or_init(&key, "first").await.unwrap(), "first");
    assert_eq!(store.get_or_init(&key, "second").await.unwrap(), "first");
    let other = b.keys.secret("other");
    assert_eq!(store.get_or_init(&other, "third").await.unwrap(), "third");
}

async fn ping_answers(b: &Backend) {
    b.store().ping().await.unwrap();
}
