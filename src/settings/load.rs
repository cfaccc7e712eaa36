//! Loading: the embedded defaults, then the file, then `TOLLGATE__…`
//! variables, validated once; and the error that names the offending key.

use std::path::Path;

use figment::error::{Actual, Kind};
use figment::providers::{Data, Format, Toml};
use figment::value::{Dict, Map};
use figment::{Figment, Metadata, Profile, Provider};

use super::env::TypedEnv;
use super::{Settings, DEFAULTS};

/// The largest config file read: a file of block lists and limits is some
/// kilobytes; a link to `/dev/zero` or a runaway generator is not read
/// into memory.
pub const MAX_CONFIG_BYTES: u64 = 16 * 1024 * 1024;

/// Why the settings were refused, at start-up or on SIGHUP.
#[derive(Debug, thiserror::Error)]
pub enum SettingsError {
    /// The file named by `--config` / `TOLLGATE_CONFIG` is not there.
    #[error("config file {0} does not exist")]
    MissingFile(String),
    /// A source could not be read or merged, and no single key is to blame
    /// (a TOML syntax error, say). Without the source's lines: they may
    /// hold a secret.
    #[error("{0}")]
    Load(String),
    /// A value is missing, malformed or out of range.
    #[error("invalid setting `{key}`: {message}")]
    Invalid {
        /// The setting, as a config file spells it (`sms.code_ttl`).
        key: String,
        /// What is wrong with it.
        message: String,
    },
}

impl SettingsError {
    pub(crate) fn invalid(key: &str, message: impl Into<String>) -> Self {
        Self::Invalid {
            key: key.to_string(),
            message: message.into(),
        }
    }
}

impl Settings {
    /// The embedded defaults, validated.
    pub fn defaults() -> Result<Self, SettingsError> {
        Self::from_figment(Figment::from(Toml::string(DEFAULTS)))
    }

    /// Defaults, then `file` (when given), then `TOLLGATE__SECTION__KEY` variables.
    /// The file is read as a reload reads it (a regular file of at most
    /// [`MAX_CONFIG_BYTES`]), so that what starts also reloads.
    pub fn load(file: Option<&Path>) -> Result<Self, SettingsError> {
        let Some(path) = file else {
            return Self::with_env(Figment::from(Toml::string(DEFAULTS)));
        };
        if !path.is_file() {
            return Err(SettingsError::MissingFile(path.display().to_string()));
        }
        let text = crate::regular_file::read_to_string(path, MAX_CONFIG_BYTES)
            .map_err(|e| SettingsError::Load(format!("config file {}: {e}", path.display())))?;
        Self::load_text(path, &text)
    }

    /// As [`Settings::load`], with `text` as the content of the config file
    /// at `path`, read once by the caller (a reload checks the text it then
    /// loads: a file rewritten between two reads cannot slip through).
    /// Errors name the file as `load`'s do.
    pub fn load_text(path: &Path, text: &str) -> Result<Self, SettingsError> {
        let file = FileText {
            data: Toml::string(text),
            path,
        };
        Self::with_env(Figment::from(Toml::string(DEFAULTS)).merge(file))
    }

    fn with_env(mut figment: Figment) -> Result<Self, SettingsError> {
        let defaults = Toml::string(DEFAULTS)
            .data()
            .map_err(|e| SettingsError::Load(without_source_lines(&e)))?
            .remove(&Profile::Default)
            .unwrap_or_default();
        figment = figment.merge(TypedEnv::new(defaults));
        Self::from_figment(figment)
    }

    fn from_figment(figment: Figment) -> Result<Self, SettingsError> {
        let settings: Settings = figment.extract().map_err(load_error)?;
        settings.validate()?;
        Ok(settings)
    }

    /// The effective settings as TOML, secrets shown as `"***"`.
    pub fn to_redacted_toml(&self) -> String {
        toml::to_string_pretty(self).unwrap_or_else(|e| format!("# cannot print settings: {e}"))
    }
}

/// A config file's text, read by the caller, named as figment names the
/// file it reads itself.
struct FileText<'a> {
    data: Data<Toml>,
    path: &'a Path,
}

impl Provider for FileText<'_> {
    fn metadata(&self) -> Metadata {
        Metadata::from("TOML file", self.path)
    }

    fn data(&self) -> Result<Map<Profile, Dict>, figment::Error> {
        self.data.data()
    }
}

