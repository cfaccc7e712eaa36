use unicode_normalization::UnicodeNormalization;

const MAX_CHARS: usize = 256;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum UsernameError {
    #[error("user is required")]
    Empty,
    #[error("user is longer than 256 characters")]
    TooLong,
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

/// Unicode's Default_Ignorable_Code_Point (DerivedCoreProperties.txt): code
/// points that render as nothing, so a name with them looks like one without.
fn default_ignorable(c: char) -> bool {
    matches!(c as u32,
        0x00AD | 0x034F | 0x061C | 0x115F..=0x1160 | 0x17B4..=0x17B5 | 0x180B..=0x180F
        | 0x200B..=0x200F | 0x202A..=0x202E | 0x2060..=0x206F | 0x3164 | 0xFE00..=0xFE0F
        | 0xFEFF | 0xFFA0 | 0xFFF0..=0xFFF8 | 0x1BCA0..=0x1BCA3 | 0x1D173..=0x1D17A
        | 0xE0000..=0xE0FFF)
}

impl Username {
    pub fn parse(raw: &str) -> Result<Self, UsernameError> {
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
        if normalised.chars().count() > MAX_CHARS {
            return Err(UsernameError::TooLong);
        }
        if normalised.chars().any(char::is_control) {
            return Err(UsernameError::ControlCharacters);
        }
        Ok(Self(normalised))
    }

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
}
