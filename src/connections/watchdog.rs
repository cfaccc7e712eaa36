//! One connection's clock, and the watchdog that closes it when it stalls.
//!
//! actix bounds only the first request's head (`client_request_timeout`)
//! and an idle keep-alive; a later head, once its first byte is in, and the
//! writing of an answer the client does not read are bounded by nothing.
//! So each connection counts from its accept, then from the end of each
//! answer: between two requests (idle, the next head, the previous answer
//! going out) it has `server.request_timeout`; while a request is in the
//! application it is "busy" and its body is bounded by [`super::deadline`]
//! with the same clock. A connection still not busy when the time is up is
//! shut down (reset): its dispatcher sees the socket closed and drops it.
//!
//! The body's deadline is the end of the period the request started in, so
//! the watchdog's own timer ends it too: a body still awaited when the
//! watchdog wakes past that end is timed out and its reader woken. A timer
//! per request (armed whenever a body was not in with its head, which on a
//! loaded server is most requests) cost about 1,100 instructions a login.
//!
//! The watchdog reaches the socket by its descriptor number, as the
//! dispatcher owns the stream. That is sound because the watchdog is a task
//! of the connection's worker thread, aborted when [`Connection`] drops, and
//! the connection's extensions drop with its dispatcher in one step on that
//! same thread, with the stream: once the descriptor is closed the watchdog
//! never runs again. Belt and braces, it also checks the socket's peer is
//! still this connection's before it acts.

use std::cell::Cell;
use std::net::{Shutdown, SocketAddr};
use std::os::fd::{BorrowedFd, RawFd};
use std::rc::Rc;
use std::task::Waker;
use std::time::{Duration, Instant};

use metrics::{Counter, Gauge};
use socket2::SockRef;
use tokio::sync::Notify;
use tokio::task::JoinHandle;

use super::per_ip::Slot;

/// What a connection's requests and its watchdog share.
pub struct ConnState {
    fd: RawFd,
    peer: SocketAddr,
    timeout: Duration,
    /// When the connection last had no request in the application: its
    /// accept, or the end of its last answer.
    idle_since: Cell<Instant>,
    /// Requests in the application now (more than one only when pipelined).
    busy: Cell<u32>,
    /// Set by a watchdog that waits for the connection to go idle.
    watching: Cell<bool>,
    idle: Notify,
    /// The current request's body ran out of time (see `deadline`).
    timed_out: Cell<bool>,
    /// The reader of a body not all in yet, woken when it runs out of time.
    body_waiter: Cell<Option<Waker>>,
    /// The watchdog found the awaited body late; the body's stream fails
    /// (and sets `timed_out`) only if its next read still finds nothing.
    body_late: Cell<bool>,
    /// Requests begun on the connection: the body calls below come from
    /// the current request's stream only, one of an earlier request (were
    /// it still read) changes nothing of the current one's.
    requests: Cell<u64>,
}

impl ConnState {
    /// When the request now starting must be in, body included.
    pub fn deadline(&self) -> Instant {
        self.idle_since.get() + self.timeout
    }

    /// Mark a request in the application until the guard drops.
    pub fn busy(self: &Rc<Self>) -> Busy {
        self.busy.set(self.busy.get() + 1);
        self.requests.set(self.requests.get() + 1);
        self.timed_out.set(false);
        self.body_late.set(false);
        // A body the previous request left unfinished is not this one's.
        drop(self.body_waiter.take());
        Busy(self.clone())
    }

    /// The request now in the application, for its body's calls below.
    pub fn request(&self) -> u64 {
        self.requests.get()
    }

    pub fn timed_out(&self) -> bool {
        self.timed_out.get()
    }

    /// The awaited body of `request` was found late and its read found
    /// nothing more: the request is timed out (its answer becomes the
    /// 408). An earlier request's body is over in any case.
    pub fn body_timed_out(&self, request: u64) -> bool {
        if request != self.request() {
            return true;
        }
        let late = self.body_late.get();
        if late {
            self.timed_out.set(true);
        }
        late
    }

    /// The body of `request`, the current one, is not all in: wake `waker`
    /// if it runs out of time. A watchdog that waits for the request to
    /// leave looks again, as the body may already be late.
    pub fn await_body(&self, request: u64, waker: &Waker) {
        if request != self.request() {
            return;
        }
        let kept = self.body_waiter.take();
        self.body_waiter.set(Some(match kept {
            Some(kept) if kept.will_wake(waker) => kept,
            _ => waker.clone(),
        }));
        if self.watching.replace(false) {
            self.idle.notify_one();
        }
    }