/// `["email", "admin_alerts_to", "1"]` → `email.admin_alerts_to[1]`.
fn config_key(path: &[String]) -> String {
    let mut key = String::new();
    for part in path {
        if part.bytes().all(|b| b.is_ascii_digit()) && !key.is_empty() {
            key.push_str(&format!("[{part}]"));
        } else {
            if !key.is_empty() {
                key.push('.');
            }
            key.push_str(&part.to_lowercase());
        }
    }
    key
}

/// Names the key as a config file spells it (`sms.code_ttl`), whether the bad
/// value came from the file or from `TOLLGATE__SMS__CODE_TTL`. A value of
/// the wrong type is not repeated: the error goes to stderr and, on reload,
/// to the log, and the value may be a token written in the wrong shape.
fn load_error(error: figment::Error) -> SettingsError {
    if error.path.is_empty() {
        return SettingsError::Load(without_source_lines(&error));
    }
    let key = config_key(&error.path);
    let source = error
        .metadata
        .as_ref()
        .map(|m| format!(" (from {})", m.name))
        .unwrap_or_default();
    SettingsError::Invalid {
        key,
        message: format!("{}{source}", without_value(&error.kind)),
    }
}

/// What is wrong with a value; of the wrong type, its type but not itself.
fn without_value(kind: &Kind) -> String {
    match kind {
        Kind::InvalidType(actual, expected) => {
            format!(
                "invalid type: found {}, expected {expected}",
                type_of(actual)
            )
        }
        Kind::Unsupported(actual) => format!("unsupported type {}", type_of(actual)),
        Kind::UnsupportedKey(actual, expected) => {
            format!(
                "unsupported type {} for a key, expected {expected}",
                type_of(actual)
            )
        }
        // The rest say what is wrong with a value of the right type (`-1`
        // for a count, an unknown `kind`), where the value helps and no
        // secret is written, or name keys and lengths, or are this crate's
        // own messages (durations, sizes, addresses).
        other => other.to_string(),
    }
}

/// `string`, `unsigned int`: figment's words, less the value.
fn type_of(actual: &Actual) -> String {
    match actual {
        Actual::Bool(_) => "bool".into(),
        Actual::Unsigned(_) => "unsigned int".into(),
        Actual::Signed(_) => "signed int".into(),
        Actual::Float(_) => "float".into(),
        Actual::Char(_) => "char".into(),
        Actual::Str(_) => "string".into(),
        Actual::Bytes(_) => "bytes".into(),
        Actual::Other(_) => "value".into(),
        // The rest carry no value.
        other => other.to_string(),
    }
}

/// A syntax error without the lines of the file it quotes (`3 | key =
/// "…"`): the line and column say where, and the line may hold a secret.
fn without_source_lines(error: &figment::Error) -> String {
    error
        .to_string()
        .lines()
        .filter(|line| {
            let quoted = line
                .trim_start()
                .trim_start_matches(|c: char| c.is_ascii_digit());
            !quoted.trim_start().starts_with('|')
        })
        .collect::<Vec<_>>()
        .join(" ")
}

#[cfg(test)]
mod tests {
    use super::*;

    const TOKEN: &str = "s3cr3t-token-0123456789";

    /// A token in the wrong shape, a number or a TOML error on its line:
    /// the error names the key and the place, not the value.
    #[test]
    fn a_value_of_the_wrong_type_is_not_repeated() {
        let dir = tempfile::tempdir().expect("a temporary directory");
        let path = dir.path().join("tollgate.toml");
        for (text, key) in [
            (
                format!("[server]\napi_keys = \"{TOKEN}\"\n"),
                "server.api_keys",
            ),
            (
                format!("[server]\napi_keys = [{{ k = \"{TOKEN}\" }}]\n"),
                "server.api_keys",
            ),
            (
                "[sms]\ncode_secret = 8231749182731948\n".to_string(),
                "sms.code_secret",
            ),
            (format!("[sms]\ncode_secret = \"{TOKEN}\\q\"\n"), "line 2"),
        ] {
            let error = Settings::load_text(&path, &text)
                .expect_err("refused")
                .to_string();
            assert!(error.contains(key), "{error}");
            for secret in [TOKEN, "8231749182731948"] {
                assert!(!error.contains(secret), "{error}");
            }
        }
    }

