//! One-time codes, deletes, shared secrets and reachability.

use tollgate::store::{
    CodeToStore, CodeTry, DroppedCode, OtpOutcome, ReserveRequest, SubjectWindows, WindowSpec,
};

use super::backend::StoreUnderTest;
use super::on_both_backends;

on_both_backends!(
    a_code_is_valid_once_then_a_stand_in_answers,
    wrong_codes_count_down_then_burn_the_code_until_it_expires,
    without_a_code_a_stand_in_counts_down_and_burns_alike,
    putting_a_code_replaces_the_previous_one,
    dropping_a_code_deletes_it_only_while_it_is_the_one_sealed_so,
    dropping_a_code_tells_whether_it_was_tried,
    a_failed_resend_puts_the_earlier_code_back_with_the_tries_it_had,
    a_failed_send_brings_back_no_used_expired_or_stand_in_code,
    a_burnt_code_comes_back_burnt,
    a_code_no_sms_carried_never_comes_back,
    a_code_keeps_at_most_eight_it_replaced,
    only_the_code_a_failed_send_replaced_comes_back,
    a_code_says_whether_its_send_was_counted,
    a_reserved_code_over_an_exempt_one_is_counted,
    strangers_use_up_their_own_tries_and_cannot_burn_the_askers_code,
    the_askers_last_wrong_try_burns_the_code_for_everyone,
    a_code_asked_for_without_an_address_counts_every_try_in_one_share,
    a_send_over_a_used_up_stand_in_gives_both_shares_afresh,
    a_send_from_another_address_makes_that_address_the_asker,
    a_code_expires_after_its_ttl,
    deleted_keys_are_gone,
    get_or_init_keeps_the_first_value,
    ping_answers,
);

/// Tries per code, and a code's life.
const ATTEMPTS: u32 = 3;
const TTL_MS: u64 = 60_000;
/// The address that asks for the codes, and others.
const ASKER: &str = "203.0.113.7";
const STRANGER: &str = "198.51.100.9";
const OTHER_STRANGER: &str = "2001:db8:1:2::/64";

/// A failed send's roll-back of the code sealed as `mac` at `key`
/// (`ATTEMPTS` tries): what it found.
async fn drop_code(b: &StoreUnderTest, key: &str, mac: &str) -> DroppedCode {
    b.store()
        .otp_drop(key, mac, ATTEMPTS)
        .await
        .expect("otp_drop")
}

/// A code asked for by `ASKER`.
async fn put(b: &StoreUnderTest, key: &str, mac: &str, attempts: u32, ttl_ms: u64, counted: bool) {
    put_by(b, key, mac, (attempts, ttl_ms), counted, ASKER).await;
}

async fn put_by(
    b: &StoreUnderTest,
    key: &str,
    mac: &str,
    (attempts, ttl_ms): (u32, u64),
    counted: bool,
    asker: &str,
) {
    let code = CodeToStore {
        key,
        mac,
        attempts,
        ttl_ms,
        asker,
    };
    b.store().otp_put(code, counted).await.expect("otp_put");
}

/// A try by `ASKER`.
async fn check(b: &StoreUnderTest, key: &str, mac: &str) -> OtpOutcome {
    check_from(b, key, mac, ASKER).await
}

async fn check_from(b: &StoreUnderTest, key: &str, mac: &str, client: &str) -> OtpOutcome {
    b.store()
        .otp_check(CodeTry {
            key,
            mac,
            client,
            attempts: ATTEMPTS,
            ttl_ms: TTL_MS,
        })
        .await
        .expect("otp_check")
}

/// Wrong tries, each from its client, answer the tries left given.
async fn count_down(b: &StoreUnderTest, key: &str, tries: &[(&str, u32)]) {
    for &(client, left) in tries {
        assert_eq!(
            check_from(b, key, "mac-wrong", client).await,
            OtpOutcome::Wrong {
                attempts_left: left
            },
            "a wrong try from {client:?}"
        );
    }
}

