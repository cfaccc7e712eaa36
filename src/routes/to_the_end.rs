//! Decisions that run to their end when the client goes away.

use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use tracing::Instrument;

use crate::telemetry;

/// `decision`, polled in its request's task; should the request be dropped
/// before it ends (actix drops a handler when its client resets the
/// connection), the rest of it runs on a task of its own, with the
/// request's id and span, counted by `detached` until it ends. A decision
/// dropped after the store counted it (a lock Redis set, a code's try
/// taken, an SMS at the provider) would lose its audit row, its lock
/// notice or its windows' settling. Polled in place, not spawned: a
/// spawn cost every request a task and a scheduler round.
pub fn to_the_end<F>(detached: Detached, decision: F) -> ToTheEnd<F>
where
    F: Future + 'static,
    F::Output: 'static,
{
    ToTheEnd {
        decision: Some(Box::pin(decision)),
        detached,
    }
}

/// See [`to_the_end`].
pub struct ToTheEnd<F: Future + 'static>
where
    F::Output: 'static,
{
    /// `None` once it ended.
    decision: Option<Pin<Box<F>>>,
    detached: Detached,
}

impl<F: Future + 'static> Future for ToTheEnd<F>
where
    F::Output: 'static,
{
    type Output = F::Output;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<F::Output> {
        let Some(decision) = self.decision.as_mut() else {
            // Polled after its end: no executor does.
            return Poll::Pending;
        };
        let ended = std::task::ready!(decision.as_mut().poll(cx));
        self.decision = None;
        Poll::Ready(ended)
    }
}

impl<F: Future + 'static> Drop for ToTheEnd<F>
where
    F::Output: 'static,
{
    fn drop(&mut self) {
        let Some(rest) = self.decision.take() else {
            return;
        };
        if std::thread::panicking() {
            // The request's own panic: a spawn that panicked too would abort.
            return;
        }
        let running = self.detached.start();
        // Dropped inside the request's scope and span (tokio's task-local
        // future and tracing's `Instrumented` drop what they wrap in them).
        let id = telemetry::current_request_id();
        let rest = async move {
            rest.await;
            running.ended();
        }
        .instrument(tracing::Span::current());
        let spawned = std::panic::catch_unwind(AssertUnwindSafe(move || match id {
            Some(id) => drop(actix_web::rt::spawn(telemetry::scope_request_id(id, rest))),
            None => drop(actix_web::rt::spawn(rest)),
        }));
        if spawned.is_err() {
            tracing::warn!(
                "a decision dropped with its request could not be finished: no worker runtime"
            );
        }
    }
}

/// The decisions detached from their requests and still running: a stop
/// waits for them ([`Detached::settled`]) before the workers, whose
/// runtimes hold them, stop.
#[derive(Clone, Default)]
pub struct Detached(Arc<Count>);

#[derive(Default)]
struct Count {
    running: AtomicUsize,
    ended: tokio::sync::Notify,
}

impl Detached {
    /// One more running until the guard is dropped (its task ended, or was
    /// dropped with its runtime).
    fn start(&self) -> Running {
        self.0.running.fetch_add(1, Ordering::AcqRel);
        Running(self.0.clone(), false)
    }

    /// How many run now.
    pub fn running(&self) -> usize {
        self.0.running.load(Ordering::Acquire)
    }

    /// Wait until none runs, at most `bound`; whether none does.
    pub async fn settled(&self, bound: Duration) -> bool {
        let none = async {
            loop {
                let ended = self.0.ended.notified();
                if self.running() == 0 {
                    return;
                }
                ended.await;
            }
        };
        tokio::time::timeout(bound, none).await.is_ok()
    }
}

/// Counts one detached decision while it lives.
struct Running(Arc<Count>, bool);

impl Running {
    /// Its decision ran to its end.
    fn ended(mut self) {
        self.1 = true;
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        if !self.1 {
            // A stop past its bound, or a client that reset during the
            // drain on a worker left with no connection: its runtime went.
            tracing::warn!("a decision whose client went away was dropped unfinished by the stop: its audit row may be missing");
        }
        if self.0.running.fetch_sub(1, Ordering::AcqRel) == 1 {
            self.0.ended.notify_waiters();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A decision dropped before its end finishes on a task of its own,
    /// counted until it does; one polled to its end is never spawned.
    #[actix_web::test]
    async fn a_dropped_decision_finishes_and_is_counted_until_it_does() {
        let detached = Detached::default();
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        let finished = Arc::new(AtomicUsize::new(0));
        let done = finished.clone();
        let decision = to_the_end(detached.clone(), async move {
            let _ = rx.await;
            done.fetch_add(1, Ordering::AcqRel);
        });
        // Polled once (it waits), then dropped as a reset request's is.
        let mut decision = Box::pin(decision);
        assert!(futures::poll!(decision.as_mut()).is_pending());
        drop(decision);
        assert_eq!(detached.running(), 1);
        assert!(
            !detached.settled(Duration::from_millis(50)).await,
            "still waits"
        );
        tx.send(()).expect("the decision waits");
        assert!(detached.settled(Duration::from_secs(5)).await);
        assert_eq!(finished.load(Ordering::Acquire), 1);

        let ended = to_the_end(detached.clone(), async { 7 }).await;
        assert_eq!((ended, detached.running()), (7, 0));
    }
}
