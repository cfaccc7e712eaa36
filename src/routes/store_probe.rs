//! `/readyz`'s write to the store, shared by every probe.
//!
//! The public `/readyz` needs no key, so each probe that wrote to Redis let
//! anyone on the internet make Redis take writes at the rate they could
//! send requests. One write a second at most serves every load balancer:
//! a probe reuses an answer younger than [`FRESH`], and probes that come
//! while a write is on its way wait for that write's answer instead of
//! sending their own.

use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::store::WindowStore;

/// How long one write's answer stands for every probe. Load balancers probe
/// every few seconds and act after several answers: a second of staleness
/// changes none of their decisions.
pub const FRESH: Duration = Duration::from_secs(1);

/// The store's writability as `/readyz` reports it, for every probe of
/// this process.
pub struct StoreProbe {
    store: Arc<dyn WindowStore>,
    key: Arc<str>,
    /// The last write's answer and when it came; the lock is held across
    /// the write, so that concurrent probes share it.
    last: Arc<tokio::sync::Mutex<Option<(Instant, bool)>>>,
}

impl StoreProbe {
    /// `store` as configured, without the `on_error` fallback; `key` is
    /// `Keys::readiness`.
    pub fn new(store: Arc<dyn WindowStore>, key: String) -> Self {
        Self {
            store,
            key: key.into(),
            last: Arc::default(),
        }
    }

    /// Whether the store takes a write and runs a script
    /// (`WindowStore::writable`): a Redis over `maxmemory` under
    /// `noeviction` answers `PING` but refuses every write a request makes.
    /// Bounded by twice `store.timeout` (two calls), plus the wait for a
    /// write already on its way.
    pub async fn writable(&self) -> bool {
        let mut last = Arc::clone(&self.last).lock_owned().await;
        if let Some(ok) = fresh(*last, Instant::now()) {
            return ok;
        }
        let (store, key) = (Arc::clone(&self.store), Arc::clone(&self.key));
        // A task of its own, holding the lock: a probe whose client resets
        // its connection mid-write is dropped, and had the write been its
        // own, the next probe in line would write again (a stalled Redis
        // then took one write per reset connection).
        let write = tokio::spawn(async move {
            let ok = store.writable(&key).await.is_ok();
            *last = Some((Instant::now(), ok));
            ok
        });
        write.await.unwrap_or(false)
    }
}

/// The last answer, while it stands.
fn fresh(last: Option<(Instant, bool)>, now: Instant) -> Option<bool> {
    let (at, ok) = last?;
    (now.saturating_duration_since(at) < FRESH).then_some(ok)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_answer_stands_for_a_second_either_way() {
        let at = Instant::now();
        assert_eq!(fresh(None, at), None);
        for ok in [true, false] {
            assert_eq!(fresh(Some((at, ok)), at), Some(ok));
            let almost = at + FRESH - Duration::from_millis(1);
            assert_eq!(fresh(Some((at, ok)), almost), Some(ok));
            assert_eq!(fresh(Some((at, ok)), at + FRESH), None);
        }
    }
}
