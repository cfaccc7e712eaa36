//! Login names: checked as given, then normalised so that names that look
//! alike count as one user.

use std::sync::LazyLock;

use unicode_normalization::UnicodeNormalization;

use super::pattern::{class_members, in_ranges, CONTROL, DEFAULT_IGNORABLE, WHITE_SPACE};

/// The most characters a name may have as given (before normalisation).
pub const MAX_CHARS: usize = 256;

/// Why a login name was refused (400 `invalid_request`).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum UsernameError {
    /// Nothing left once white space and invisible characters are dropped.
    #[error("user is required")]
    Empty,
    /// More than `MAX_CHARS` characters as given.
    #[error("user is longer than 256 characters")]
    TooLong,
    /// More than `MAX_CHARS` characters once normalised: NFKC makes one
    /// character up to 18 (`\u{fdfa}`), and the normalised name is what the
    /// store keeps (400 `subject_too_long`).
    #[error("user is longer than 256 characters once normalised (NFKC, case folded)")]
    TooLongNormalised,
    /// A control character (general category Cc) anywhere in the name.
    #[error("user contains control characters")]
    ControlCharacters,
}

/// A login name in one form per name, so that `Alice`, `ALICE`, `Ａｌｉｃｅ`,
/// `alice\u{200b}` and `al\u{ad}ice` share one counter: NFKC, then without
/// default-ignorable code points (invisible: zero-width spaces and joiners,
/// soft hyphens, byte-order marks, variation selectors), then fully case
/// folded (`ß` and `ss` are one name), then NFKC again (what folding can
/// leave unnormalised), which is Unicode's `NFKC_Casefold` in all but name.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Username(String);

fn default_ignorable(c: char) -> bool {
    in_ranges(DEFAULT_IGNORABLE, c)
}

/// What [`Username::parse`] accepts, as the OpenAPI document's `pattern`
/// (with `maxLength` [`MAX_CHARS`]): no control character, and at least one
/// character that is neither white space nor default-ignorable.
pub static PATTERN: LazyLock<String> = LazyLock::new(|| {
    let control = class_members(CONTROL);
    let blank = class_members(WHITE_SPACE) + &class_members(DEFAULT_IGNORABLE);
    format!("^[^{control}]*[^{control}{blank}][^{control}]*$")
});

impl Username {
    /// Check `raw` as given (length, control characters), then normalise it as
    /// `Username` describes; white space around the name is dropped.
    pub fn parse(raw: &str) -> Result<Self, UsernameError> {
        // Counted and checked as given, as the document's pattern and
        // `maxLength` say: what normalisation makes of a name is ours.
        if raw.chars().count() > MAX_CHARS {
            return Err(UsernameError::TooLong);
        }
        if raw.chars().any(|c| in_ranges(CONTROL, c)) {
            return Err(UsernameError::ControlCharacters);
        }
        let raw = raw.trim();
        // ASCII is its own NFKC, holds no default-ignorable code point, and
        // folds to lower case: most names skip the Unicode work.
        let normalised: String = if raw.is_ascii() {
            raw.to_ascii_lowercase()
        } else {
            let visible: String = raw.nfkc().filter(|c| !default_ignorable(*c)).collect();
            caseless::default_case_fold_str(visible.trim())
                .nfkc()
                .collect()
        };
        if normalised.is_empty() {
            return Err(UsernameError::Empty);
        }
        // Bytes bound characters: most names stop at the cheap test.
        if normalised.len() > MAX_CHARS && normalised.chars().count() > MAX_CHARS {
            return Err(UsernameError::TooLongNormalised);
        }
        Ok(Self(normalised))
    }

    /// The normalised name: the `user` subject's id.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_that_look_alike_are_one_name() {
        for lookalike in [
            "alice\u{200b}",
            "al\u{ad}ice",
            "\u{feff}alice",
            "a\u{200d}lice",
            "alice\u{fe0f}",
            "ALICE\u{2060}",
        ] {
            assert_eq!(
                Username::parse(lookalike).unwrap().as_str(),
                "alice",
                "{lookalike:?}"
            );
        }
        assert_eq!(
            Username::parse("STRAẞE").unwrap(),
            Username::parse("strasse").unwrap(),
            "full case folding"
        );
        assert_eq!(Username::parse("\u{200b}"), Err(UsernameError::Empty));
    }

    #[test]
    fn names_too_long_once_normalised_are_refused() {
        // U+FDFA is one character as given, 18 under NFKC.
        let grown = "\u{fdfa}".repeat(15);
        assert_eq!(
            Username::parse(&grown),
            Err(UsernameError::TooLongNormalised)
        );
        let fits = "\u{fdfa}".repeat(14);
        assert_eq!(
            Username::parse(&fits).unwrap().as_str().chars().count(),
            252
        );
        assert!(
            Username::parse(&"é".repeat(256)).is_ok(),
            "256 two-byte characters fit"
        );
    }

    #[test]
    fn names_are_nfkc_normalised_and_lowercased() {
        assert_eq!(Username::parse("Alice").unwrap().as_str(), "alice");
        assert_eq!(Username::parse("Ａｌｉｃｅ").unwrap().as_str(), "alice");
        assert_eq!(Username::parse(" BOB ").unwrap().as_str(), "bob");
    }

    #[test]
    fn empty_long_and_control_names_are_rejected() {
        assert_eq!(Username::parse(""), Err(UsernameError::Empty));
        assert_eq!(Username::parse("  "), Err(UsernameError::Empty));
        assert_eq!(
            Username::parse(&"a".repeat(257)),
            Err(UsernameError::TooLong)
        );
        assert_eq!(
            Username::parse("a\u{0}b"),
            Err(UsernameError::ControlCharacters)
        );
    }

    /// The pattern the OpenAPI document gives is what `parse` accepts: for
    /// every single code point (so no character that normalises to nothing
    /// is missed), and around the length limit.
    #[test]
    fn the_documented_pattern_is_what_parse_accepts() {
        let pattern = regex::Regex::new(&PATTERN).unwrap();
        let documented = |s: &str| pattern.is_match(s) && s.chars().count() <= MAX_CHARS;
        for c in (0..=0x10ffff).filter_map(char::from_u32) {
            let s = c.to_string();
            assert_eq!(
                Username::parse(&s).is_ok(),
                documented(&s),
                "U+{:04X}",
                c as u32
            );
        }
        for s in [
            "a".repeat(256),
            "a".repeat(257),
            format!(" {} ", "a".repeat(255)),
            "alice\n".into(),
            " \u{200b}\u{3000}".into(),
            "\u{3164}\u{ffa0}".into(),
        ] {
            assert_eq!(Username::parse(&s).is_ok(), documented(&s), "{s:?}");
        }
        // What no pattern can say: the length once normalised. The document
        // gives it in words, and the refusal has its own code.
        let grows = "\u{fdfa}".repeat(200);
        assert!(documented(&grows));
        assert_eq!(
            Username::parse(&grows),
            Err(UsernameError::TooLongNormalised)
        );
    }
}
