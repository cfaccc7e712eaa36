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

/// A login name, NFKC-normalised and lowercased so that `Alice`, `ALICE` and
/// `Ａｌｉｃｅ` share one counter.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Username(String);

impl Username {
    pub fn parse(raw: &str) -> Result<Self, UsernameError> {
        let normalised: String = raw.trim().nfkc().collect::<String>().to_lowercase();
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
