//! Decisions that run to their end when the client goes away.

use std::future::Future;

use tracing::Instrument;

use crate::error::ApiError;
use crate::telemetry;

/// Run `decision` on a task of its own and wait for it. actix drops a
/// handler's future when its client resets the connection (or at
/// `server.shutdown_timeout`); a decision dropped after the store counted
/// it (a lock Redis set, a code's try taken) would lose its audit row, its
/// lock notice or its SMS. On its own task it ends whoever waits, with the
/// request's id and span.
pub async fn to_the_end<F>(decision: F) -> Result<F::Output, ApiError>
where
    F: Future + 'static,
    F::Output: 'static,
{
    let decision = decision.in_current_span();
    let task = match telemetry::current_request_id() {
        Some(id) => actix_web::rt::spawn(telemetry::scope_request_id(id, decision)),
        None => actix_web::rt::spawn(decision),
    };
    task.await.map_err(|e| {
        if e.is_panic() {
            std::panic::resume_unwind(e.into_panic());
        }
        // The runtime stops: the worker is shutting down.
        ApiError::Internal(anyhow::anyhow!("a decision's task was cancelled: {e}"))
    })
}