    /// A file's text loads as the file does, and a bad value in it is
    /// named with the file, word for word as `load` names it.
    #[test]
    fn a_file_read_once_loads_as_the_file() {
        let dir = tempfile::tempdir().expect("a temporary directory");
        let path = dir.path().join("tollgate.toml");
        let good = "[sms]\ncode_length = 8\n[login]\ncaptcha_after = 7\n";
        std::fs::write(&path, good).expect("written");
        let from_file = Settings::load(Some(&path)).expect("loads");
        let from_text = Settings::load_text(&path, good).expect("loads");
        assert_eq!(from_text.to_redacted_toml(), from_file.to_redacted_toml());
        assert_eq!(from_text.sms.code_length, 8);

        let bad = "[sms]\ncode_length = \"eight\"\n";
        std::fs::write(&path, bad).expect("written");
        let from_file = Settings::load(Some(&path)).expect_err("refused");
        let from_text = Settings::load_text(&path, bad).expect_err("refused");
        assert_eq!(from_text.to_string(), from_file.to_string());
        assert!(
            from_text.to_string().contains("sms.code_length"),
            "{from_text}"
        );
    }

    /// A region the phone metadata does not know would allow or deny no
    /// number: refused naming its key, `UK` with its hint; any case of a
    /// known one, and `001`, pass.
    #[test]
    fn regions_the_metadata_does_not_know_are_refused_naming_the_key() {
        let path = std::path::Path::new("tollgate.toml");
        let load =
            |list: &str| Settings::load_text(path, &format!("[sms]\ndenied_regions = [{list}]\n"));
        for good in ["\"GB\"", "\"gb\", \"US\"", "\"001\"", "\"XK\", \"AQ\""] {
            assert!(load(good).is_ok(), "{good}");
        }
        for (bad, key) in [
            ("\"UK\"", "sms.denied_regions[0]"),
            ("\"GB\", \"XX\"", "sms.denied_regions[1]"),
            ("\"EU\"", "sms.denied_regions[0]"),
            ("\"002\"", "sms.denied_regions[0]"),
        ] {
            let error = load(bad).expect_err(bad).to_string();
            assert!(error.contains(key), "{bad}: {error}");
        }
        let uk = load("\"UK\"").expect_err("UK").to_string();
        assert!(uk.contains("\"GB\""), "{uk}");
    }

    #[test]
    fn a_lists_refresh_under_100ms_is_refused() {
        let path = std::path::Path::new("tollgate.toml");
        let load = |every: &str| {
            Settings::load_text(path, &format!("[lists]\nrefresh_interval = \"{every}\"\n"))
        };
        assert!(load("100ms").is_ok());
        for short in ["1ms", "99ms"] {
            let error = load(short).expect_err(short).to_string();
            assert!(error.contains("lists.refresh_interval"), "{error}");
        }
    }

    /// A URL its client could not parse, or a webhook header no request
    /// can carry, stops start-up (and `check-config`) naming its key, not
    /// the first call; the URL's password is not repeated.
    #[test]
    fn urls_and_headers_their_clients_cannot_take_are_refused_naming_the_key() {
        let dir = tempfile::tempdir().expect("a temporary directory");
        let path = dir.path().join("tollgate.toml");
        let redis = |url: &str| {
            format!(
                "[store]\nbackend = \"redis\"\nredis_url = \"{url}\"\n\
                 [sms]\ncode_secret = \"{TOKEN}\"\n"
            )
        };
        let webhook = |url: &str, header: &str| {
            format!(
                "[sms.provider]\nkind = \"webhook\"\nurl = \"{url}\"\n\
                 headers = {{ {header} }}\n"
            )
        };
        let refused = [
            (redis("redis://u:pw-secret@:::::"), "store.redis_url"),
            (redis("redis://h:99999999"), "store.redis_url"),
            (redis("redis://:6379"), "store.redis_url"),
            (redis("redis-cluster://h1:7000,h2:port"), "store.redis_url"),
            // fred splits a node's host from its port at the first colon.
            (
                redis("redis-cluster://h1:7000,[::1]:7002"),
                "store.redis_url",
            ),
            (
                "[audit]\ndatabase_url = \"postgres://u:pw-secret@h:notaport/db\"\n".into(),
                "audit.database_url",
            ),
            (
                webhook("http://u:pw-secret@[::1", "\"X-A\" = \"v\""),
                "sms.provider.url",
            ),
            (
                webhook("http://exa mple.com/", "\"X-A\" = \"v\""),
                "sms.provider.url",
            ),
            (
                webhook("http://h:99999/", "\"X-A\" = \"v\""),
                "sms.provider.url",
            ),
            (
                webhook("http://h/", "\"Bad Header\" = \"v\""),
                "sms.provider.headers.Bad Header",
            ),
            (
                webhook("http://h/", "\"X-A\" = \"a\\nb\""),
                "sms.provider.headers.X-A",
            ),
            (
                "[captcha]\nverify_url = \"http://[::1\"\n".into(),
                "captcha.verify_url",
            ),
            (
                "[email]\nsmtp_url = \"smtp://[::1\"\n".into(),
                "email.smtp_url",
            ),
        ];
        for (text, key) in refused {
            let error = Settings::load_text(&path, &text)
                .expect_err(&text)
                .to_string();
            assert!(error.contains(key), "{text}: {error}");
            assert!(!error.contains("pw-secret"), "{error}");
        }
        let taken = [
            redis("redis://:pw@127.0.0.1:6379/2"),
            redis("rediss://[::1]:6380"),
            redis("redis-cluster://u:p@h1:7000,h2:7001/?x=1"),
            redis("redis-cluster://h1:7000,h2:7001,"),
            redis("redis-cluster://h1:7000?node=h2:7001"),
            // Headers a log provider never sends are not its concern.
            "[sms.provider]\nkind = \"log\"\nheaders = { \"Bad Header\" = \"v\" }\n".into(),
            "[audit]\ndatabase_url = \"sqlite::memory:\"\n".into(),
            "[audit]\ndatabase_url = \"sqlite://audit.db?mode=rwc\"\n".into(),
            "[audit]\ndatabase_url = \"postgresql://u:p@[::1]:5432/db?sslmode=require\"\n".into(),
            webhook("https://hooks.example/sms?t=1", "\"X-Token\" = \"t0k\""),
            "[email]\nsmtp_url = \"smtps://u:p@mail.example:465\"\n".into(),
        ];
        for text in taken {
            Settings::load_text(&path, &text).expect(&text);
        }
    }

