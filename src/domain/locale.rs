//! A language tag as callers name the language of a text (`zh-CN`, `en`):
//! letters, digits, `-` and `_`, at most 35. Which locales have texts is the
//! templates' business; an unknown one falls back to `en` there.

/// What [`Locale::parse`] accepts, as the OpenAPI document's `pattern`.
pub const PATTERN: &str = "^[A-Za-z0-9_-]{1,35}$";

/// A `locale` that is not a language tag as `PATTERN` describes.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("locale must be a language tag such as zh-CN")]
pub struct LocaleError;

/// A language tag checked for its form only; the templates decide whether
/// they have texts for it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Locale(String);

impl Locale {
    /// Take `raw` unchanged when it has 1 to 35 letters, digits, `-` and `_`.
    pub fn parse(raw: &str) -> Result<Self, LocaleError> {
        let tag_char = |c: char| c.is_ascii_alphanumeric() || c == '-' || c == '_';
        if (1..=35).contains(&raw.len()) && raw.chars().all(tag_char) {
            Ok(Self(raw.to_string()))
        } else {
            Err(LocaleError)
        }
    }

    /// The tag as given.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The tag as given.
    pub fn into_string(self) -> String {
        self.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_pattern_is_what_parse_takes() {
        let pattern = regex::Regex::new(PATTERN).unwrap();
        for raw in [
            "en",
            "zh-CN",
            "pt_BR",
            "",
            "zh CN",
            "é",
            &"a".repeat(35),
            &"a".repeat(36),
        ] {
            assert_eq!(Locale::parse(raw).is_ok(), pattern.is_match(raw), "{raw:?}");
        }
    }
}
