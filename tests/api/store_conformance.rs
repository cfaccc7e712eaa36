//! One set of cases, run against both `WindowStore` backends so their semantics
//! cannot drift: `<case>::on_memory` uses a manual clock and asserts exact
//! times; `<case>::on_redis` uses real sleeps against `TOLLGATE_TEST_REDIS_URL`
//! (default `redis://127.0.0.1:6379`) under a throw-away key prefix that is
//! deleted afterwards, and asserts waits within the time that really passed.

mod backend;
mod codes;
mod conversions;
mod login;
mod redis_only;
mod windows;

pub use backend::StoreUnderTest;

/// For each case `name`, a module `name` with the tests `on_memory` and
/// `on_redis`. A Redis test deletes its keys even when the case panics.
macro_rules! on_both_backends {
    ($($name:ident),* $(,)?) => {$(
        mod $name {
            use futures::FutureExt;

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn on_memory() {
                let backend = $crate::store_conformance::StoreUnderTest::memory();
                super::$name(&backend).await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn on_redis() {
                let backend = $crate::store_conformance::StoreUnderTest::redis().await;
                let outcome = std::panic::AssertUnwindSafe(super::$name(&backend))
                    .catch_unwind()
                    .await;
                backend.cleanup().await;
                if let Err(panic) = outcome {
                    std::panic::resume_unwind(panic);
                }
            }
        }
    )*};
}

pub(crate) use on_both_backends;
