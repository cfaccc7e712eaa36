//! The writer's queue: a bounded channel whose senders nudge the writer
//! when it fills past half. The writer gathers a batch by looking at the
//! queue after naps, each sized to end before half the queue has filled at
//! the rate events came so far (see `batch::gather_nap`); a burst after a
//! calm start outruns that guess, and without a nudge a small queue would
//! fill within one nap and its senders spool. Below half, no send wakes
//! the writer: a wake-up an event is what the naps are there to avoid.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::mpsc::error::{SendError, TryRecvError, TrySendError};
use tokio::sync::{mpsc, Notify};

use super::Message;

/// A queue of `capacity` messages (at least one).
pub(super) fn channel(capacity: usize) -> (Sender, Receiver) {
    let (sender, receiver) = mpsc::channel(capacity.max(1));
    let nudge = Arc::new(Notify::new());
    (
        Sender {
            inner: sender,
            nudge: nudge.clone(),
        },
        Receiver {
            inner: receiver,
            nudge,
        },
    )
}

#[derive(Clone)]
pub(super) struct Sender {
    inner: mpsc::Sender<Message>,
    nudge: Arc<Notify>,
}

impl Sender {
    /// Queue without waiting; past half full, the writer is nudged out of
    /// its nap.
    pub(super) fn try_send(&self, message: Message) -> Result<(), TrySendError<Message>> {
        self.inner.try_send(message)?;
        if self.inner.capacity() <= self.inner.max_capacity() / 2 {
            self.nudge.notify_one();
        }
        Ok(())
    }

    /// Queue, waiting for room, and nudge the writer: what is sent this
    /// way (a flush) has someone waiting on it.
    pub(super) async fn send(&self, message: Message) -> Result<(), SendError<Message>> {
        self.inner.send(message).await?;
        self.nudge.notify_one();
        Ok(())
    }

    #[cfg(test)]
    pub(super) fn blocking_send(&self, message: Message) -> Result<(), SendError<Message>> {
        self.inner.blocking_send(message)
    }
}

pub(super) struct Receiver {
    inner: mpsc::Receiver<Message>,
    nudge: Arc<Notify>,
}

impl Receiver {
    /// Wait for at least one message, then take up to `limit` (0 once every
    /// sender is gone).
    pub(super) async fn recv_many(&mut self, into: &mut Vec<Message>, limit: usize) -> usize {
        self.inner.recv_many(into, limit).await
    }

    pub(super) fn try_recv(&mut self) -> Result<Message, TryRecvError> {
        self.inner.try_recv()
    }

    pub(super) fn max_capacity(&self) -> usize {
        self.inner.max_capacity()
    }

    /// Sleep `duration`, or less if a sender nudges: one did since the last
    /// nap ended, or does during this one.
    pub(super) async fn nap(&self, duration: Duration) {
        tokio::select! {
            () = tokio::time::sleep(duration) => {}
            () = self.nudge.notified() => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures::FutureExt;

    fn flush() -> Message {
        Message::Flush(tokio::sync::oneshot::channel().0)
    }

    /// Whether a nap of an hour ends at once: a nudge is waiting.
    fn nudged(rx: &Receiver) -> bool {
        rx.nap(Duration::from_secs(3600)).now_or_never().is_some()
    }

    #[tokio::test]
    async fn a_send_nudges_the_writer_only_past_half_full() {
        let (tx, rx) = channel(8);
        for _ in 0..3 {
            assert!(tx.try_send(flush()).is_ok());
        }
        assert!(!nudged(&rx), "three of eight queued: no nudge");
        assert!(tx.try_send(flush()).is_ok());
        assert!(nudged(&rx), "half full: nudged");
        assert!(!nudged(&rx), "one nudge, taken");
    }

    #[tokio::test]
    async fn a_flush_sent_nudges_the_writer() {
        let (tx, rx) = channel(8);
        assert!(tx.send(flush()).await.is_ok());
        assert!(nudged(&rx));
    }
}
