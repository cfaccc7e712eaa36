//! Phone numbers, parsed and validated by libphonenumber's metadata (the
//! `phonenumber` crate), normalised to E.164. The common input takes the fast
//! path in `fast.rs`; everything else the crate's own parser.

mod fast;

/// Why a phone number was refused: an empty one answers 400
/// `invalid_request`, the others 400 `invalid_phone`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PhoneError {
    /// Nothing but spaces.
    #[error("phone is required")]
    Empty,
    /// No leading `+`.
    #[error("phone must be an international number starting with + (E.164)")]
    NotInternational,
    /// Too long, a character other than digits and grouping, or not a
    /// number of its country's numbering plan.
    #[error("phone is not a valid number")]
    Invalid,
}

/// What `sms.allowed_regions` and `sms.denied_regions` call the numbers no
/// region claims, as libphonenumber does: the non-geographic calling codes
/// (+800 freephone, +808, +870 Inmarsat, +881 and +882/+883 satellite and
/// global services, +979 premium rate), favourite targets of SMS pumping.
pub const NO_REGION: &str = "001";

/// A valid phone number, normalised to E.164, with its region. `Display`
/// masks it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PhoneNumber {
    e164: String,
    country_code: String,
    national: String,
    region: Option<String>,
}

/// The text taken for a phone number, as the OpenAPI document's `pattern`
/// (with `maxLength` [`MAX_LEN`]): a `+`, then digits that spaces, dots,
/// dashes and parentheses may group, with spaces around. Whether the digits
/// are a number in use is the numbering plan's call, which a pattern cannot
/// make (the document says `format: phone`).
pub const PATTERN: &str = r"^ *\+[-0-9 ().]+$";
/// The most bytes (all ASCII) a phone number may be given in.
pub const MAX_LEN: usize = 32;

/// `raw` without its surrounding spaces, when it has the documented form.
fn international(raw: &str) -> Result<&str, PhoneError> {
    let number = raw.trim_matches(' ');
    if number.is_empty() {
        return Err(PhoneError::Empty);
    }
    let Some(grouped_digits) = number.strip_prefix('+') else {
        return Err(PhoneError::NotInternational);
    };
    let grouping = |b: u8| b.is_ascii_digit() || b" ().-".contains(&b);
    if raw.len() > MAX_LEN || !grouped_digits.bytes().all(grouping) {
        return Err(PhoneError::Invalid);
    }
    Ok(number)
}

/// `+` and the digits of a number in [`PATTERN`]'s form: its spaces, dots,
/// dashes and parentheses only group the digits, and without them most
/// numbers take the fast path (the crate's own reading of them is ten times
/// dearer when its pattern cache is made to miss).
fn compact(number: &str) -> std::borrow::Cow<'_, str> {
    if number.bytes().skip(1).all(|b| b.is_ascii_digit()) {
        return std::borrow::Cow::Borrowed(number);
    }
    let digits = number.bytes().filter(u8::is_ascii_digit).map(char::from);
    std::borrow::Cow::Owned(std::iter::once('+').chain(digits).collect())
}

impl PhoneNumber {
    /// Parse a number in `PATTERN`'s form and check it against its country's
    /// numbering plan.
    pub fn parse(raw: &str) -> Result<Self, PhoneError> {
        let raw = compact(international(raw)?);
        match fast::parse(&raw) {
            Some(fast::Parsed { valid: false, .. }) => Err(PhoneError::Invalid),
            Some(parsed) => Ok(Self::from_parts(
                parsed.country_code,
                parsed.national,
                Some(parsed.region),
            )),
            None => Self::parse_with_crate(&raw),
        }
    }

    /// Load the metadata now (80 ms in a release build, most of a second in
    /// a debug one, during which a worker that met it first would answer
    /// nothing), and compile the fast path's patterns in the background (each
    /// region's are also compiled on first use, once).
    pub fn warm_up() {
        let _ = Self::parse_with_crate("+14155552671");
        let compiled = std::thread::Builder::new()
            .name("phone-patterns".into())
            .spawn(fast::warm_up);
        if let Err(e) = compiled {
            tracing::warn!(error = %e, "phone patterns compile on first use");
        }
    }