/// Even the right code is refused as burnt to each of `clients`.
async fn burnt_for(b: &StoreUnderTest, key: &str, mac: &str, clients: &[&str]) {
    for &client in clients {
        assert!(
            matches!(
                check_from(b, key, mac, client).await,
                OtpOutcome::Burnt { .. }
            ),
            "burnt for {client:?}"
        );
    }
}

/// Strangers share tries of their own: using them up refuses every
/// stranger, and the asker's code stays good for its own tries.
async fn strangers_use_up_their_own_tries_and_cannot_burn_the_askers_code(b: &StoreUnderTest) {
    let key = b.keys.otp("phone", "+33612345686");
    put(b, &key, "mac-right", ATTEMPTS, TTL_MS, true).await;
    // Every other address counts in one share.
    count_down(
        b,
        &key,
        &[(STRANGER, 2), (OTHER_STRANGER, 1), (STRANGER, 0)],
    )
    .await;
    burnt_for(b, &key, "mac-right", &[STRANGER, OTHER_STRANGER, ""]).await;
    assert_eq!(
        check(b, &key, "mac-wrong").await,
        OtpOutcome::Wrong { attempts_left: 2 },
        "the asker's tries are its own"
    );
    assert_eq!(
        check(b, &key, "mac-right").await,
        OtpOutcome::Valid {
            attempts_left: 2,
            counted: true
        }
    );
}

/// The asker's last wrong try burns the code for everyone; a stranger's
/// right code before that is good, and used once.
async fn the_askers_last_wrong_try_burns_the_code_for_everyone(b: &StoreUnderTest) {
    let key = b.keys.otp("phone", "+33612345687");
    put(b, &key, "mac-right", ATTEMPTS, TTL_MS, true).await;
    count_down(b, &key, &[(ASKER, 2), (ASKER, 1), (ASKER, 0)]).await;
    burnt_for(b, &key, "mac-right", &[ASKER, STRANGER, ""]).await;
    let other = b.keys.otp("phone", "+33612345688");
    put(b, &other, "mac-right", ATTEMPTS, TTL_MS, true).await;
    assert_eq!(
        check_from(b, &other, "mac-right", STRANGER).await,
        OtpOutcome::Valid {
            attempts_left: ATTEMPTS,
            counted: true
        },
        "a right code from another address (the user's phone on its own network) is good"
    );
    assert_eq!(
        check(b, &other, "mac-right").await,
        OtpOutcome::Wrong { attempts_left: 2 },
        "and used: a stand-in takes the asker's next try"
    );
}

/// A send offered through `reserve` (as `/sms/send` does) by `asker`.
async fn send(b: &StoreUnderTest, phone: &str, mac: &str, asker: &str) {
    let key = b.keys.otp("phone", phone);
    let window_key = b.keys.window("phone", phone, "sms_send");
    let windows = [WindowSpec::enforce(50, 60_000)];
    let subjects = [SubjectWindows {
        key: &window_key,
        windows: &windows,
        callers_own: false,
    }];
    let sent = b
        .store()
        .reserve(ReserveRequest {
            subjects: &subjects,
            conversions: &[],
            member: &uuid::Uuid::new_v4().to_string(),
            gate_open: false,
            force: false,
            code: Some(CodeToStore {
                key: &key,
                mac,
                attempts: ATTEMPTS,
                ttl_ms: TTL_MS,
                asker,
            }),
        })
        .await
        .expect("reserve");
    assert!(sent.recorded);
}

/// Strangers who used up a stand-in's tries (it has no asker) leave nothing
/// on the code a send puts over it.
async fn a_send_over_a_used_up_stand_in_gives_both_shares_afresh(b: &StoreUnderTest) {
    let phone = "+33612345690";
    let key = b.keys.otp("phone", phone);
    count_down(b, &key, &[(STRANGER, 2), (STRANGER, 1), (STRANGER, 0)]).await;
    burnt_for(b, &key, "mac-any", &[STRANGER]).await;
    send(b, phone, "mac-right", ASKER).await;
    assert_eq!(
        check_from(b, &key, "mac-wrong", STRANGER).await,
        OtpOutcome::Wrong { attempts_left: 2 }
    );
    assert_eq!(
        check(b, &key, "mac-right").await,
        OtpOutcome::Valid {
            attempts_left: ATTEMPTS,
            counted: true
        }
    );
}

