//! Who the admins are: static tokens with a name and a role
//! (`server.admin_tokens`), and single sign-on through an OpenID Connect
//! provider (`[admin.oidc]`).

use std::collections::BTreeMap;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::{duration, Secret, SettingsError};
use crate::domain::admin_role::{Role, Roles};

/// One entry of `server.admin_tokens`: a plain string (as before roles: an
/// admin named after its position, `token:1` for the first, holding
/// `operator` and `auditor`, so it keeps every right it had), or
/// `{ name = "oncall", token = "…", role = "operator" }`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(untagged)]
pub enum AdminToken {
    /// `"<token>"`.
    Plain(Secret),
    /// `{ name, token, role }`.
    Named(NamedAdminToken),
}

/// A string or a table, each read as its own form, so that a table's
/// mistake is named (a missing `name`, an unknown field, a role that is
/// none of the three) rather than serde's "did not match any variant".
impl<'de> Deserialize<'de> for AdminToken {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Form;
        impl<'de> serde::de::Visitor<'de> for Form {
            type Value = AdminToken;

            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a token string or a table { name, token, role }")
            }

            fn visit_str<E: serde::de::Error>(self, token: &str) -> Result<AdminToken, E> {
                Ok(AdminToken::plain(token))
            }

            fn visit_map<M: serde::de::MapAccess<'de>>(
                self,
                map: M,
            ) -> Result<AdminToken, M::Error> {
                let table = serde::de::value::MapAccessDeserializer::new(map);
                NamedAdminToken::deserialize(table).map(AdminToken::Named)
            }
        }
        d.deserialize_any(Form)
    }
}

/// A static admin token with its admin's name and role.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NamedAdminToken {
    /// Names the admin in audit rows (`token:<name>`): letters, digits, `.`,
    /// `_`, `-`; at most 64.
    pub name: String,
    /// The secret, at least 16 characters.
    pub token: Secret,
    /// `viewer`, `operator` or `auditor`.
    pub role: Role,
}

impl AdminToken {
    /// A plain-string token (tests, old configs).
    pub fn plain(token: impl Into<String>) -> Self {
        Self::Plain(Secret::new(token))
    }

    /// The secret the admin presents.
    pub fn secret(&self) -> &Secret {
        match self {
            Self::Plain(secret) => secret,
            Self::Named(named) => &named.token,
        }
    }

    /// The admin's name: its own, or its 1-based position for a plain one.
    pub fn name(&self, index: usize) -> String {
        match self {
            Self::Plain(_) => (index + 1).to_string(),
            Self::Named(named) => named.name.clone(),
        }
    }

    /// The roles it holds.
    pub fn roles(&self) -> Roles {
        match self {
            Self::Plain(_) => Roles::legacy_token(),
            Self::Named(named) => Roles::of(&[named.role]),
        }
    }
}

/// `[admin]`: how admins sign in besides static tokens.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AdminSettings {
    /// `[admin.oidc]`: single sign-on for the console and JWT bearer tokens
    /// for the admin API.
    #[serde(default)]
    pub oidc: OidcSettings,
}

/// `[admin.oidc]`: an OpenID Connect provider (Keycloak, Okta, Google, …).
/// Off while `issuer_url` is empty (the default).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OidcSettings {
    /// The issuer, exactly as its discovery document and tokens name it
    /// (`https://sso.example.com/realms/ops`); `/.well-known/openid-configuration`
    /// is read below it. https, or http on a loopback address only.
    pub issuer_url: String,
    /// The client tollgate is at the provider.
    pub client_id: String,
    /// The client's secret (a confidential client); also keys the console's
    /// cookies, so changing it signs everyone out. At least 16 characters.
    pub client_secret: Secret,
    /// Where the provider sends the browser back: tollgate's address
    /// followed by `/admin/oidc/callback`, registered at the provider.
    pub redirect_url: String,
    /// Scopes asked for; `openid` is always asked for. Default
    /// `["openid", "email"]`.
    pub scopes: Vec<String>,
    /// The claim of the ID token (and of JWT access tokens) holding the
    /// admin's groups or roles: a string or a list of strings, a dotted path
    /// for a nested one (`realm_access.roles`). Default `roles`.
    pub roles_claim: String,
    /// Which claim value grants which tollgate role:
    /// `{ "tollgate-operators" = "operator" }`. A user with no mapped value
    /// is refused.
    pub role_map: BTreeMap<String, Role>,
    /// The audience (`aud`) of JWT access tokens the admin API accepts as
    /// `Authorization: Bearer`; empty (the default): none is accepted.
    pub api_audience: String,
    /// How long a console session lasts; default 8 hours.
    #[serde(with = "duration")]
    pub session_ttl: Duration,
    /// Upper bound of one call to the provider (discovery, keys, token).
    #[serde(with = "duration")]
    pub timeout: Duration,
}

