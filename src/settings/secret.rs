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

/// A URL that may carry a secret: a password in its authority
/// (`redis://:pw@host`, `http://user:pw@host`) or in its query
/// (`postgres://host/db?password=pw`, `https://hook?token=t`). Printed
/// (`Debug`, `Serialize`, so `check-config`) and logged only masked; the
/// code that connects takes [`SecretUrl::expose`].
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
    /// Whether the URL is unset.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
    /// The URL with its password and secret query values replaced by `***`,
    /// for logs and `check-config`.
    pub fn masked(&self) -> String {
        mask_url(&self.0)
    }
}

impl From<String> for SecretUrl {
    fn from(url: String) -> Self {
        Self(url)
    }
}

impl From<&str> for SecretUrl {
    fn from(url: &str) -> Self {
        Self(url.to_string())
    }
}

impl std::fmt::Debug for SecretUrl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:?}", self.masked())
    }
}

impl std::fmt::Display for SecretUrl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.masked())
    }
}

impl Serialize for SecretUrl {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.masked())
    }
}

/// Query parameters whose value is a secret, compared without case; a name
/// that ends in `_token`, `_key`, `_secret` or `_password` (`access_token`,
/// `client_secret`) is one too.
const SECRET_PARAMS: [&str; 10] = [
    "password",
    "pass",
    "pwd",
    "secret",
    "token",
    "key",
    "api_key",
    "apikey",
    "auth",
    "sslpassword",
];
const SECRET_SUFFIXES: [&str; 4] = ["_token", "_key", "_secret", "_password"];

fn secret_param(name: &str) -> bool {
    // As a server reads it: `pass%77ord` is `password`.
    let name = url::form_urlencoded::parse(name.as_bytes())
        .next()
        .map_or_else(String::new, |(decoded, _)| decoded.to_ascii_lowercase());
    SECRET_PARAMS.contains(&name.as_str()) || SECRET_SUFFIXES.iter().any(|s| name.ends_with(s))
}

/// `url` with the password of its `scheme://user:password@host` authority
/// (cluster URLs list several hosts but one authority; userinfo without a
/// colon is taken for a token and masked whole) and the values of secret
/// query parameters replaced by `***`.
pub fn mask_url(url: &str) -> String {
    let (before_query, query) = match url.split_once('?') {
        Some((head, query)) => (head, Some(query)),
        None => (url, None),
    };
    let mut masked = mask_userinfo(before_query);
    if let Some(query) = query {
        let (query, fragment) = match query.split_once('#') {
            Some((q, f)) => (q, Some(f)),
            None => (query, None),
        };
        masked.push('?');
        let pairs: Vec<String> = query
            .split('&')
            .map(|pair| match pair.split_once('=') {
                Some((name, _)) if secret_param(name) => format!("{name}=***"),
                _ => pair.to_string(),
            })
            .collect();
        masked.push_str(&pairs.join("&"));
        if let Some(fragment) = fragment {
            masked.push('#');
            masked.push_str(fragment);
        }
    }
    masked
}

fn mask_userinfo(url: &str) -> String {
    let Some(scheme_end) = url.find("://") else {
        return url.to_string();
    };
    let rest = &url[scheme_end + 3..];
    let authority_end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
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
            mask_url("postgres://app:hunter2@db:5432/tg"),
            "postgres://app:***@db:5432/tg"
        );
        assert_eq!(mask_url("redis://:pw@h:6379"), "redis://:***@h:6379");
        assert_eq!(mask_url("redis://h:6379"), "redis://h:6379");
        assert_eq!(
            mask_url("https://sms.example/send?pass%77ord=hunter2&PASS%57ORD=x&user=a"),
            "https://sms.example/send?pass%77ord=***&PASS%57ORD=***&user=a"
        );
        assert_eq!(
            mask_url("https://h/?client%5Fsecret=s&access+token=t"),
            "https://h/?client%5Fsecret=***&access+token=t"
        );
        assert_eq!(
            mask_url("sqlite://tollgate-audit.db?mode=rwc"),
            "sqlite://tollgate-audit.db?mode=rwc"
        );
    }

    #[test]
    fn secret_query_parameters_are_masked_whatever_their_case() {
        for (url, masked) in [
            (
                "postgres://db/tg?sslmode=require&password=hunter2",
                "postgres://db/tg?sslmode=require&password=***",
            ),
            (
                "https://hooks.example/sms?Token=t0k&tenant=acme&API_KEY=k",
                "https://hooks.example/sms?Token=***&tenant=acme&API_KEY=***",
            ),
            (
                "postgres://db/tg?sslpassword=x&application_name=tg",
                "postgres://db/tg?sslpassword=***&application_name=tg",
            ),
            (
                "https://u:p@h/x?access_token=a&pwd=b#frag",
                "https://u:***@h/x?access_token=***&pwd=***#frag",
            ),
            ("https://TOKEN@h/x", "https://***@h/x"),
            ("http://h/x?key", "http://h/x?key"),
            ("", ""),
        ] {
            assert_eq!(mask_url(url), masked, "{url}");
        }
    }

    #[test]
    fn secrets_never_print() {
        let s = Secret::new("abc");
        assert_eq!(format!("{s:?}"), "\"***\"");
        assert_eq!(serde_json::to_string(&s).unwrap(), "\"***\"");
    }
}
