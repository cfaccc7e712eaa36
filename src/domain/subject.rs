use serde::{Deserialize, Serialize};

/// What a limit is counted against.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum SubjectKind {
    Phone,
    Prefix,
    User,
    Ip,
    Global,
}

impl SubjectKind {
    pub const ALL: [SubjectKind; 5] = [
        SubjectKind::Phone,
        SubjectKind::Prefix,
        SubjectKind::User,
        SubjectKind::Ip,
        SubjectKind::Global,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            SubjectKind::Phone => "phone",
            SubjectKind::Prefix => "prefix",
            SubjectKind::User => "user",
            SubjectKind::Ip => "ip",
            SubjectKind::Global => "global",
        }
    }

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
    pub kind: SubjectKind,
    pub id: String,
}

impl Subject {
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
    SmsSend,
    SmsVerify,
    LoginAttempt,
    Admin,
}

impl Action {
    pub fn as_str(self) -> &'static str {
        match self {
            Action::SmsSend => "sms_send",
            Action::SmsVerify => "sms_verify",
            Action::LoginAttempt => "login_attempt",
            Action::Admin => "admin",
        }
    }

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