impl Default for OidcSettings {
    fn default() -> Self {
        Self {
            issuer_url: String::new(),
            client_id: String::new(),
            client_secret: Secret::default(),
            redirect_url: String::new(),
            scopes: vec!["openid".into(), "email".into()],
            roles_claim: "roles".into(),
            role_map: BTreeMap::new(),
            api_audience: String::new(),
            session_ttl: Duration::from_secs(8 * 3600),
            timeout: Duration::from_secs(5),
        }
    }
}

/// The path of the console's callback; `redirect_url` must end in it.
pub const CALLBACK_PATH: &str = "/admin/oidc/callback";

impl OidcSettings {
    /// Whether single sign-on is configured.
    pub fn enabled(&self) -> bool {
        !self.issuer_url.is_empty()
    }
}

type Check = Result<(), SettingsError>;

/// https anywhere, http only to a loopback host (a provider on the same
/// machine, a test).
fn provider_url(key: &str, raw: &str) -> Check {
    let bad = |why: &str| Err(SettingsError::invalid(key, why));
    let Ok(url) = url::Url::parse(raw) else {
        return bad("is not an absolute URL");
    };
    let loopback = match url.host() {
        Some(url::Host::Domain(d)) => d == "localhost",
        Some(url::Host::Ipv4(ip)) => ip.is_loopback(),
        Some(url::Host::Ipv6(ip)) => ip.is_loopback(),
        None => return bad("has no host"),
    };
    match url.scheme() {
        "https" => Ok(()),
        "http" if loopback => Ok(()),
        _ => bad("must be an https URL (http only on a loopback address)"),
    }
}

/// Static tokens: names well-formed and unique.
pub(super) fn validate_tokens(tokens: &[AdminToken]) -> Check {
    let mut seen = std::collections::BTreeSet::new();
    for (i, token) in tokens.iter().enumerate() {
        let name = token.name(i);
        let well_formed = !name.is_empty()
            && name.len() <= 64
            && name
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'));
        if !well_formed {
            return Err(SettingsError::invalid(
                &format!("server.admin_tokens[{i}].name"),
                "must be 1 to 64 letters, digits, `.`, `_` or `-`",
            ));
        }
        if !seen.insert(name.clone()) {
            return Err(SettingsError::invalid(
                &format!("server.admin_tokens[{i}].name"),
                format!(
                    "names the admin \"token:{name}\" as another entry does \
                     (a plain-string token is named after its position, from 1)"
                ),
            ));
        }
    }
    Ok(())
}