    /// An SMTP login goes encrypted, or to a relay on this host; a URL
    /// without one has no secret to lose.
    #[test]
    fn an_smtp_login_is_taken_encrypted_or_to_this_host() {
        let dir = tempfile::tempdir().expect("a temporary directory");
        let path = dir.path().join("tollgate.toml");
        for url in [
            "smtp://u:p@mail.example:587?tls=required",
            "smtps://u:p@mail.example:465",
            "smtp://u:p@127.0.0.1:25",
            "smtp://u:p@[::1]:25",
            "smtp://u:p@localhost:25?tls=opportunistic",
            "smtp://mail.example:25",
        ] {
            let text = format!("[email]\nsmtp_url = \"{url}\"\n");
            Settings::load_text(&path, &text).expect(url);
        }
        for url in [
            "smtp://u:p@mail.example:587",
            "smtp://u:p@mail.example:587?tls=opportunistic",
            // lettre goes by the first `tls`.
            "smtp://u:p@mail.example:587?tls=opportunistic&tls=required",
            "smtp://u@192.0.2.1:587",
        ] {
            let text = format!("[email]\nsmtp_url = \"{url}\"\n");
            let error = Settings::load_text(&path, &text)
                .expect_err(url)
                .to_string();
            assert!(error.contains("email.smtp_url"), "{url}: {error}");
        }
    }

    /// A named admin token's mistake is named: the role that is none of
    /// the three, the missing field, the unknown one; never the token.
    #[test]
    fn a_named_admin_tokens_mistake_is_named() {
        let dir = tempfile::tempdir().expect("a temporary directory");
        let path = dir.path().join("tollgate.toml");
        for (entry, says) in [
            (
                format!("{{ name = \"x\", token = \"{TOKEN}\", role = \"god\" }}"),
                ["`god`", "operator"],
            ),
            (
                format!("{{ token = \"{TOKEN}\", role = \"viewer\" }}"),
                ["missing field", "`name`"],
            ),
            (
                format!("{{ name = \"x\", token = \"{TOKEN}\", roles = [\"viewer\"] }}"),
                ["unknown field", "`roles`"],
            ),
        ] {
            let text = format!("[server]\nadmin_tokens = [\"{TOKEN}-plain\", {entry}]\n");
            let error = Settings::load_text(&path, &text)
                .expect_err(&text)
                .to_string();
            assert!(error.contains("server.admin_tokens"), "{error}");
            for words in says {
                assert!(error.contains(words), "{entry}: {error}");
            }
            assert!(!error.contains(TOKEN), "{error}");
        }
        // A token written as a number is not repeated either.
        for entry in [
            "8231749182731948",
            "{ name = \"x\", token = 8231749182731948, role = \"viewer\" }",
        ] {
            let text = format!("[server]\nadmin_tokens = [{entry}]\n");
            let error = Settings::load_text(&path, &text)
                .expect_err(&text)
                .to_string();
            assert!(error.contains("server.admin_tokens[0]"), "{error}");
            assert!(!error.contains("8231749182731948"), "{error}");
        }
        let text = format!(
            "[server]\nadmin_tokens = [\"{TOKEN}-plain\", \
             {{ name = \"x\", token = \"{TOKEN}\", role = \"viewer\" }}]\n"
        );
        let settings = Settings::load_text(&path, &text).expect("loads");
        assert_eq!(settings.server.admin_tokens.len(), 2);
    }

