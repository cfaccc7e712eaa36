//! Phone numbers, parsed and validated by the `phonenumber` crate (libphonenumber's
//! metadata), normalised to E.164.

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PhoneError {
    #[error("phone is required")]
    Empty,
    #[error("phone must be an international number starting with + (E.164)")]
    NotInternational,
    #[error("phone is not a valid number")]
    Invalid,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PhoneNumber {
    e164: String,
    country_code: String,
    national: String,
    region: Option<String>,
}

impl PhoneNumber {
    pub fn parse(raw: &str) -> Result<Self, PhoneError> {
        let raw = raw.trim();
        if raw.is_empty() {
            return Err(PhoneError::Empty);
        }
        if !raw.starts_with('+') {
            return Err(PhoneError::NotInternational);
        }
        if raw.len() > 32 {
            return Err(PhoneError::Invalid);
        }
        let number = phonenumber::parse(None, raw).map_err(|_| PhoneError::Invalid)?;
        if !phonenumber::is_valid(&number) || number.extension().is_some() {
            return Err(PhoneError::Invalid);
        }
        let national = number.national();
        let national = format!(
            "{}{}",
            "0".repeat(national.zeros() as usize),
            national.value()
        );
        let country_code = number.code().value().to_string();
        // E.164 is `+`, the country code and the national significant number:
        // written here rather than by the crate's formatter, which looks up
        // formatting patterns (regexes) that E.164 never uses.
        Ok(Self {
            e164: format!("+{country_code}{national}"),
            country_code,
            national,
            region: number.country().id().map(|id| id.as_ref().to_string()),
        })
    }

    /// `+8613800138000`.
    pub fn e164(&self) -> &str {
        &self.e164
    }

    /// ISO 3166 alpha-2 region, when the number belongs to one.
    pub fn region(&self) -> Option<&str> {
        self.region.as_deref()
    }

    /// The first `digits` digits of the E.164 number, with the plus.
    pub fn prefix(&self, digits: usize) -> String {
        self.e164.chars().take(digits + 1).collect()
    }

    /// `+86138****8000`: country code, the first 3 national digits and the last
    /// 4 stay; a national number shorter than 8 digits shows only its last 2.
    pub fn masked(&self) -> String {
        let n = &self.national;
        let (head, tail) = if n.len() >= 8 {
            (&n[..3], &n[n.len() - 4..])
        } else {
            ("", &n[n.len().saturating_sub(2)..])
        };
        let stars = "*".repeat(n.len() - head.len() - tail.len());
        format!("+{}{head}{stars}{tail}", self.country_code)
    }
}

impl std::fmt::Display for PhoneNumber {
    /// Masked: phone numbers never reach logs in clear.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.masked())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbers_are_normalised_to_e164() {
        let p = PhoneNumber::parse(" +86 138-0013-8000 ").unwrap();
        assert_eq!(p.e164(), "+8613800138000");
        assert_eq!(p.region(), Some("CN"));
        assert_eq!(p.prefix(7), "+8613800");
    }

    #[test]
    fn e164_is_what_the_crate_formats() {
        // Italy keeps its leading zero; Niue is short; the rest are common.
        for raw in [
            "+390212345678",
            "+6837012",
            "+8613800138000",
            "+14155552671",
            "+447911123456",
            "+33612345678",
        ] {
            let ours = PhoneNumber::parse(raw).unwrap();
            let theirs = phonenumber::parse(None, raw).unwrap();
            assert_eq!(
                ours.e164(),
                theirs.format().mode(phonenumber::Mode::E164).to_string(),
                "{raw}"
            );
        }
    }

    #[test]
    fn masking_keeps_country_code_first_three_and_last_four() {
        assert_eq!(
            PhoneNumber::parse("+8613800138000").unwrap().masked(),
            "+86138****8000"
        );
        assert_eq!(
            PhoneNumber::parse("+14155552671").unwrap().masked(),
            "+1415***2671"
        );
    }

    #[test]
    fn short_national_numbers_show_only_their_last_two_digits() {
        // Niue: 4-digit national numbers.
        let p = PhoneNumber::parse("+6837012").unwrap();
        assert_eq!(p.masked(), "+683**12");
    }

    #[test]
    fn bad_numbers_are_rejected_with_a_reason() {
        let cases = [
            ("", PhoneError::Empty),
            ("   ", PhoneError::Empty),
            ("13800138000", PhoneError::NotInternational),
            ("+86abc", PhoneError::Invalid),
            ("+861", PhoneError::Invalid),
            ("+999123456789", PhoneError::Invalid),
        ];
        for (input, expected) in cases {
            assert_eq!(PhoneNumber::parse(input), Err(expected), "input {input:?}");
        }
    }
}