/// A send replaces the code, and its address becomes the asker: the
/// earlier asker is a stranger to the new code.
async fn a_send_from_another_address_makes_that_address_the_asker(b: &StoreUnderTest) {
    let phone = "+33612345691";
    let key = b.keys.otp("phone", phone);
    send(b, phone, "mac-first", ASKER).await;
    send(b, phone, "mac-second", STRANGER).await;
    // The first asker counts with everyone else now.
    count_down(b, &key, &[(ASKER, 2), (ASKER, 1), (ASKER, 0)]).await;
    burnt_for(b, &key, "mac-second", &[ASKER]).await;
    assert_eq!(
        check_from(b, &key, "mac-second", STRANGER).await,
        OtpOutcome::Valid {
            attempts_left: ATTEMPTS,
            counted: true
        }
    );
}

/// A code asked for without an address has no asker: every try, with an
/// address or without, counts in one share, as before tries were split.
async fn a_code_asked_for_without_an_address_counts_every_try_in_one_share(b: &StoreUnderTest) {
    let key = b.keys.otp("phone", "+33612345689");
    put_by(b, &key, "mac-right", (ATTEMPTS, TTL_MS), true, "").await;
    count_down(b, &key, &[("", 2), (STRANGER, 1), ("", 0)]).await;
    burnt_for(b, &key, "mac-right", &[""]).await;
}