    /// A send waits for the captcha's and the SMS provider's calls: a
    /// timeout of minutes (a slipped unit) is refused at start-up.
    #[test]
    fn provider_timeouts_past_30s_are_refused() {
        let dir = tempfile::tempdir().expect("a temporary directory");
        let path = dir.path().join("tollgate.toml");
        for (section, key) in [
            ("sms.provider", "sms.provider.timeout"),
            ("captcha", "captcha.timeout"),
        ] {
            let text = format!("[{section}]\ntimeout = \"5m\"\n");
            let error = Settings::load_text(&path, &text).expect_err("refused");
            let error = error.to_string();
            assert!(error.contains(key), "{error}");
            assert!(error.contains("at most 30s"), "{error}");
            let text = format!("[{section}]\ntimeout = \"30s\"\n");
            Settings::load_text(&path, &text).expect("30s loads");
        }
    }

    /// A network is 32 to 64 bits: wider would count registries as one
    /// client, narrower splits the /64 an IP subject is.
    #[test]
    fn network_bits_outside_32_to_64_are_refused() {
        let dir = tempfile::tempdir().expect("a temporary directory");
        let path = dir.path().join("tollgate.toml");
        for bits in [0, 31, 65, 128] {
            let text = format!("[sms]\nnetwork_bits = {bits}\n");
            let error = Settings::load_text(&path, &text).expect_err("refused");
            let error = error.to_string();
            assert!(error.contains("sms.network_bits"), "{error}");
            assert!(error.contains("between 32 and 64"), "{error}");
        }
        for bits in [32, 48, 64] {
            let text = format!("[sms]\nnetwork_bits = {bits}\n");
            let settings = Settings::load_text(&path, &text).expect("loads");
            assert_eq!(settings.sms.network_bits, bits);
        }
    }

    /// Start-up reads the file as a reload does: one past 16 MiB is refused
    /// (it started, and then every reload was refused).
    #[test]
    fn a_config_file_past_16_mib_is_refused_at_start_up() {
        let dir = tempfile::tempdir().expect("a temporary directory");
        let path = dir.path().join("tollgate.toml");
        let mut text = "#".repeat(MAX_CONFIG_BYTES as usize);
        std::fs::write(&path, &text).expect("written");
        Settings::load(Some(&path)).expect("16 MiB of comments load");
        text.push('#');
        std::fs::write(&path, &text).expect("written");
        let error = Settings::load(Some(&path))
            .expect_err("refused")
            .to_string();
        assert!(error.contains("larger than"), "{error}");
    }

    /// `store.timeout` has a ceiling: a slip of a unit (`100m` for `100ms`)
    /// would hold every decision for hours. `audit.flush_interval` has
    /// none: an hour holds a batch back on purpose (the image test's
    /// kill -9 of a queue), and the journal keeps every row meanwhile.
    #[test]
    fn a_store_timeout_of_minutes_is_refused() {
        let dir = tempfile::tempdir().expect("a temporary directory");
        let path = dir.path().join("tollgate.toml");
        for (text, key) in [
            ("[store]\ntimeout = \"100m\"\n", "store.timeout"),
            ("[store]\ntimeout = \"10001ms\"\n", "store.timeout"),
        ] {
            let error = Settings::load_text(&path, text)
                .expect_err(text)
                .to_string();
            assert!(error.contains(key), "{text}: {error}");
        }
        let text = "[store]\ntimeout = \"10s\"\n[audit]\nflush_interval = \"1h\"\n";
        let settings = Settings::load_text(&path, text).expect("loads");
        assert_eq!(settings.store.timeout, std::time::Duration::from_secs(10));
    }

    /// An alert threshold of billions, to mute the alerts, let a flood of
    /// denials grow each rule's list of their times without end.
    #[test]
    fn an_alert_threshold_past_100_000_is_refused() {
        let dir = tempfile::tempdir().expect("a temporary directory");
        let path = dir.path().join("tollgate.toml");
        let error = Settings::load_text(&path, "[email]\nalert_threshold = 100001\n")
            .expect_err("refused")
            .to_string();
        assert!(error.contains("email.alert_threshold"), "{error}");
        let text = "[email]\nalert_threshold = 100000\n";
        let settings = Settings::load_text(&path, text).expect("loads");
        assert_eq!(settings.email.alert_threshold, 100_000);
    }
}