/// `[admin.oidc]`, when an issuer is set.
pub(super) fn validate_oidc(oidc: &OidcSettings) -> Check {
    super::duration::at_least_a_millisecond("admin.oidc.timeout", oidc.timeout)?;
    if oidc.session_ttl < Duration::from_secs(60)
        || oidc.session_ttl > Duration::from_secs(7 * 86400)
    {
        return Err(SettingsError::invalid(
            "admin.oidc.session_ttl",
            "must be between 1m and 7d",
        ));
    }
    if !oidc.enabled() {
        return Ok(());
    }
    provider_url("admin.oidc.issuer_url", &oidc.issuer_url)?;
    provider_url("admin.oidc.redirect_url", &oidc.redirect_url)?;
    let callback = url::Url::parse(&oidc.redirect_url).map(|u| u.path().to_string());
    if callback.as_deref() != Ok(CALLBACK_PATH) {
        return Err(SettingsError::invalid(
            "admin.oidc.redirect_url",
            format!("must be tollgate's address followed by {CALLBACK_PATH}"),
        ));
    }
    if oidc.client_id.is_empty() {
        return Err(SettingsError::invalid(
            "admin.oidc.client_id",
            "is required with admin.oidc.issuer_url",
        ));
    }
    if oidc.api_audience == oidc.client_id {
        // Every ID token the console gets is for the client id: the API
        // would take an ID token (kept in more places) as an access token.
        return Err(SettingsError::invalid(
            "admin.oidc.api_audience",
            "must differ from admin.oidc.client_id (the audience of ID tokens)",
        ));
    }
    if oidc.client_secret.expose().chars().count() < 16 {
        return Err(SettingsError::invalid(
            "admin.oidc.client_secret",
            "is required with admin.oidc.issuer_url: the client's secret, at least 16 characters",
        ));
    }
    if oidc.roles_claim.is_empty() || oidc.roles_claim.split('.').any(str::is_empty) {
        return Err(SettingsError::invalid(
            "admin.oidc.roles_claim",
            "must name a claim (`roles`, or a dotted path such as `realm_access.roles`)",
        ));
    }
    if oidc.role_map.is_empty() {
        return Err(SettingsError::invalid(
            "admin.oidc.role_map",
            "must map at least one claim value to a role (viewer, operator, auditor)",
        ));
    }
    // Addresses are matched without (ASCII) case: two keys that differ only
    // in case would give one person the role of whichever case arrived.
    if oidc.roles_claim == "email" {
        let keys: Vec<&String> = oidc.role_map.keys().collect();
        for (i, key) in keys.iter().enumerate() {
            if let Some(twin) = keys[i + 1..].iter().find(|k| k.eq_ignore_ascii_case(key)) {
                return Err(SettingsError::invalid(
                    "admin.oidc.role_map",
                    format!("{key:?} and {twin:?} are one address: addresses match without case"),
                ));
            }
        }
    }
    if let Some(i) = oidc
        .scopes
        .iter()
        .position(|s| s.is_empty() || s.contains(char::is_whitespace))
    {
        return Err(SettingsError::invalid(
            &format!("admin.oidc.scopes[{i}]"),
            "must be one scope, without spaces",
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plain_and_named_tokens_read_from_toml() {
        #[derive(Deserialize)]
        struct Server {
            admin_tokens: Vec<AdminToken>,
        }
        let server: Server = toml::from_str(
            r#"admin_tokens = ["plain-token-0123456789", { name = "oncall", token = "oncall-token-0123456789", role = "viewer" }]"#,
        )
        .unwrap();
        let [plain, named] = &server.admin_tokens[..] else {
            panic!("two tokens")
        };
        assert_eq!(plain.name(0), "1");
        assert_eq!(plain.roles(), Roles::legacy_token());
        assert_eq!(named.name(1), "oncall");
        assert_eq!(named.roles(), Roles::of(&[Role::Viewer]));
        assert_eq!(named.secret().expose(), "oncall-token-0123456789");
        let printed = toml::to_string(&Server2 {
            admin_tokens: server.admin_tokens.clone(),
        })
        .unwrap();
        assert!(!printed.contains("0123456789"), "{printed}");
        assert!(
            printed.contains("oncall") && printed.contains("viewer"),
            "{printed}"
        );
    }

    #[derive(Serialize)]
    struct Server2 {
        admin_tokens: Vec<AdminToken>,
    }

    #[test]
    fn token_names_must_be_unique_and_plain() {
        let named = |name: &str| {
            AdminToken::Named(NamedAdminToken {
                name: name.into(),
                token: Secret::new("x".repeat(20)),
                role: Role::Viewer,
            })
        };
        assert!(validate_tokens(&[AdminToken::plain("a"), named("oncall")]).is_ok());
        let clash = validate_tokens(&[AdminToken::plain("a"), named("1")]).unwrap_err();
        assert!(
            clash.to_string().contains("server.admin_tokens[1].name"),
            "{clash}"
        );
        let bad = validate_tokens(&[named("on call")]).unwrap_err();
        assert!(
            bad.to_string().contains("server.admin_tokens[0].name"),
            "{bad}"
        );
    }

    #[test]
    fn oidc_settings_are_checked_naming_the_key() {
        let good = OidcSettings {
            issuer_url: "https://sso.example.com/realms/ops".into(),
            client_id: "tollgate".into(),
            client_secret: Secret::new("s".repeat(32)),
            redirect_url: "https://tollgate.example.com/admin/oidc/callback".into(),
            role_map: [("ops".to_string(), Role::Operator)].into(),
            ..OidcSettings::default()
        };
        assert!(validate_oidc(&good).is_ok());
        assert!(validate_oidc(&OidcSettings::default()).is_ok(), "off");
        type Spoil = fn(&mut OidcSettings);
        let cases: [(&str, Spoil); 10] = [
            ("admin.oidc.issuer_url", |o| {
                o.issuer_url = "http://sso.example.com".into()
            }),
            ("admin.oidc.issuer_url", |o| {
                o.issuer_url = "sso.example.com".into()
            }),
            ("admin.oidc.redirect_url", |o| {
                o.redirect_url = "https://tollgate.example.com/callback".into()
            }),
            ("admin.oidc.client_id", |o| o.client_id.clear()),
            ("admin.oidc.client_secret", |o| {
                o.client_secret = Secret::new("short")
            }),
            ("admin.oidc.role_map", |o| o.role_map.clear()),
            ("admin.oidc.api_audience", |o| {
                o.api_audience = o.client_id.clone()
            }),
            ("admin.oidc.roles_claim", |o| {
                o.roles_claim = "realm_access.".into()
            }),
            ("admin.oidc.session_ttl", |o| {
                o.session_ttl = Duration::from_secs(1)
            }),
            ("admin.oidc.role_map", |o| {
                o.roles_claim = "email".into();
                o.role_map = [
                    ("ann@example.com".to_string(), Role::Viewer),
                    ("Ann@Example.com".to_string(), Role::Operator),
                ]
                .into();
            }),
        ];
        for (key, spoil) in cases {
            let mut bad = good.clone();
            spoil(&mut bad);
            let error = validate_oidc(&bad).unwrap_err().to_string();
            assert!(error.contains(&format!("`{key}`")), "{key}: {error}");
        }
        let mut local = good.clone();
        local.issuer_url = "http://127.0.0.1:9000".into();
        local.redirect_url = "http://localhost:8080/admin/oidc/callback".into();
        assert!(validate_oidc(&local).is_ok(), "http on loopback");
        let mut groups = good.clone();
        groups.roles_claim = "groups".into();
        groups.role_map = [
            ("Ops".to_string(), Role::Viewer),
            ("ops".to_string(), Role::Operator),
        ]
        .into();
        assert!(
            validate_oidc(&groups).is_ok(),
            "group names keep their case"
        );
    }
}