/// A code put as not counted (an allow-listed send) says so when it is
/// right, through wrong tries; a code put over it as counted says that.
async fn a_code_says_whether_its_send_was_counted(b: &StoreUnderTest) {
    let key = b.keys.otp("phone", "+33612345678");
    put(b, &key, "mac-a", ATTEMPTS, TTL_MS, false).await;
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
    put(b, &key, "mac-b", ATTEMPTS, TTL_MS, false).await;
    put(b, &key, "mac-c", ATTEMPTS, TTL_MS, true).await;
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
    let phone = "+33612345679";
    let key = b.keys.otp("phone", phone);
    put(b, &key, "mac-a", ATTEMPTS, TTL_MS, false).await;
    send(b, phone, "mac-b", ASKER).await;
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
    put(b, &key, "mac-a", 3, 60_000, true).await;
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
    put(b, &key, "mac-right", 3, 2_000, true).await;
    count_down(b, &key, &[(ASKER, 2), (ASKER, 1), (ASKER, 0)]).await;
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
    count_down(b, &key, &[(ASKER, 2), (ASKER, 1), (ASKER, 0)]).await;
    for offered in ["mac-any", "", "x"] {
        let OtpOutcome::Burnt { retry_after_ms } = check(b, &key, offered).await else {
            panic!("a burnt stand-in answers Burnt to {offered:?}");
        };
        assert_eq!(retry_after_ms, TTL_MS, "as a burnt code's");
    }
    // A send puts a real code over the burnt stand-in.
    put(b, &key, "mac-new", 3, 60_000, true).await;
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
    put(b, &key, "mac-first", 3, 60_000, true).await;
    assert_eq!(
        check(b, &key, "mac-wrong").await,
        OtpOutcome::Wrong { attempts_left: 2 }
    );
    put(b, &key, "mac-second", 3, 60_000, true).await;
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

/// A failed delivery's roll-back: a racing send's code stays.
async fn dropping_a_code_deletes_it_only_while_it_is_the_one_sealed_so(b: &StoreUnderTest) {
    let key = b.keys.otp("phone", "+33612345690");
    let drop = |mac: &'static str| drop_code(b, &key, mac);
    drop("mac-none").await;
    assert!(!b.exists(&key).await, "dropping nothing puts nothing");

    put(b, &key, "mac-failed", 3, 60_000, true).await;
    put(b, &key, "mac-raced", 3, 60_000, true).await;
    drop("mac-failed").await;
    assert_eq!(
        check(b, &key, "mac-raced").await,
        OtpOutcome::Valid {
            attempts_left: 3,
            counted: true
        },
        "the code put since the failed one stays"
    );

    put(b, &key, "mac-failed", 3, 60_000, true).await;
    drop("mac-failed").await;
    assert!(!b.exists(&key).await, "its own code is deleted");
}

/// A failed delivery's roll-back tells what its code came to while the
/// provider had it: untried, tried (a wrong try of the asker's or a
/// stranger's, here or where a racing send kept it), or absent (a right
/// try used it); whether reserved or put.
async fn dropping_a_code_tells_whether_it_was_tried(b: &StoreUnderTest) {
    let phone = "+33612345697";
    let key = b.keys.otp("phone", phone);
    let drop = |mac: &'static str| drop_code(b, &key, mac);

    send(b, phone, "mac-f", ASKER).await;
    assert_eq!(drop("mac-f").await, DroppedCode::Untried, "reserved");
    put(b, &key, "mac-f", ATTEMPTS, TTL_MS, true).await;
    assert_eq!(drop("mac-f").await, DroppedCode::Untried, "put");

    for trier in [ASKER, STRANGER] {
        send(b, phone, "mac-f", ASKER).await;
        check_from(b, &key, "mac-x", trier).await;
        assert_eq!(drop("mac-f").await, DroppedCode::Tried, "{trier}");
    }

    send(b, phone, "mac-f", ASKER).await;
    check(b, &key, "mac-f").await;
    assert_eq!(drop("mac-f").await, DroppedCode::Absent, "used");
    assert_eq!(drop("mac-none").await, DroppedCode::Absent, "never put");

    send(b, phone, "mac-f", ASKER).await;
    send(b, phone, "mac-r", ASKER).await;
    assert_eq!(drop("mac-f").await, DroppedCode::Untried, "kept, untried");
    assert_eq!(drop("mac-r").await, DroppedCode::Untried, "the racer's");

    send(b, phone, "mac-f", ASKER).await;
    check_from(b, &key, "mac-x", STRANGER).await;
    send(b, phone, "mac-r", ASKER).await;
    assert_eq!(
        drop("mac-f").await,
        DroppedCode::Tried,
        "kept, tried before"
    );
}

/// A resend whose delivery fails leaves the phone's earlier code as it
/// was: it verifies, with the tries each share had left, whether the
/// failed send was reserved (`reserve`) or put (`otp_put`, an exempt send).
async fn a_failed_resend_puts_the_earlier_code_back_with_the_tries_it_had(b: &StoreUnderTest) {
    for (phone, reserved) in [("+33612345694", true), ("+33612345695", false)] {
        let key = b.keys.otp("phone", phone);
        put(b, &key, "mac-a", ATTEMPTS, TTL_MS, false).await;
        count_down(b, &key, &[(ASKER, 2), (STRANGER, 2)]).await;
        if reserved {
            send(b, phone, "mac-b", ASKER).await;
        } else {
            put(b, &key, "mac-b", ATTEMPTS, TTL_MS, true).await;
        }
        drop_code(b, &key, "mac-b").await;
        assert_eq!(
            check_from(b, &key, "mac-b", OTHER_STRANGER).await,
            OtpOutcome::Wrong { attempts_left: 1 },
            "the failed code is gone, and the strangers' share goes on (reserved: {reserved})"
        );
        assert_eq!(
            check(b, &key, "mac-a").await,
            OtpOutcome::Valid {
                attempts_left: 2,
                counted: false
            },
            "the earlier code verifies, its asker's share as it was (reserved: {reserved})"
        );
        assert!(
            !b.exists(&key).await,
            "and is used up (reserved: {reserved})"
        );
    }
}

/// Only a live code that was sent comes back: not one used, not one that
/// has expired, not the stand-in a try without a code left.
async fn a_failed_send_brings_back_no_used_expired_or_stand_in_code(b: &StoreUnderTest) {
    let phone = "+33612345696";
    let key = b.keys.otp("phone", phone);
    let fail = |mac: &'static str| {
        let key = key.clone();
        async move {
            send(b, phone, mac, ASKER).await;
            drop_code(b, &key, mac).await;
        }
    };
    put(b, &key, "mac-used", ATTEMPTS, TTL_MS, true).await;
    assert!(matches!(
        check(b, &key, "mac-used").await,
        OtpOutcome::Valid { .. }
    ));
    fail("mac-b").await;
    assert!(!b.exists(&key).await, "a used code stays used");

    put(b, &key, "mac-short", ATTEMPTS, 300, true).await;
    send(b, phone, "mac-c", ASKER).await;
    b.advance(400).await;
    drop_code(b, &key, "mac-c").await;
    assert!(
        !b.exists(&key).await,
        "a code that expired while the send was in flight stays expired"
    );

    count_down(b, &key, &[(STRANGER, 2)]).await;
    fail("mac-d").await;
    assert!(!b.exists(&key).await, "a stand-in is no code to bring back");
}

