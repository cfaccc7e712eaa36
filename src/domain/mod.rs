//! Values parsed once at the edge; nothing inward handles raw strings.

pub mod admin_role;
pub mod client_ip;
pub mod email;
pub mod forwarding;
pub mod ip_range;
pub mod locale;
pub mod origin;
pub mod pattern;
pub mod phone;
pub mod reason;
pub mod rule;
pub mod subject;
pub mod text;
pub mod username;

pub use client_ip::ClientIp;
pub use email::EmailAddress;
pub use locale::Locale;
pub use phone::{PhoneError, PhoneNumber, NO_REGION};
pub use reason::Reason;
pub use rule::{Algorithm, Rule};
pub use subject::{Action, Subject, SubjectError, SubjectKind};
pub use username::{Username, UsernameError};

#[cfg(test)]
mod proptests;
