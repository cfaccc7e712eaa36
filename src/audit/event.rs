//! The audit event: one row of the trail, as guards build it and the admin
//! API returns it.

use chrono::{DateTime, SubsecRound, Utc};
use serde::{Deserialize, Serialize};
use uuid::Uuid;

use crate::domain::{Action, Rule, Subject, SubjectKind};

/// What happened to the subject: refused, asked for a captcha, locked or
/// blocked, or unblocked by an admin; or an admin's change to the allow and
/// block lists.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum AuditDecision {
    /// A request was refused.
    Deny,
    /// A captcha was demanded, or a login failure first made one required.
    Challenge,
    /// A user was locked or an IP blocked.
    Lock,
    /// An admin cleared the subject's windows and lock.
    Unblock,
    /// An admin added an allow or block entry (`reason` says which list).
    ListAdd,
    /// An admin deleted one.
    ListRemove,
    /// An admin exported the trail as CSV (`rule` holds the filter).
    Export,
    /// An admin signed in to the console through single sign-on.
    SignIn,
    /// A single sign-on attempt failed (`reason` says why).
    SignInFailed,
    /// An admin signed out of the console (reason `oidc`).
    SignOut,
}

impl AuditDecision {
    /// Every decision, for parsing and for listing them.
    pub const ALL: [AuditDecision; 10] = [
        AuditDecision::Deny,
        AuditDecision::Challenge,
        AuditDecision::Lock,
        AuditDecision::Unblock,
        AuditDecision::ListAdd,
        AuditDecision::ListRemove,
        AuditDecision::Export,
        AuditDecision::SignIn,
        AuditDecision::SignInFailed,
        AuditDecision::SignOut,
    ];

    /// The decisions that count as refusals (what the stats and roll-ups count).
    pub const REFUSALS: [AuditDecision; 3] = [
        AuditDecision::Deny,
        AuditDecision::Challenge,
        AuditDecision::Lock,
    ];

