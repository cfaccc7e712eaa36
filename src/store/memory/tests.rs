use super::*;
use crate::store::{Keys, ManualClock};

#[test]
fn the_shard_is_the_hash_tag_or_the_whole_key() {
    assert_eq!(shard_of("tg:{user:alice}:lock"), "user:alice");
    assert_eq!(shard_of("tg:secret:otp"), "tg:secret:otp");
    assert_eq!(shard_of("tg:{}:x{a}"), "tg:{}:x{a}");
    assert_eq!(shard_of("tg:{open"), "tg:{open");
}

#[tokio::test]
async fn sweep_frees_expired_windows_and_empty_subjects() {
    let clock = ManualClock::new(1_000_000);
    let store = MemoryStore::new(Arc::new(clock.clone()));
    let keys = Keys::new("t");
    let key = keys.window("phone", "1", "sms_send");
    let windows = [WindowSpec::enforce(5, 1_000), WindowSpec::enforce(9, 3_000)];
    let req = HitRequest {
        key: &key,
        windows: &windows,
        member: "m1",
        gate_open: false,
        force: false,
    };
    store.hit(req).await.unwrap();

    clock.advance_ms(3_000);
    store.sweep();
    assert!(store.contains_key(&key), "still held at the window's end");
    assert_eq!(store.subjects.len(), 1);

    clock.advance_ms(1);
    store.sweep();
    assert!(!store.contains_key(&key));
    assert_eq!(store.subjects.len(), 0, "the empty subject is freed");
}
