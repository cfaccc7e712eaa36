//! `TOLLGATE__SECTION__KEY` variables, typed by what the compiled-in defaults
//! say each key is.
//!
//! figment's own `Env` provider guesses a type from the text alone, so
//! `TOLLGATE__SMS__PROVIDER__FROM=+15005550006` became the integer
//! 15005550006 (refused: a string was expected) and an all-digit secret
//! `007` the number 7 (its text lost). Here a key whose default is a string
//! keeps the variable's exact text; a key whose default is a list of strings
//! (or an empty list) takes `[a, b]` as a list of exact texts; every other
//! key the defaults name (numbers, booleans, tables, lists of tables) is read
//! as figment reads it. A key the defaults do not name (`server.admin_bind`,
//! `sms.templates_dir`, a webhook header) is text too, unless written as a
//! list `[…]` or a table `{…}`, or one of the connection numbers they leave
//! unset (`UNSET_NUMBERS`: `server.workers`, the connection caps). A value
//! in double quotes is figment's quoted string, escapes and all, as before.

use figment::value::{Dict, Map, Value};
use figment::{Error, Metadata, Profile, Provider};

/// Keys the defaults leave unset whose values are numbers: read as figment
/// reads them, where another unset key's value is text.
const UNSET_NUMBERS: &[&str] = &[
    "server.max_connections",
    "server.admin_max_connections",
    "server.max_connections_per_ip",
    "server.admin_max_connections_per_ip",
    "server.workers",
];

/// The `TOLLGATE__` variables, nested by `__`, typed by `defaults`.
pub(super) struct TypedEnv {
    env: figment::providers::Env,
    defaults: Dict,
}

impl TypedEnv {
    /// `TOLLGATE__…` variables, read against the defaults `defaults` holds.
    pub(super) fn new(defaults: Dict) -> Self {
        Self {
            env: figment::providers::Env::prefixed("TOLLGATE__").split("__"),
            defaults,
        }
    }

    fn typed(&self, key: &str, raw: &str) -> Value {
        let trimmed = raw.trim();
        let figment = || raw.parse::<Value>().unwrap_or_else(|e| match e {});
        match find(&self.defaults, key) {
            Some(Value::String(..)) => text(raw),
            // `server.admin_tokens` also takes tables: `[{ name = "…", … }]`.
            Some(Value::Array(_, items))
                if items.iter().all(|v| matches!(v, Value::String(..)))
                    && !lists_tables(trimmed) =>
            {
                texts(trimmed).map_or_else(figment, Value::from)
            }
            Some(_) => figment(),
            None if UNSET_NUMBERS.contains(&key) => figment(),
            None if trimmed.starts_with(['[', '{']) => figment(),
            None => text(raw),
        }
    }
}

impl Provider for TypedEnv {
    fn metadata(&self) -> Metadata {
        self.env.metadata()
    }

    fn data(&self) -> Result<Map<Profile, Dict>, Error> {
        for (name, _) in std::env::vars_os() {
            let name = name.to_string_lossy();
            if let Some(why) = misnamed(&name, &self.defaults) {
                return Err(Error::from(why));
            }
        }
        let mut dict = Dict::new();
        for (key, raw) in self.env.iter() {
            let value = self.typed(key.as_str(), &raw);
            insert(&mut dict, key.as_str(), value);
        }
        Ok(Profile::Default.collect(dict))
    }
}

/// Why the variable `name` is a setting figment would pass over without a
/// word, if it is one: `TOLLGATE__` with an empty segment
/// (`TOLLGATE__SMS____CODE_TTL`, a trailing `__`), or `TOLLGATE_` with one
/// underscore before a section and `__` (`TOLLGATE_SMS__CODE_TTL`). Other
/// `TOLLGATE_…` variables belong to the scripts and tests, not here.
fn misnamed(name: &str, defaults: &Dict) -> Option<String> {
    let upper = name.to_ascii_uppercase();
    if let Some(key) = upper.strip_prefix("TOLLGATE__") {
        let empty = key.split("__").any(|segment| segment.trim().is_empty());
        return empty.then(|| {
            format!(
                "the environment variable {name} has an empty segment (`__` twice in a row, \
                 or at the end) and would be ignored: write TOLLGATE__SECTION__KEY"
            )
        });
    }
    let rest = upper.strip_prefix("TOLLGATE_")?;
    let (section, key) = rest.split_once("__")?;
    defaults
        .contains_key(&section.to_ascii_lowercase())
        .then(|| {
            format!(
                "the environment variable {name} has one underscore after TOLLGATE and would be \
             ignored: did you mean TOLLGATE__{section}__{key}?"
            )
        })
}