    /// The name stored in the database and used in filters.
    pub fn as_str(self) -> &'static str {
        match self {
            AuditDecision::Deny => "deny",
            AuditDecision::Challenge => "challenge",
            AuditDecision::Lock => "lock",
            AuditDecision::Unblock => "unblock",
            AuditDecision::ListAdd => "list_add",
            AuditDecision::ListRemove => "list_remove",
            AuditDecision::Export => "export",
            AuditDecision::SignIn => "sign_in",
            AuditDecision::SignInFailed => "sign_in_failed",
            AuditDecision::SignOut => "sign_out",
        }
    }

    /// The decision `as_str` names `s`, if any.
    pub fn parse(s: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|d| d.as_str() == s)
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
    /// Unique id of the row (a UUIDv7).
    pub id: Uuid,
    /// RFC 3339, UTC, milliseconds.
    #[serde(with = "rfc3339_ms")]
    #[schema(example = "2026-11-02T08:15:30.123Z")]
    pub occurred_at: DateTime<Utc>,
    /// What was asked: `sms_send`, `sms_verify`, `login_attempt`, or `admin`
    /// for an admin's action.
    pub action: Action,
    /// What was decided.
    pub decision: AuditDecision,
    /// Why, as a code: `rate_limited`, `captcha_required`, `region_blocked`,
    /// `verify_attempts_exhausted`, `user_locked`, `ip_blocked`,
    /// `too_many_failures`, `admin_unblock`, `pumping_suspected`,
    /// `admin_auth_failures` (an address throttled for failing admin
    /// authentication), or for a list change the list: `allow_list`,
    /// `block_list`.
    #[schema(example = "rate_limited")]
    pub reason: String,
    /// What the subject is: `phone`, `prefix`, `user`, `ip`, `global` or
    /// `country`.
    pub subject_kind: SubjectKind,
    /// The subject's id: an E.164 number, a number prefix, a normalised user
    /// name, an IP (IPv6 as its /64), for `global` the action, for `country`
    /// an ISO 3166 alpha-2 code.
    #[schema(example = "+8613800138000")]
    pub subject: String,
    /// The client IP of the request, when known.
    #[schema(required = true, example = "203.0.113.7")]
    pub ip: Option<String>,
    /// The rule that decided, `<subject kind> <limit>/<window>`; null when none
    /// did (a blocked region, an unblock).
    #[schema(required = true, example = "phone 5/1h")]
    pub rule: Option<String>,
    /// The count the rule saw: before the request on a refusal, after the
    /// failure on a challenge or lock that the failure caused.
    #[schema(required = true)]
    pub observed: Option<i64>,
    /// The rule's limit.
    #[schema(required = true)]
    pub limit: Option<i64>,
    /// The rule's window, in milliseconds.
    #[schema(required = true)]
    pub window_ms: Option<i64>,
    /// Milliseconds until the subject may pass again; on a `lock`, how long it
    /// can last.
    #[schema(required = true)]
    pub retry_after_ms: Option<i64>,
    /// The request's id: its `x-request-id`, or one tollgate made up.
    #[schema(required = true)]
    pub request_id: Option<String>,
    /// The request's `User-Agent`, when it sent one.
    #[schema(required = true)]
    pub user_agent: Option<String>,
    /// Recorded in shadow mode: the request was let through.
    pub shadow: bool,
    /// The admin who acted, on admin rows: `token:<name>` (a static token)
    /// or `oidc:<email or subject>` (single sign-on, a JWT bearer); null on
    /// other rows and on rows written before admins had names.
    #[serde(default)]
    #[schema(required = true, example = "oidc:ann@example.com")]
    pub actor: Option<String>,
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
            id: crate::uuid_v7::now(),
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
            actor: None,
        }
    }

    /// When a lock row's lock runs out, in ms since 1970 (its time plus
    /// `retry_after_ms`); `None` on other rows. Stored as `lock_until_ms`,
    /// which the overview's open locks are found by.
    pub fn lock_until_ms(&self) -> Option<i64> {
        match (self.decision, self.retry_after_ms) {
            (AuditDecision::Lock, Some(wait)) => {
                Some(self.occurred_at.timestamp_millis().saturating_add(wait))
            }
            _ => None,
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

    /// A decision no window rule made (the pumping guard's): its
    /// description in the `rule` column, the count it saw, the threshold of
    /// that count and the window it was counted in.
    pub fn described(mut self, rule: String, observed: u32, limit: u32, window_ms: u64) -> Self {
        self.rule = Some(rule);
        self.observed = Some(observed.into());
        self.limit = Some(limit.into());
        self.window_ms = Some(window_ms as i64);
        self
    }

    /// How long until the subject may pass again.
    pub fn retry_after_ms(mut self, ms: u64) -> Self {
        self.retry_after_ms = Some(ms as i64);
        self
    }

    /// Marks a row recorded in shadow mode, where the request was let through.
    pub fn shadow(mut self, shadow: bool) -> Self {
        self.shadow = shadow;
        self
    }

    /// The admin who acted.
    pub fn actor(mut self, actor: Option<String>) -> Self {
        self.actor = actor;
        self
    }

    /// What the request tells: client IP, request id and user agent.
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

    /// `2026-11-02T08:15:30.123Z`.
    pub fn format(t: &DateTime<Utc>) -> String {
        t.to_rfc3339_opts(SecondsFormat::Millis, true)
    }

    /// Serde: writes `format`'s text.
    pub fn serialize<S: Serializer>(t: &DateTime<Utc>, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&format(t))
    }

    /// Serde: reads any RFC 3339 time, converted to UTC.
    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<DateTime<Utc>, D::Error> {
        let raw = String::deserialize(d)?;
        DateTime::parse_from_rfc3339(&raw)
            .map(|t| t.with_timezone(&Utc))
            .map_err(serde::de::Error::custom)
    }
}
