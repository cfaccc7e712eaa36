//! Version 7 UUIDs (time-ordered) for request ids and audit rows, each
//! thread with a context of its own. `Uuid::now_v7` keeps one context for
//! the whole process behind a `Mutex`, so every request of every worker
//! took the same lock and moved its cache line between cores. With a
//! context per thread (uuid's `ThreadLocalContext`), ids stay ordered within
//! a thread and unique across threads: each context reseeds its 42-bit
//! counter at random every millisecond, and the 32 bits after it are random,
//! as they are between processes.

use uuid::timestamp::context::{ContextV7, ThreadLocalContext};
use uuid::{Timestamp, Uuid};

thread_local! {
    static CONTEXT: ContextV7 = const { ContextV7::new() };
}

/// A new version 7 UUID: the current time, then this thread's counter.
pub fn now() -> Uuid {
    Uuid::new_v7(Timestamp::now(ThreadLocalContext::new(&CONTEXT)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_are_version_7_and_ordered_within_a_thread() {
        let ids: Vec<Uuid> = (0..10_000).map(|_| now()).collect();
        assert!(ids.iter().all(|id| id.get_version_num() == 7));
        assert!(ids.windows(2).all(|pair| pair[0] < pair[1]));
    }

    #[test]
    fn threads_make_distinct_ids() {
        let threads: Vec<_> = (0..4)
            .map(|_| std::thread::spawn(|| (0..10_000).map(|_| now()).collect::<Vec<_>>()))
            .collect();
        let mut all: Vec<Uuid> = threads
            .into_iter()
            .flat_map(|t| t.join().expect("a generating thread"))
            .collect();
        let made = all.len();
        all.sort();
        all.dedup();
        assert_eq!(all.len(), made);
    }
}