/// The default value at a dotted key (`sms.provider.from`).
fn find<'a>(defaults: &'a Dict, key: &str) -> Option<&'a Value> {
    let (first, rest) = key.split_once('.').unwrap_or((key, ""));
    let value = defaults.get(first)?;
    if rest.is_empty() {
        return Some(value);
    }
    match value {
        Value::Dict(_, inner) => find(inner, rest),
        _ => None,
    }
}

/// Put `value` at the dotted `key`, beside what is there already.
fn insert(dict: &mut Dict, key: &str, value: Value) {
    match key.split_once('.') {
        None => {
            dict.insert(key.to_string(), value);
        }
        Some((first, rest)) => {
            let entry = dict
                .entry(first.to_string())
                .or_insert_with(|| Value::from(Dict::new()));
            if !matches!(entry, Value::Dict(..)) {
                *entry = Value::from(Dict::new());
            }
            if let Value::Dict(_, inner) = entry {
                insert(inner, rest, value);
            }
        }
    }
}

/// A string as given, or figment's reading of a `"quoted"` one.
fn text(raw: &str) -> Value {
    let trimmed = raw.trim();
    if trimmed.len() >= 2 && trimmed.starts_with('"') && trimmed.ends_with('"') {
        if let Ok(quoted @ Value::String(..)) = trimmed.parse::<Value>() {
            return quoted;
        }
    }
    Value::from(raw.to_string())
}

/// Whether the list `raw` has a table among its elements: a `{` that opens
/// an element (after `[` or a `,`), outside double quotes.
fn lists_tables(raw: &str) -> bool {
    let (mut quoted, mut escaped, mut opens) = (false, false, false);
    for c in raw.chars() {
        match c {
            _ if escaped => escaped = false,
            '\\' if quoted => escaped = true,
            '"' => quoted = !quoted,
            '{' if !quoted && opens => return true,
            _ => {}
        }
        if !quoted && !c.is_whitespace() {
            opens = matches!(c, '[' | ',');
        }
    }
    false
}

