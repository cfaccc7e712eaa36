//! Subjects (what limits are counted against, by kind) and the actions
//! events belong to.

use serde::{Deserialize, Serialize};

use super::username::UsernameError;
use super::{ClientIp, PhoneError, PhoneNumber, Username};

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
    /// An IPv6 client's network, its first `sms.network_bits` bits
    /// (`2001:db8:1::/48`): the /64s one site or tunnel holds, counted
    /// together by `/sms/send`'s network windows.
    Network,
    /// One subject per action, counting every request.
    Global,
    /// A phone number's region, ISO 3166 alpha-2 (`CN`): what the SMS
    /// pumping guard counts besides the prefix.
    Country,
}

impl SubjectKind {
    /// Only the caller's own requests fill this subject's windows (its
    /// address, its network); anyone's fill a phone's, a prefix's, a user's
    /// or the global ones.
    pub fn is_callers_own(self) -> bool {
        matches!(self, Self::Ip | Self::Network)
    }

    /// Every kind, for parsing and for listing them.
    pub const ALL: [SubjectKind; 7] = [
        SubjectKind::Phone,
        SubjectKind::Prefix,
        SubjectKind::User,
        SubjectKind::Ip,
        SubjectKind::Network,
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
            SubjectKind::Network => "network",
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
    /// `2001:db8:1:2::/64`, `2001:db8:1::/48`, `sms_send`, `CN`.
    pub id: String,
}

/// Why a subject an admin named is not one.
#[derive(Debug, thiserror::Error)]
pub enum SubjectError {
    /// The kind is none of [`SubjectKind::ALL`]. Neither this nor
    /// `Malformed` says the text given: a link anyone can send an admin
    /// chooses it, and the console shows the message in its own red box.
    #[error("unknown subject kind")]
    UnknownKind(String),
    /// A phone subject that is no phone number (`invalid_phone`).
    #[error(transparent)]
    Phone(#[from] PhoneError),
    /// A user subject that is no login name.
    #[error(transparent)]
    User(#[from] UsernameError),
    /// An id that cannot be of its kind; the message says what it must be.
    #[error("the id is not {expected}")]
    Malformed {
        /// The id as given.
        id: String,
        /// What an id of the kind looks like.
        expected: &'static str,
    },
}

/// An id from a query string with the `+` a form or link lost put back: a
/// raw `+` arrives as a space (`id=+8613800138000`), and a phone or prefix
/// without it is refused. Only for those kinds, or no kind (a filter on
/// any subject): a pasted ` 203.0.113.7` or a user ` 42` keeps its space,
/// trimmed later.
pub fn plus_restored(kind: Option<SubjectKind>, raw: &str) -> std::borrow::Cow<'_, str> {
    let numbered = matches!(kind, None | Some(SubjectKind::Phone | SubjectKind::Prefix));
    match raw.strip_prefix(' ') {
        Some(rest) if numbered && rest.starts_with(|c: char| c.is_ascii_digit()) => {
            format!("+{rest}").into()
        }
        _ => raw.into(),
    }
}

impl Subject {
    /// A subject from an id already normalised for its kind.
    pub fn new(kind: SubjectKind, id: impl Into<String>) -> Self {
        Self {
            kind,
            id: id.into(),
        }
    }

    /// A subject from its kind and id as an admin writes them, the id
    /// normalised as the guards count it (`Alice` is `alice`,
    /// `+86 138 0013 8000` is `+8613800138000`, `cn` is `CN`).
    pub fn parse(kind: &str, id: &str) -> Result<Self, SubjectError> {
        let kind =
            SubjectKind::parse(kind).ok_or_else(|| SubjectError::UnknownKind(kind.to_string()))?;
        let malformed = |expected| SubjectError::Malformed {
            id: id.to_string(),
            expected,
        };
        let id = match kind {
            SubjectKind::Phone => PhoneNumber::parse(id)?.e164().to_string(),
            SubjectKind::User => Username::parse(id)?.as_str().to_string(),
            SubjectKind::Ip => ClientIp::parse_subject(id)
                .ok_or_else(|| {
                    malformed("an IP address or IPv6 /64 (another range is not a subject)")
                })?
                .subject_id(),
            SubjectKind::Network => ClientIp::parse_network(id).ok_or_else(|| {
                malformed("an IPv6 network such as 2001:db8:1::/48 (a length of 32 to 64)")
            })?,
            SubjectKind::Prefix => {
                let digits = id.strip_prefix('+').unwrap_or(id);
                let valid = !digits.is_empty()
                    && digits.len() <= 15
                    && digits.chars().all(|c| c.is_ascii_digit());
                if !valid {
                    return Err(malformed("a number prefix such as +8613800"));
                }
                format!("+{digits}")
            }
            SubjectKind::Global => {
                if Action::parse(id) != Some(Action::SmsSend) {
                    return Err(malformed("a global subject (sms_send)"));
                }
                id.to_string()
            }
            // As `PhoneNumber::region` names it: upper case.
            SubjectKind::Country => {
                if id.len() != 2 || !id.chars().all(|c| c.is_ascii_alphabetic()) {
                    return Err(malformed("an ISO 3166 alpha-2 country code such as CN"));
                }
                id.to_ascii_uppercase()
            }
        };
        Ok(Subject::new(kind, id))
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
    /// Every action, for parsing and for listing them.
    pub const ALL: [Action; 4] = [
        Action::SmsSend,
        Action::SmsVerify,
        Action::LoginAttempt,
        Action::Admin,
    ];

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
        Self::ALL.into_iter().find(|a| a.as_str() == s)
    }
}

impl std::fmt::Display for Action {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}
