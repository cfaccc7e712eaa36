//! Waiting for what a test cannot be told about, with a deadline.

use std::time::Duration;

/// Poll `done` every 100 ms until it holds; fail naming `what` after `timeout`.
pub async fn eventually<F, Fut>(what: &str, timeout: Duration, mut done: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = tokio::time::Instant::now() + timeout;
    while !done().await {
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}