/// A code its asker burnt comes back burnt: a failed send is not the new
/// send a burnt code waits for.
async fn a_burnt_code_comes_back_burnt(b: &StoreUnderTest) {
    let phone = "+33612345697";
    let key = b.keys.otp("phone", phone);
    put(b, &key, "mac-a", 1, TTL_MS, true).await;
    count_down(b, &key, &[(ASKER, 0)]).await;
    send(b, phone, "mac-b", ASKER).await;
    drop_code(b, &key, "mac-b").await;
    burnt_for(b, &key, "mac-a", &[ASKER, STRANGER]).await;
}

/// Sends that overlap, each failing while another is in flight, in either
/// order: the code the phone's last delivered SMS carries comes back, and
/// never a code no SMS carried.
async fn a_code_no_sms_carried_never_comes_back(b: &StoreUnderTest) {
    let phone = "+33612345698";
    let key = b.keys.otp("phone", phone);
    let drop = |mac: &'static str| drop_code(b, &key, mac);
    for (first, second) in [("mac-b", "mac-c"), ("mac-c", "mac-b")] {
        put(b, &key, "mac-a", ATTEMPTS, TTL_MS, true).await;
        send(b, phone, "mac-b", ASKER).await;
        send(b, phone, "mac-c", ASKER).await;
        drop(first).await;
        drop(second).await;
        for failed in ["mac-b", "mac-c"] {
            assert!(
                matches!(
                    check_from(b, &key, failed, STRANGER).await,
                    OtpOutcome::Wrong { .. }
                ),
                "{failed} failed ({first} first): it does not verify"
            );
        }
        assert!(
            matches!(check(b, &key, "mac-a").await, OtpOutcome::Valid { .. }),
            "the delivered code comes back ({first} failed first)"
        );
    }

    put(b, &key, "mac-a", ATTEMPTS, TTL_MS, true).await;
    send(b, phone, "mac-b", ASKER).await;
    send(b, phone, "mac-c", ASKER).await;
    drop("mac-c").await;
    assert_eq!(
        check(b, &key, "mac-b").await,
        OtpOutcome::Valid {
            attempts_left: ATTEMPTS,
            counted: true
        },
        "the send still in flight has its code back"
    );
}

/// A code keeps at most eight of those it replaced: eight sends in flight
/// over a code, all failing, leave it; a ninth does not.
async fn a_code_keeps_at_most_eight_it_replaced(b: &StoreUnderTest) {
    for (phone, sends, kept) in [("+33612345691", 8, true), ("+33612345690", 9, false)] {
        let key = b.keys.otp("phone", phone);
        let macs: Vec<String> = (1..=sends).map(|i| format!("mac-{i}")).collect();
        put(b, &key, "mac-0", ATTEMPTS, TTL_MS, true).await;
        for mac in &macs {
            send(b, phone, mac, ASKER).await;
        }
        for mac in macs.iter().rev() {
            drop_code(b, &key, mac).await;
        }
        let outcome = check(b, &key, "mac-0").await;
        assert_eq!(
            matches!(outcome, OtpOutcome::Valid { .. }),
            kept,
            "{sends} sends over mac-0: {outcome:?}"
        );
    }
}

