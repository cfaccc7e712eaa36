//! Values that must never be printed: they serialize and debug-print as `***`.

use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// A key, token or password from the configuration. `Debug` always shows
/// `***`; `check-config` shows `***`, or `""` when it is unset.
#[derive(Clone, Default, PartialEq, Eq)]
pub struct Secret(String);

impl Secret {
    /// Wraps a value that must not be printed.
    pub fn new(value: impl Into<String>) -> Self {
        Self(value.into())
    }
    /// The value itself, for the code that uses it; never log it.
    pub fn expose(&self) -> &str {
        &self.0
    }
    /// Whether the secret is unset.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("\"***\"")
    }
}

impl Serialize for Secret {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        if self.0.is_empty() {
            s.serialize_str("")
        } else {
            s.serialize_str("***")
        }
    }
}

impl<'de> Deserialize<'de> for Secret {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        String::deserialize(d).map(Secret)
    }
}

/// A connection URL whose password is masked when printed
/// (`redis://:***@host:6379`).
#[derive(Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(transparent)]
pub struct SecretUrl(String);

impl SecretUrl {
    /// Wraps a URL whose password must not be printed.
    pub fn new(value: impl Into<String>) -> Self {
        Self(value.into())
    }
    /// The URL as given, password included, for connecting; never log it.
    pub fn expose(&self) -> &str {
        &self.0
    }
    /// The URL with its password replaced by `***`, for logs and `check-config`.
    pub fn masked(&self) -> String {
        mask_url_password(&self.0)
    }
}

impl std::fmt::Debug for SecretUrl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:?}", self.masked())
    }
}

impl Serialize for SecretUrl {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.masked())
    }
}

/// Replaces the password of every `scheme://user:password@host` authority
/// (cluster URLs list several hosts but one authority).
fn mask_url_password(url: &str) -> String {
    let Some(scheme_end) = url.find("://") else {
        return url.to_string();
    };
    let rest = &url[scheme_end + 3..];
    let authority_end = rest.find(['/', '?']).unwrap_or(rest.len());
    let authority = &rest[..authority_end];
    let Some(at) = authority.rfind('@') else {
        return url.to_string();
    };
    let userinfo = &authority[..at];
    let masked_userinfo = match userinfo.find(':') {
        Some(colon) => format!("{}:***", &userinfo[..colon]),
        None => "***".to_string(),
    };
    format!(
        "{}{}@{}",
        &url[..scheme_end + 3],
        masked_userinfo,
        &rest[at + 1..]
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn passwords_in_urls_are_masked() {
        assert_eq!(
            mask_url_password("postgres://app:hunter2@db:5432/tg"),
            "postgres://app:***@db:5432/tg"
        );
        assert_eq!(
            mask_url_password("redis://:pw@h:6379"),
            "redis://:***@h:6379"
        );
        assert_eq!(mask_url_password("redis://h:6379"), "redis://h:6379");
        assert_eq!(
            mask_url_password("sqlite://tollgate-audit.db?mode=rwc"),
            "sqlite://tollgate-audit.db?mode=rwc"
        );
    }

    #[test]
    fn secrets_never_print() {
        let s = Secret::new("abc");
        assert_eq!(format!("{s:?}"), "\"***\"");
        assert_eq!(serde_json::to_string(&s).unwrap(), "\"***\"");
    }
}