    fn from_parts(country_code: String, national: String, region: Option<String>) -> Self {
        // E.164 is `+`, the country code and the national significant number
        // (pieces pushed rather than `format!`ted: the formatting machinery
        // was a few hundred instructions of every send).
        let mut e164 = String::with_capacity(1 + country_code.len() + national.len());
        e164.push('+');
        e164.push_str(&country_code);
        e164.push_str(&national);
        Self {
            e164,
            country_code,
            national,
            region,
        }
    }

    /// [`PhoneNumber::parse`] without the fast path and without dropping
    /// the grouping: the crate's own reading of `raw`, for tests that hold
    /// both equal.
    #[cfg(test)]
    pub(crate) fn parse_with_crate_for_tests(raw: &str) -> Result<Self, PhoneError> {
        Self::parse_with_crate(international(raw)?)
    }

    /// `raw` has passed [`international`].
    fn parse_with_crate(raw: &str) -> Result<Self, PhoneError> {
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
        // E.164 is written by `from_parts` rather than by the crate's
        // formatter, which looks up formatting patterns E.164 never uses.
        Ok(Self::from_parts(
            number.code().value().to_string(),
            national,
            number.country().id().map(|id| id.as_ref().to_string()),
        ))
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
        let end = self
            .e164
            .char_indices()
            .nth(digits + 1)
            .map_or(self.e164.len(), |(at, _)| at);
        self.e164[..end].to_owned()
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
        let stars = n.len() - head.len() - tail.len();
        // Pushed piece by piece: `format!` and `repeat` were about 1,100
        // instructions of a send, which masks the phone twice.
        let mut out = String::with_capacity(1 + self.country_code.len() + n.len());
        out.push('+');
        out.push_str(&self.country_code);
        out.push_str(head);
        out.extend(std::iter::repeat_n('*', stars));
        out.push_str(tail);
        out
    }
}

impl std::fmt::Display for PhoneNumber {
    /// Masked: phone numbers never reach logs in clear.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.masked())
    }
}

/// The country calling codes the metadata knows, as text (`1`, `44`, `882`).
static CALLING_CODES: std::sync::LazyLock<Vec<String>> = std::sync::LazyLock::new(|| {
    (1u16..=999)
        .filter(|code| phonenumber::metadata::DATABASE.by_code(code).is_some())
        .map(|code| code.to_string())
        .collect()
});

/// Whether the digits `digits` (of a `+digits*` prefix) begin a number of
/// some country calling code the metadata knows: a code starts with them
/// (`+8`), or they start with a code (`+8613`). `+0`, `+28` match nothing.
pub fn reaches_a_calling_code(digits: &str) -> bool {
    CALLING_CODES
        .iter()
        .any(|code| code.starts_with(digits) || digits.starts_with(code.as_str()))
}

/// ISO 3166 alpha-2 codes the phone metadata has no numbers for
/// (Antarctica, Bouvet Island, South Georgia, Heard and McDonald Islands,
/// Pitcairn, the French Southern Territories, the US Minor Outlying
/// Islands): valid regions that match no number.
const NUMBERLESS_REGIONS: [&str; 7] = ["AQ", "BV", "GS", "HM", "PN", "TF", "UM"];

