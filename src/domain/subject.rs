//! Subjects (what limits are counted against, by kind) and the actions
//! events belong to.

use serde::{Deserialize, Serialize};

/// What a limit is counted against.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum SubjectKind {
    /// A phone number in E.164 form.
    Phone,
    /// The first digits of a phone number, country code included.
    Prefix,
    /// A login name, normalised.
    User,
    /// An IPv4 address, or an IPv6 /64.
    Ip,
    /// One subject per action, counting every request.
    Global,
    /// A phone number's region, ISO 3166 alpha-2 (`CN`): what the SMS
    /// pumping guard counts besides the prefix.
    Country,
}

impl SubjectKind {
    /// Every kind, for parsing and for listing them.
    pub const ALL: [SubjectKind; 6] = [
        SubjectKind::Phone,
        SubjectKind::Prefix,
        SubjectKind::User,
        SubjectKind::Ip,
        SubjectKind::Global,
        SubjectKind::Country,
    ];

    /// The wire form (`phone`), as in audit rows and admin paths.
    pub fn as_str(self) -> &'static str {
        match self {
            SubjectKind::Phone => "phone",
            SubjectKind::Prefix => "prefix",
            SubjectKind::User => "user",
            SubjectKind::Ip => "ip",
            SubjectKind::Global => "global",
            SubjectKind::Country => "country",
        }
    }

    /// The kind whose wire form is `s`.
    pub fn parse(s: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|k| k.as_str() == s)
    }
}

impl std::fmt::Display for SubjectKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A counted subject: its kind and its normalised id.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Subject {
    /// Which kind of subject, which decides the form of `id`.
    pub kind: SubjectKind,
    /// The normalised id: `+8613800138000`, `+8613800`, `alice`,
    /// `2001:db8:1:2::/64`, `sms_send`, `CN`.
    pub id: String,
}

impl Subject {
    /// A subject from an id already normalised for its kind.
    pub fn new(kind: SubjectKind, id: impl Into<String>) -> Self {
        Self {
            kind,
            id: id.into(),
        }
    }
}

/// The action an event belongs to; also the audit `action` column.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum Action {
    /// `POST /sms/send`.
    SmsSend,
    /// `POST /sms/verify`.
    SmsVerify,
    /// A login attempt (`POST /login/attempt`; `/login/check` reads its windows).
    LoginAttempt,
    /// An admin's change to a subject, such as an unblock.
    Admin,
}

impl Action {
    /// The wire form (`sms_send`), as in the audit `action` column.
    pub fn as_str(self) -> &'static str {
        match self {
            Action::SmsSend => "sms_send",
            Action::SmsVerify => "sms_verify",
            Action::LoginAttempt => "login_attempt",
            Action::Admin => "admin",
        }
    }

    /// The action whose wire form is `s`.
    pub fn parse(s: &str) -> Option<Self> {
        [
            Self::SmsSend,
            Self::SmsVerify,
            Self::LoginAttempt,
            Self::Admin,
        ]
        .into_iter()
        .find(|a| a.as_str() == s)
    }
}

impl std::fmt::Display for Action {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}
