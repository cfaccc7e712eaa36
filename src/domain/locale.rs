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

/// Whether two tags name one locale: alike but for the case of a letter
/// and `-` against `_` (`zh-CN`, `zh-cn`, `zh_CN`), as a request or a file
/// name may spell it.
pub fn same_tag(a: &str, b: &str) -> bool {
    let unit = |c: char| {
        if c == '_' {
            '-'
        } else {
            c.to_ascii_lowercase()
        }
    };
    a.len() == b.len() && a.chars().map(unit).eq(b.chars().map(unit))
}

/// One spelling of each locale [`same_tag`] puts together: lower case,
/// `-` between the parts.
pub fn canonical(tag: &str) -> String {
    tag.chars()
        .map(|c| {
            if c == '_' {
                '-'
            } else {
                c.to_ascii_lowercase()
            }
        })
        .collect()
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

    #[test]
    fn tags_alike_but_for_case_and_separator_are_one_locale() {
        for (a, b) in [("zh-CN", "zh-cn"), ("pt_BR", "pt-BR"), ("EN", "en")] {
            assert!(same_tag(a, b), "{a} {b}");
            assert_eq!(canonical(a), canonical(b));
        }
        for (a, b) in [("zh-CN", "zh-TW"), ("pt", "pt-BR"), ("en-", "en")] {
            assert!(!same_tag(a, b), "{a} {b}");
            assert_ne!(canonical(a), canonical(b));
        }
    }
}