/// Whether `region` names a region (any case): one the phone metadata
/// knows (`GB`, `XK`, `AC`), an ISO 3166 code it has no numbers for, or
/// [`NO_REGION`]. `UK`, `EU` or a typo would match no number, unseen.
pub fn is_known_region(region: &str) -> bool {
    let upper = region.to_ascii_uppercase();
    region == NO_REGION
        || NUMBERLESS_REGIONS.contains(&upper.as_str())
        || phonenumber::metadata::DATABASE
            .by_id(upper.as_str())
            .is_some()
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
        assert_eq!(p.prefix(0), "+");
        assert_eq!(p.prefix(13), "+8613800138000");
        assert_eq!(p.prefix(40), "+8613800138000");
    }

    /// A region is where the number is, not its calling code's first
    /// region: docs/rules.md warns that `denied_regions = ["GB"]` leaves
    /// these through.
    #[test]
    fn numbers_of_a_shared_calling_code_have_regions_of_their_own() {
        for (raw, region) in [
            ("+447400123456", "GB"),
            ("+447911123456", "GG"),
            ("+14155552671", "US"),
        ] {
            let phone = PhoneNumber::parse(raw).unwrap();
            assert_eq!(phone.region(), Some(region), "{raw}");
        }
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

    /// The fast path answers exactly what the crate answers, wherever it
    /// answers at all: every region's example numbers, and numbers of every
    /// length around the possible ones, with and without a national prefix.
    #[test]
    fn the_fast_path_agrees_with_the_crate() {
        let mut seed: u64 = 0x2545_f491_4f6c_dd1d;
        let mut next = move || {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed
        };
        let (mut compared, mut fast_valid) = (0, 0);
        for meta in phonenumber::metadata::DATABASE.iter() {
            let d = meta.descriptors();
            let mut nationals: Vec<String> = [
                Some(d.general()),
                d.fixed_line(),
                d.mobile(),
                d.toll_free(),
                d.premium_rate(),
                d.voip(),
            ]
            .into_iter()
            .flatten()
            .filter_map(|desc| desc.example().map(str::to_string))
            .collect();
            for len in 3..=15 {
                for _ in 0..3 {
                    nationals.push(
                        (0..len)
                            .map(|_| char::from(b'0' + (next() % 10) as u8))
                            .collect(),
                    );
                }
            }
            let examples: Vec<String> = nationals.clone();
            if let Some(prefix) = meta.national_prefix() {
                nationals.extend(examples.iter().map(|n| format!("{prefix}{n}")));
            }
            for national in nationals {
                let raw = format!("+{}{national}", meta.country_code());
                if raw.len() > 32 {
                    continue;
                }
                let Some(fast) = fast::parse(&raw) else {
                    continue;
                };
                compared += 1;
                let theirs = PhoneNumber::parse_with_crate(&raw);
                match (&theirs, fast.valid) {
                    (Ok(p), true) => {
                        fast_valid += 1;
                        assert_eq!(p.country_code, fast.country_code, "{raw}");
                        assert_eq!(p.national, fast.national, "{raw}");
                        assert_eq!(p.region.as_deref(), Some(fast.region.as_str()), "{raw}");
                    }
                    (Err(PhoneError::Invalid), false) => {}
                    _ => panic!("{raw}: the crate says {theirs:?}, the fast path {fast:?}"),
                }
            }
        }
        assert!(
            compared > 5_000,
            "only {compared} numbers took the fast path"
        );
        assert!(
            fast_valid > 500,
            "only {fast_valid} valid numbers took the fast path"
        );
        assert!(
            fast::parse("+8613800138000").is_some_and(|p| p.valid),
            "a Chinese mobile number takes the fast path"
        );
    }

    /// A shared calling code's numbers take the fast path, each to its
    /// own region (`the_fast_path_agrees_with_the_crate` holds it equal).
    #[test]
    fn a_shared_calling_code_takes_the_fast_path() {
        for (shared, region) in [
            ("+14155552671", "US"),
            ("+15062345678", "CA"),
            ("+12684601234", "AG"),
            ("+447911123456", "GG"),
            ("+77112345678", "KZ"),
        ] {
            let parsed = fast::parse(shared);
            assert!(
                parsed
                    .as_ref()
                    .is_some_and(|p| p.valid && p.region == region),
                "{shared}: a shared calling code takes the fast path: {parsed:?}"
            );
        }
    }

    /// Grouping is only grouping: the crate reads a formatted number as
    /// the digits alone, which is what the fast path is given.
    #[test]
    fn a_formatted_number_reads_as_its_digits_do_through_the_crate() {
        for raw in [
            "+1 (415) 555-2671",
            "+44 7911 123456",
            "+44 (0) 20 7946 0000",
            "+49 151 2345 6789",
            "+33 6 12 34 56 78",
            "+7 (701) 234-56-78",
            "+86 138.0013.8000",
            "+1 268 460 1234",
        ] {
            let ours = PhoneNumber::parse(raw);
            let theirs = PhoneNumber::parse_with_crate(international(raw).unwrap());
            assert_eq!(ours, theirs, "{raw}");
        }
        // A grouping the crate refuses reads as its digits: grouping is
        // dropped before either path parses.
        for (grouped, plain) in [
            ("+14-012000000", "+14012000000"),
            ("+464(20000000", "+46420000000"),
        ] {
            assert!(
                PhoneNumber::parse_with_crate(international(grouped).unwrap()).is_err(),
                "{grouped}: the crate's own reading"
            );
            assert_eq!(
                PhoneNumber::parse(grouped).map(|p| p.e164().to_string()),
                Ok(plain.to_string()),
                "{grouped}"
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