/// Only the code a failed send replaced comes back, never one further
/// back: a code sent with a longer TTL (before a reload shortened it) is
/// not brought back once the one that replaced it has expired.
async fn only_the_code_a_failed_send_replaced_comes_back(b: &StoreUnderTest) {
    let phone = "+33612345689";
    let key = b.keys.otp("phone", phone);
    put(b, &key, "mac-long", ATTEMPTS, TTL_MS, true).await;
    put(b, &key, "mac-short", ATTEMPTS, 300, true).await;
    send(b, phone, "mac-failed", ASKER).await;
    b.advance(400).await;
    drop_code(b, &key, "mac-failed").await;
    assert!(
        !b.exists(&key).await,
        "mac-long, which a delivered code replaced, stays replaced"
    );
}

async fn a_code_expires_after_its_ttl(b: &StoreUnderTest) {
    let key = b.keys.otp("phone", "+33612345681");
    put(b, &key, "mac-a", 3, 600, true).await;
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
    put(b, &otp, "mac-a", 3, 60_000, true).await;
    let unrelated = b.keys.otp("phone", "+33612345683");
    put(b, &unrelated, "mac-b", 3, 60_000, true).await;

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

/// What a build before the two shares wrote: a code of `mac, left, exp, u`
/// counts every try in one share, from the tries it has left; and its send
/// over a stand-in strangers used up (which leaves the stand-in's `n` and
/// `lo` behind, during a rolling upgrade) gives a code that is not burnt.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn codes_an_earlier_build_wrote_count_every_try_in_one_share() {
    use futures::FutureExt;
    let b = StoreUnderTest::redis().await;
    let outcome = std::panic::AssertUnwindSafe(earlier_build_codes(&b))
        .catch_unwind()
        .await;
    b.cleanup().await;
    if let Err(panic) = outcome {
        std::panic::resume_unwind(panic);
    }
}

async fn earlier_build_codes(b: &StoreUnderTest) {
    let now_ms = || {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .expect("after 1970")
            .as_millis() as u64
    };
    let earlier_send = |left: u32| {
        vec![
            ("mac", "mac-right".to_owned()),
            ("left", left.to_string()),
            ("exp", (now_ms() + TTL_MS).to_string()),
            ("u", "0".to_owned()),
        ]
    };
    let key = b.keys.otp("phone", "+33612345692");
    b.redis_hset(&key, earlier_send(2)).await;
    assert_eq!(
        check(b, &key, "mac-wrong").await,
        OtpOutcome::Wrong { attempts_left: 1 }
    );
    assert_eq!(
        check_from(b, &key, "mac-wrong", STRANGER).await,
        OtpOutcome::Wrong { attempts_left: 0 },
        "one share, the asker's field unknown"
    );
    assert!(matches!(
        check(b, &key, "mac-right").await,
        OtpOutcome::Burnt { .. }
    ));

    let stand_in = b.keys.otp("phone", "+33612345693");
    for _ in 0..ATTEMPTS {
        check_from(b, &stand_in, "mac-any", STRANGER).await;
    }
    b.advance(2).await;
    b.redis_hset(&stand_in, earlier_send(ATTEMPTS)).await;
    assert_eq!(
        check_from(b, &stand_in, "mac-right", STRANGER).await,
        OtpOutcome::Valid {
            attempts_left: ATTEMPTS,
            counted: true
        },
        "the stand-in's used-up share is not the new code's"
    );

    // A failed resend over such a code puts it back as it was: one share.
    let phone = "+33612345699";
    let earlier = b.keys.otp("phone", phone);
    b.redis_hset(&earlier, earlier_send(2)).await;
    send(b, phone, "mac-new", ASKER).await;
    drop_code(b, &earlier, "mac-new").await;
    assert_eq!(
        check_from(b, &earlier, "mac-wrong", STRANGER).await,
        OtpOutcome::Wrong { attempts_left: 1 },
        "back in one share, from the tries it had"
    );
    assert_eq!(
        check(b, &earlier, "mac-right").await,
        OtpOutcome::Valid {
            attempts_left: 1,
            counted: true
        }
    );
}
