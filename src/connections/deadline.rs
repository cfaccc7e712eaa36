//! The body deadline, for every route of every listener: the request's
//! payload is wrapped in a stream that fails once the connection's period
//! (`watchdog`: `server.request_timeout` from the accept or the previous
//! answer) is over, and an answer given after that failure, whatever the
//! body reader made of it (the JSON extractor's 400, a form's), becomes the
//! 408 `request_timeout` that closes the connection. The connection's
//! watchdog, whose timer already ends that period, wakes a body reader
//! that is still waiting then; the stream holds no timer of its own.
//!
//! Every handler reads its body through an extractor before it runs, so a
//! body cut short decides nothing and records nothing.
//!
//! While the request is in the application the connection is "busy", and
//! the watchdog leaves it alone; a streamed answer (the CSV export) keeps it
//! busy until its last chunk, so a long export is not cut.

use std::io;
use std::pin::Pin;
use std::rc::Rc;
use std::task::{Context, Poll};

use actix_web::body::{BodySize, BoxBody, EitherBody, MessageBody};
use actix_web::dev::{Payload, ServiceRequest, ServiceResponse};
use actix_web::error::PayloadError;
use actix_web::web::Bytes;
use actix_web::ResponseError;
use futures::Stream;

use super::watchdog::{Busy, ConnState, Connection};
use crate::error::ApiError;

/// One request's hold on its connection's deadline, from [`enter`] to
/// [`leave`].
pub struct Entered {
    conn: Rc<ConnState>,
    busy: Busy,
}

/// Bound `req`'s body by its connection's deadline and mark the connection
/// busy. `None` when the request did not come through a listener of ours (a
/// test service): nothing to bound.
///
/// Called by the request-id layer (`routes::request_id`) rather than from
/// a layer of its own: a layer costs every request its future's moves, and
/// a `from_fn` one a boxed future, some 300 instructions of a login
/// (callgrind).
pub fn enter(req: &mut ServiceRequest) -> Option<Entered> {
    let conn = req.conn_data::<Connection>()?.state().clone();
    let busy = conn.busy();
    let (_, payload) = req.parts_mut();
    if !matches!(payload, Payload::None) {
        let body = Deadline {
            inner: payload.take(),
            conn: conn.clone(),
            request: conn.request(),
        };
        *payload = Payload::Stream {
            payload: Box::pin(body),
        };
    }
    Some(Entered { conn, busy })
}

/// The answer to a request [`enter`] bounded: the 408 `request_timeout`
/// when its body ran out of time, whatever the handler made of that; a
/// streamed answer keeps the connection busy until its last chunk.
pub fn leave<B: MessageBody + 'static>(
    entered: Option<Entered>,
    answer: Result<ServiceResponse<B>, actix_web::Error>,
) -> Result<ServiceResponse<EitherBody<B>>, actix_web::Error> {
    let Some(Entered { conn, busy }) = entered else {
        return answer.map(ServiceResponse::map_into_left_body);
    };
    if conn.timed_out() {
        return match answer {
            Ok(res) => Ok(res
                .into_response(ApiError::RequestTimeout.error_response())
                .map_into_right_body()),
            Err(_) => Err(ApiError::RequestTimeout.into()),
        };
    }
    let res = answer?;
    if matches!(res.response().body().size(), BodySize::Stream) {
        return Ok(res.map_body(|_, body| {
            EitherBody::right(BoxBody::new(Streaming {
                inner: body.boxed(),
                _busy: busy,
            }))
        }));
    }
    Ok(res.map_into_left_body())
}

/// A request body that fails once its connection's watchdog found it not
/// all in at the end of the request's period.
struct Deadline {
    inner: Payload,
    conn: Rc<ConnState>,
    /// Which of the connection's requests this body is.
    request: u64,
}

impl Stream for Deadline {
    type Item = Result<Bytes, PayloadError>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        if let Poll::Ready(item) = Pin::new(&mut self.inner).poll_next(cx) {
            if item.is_none() {
                self.conn.body_done(self.request);
            }
            return Poll::Ready(item);
        }
        if self.conn.body_timed_out(self.request) {
            return Poll::Ready(Some(Err(PayloadError::Io(io::Error::new(
                io::ErrorKind::TimedOut,
                "request body not received within server.request_timeout",
            )))));
        }
        self.conn.await_body(self.request, cx.waker());
        Poll::Pending
    }
}

impl Drop for Deadline {
    /// A body dropped unread (the answer given without it) is no longer
    /// awaited.
    fn drop(&mut self) {
        self.conn.body_done(self.request);
    }
}

/// A streamed answer, holding its request busy until it is all sent.
struct Streaming {
    inner: BoxBody,
    _busy: Busy,
}

impl MessageBody for Streaming {
    type Error = Box<dyn std::error::Error>;

    fn size(&self) -> BodySize {
        self.inner.size()
    }

    fn poll_next(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Bytes, Self::Error>>> {
        Pin::new(&mut self.inner).poll_next(cx)
    }
}
