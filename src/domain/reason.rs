//! Why a request was refused, challenged or a subject locked: the audit
//! trail's `reason`, `LoginState.reason`, the alert digest's wording and the
//! metrics' labels, in one vocabulary.

use serde::Serialize;

/// A reason, written in `snake_case` wherever it appears.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum Reason {
    /// A window of the rule is full.
    RateLimited,
    /// A captcha tier applies and no captcha was passed.
    CaptchaRequired,
    /// The phone's region is not allowed to receive codes.
    RegionBlocked,
    /// A code was tried wrong too often and is burnt.
    VerifyAttemptsExhausted,
    /// The user is locked.
    UserLocked,
    /// The IP is blocked for failing logins across users.
    IpBlocked,
    /// This failure locked the user.
    TooManyFailures,
    /// An admin lifted the subject's windows and lock.
    AdminUnblock,
    /// The IP, phone or user is on the block list.
    Blocklisted,
    /// Too few of the codes sent to a number prefix or country were
    /// verified: it is blocked as a likely target of SMS pumping.
    PumpingSuspected,
    /// The entry an admin added or deleted is on the allow list.
    AllowList,
    /// The entry an admin added or deleted is on the block list.
    BlockList,
    /// An address failed admin authentication `server.admin_auth_limit`
    /// times (an IPv6 /48 `server.admin_auth_network_limit` times): its
    /// admin requests are refused for the window.
    AdminAuthFailures,
    /// The admin's role does not allow what it asked (`rule` names the
    /// permission and the role it needs).
    Forbidden,
    /// An admin exported audit rows as CSV.
    CsvExport,
    /// Signed in through the OpenID Connect provider.
    Oidc,
    /// A sign-in callback without the browser's pending sign-in, or with
    /// another `state`: forged, replayed or stale.
    InvalidCallback,
    /// The provider answered an error, or could not be reached, or refused
    /// the code.
    IdpError,
    /// The ID token failed validation (signature, issuer, audience, expiry,
    /// nonce).
    InvalidIdToken,
    /// The admin's claims map to no tollgate role.
    NoRole,
}

impl Reason {
    /// Every reason, for `parse` to search.
    pub const ALL: [Reason; 20] = [
        Reason::RateLimited,
        Reason::CaptchaRequired,
        Reason::RegionBlocked,
        Reason::VerifyAttemptsExhausted,
        Reason::UserLocked,
        Reason::IpBlocked,
        Reason::TooManyFailures,
        Reason::AdminUnblock,
        Reason::Blocklisted,
        Reason::PumpingSuspected,
        Reason::AllowList,
        Reason::BlockList,
        Reason::AdminAuthFailures,
        Reason::Forbidden,
        Reason::CsvExport,
        Reason::Oidc,
        Reason::InvalidCallback,
        Reason::IdpError,
        Reason::InvalidIdToken,
        Reason::NoRole,
    ];

    /// The wire form (`rate_limited`), the same as the serde form.
    pub fn as_str(self) -> &'static str {
        match self {
            Reason::RateLimited => "rate_limited",
            Reason::CaptchaRequired => "captcha_required",
            Reason::RegionBlocked => "region_blocked",
            Reason::VerifyAttemptsExhausted => "verify_attempts_exhausted",
            Reason::UserLocked => "user_locked",
            Reason::IpBlocked => "ip_blocked",
            Reason::TooManyFailures => "too_many_failures",
            Reason::AdminUnblock => "admin_unblock",
            Reason::Blocklisted => "blocklisted",
            Reason::PumpingSuspected => "pumping_suspected",
            Reason::AllowList => "allow_list",
            Reason::BlockList => "block_list",
            Reason::AdminAuthFailures => "admin_auth_failures",
            Reason::Forbidden => "forbidden",
            Reason::CsvExport => "csv_export",
            Reason::Oidc => "oidc",
            Reason::InvalidCallback => "invalid_callback",
            Reason::IdpError => "idp_error",
            Reason::InvalidIdToken => "invalid_id_token",
            Reason::NoRole => "no_role",
        }
    }

    /// The reason an audit row names, if it is one of ours.
    pub fn parse(s: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|r| r.as_str() == s)
    }
}

impl AsRef<str> for Reason {
    fn as_ref(&self) -> &str {
        self.as_str()
    }
}

impl std::fmt::Display for Reason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_wire_form_is_the_serde_form() {
        for reason in Reason::ALL {
            assert_eq!(
                serde_json::to_value(reason).unwrap(),
                serde_json::json!(reason.as_str())
            );
            assert_eq!(Reason::parse(reason.as_str()), Some(reason));
        }
    }
}
