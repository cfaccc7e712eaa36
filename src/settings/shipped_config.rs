//! The config file the Debian package installs as `/etc/tollgate/tollgate.toml`
//! (`packaging/debian/tollgate.toml`). It must load as shipped, keep the
//! state where the systemd unit lets the service write, and every example it
//! shows commented out must stay a key tollgate knows with a value it takes:
//! otherwise the file operators copy from rots as the settings change.
//!
//! An example is a line `# key = value` (a bare lower-case key, then ` = `);
//! other comment lines are prose. An example that no longer parses as TOML
//! is reported, not taken for prose.

use figment::providers::{Format, Toml};
use figment::Figment;

use super::{Settings, SettingsError, SmsProviderKind, StoreBackend, DEFAULTS};

const SHIPPED: &str = include_str!("../../packaging/debian/tollgate.toml");

/// The unit's `StateDirectory=tollgate`: the only place, besides /tmp, where
/// `ProtectSystem=strict` lets the service write.
const STATE_DIR: &str = "/var/lib/tollgate/";

/// A commented-out `key = value` line of the file.
struct Example<'a> {
    /// Index of the line in the file.
    index: usize,
    /// The table it belongs to (`sms.provider`), from the last `[…]` above it.
    section: String,
    key: &'a str,
    /// The line without its `# `.
    text: &'a str,
}

impl Example<'_> {
    /// `sms.provider.kind`, as errors name keys.
    fn full_key(&self) -> String {
        format!("{}.{}", self.section, self.key)
    }
}

fn header(line: &str) -> Option<String> {
    let name = line.trim().strip_prefix('[')?.strip_suffix(']')?;
    Some(name.trim().to_string())
}

/// `key` when `text` starts with `key = ` and `key` is a bare lower-case key.
fn assigned_key(text: &str) -> Option<&str> {
    let (key, _) = text.split_once(" = ")?;
    let bare = !key.is_empty() && key.bytes().all(|b| b.is_ascii_lowercase() || b == b'_');
    bare.then_some(key)
}

fn examples(file: &str) -> Vec<Example<'_>> {
    let mut section = String::new();
    let mut found = Vec::new();
    for (index, line) in file.lines().enumerate() {
        if let Some(name) = header(line) {
            section = name;
        } else if let Some(text) = line.strip_prefix("# ") {
            if let Some(key) = assigned_key(text) {
                found.push(Example {
                    index,
                    section: section.clone(),
                    key,
                    text,
                });
            }
        }
    }
    found
}

/// The file with `example` uncommented in place of the active line(s) that
/// set the same key in the same table.
fn with_example(file: &str, example: &Example) -> String {
    let mut section = String::new();
    let mut out = String::new();
    for (index, line) in file.lines().enumerate() {
        if let Some(name) = header(line) {
            section.clone_from(&name);
        }
        let replaced = section == example.section && assigned_key(line) == Some(example.key);
        if index == example.index {
            out.push_str(example.text);
        } else if !replaced {
            out.push_str(line);
        }
        out.push('\n');
    }
    out
}

fn settings_from(file: &str) -> Result<Settings, String> {
    Figment::from(Toml::string(DEFAULTS))
        .merge(Toml::string(file))
        .extract::<Settings>()
        .map_err(|e| e.to_string())
}

/// What is wrong with the examples of `file`, one message per bad line. An
/// example must load; validation may then refuse only *another* key (the
/// `kind = "twilio"` example alone lacks `account_sid`), never its own.
fn example_problems(file: &str) -> Vec<String> {
    let mut problems = Vec::new();
    for example in examples(file) {
        let line = example.index + 1;
        let key = example.full_key();
        let settings = match settings_from(&with_example(file, &example)) {
            Ok(settings) => settings,
            Err(e) => {
                problems.push(format!("line {line} `{}`: {e}", example.text));
                continue;
            }
        };
        if let Err(SettingsError::Invalid { key: bad, message }) = settings.validate() {
            let own = bad == key
                || bad.starts_with(&format!("{key}["))
                || bad.starts_with(&format!("{key}."));
            if own {
                problems.push(format!("line {line} `{}`: {bad}: {message}", example.text));
            }
        }
    }
    problems
}

#[test]
fn the_shipped_file_loads_and_keeps_state_in_the_state_directory() {
    let settings = settings_from(SHIPPED).expect("the shipped file loads");
    settings.validate().expect("the shipped file is valid");

    let database = settings.audit.database_url.expose();
    let path = database.strip_prefix("sqlite://").unwrap_or_default();
    assert!(
        path.starts_with(STATE_DIR),
        "audit.database_url {database:?} is not under {STATE_DIR}"
    );
    assert!(
        settings.audit.spool_dir.starts_with(STATE_DIR),
        "audit.spool_dir {:?}",
        settings.audit.spool_dir
    );
    // It must run on a host with neither Redis nor PostgreSQL installed.
    assert_eq!(settings.store.backend, StoreBackend::Memory);
    assert_eq!(settings.sms.provider.kind, SmsProviderKind::Log);
}

#[test]
fn every_commented_out_example_of_the_shipped_file_is_a_valid_setting() {
    let found = examples(SHIPPED);
    // Every section shows its production settings; far fewer means the
    // parser stopped recognising them.
    assert!(found.len() > 60, "only {} examples found", found.len());
    assert_eq!(example_problems(SHIPPED), Vec::<String>::new());
}

#[test]
fn a_misspelt_mistyped_or_invalid_example_is_reported_by_its_line() {
    let file = "\
[server]
bind = \"127.0.0.1:8080\"
# Prose is not an example: it does not read as key = value.
# bind = \"0.0.0.0:8080\"
# bnid = \"0.0.0.0:8080\"
# bind = 0.0.0.0:8080
[login]
# lock_after = 0
[sms.provider]
# kind = \"twilio\"
# kind = \"carrier-pigeon\"
";
    let problems = example_problems(file);
    let lines: Vec<&str> = problems
        .iter()
        .filter_map(|p| p.split('`').next())
        .collect();
    assert_eq!(
        lines,
        ["line 5 ", "line 6 ", "line 8 ", "line 11 "],
        "{problems:#?}"
    );
    assert!(problems[0].contains("bnid"), "{}", problems[0]);
    assert!(problems[2].contains("login.lock_after"), "{}", problems[2]);
}
