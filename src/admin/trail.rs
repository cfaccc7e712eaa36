//! Reading the audit trail: a page of events, or every event of a filter as
//! streamed CSV (personal data in bulk, so the export is itself audited).

use actix_web::web::Bytes;
use futures::{Stream, StreamExt};

use super::{csv, Desk};
use crate::audit::query::EventQuery;
use crate::audit::{AuditDecision, AuditError, AuditEvent, AuditLog};
use crate::domain::admin_role::Actor;
use crate::domain::{Action, Reason, Subject, SubjectKind};
use crate::error::ApiError;
use crate::guard::RequestInfo;

/// One page of events, newest first.
pub struct Page {
    /// The events.
    pub events: Vec<AuditEvent>,
    /// The cursor of the next page; none on the last.
    pub next_cursor: Option<String>,
}

/// Why an export stopped after it started (the status was already sent, so
/// the response is cut short).
#[derive(Debug, thiserror::Error)]
pub enum ExportError {
    /// A row could not be written as CSV.
    #[error("CSV export: {0}")]
    Csv(#[from] ::csv::Error),
    /// The database failed between pages.
    #[error("audit database unavailable")]
    Database,
}

/// What an export is audited against: the CSV export as a whole.
pub fn export_subject() -> Subject {
    Subject::new(SubjectKind::Global, "events.csv")
}

impl Desk<'_> {
    fn log(&self) -> Result<&AuditLog, ApiError> {
        self.audit_log.ok_or(ApiError::AuditUnavailable)
    }

    /// The page `query` asks for, `default_limit` events when it names no
    /// limit, read in `admin`'s turn.
    pub async fn page(
        &self,
        admin: &Actor,
        query: &EventQuery,
        default_limit: usize,
    ) -> Result<Page, ApiError> {
        let limit = query.limit.unwrap_or(default_limit);
        let page = self
            .log()?
            .page(admin.as_str(), &query.filter, query.cursor.as_ref(), limit)
            .await
            .map_err(unavailable)?;
        Ok(Page {
            events: page.events,
            next_cursor: page.next.map(|cursor| cursor.encode()),
        })
    }

    /// Every event `query` filters, newest first, as CSV: a header row,
    /// then the rows page by page (`limit`, when given, caps them). Audited
    /// as `admin` / `export` / `csv_export` with the filter, as a query
    /// string, in `rule`; its pages are read in `admin`'s turns.
    pub fn export(
        &self,
        admin: &Actor,
        info: &RequestInfo,
        query: EventQuery,
    ) -> Result<impl Stream<Item = Result<Bytes, ExportError>> + use<>, ApiError> {
        let EventQuery {
            filter,
            limit,
            cursor,
        } = query;
        let mut row = AuditEvent::new(
            Action::Admin,
            AuditDecision::Export,
            Reason::CsvExport,
            &export_subject(),
        );
        row.rule = Some(filter.describe(limit));
        let pages = self.log()?.stream(
            admin.to_string(),
            filter,
            cursor,
            limit.unwrap_or(usize::MAX),
        );
        self.audit.record(info.stamp(row));
        let header = csv::rows(&[], true).map_err(|e| ApiError::Internal(e.into()))?;
        let rows = pages.map(|page| match page {
            Ok(events) => Ok(csv::rows(&events, false)?),
            Err(e) => {
                tracing::error!(error = %e, "CSV export stopped by a database error");
                Err(ExportError::Database)
            }
        });
        Ok(futures::stream::once(async move { Ok(header) }).chain(rows))
    }
}

fn unavailable(e: AuditError) -> ApiError {
    tracing::warn!(request_id = %crate::telemetry::request_id(), error = %e, "admin query failed");
    ApiError::AuditUnavailable
}