    /// The body of `request` is all in, or no longer read.
    pub fn body_done(&self, request: u64) {
        if request == self.request() {
            drop(self.body_waiter.take());
        }
    }

    fn awaits_body(&self) -> bool {
        let waiter = self.body_waiter.take();
        let awaits = waiter.is_some();
        self.body_waiter.set(waiter);
        awaits
    }

    /// The body awaited is out of time: wake its reader, whose stream
    /// fails unless the rest of the body came meanwhile (see `deadline`):
    /// a body all in is decided on, never answered 408.
    fn time_out_body(&self) {
        if let Some(waker) = self.body_waiter.take() {
            self.body_late.set(true);
            waker.wake();
        }
    }
}

/// A request in the application; dropping it (the answer produced, or its
/// streamed body done) starts the connection's next period.
pub struct Busy(Rc<ConnState>);

impl Drop for Busy {
    fn drop(&mut self) {
        let state = &self.0;
        let busy = state.busy.get().saturating_sub(1);
        state.busy.set(busy);
        state.idle_since.set(Instant::now());
        if busy == 0 && state.watching.replace(false) {
            state.idle.notify_one();
        }
    }
}

/// The connection's entry in its extensions: dropped with the connection,
/// it stops the watchdog, frees the address's slot and counts it closed.
pub struct Connection {
    state: Rc<ConnState>,
    watchdog: JoinHandle<()>,
    _slot: Option<Slot>,
    open: Gauge,
}

impl Connection {
    /// Start the clock and the watchdog of a connection just accepted from
    /// `peer` on descriptor `fd`.
    pub fn start(
        fd: RawFd,
        peer: SocketAddr,
        timeout: Duration,
        slot: Option<Slot>,
        open: Gauge,
        stalled: Counter,
    ) -> Self {
        let state = Rc::new(ConnState {
            fd,
            peer,
            timeout,
            idle_since: Cell::new(Instant::now()),
            busy: Cell::new(0),
            watching: Cell::new(false),
            idle: Notify::new(),
            timed_out: Cell::new(false),
            body_waiter: Cell::new(None),
            body_late: Cell::new(false),
            requests: Cell::new(0),
        });
        open.increment(1.0);
        let watchdog = tokio::task::spawn_local(watch(state.clone(), stalled));
        Self {
            state,
            watchdog,
            _slot: slot,
            open,
        }
    }

    pub fn state(&self) -> &Rc<ConnState> {
        &self.state
    }
}

impl Drop for Connection {
    fn drop(&mut self) {
        self.watchdog.abort();
        self.open.decrement(1.0);
    }
}

/// Sleep until the connection's period ends; then time out the body a
/// request still awaits, or, unless a request is in the application (wait
/// for it to leave or to await its body) or a new period began, cut it.
async fn watch(state: Rc<ConnState>, stalled: Counter) {
    loop {
        let busy = state.busy.get() > 0;
        if busy && !state.awaits_body() {
            state.watching.set(true);
            state.idle.notified().await;
            continue;
        }
        let due = state.deadline();
        if Instant::now() < due {
            tokio::time::sleep_until(due.into()).await;
            continue;
        }
        if busy {
            state.time_out_body();
            continue;
        }
        if cut(&state) {
            stalled.increment(1);
        }
        return;
    }
}

/// Reset the connection's socket; false when it is not ours any more.
fn cut(state: &ConnState) -> bool {
    // SAFETY: the descriptor is open and this connection's while the
    // watchdog runs (module doc); the peer check below covers a descriptor
    // number reused all the same.
    let fd = unsafe { BorrowedFd::borrow_raw(state.fd) };
    let socket = SockRef::from(&fd);
    let ours = socket
        .peer_addr()
        .ok()
        .and_then(|addr| addr.as_socket())
        .is_some_and(|peer| peer == state.peer);
    if ours {
        close_now(socket);
    }
    ours
}

/// Shut a socket down in both directions, and have its close reset the
/// connection rather than linger with unsent data.
pub fn close_now(socket: SockRef<'_>) {
    let _ = socket.set_linger(Some(Duration::ZERO));
    let _ = socket.shutdown(Shutdown::Both);
}
