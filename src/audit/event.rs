use chrono::{DateTime, SubsecRound, Utc};
use serde::{Deserialize, Serialize};
use uuid::Uuid;

use crate::domain::{Action, Rule, Subject, SubjectKind};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum AuditDecision {
    Deny,
    Challenge,
    Lock,
    Unblock,
}

impl AuditDecision {
    pub fn as_str(self) -> &'static str {
        match self {
            AuditDecision::Deny => "deny",
            AuditDecision::Challenge => "challenge",
            AuditDecision::Lock => "lock",
            AuditDecision::Unblock => "unblock",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        [Self::Deny, Self::Challenge, Self::Lock, Self::Unblock]
            .into_iter()
            .find(|d| d.as_str() == s)
    }
}

/// Now, truncated to milliseconds: the precision every database keeps, so a
/// keyset cursor made from a row finds that row again on SQLite and PostgreSQL.
pub fn now_ms() -> DateTime<Utc> {
    Utc::now().trunc_subsecs(3)
}

/// One row of `audit_events` (DESIGN.md §4).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct AuditEvent {
    pub id: Uuid,
    /// RFC 3339, UTC, milliseconds.
    #[serde(with = "rfc3339_ms")]
    #[schema(example = "2026-11-02T08:15:30.123Z")]
    pub occurred_at: DateTime<Utc>,
    pub action: Action,
    pub decision: AuditDecision,
    #[schema(example = "rate_limited")]
    pub reason: String,
    pub subject_kind: SubjectKind,
    #[schema(example = "+8613800138000")]
    pub subject: String,
    #[schema(required = true, example = "203.0.113.7")]
    pub ip: Option<String>,
    #[schema(required = true, example = "phone 5/1h")]
    pub rule: Option<String>,
    /// The count in the denying window before the request.
    #[schema(required = true)]
    pub observed: Option<i64>,
    #[schema(required = true)]
    pub limit: Option<i64>,
    #[schema(required = true)]
    pub window_ms: Option<i64>,
    #[schema(required = true)]
    pub retry_after_ms: Option<i64>,
    #[schema(required = true)]
    pub request_id: Option<String>,
    #[schema(required = true)]
    pub user_agent: Option<String>,
    /// Recorded in shadow mode: the request was let through.
    pub shadow: bool,
}

impl AuditEvent {
    /// `reason` is a [`Reason`](crate::domain::Reason) from the guards; any
    /// text from tests and tools that write rows of their own.
    pub fn new(
        action: Action,
        decision: AuditDecision,
        reason: impl AsRef<str>,
        subject: &Subject,
    ) -> Self {
        Self {
            id: Uuid::now_v7(),
            occurred_at: now_ms(),
            action,
            decision,
            reason: reason.as_ref().to_string(),
            subject_kind: subject.kind,
            subject: subject.id.clone(),
            ip: None,
            rule: None,
            observed: None,
            limit: None,
            window_ms: None,
            retry_after_ms: None,
            request_id: None,
            user_agent: None,
            shadow: false,
        }
    }

    /// The rule that decided, with the count it saw.
    pub fn rule(mut self, rule: &Rule, observed: u32) -> Self {
        self.rule = Some(rule.name());
        self.observed = Some(observed.into());
        self.limit = Some(rule.limit.into());
        self.window_ms = Some(rule.window_ms() as i64);
        self
    }

    pub fn retry_after_ms(mut self, ms: u64) -> Self {
        self.retry_after_ms = Some(ms as i64);
        self
    }

    pub fn shadow(mut self, shadow: bool) -> Self {
        self.shadow = shadow;
        self
    }

    pub fn request(
        mut self,
        ip: Option<String>,
        request_id: &str,
        user_agent: Option<&str>,
    ) -> Self {
        self.ip = ip;
        self.request_id = Some(request_id.to_string());
        self.user_agent = user_agent.map(str::to_string);
        self
    }
}

/// Times as RFC 3339 in UTC with exactly three fractional digits, the same in
/// JSON, CSV and the spool.
pub mod rfc3339_ms {
    use chrono::{DateTime, SecondsFormat, Utc};
    use serde::{Deserialize, Deserializer, Serializer};

    pub fn format(t: &DateTime<Utc>) -> String {
        t.to_rfc3339_opts(SecondsFormat::Millis, true)
    }

    pub fn serialize<S: Serializer>(t: &DateTime<Utc>, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&format(t))
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<DateTime<Utc>, D::Error> {
        let raw = String::deserialize(d)?;
        DateTime::parse_from_rfc3339(&raw)
            .map(|t| t.with_timezone(&Utc))
            .map_err(serde::de::Error::custom)
    }
}