/// `[a, "b, c", 007]` as its elements' texts (`a`, `b, c`, `007`): commas
/// inside double quotes do not separate. `None` when `raw` is not a list.
fn texts(raw: &str) -> Option<Vec<Value>> {
    let inner = raw.strip_prefix('[')?.strip_suffix(']')?;
    let mut items = Vec::new();
    let (mut start, mut quoted, mut escaped) = (0, false, false);
    for (i, c) in inner.char_indices() {
        match c {
            _ if escaped => escaped = false,
            '\\' if quoted => escaped = true,
            '"' => quoted = !quoted,
            ',' if !quoted => {
                items.push(&inner[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    items.push(&inner[start..]);
    let last = items.len() - 1;
    Some(
        items
            .into_iter()
            .map(str::trim)
            .enumerate()
            // `[]` and a trailing comma leave one empty piece at the end; an
            // empty one elsewhere (`[a,,b]`) is kept, for the setting's own
            // check to refuse rather than to vanish unseen.
            .filter(|(i, item)| !(item.is_empty() && (*i == last || inner.trim().is_empty())))
            .map(|(_, item)| text(item))
            .collect(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn defaults() -> Dict {
        use figment::providers::{Format, Toml};
        let data = Toml::string(super::super::DEFAULTS).data().unwrap();
        data.get(&Profile::Default).cloned().unwrap()
    }

    fn typed(key: &str, raw: &str) -> Value {
        TypedEnv::new(defaults()).typed(key, raw)
    }

    /// Variables figment would pass over silently are named; the scripts'
    /// and tests' own `TOLLGATE_…` variables are not settings.
    #[test]
    fn misnamed_setting_variables_are_named_and_others_left_alone() {
        let defaults = defaults();
        for name in [
            "TOLLGATE__SMS____CODE_TTL",
            "TOLLGATE__SMS__CODE_TTL__",
            "TOLLGATE__SMS__ __CODE_TTL",
            "TOLLGATE_SMS__CODE_TTL",
            "tollgate_server__bind",
        ] {
            let why = misnamed(name, &defaults).unwrap_or_default();
            assert!(why.contains(name), "{name}: {why:?}");
        }
        let one = misnamed("TOLLGATE_SMS__CODE_TTL", &defaults).unwrap_or_default();
        assert!(one.contains("TOLLGATE__SMS__CODE_TTL?"), "{one}");
        for name in [
            "TOLLGATE__SMS__CODE_TTL",
            "TOLLGATE__SMS__PROVIDER__HEADERS__X_API_KEY",
            "TOLLGATE_CONFIG",
            "TOLLGATE_TEST_REDIS_URL",
            "TOLLGATE_NOT_A_SECTION__X",
            "PATH",
        ] {
            assert_eq!(misnamed(name, &defaults), None, "{name}");
        }
    }

    #[test]
    fn string_keys_keep_the_exact_text() {
        for (key, raw) in [
            ("sms.provider.from", "+15005550006"),
            ("sms.code_secret", "007"),
            ("sms.code_secret", "12345678901234567890123"),
            ("captcha.secret", "true"),
            ("sms.provider.auth_token", "a,b{c}[d]"),
            ("server.admin_bind", "127.0.0.1:9000"),
            ("sms.provider.headers.x-api-key", "0042"),
        ] {
            assert_eq!(typed(key, raw), Value::from(raw), "{key}={raw}");
        }
        assert_eq!(
            typed("sms.provider.from", r#""+1 \"quoted\"""#),
            Value::from(r#"+1 "quoted""#)
        );
    }

    #[test]
    fn other_keys_are_read_as_before() {
        assert_eq!(
            typed("sms.code_length", "8").deserialize::<u32>().ok(),
            Some(8)
        );
        let fraction = typed("sms.pumping.min_conversion", "0.5");
        assert_eq!(fraction.deserialize::<f64>().ok(), Some(0.5));
        assert_eq!(typed("server.watch_config", "false"), Value::from(false));
        let limits = typed("sms.ip_limits", r#"[{limit=3, window="1h"}]"#);
        assert!(matches!(limits, Value::Array(..)), "{limits:?}");
    }

    #[test]
    fn unset_numeric_keys_are_numbers() {
        for key in UNSET_NUMBERS {
            assert_eq!(typed(key, "3").deserialize::<u32>().ok(), Some(3), "{key}");
        }
    }

    /// Every number or flag a settings struct declares is named somewhere in
    /// the defaults (which then type it) or listed in `UNSET_NUMBERS`; a
    /// field added without a default and left off the list would take
    /// `TOLLGATE__SERVER__NEW=3` as the text "3" and refuse it. Read from
    /// the sources: serialized settings leave unset options out, and serde
    /// gives no list of a type's fields.
    #[test]
    fn every_numeric_field_is_typed_by_the_defaults_or_listed() {
        let sources = settings_sources();
        const NUMERIC: &[&str] = &[
            "u8", "u16", "u32", "u64", "usize", "i8", "i16", "i32", "i64", "isize", "f32", "f64",
            "bool",
        ];
        let defaults = defaults();
        let names = default_names(&defaults);
        let listed: Vec<&str> = UNSET_NUMBERS
            .iter()
            .filter_map(|key| key.rsplit('.').next())
            .collect();

        let mut numeric_fields = Vec::new();
        for line in sources.iter().flat_map(|source| source.lines()) {
            let Some(field) = line.trim().strip_prefix("pub ") else {
                continue;
            };
            let Some((name, ty)) = field.split_once(": ") else {
                continue;
            };
            let ty = ty.trim_end_matches(',');
            let inner = ty
                .strip_prefix("Option<")
                .and_then(|t| t.strip_suffix('>'))
                .unwrap_or(ty);
            if NUMERIC.contains(&inner) {
                numeric_fields.push(name);
            }
        }
        assert!(numeric_fields.contains(&"workers"), "{numeric_fields:?}");
        for name in &numeric_fields {
            assert!(
                names.iter().any(|n| n == name) || listed.contains(name),
                "`{name}` is a number without a default: add its key to UNSET_NUMBERS"
            );
        }
        for key in UNSET_NUMBERS {
            assert!(find(&defaults, key).is_none(), "{key} has a default");
            let name = key.rsplit('.').next().unwrap_or(key);
            assert!(numeric_fields.contains(&name), "{key} is no numeric field");
        }
    }

    /// Every file of the module, so that a new one is read too.
    fn settings_sources() -> Vec<String> {
        let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/src/settings");
        std::fs::read_dir(dir)
            .expect("the settings sources")
            .map(|entry| entry.expect("a directory entry").path())
            .filter(|path| path.extension().is_some_and(|e| e == "rs"))
            .map(|path| std::fs::read_to_string(path).expect("a readable source"))
            .collect()
    }

    /// Every key the defaults name, at any depth.
    fn default_names(defaults: &Dict) -> Vec<String> {
        fn named(value: &Value, names: &mut Vec<String>) {
            match value {
                Value::Dict(_, dict) => {
                    for (key, inner) in dict {
                        names.push(key.clone());
                        named(inner, names);
                    }
                }
                Value::Array(_, items) => items.iter().for_each(|v| named(v, names)),
                _ => {}
            }
        }
        let mut names = Vec::new();
        named(&Value::from(defaults.clone()), &mut names);
        names
    }

    /// A list of strings the defaults do not name is read as figment
    /// guesses: `TOLLGATE__CAPTCHA__SMS_ACTIONS=[2024]` would be a number,
    /// and refused. So every such field has a default, if only `[]`.
    #[test]
    fn every_list_of_strings_is_typed_by_the_defaults() {
        let names = default_names(&defaults());
        let mut lists = Vec::new();
        for source in settings_sources() {
            for line in source.lines() {
                let field = line.trim().strip_prefix("pub ").unwrap_or("");
                if let Some((name, "Vec<String>,")) = field.split_once(": ") {
                    lists.push(name.to_owned());
                }
            }
        }
        assert!(lists.iter().any(|l| l == "sms_actions"), "{lists:?}");
        for name in &lists {
            assert!(
                names.contains(name),
                "`{name}` is a list of strings without a default: add it to defaults.toml"
            );
        }
    }

    #[test]
    fn lists_of_strings_keep_each_element_as_written() {
        assert_eq!(
            typed("server.api_keys", r#"[0123456789012345, "a, b", +1 ]"#),
            Value::from(vec!["0123456789012345", "a, b", "+1"])
        );
        assert_eq!(
            typed("server.admin_tokens", "[]"),
            Value::from(Vec::<String>::new())
        );
        assert_eq!(
            typed("sms.denied_regions", "[CN,]"),
            Value::from(vec!["CN"])
        );
        assert_eq!(
            typed("sms.denied_regions", "[CN,,US]"),
            Value::from(vec!["CN", "", "US"])
        );
        assert_eq!(typed("sms.denied_regions", "[,]"), Value::from(vec![""]));
        assert_eq!(
            typed("server.admin_tokens", "[a{b}c, \"{d}\"]"),
            Value::from(vec!["a{b}c", "{d}"])
        );
    }

    #[test]
    fn admin_tokens_may_be_tables() {
        let tokens = typed(
            "server.admin_tokens",
            r#"[plain-token-0123456789, { name = "oncall", token = "t-0123456789abcdef", role = "viewer" }]"#,
        );
        let Value::Array(_, items) = &tokens else {
            panic!("{tokens:?}")
        };
        assert!(matches!(items[1], Value::Dict(..)), "{tokens:?}");
    }
}
