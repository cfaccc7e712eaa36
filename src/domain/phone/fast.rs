//! The common case of phone parsing without the `phonenumber` crate's regex
//! cache, which runs every match under one process-wide mutex: two HTTP
//! workers parsing at once queue behind each other, and a worker preempted
//! while holding it stalls the other (tens of milliseconds at p99 under load).
//!
//! The fast path takes only input the crate would parse trivially: `+` and
//! digits, a calling code of geographic regions, and a national number from
//! which the crate strips no national prefix (nor, for a shared code, a
//! leading zero). For those it picks the region as the crate does (a shared
//! code's by leading digits or numbering plan, in the crate's order) and
//! applies the crate's own validity rule (the general pattern and one type
//! pattern, each with its possible lengths, matched from the start) with the
//! crate's patterns compiled once per region into plain `regex::Regex`es
//! (shared, no lock). Anything else answers `None` and goes the crate's way;
//! a test holds both paths equal over every region's examples and thousands
//! of numbers.

use std::collections::HashMap;
use std::sync::{LazyLock, OnceLock};

use phonenumber::metadata::{Descriptor, Metadata, DATABASE};
use regex::{Regex, RegexBuilder};

/// The crate's limits on a national significant number and a calling code.
const MIN_NSN: usize = 2;
const MAX_NSN: usize = 17;
const MAX_CODE: usize = 3;

/// What a fast parse found; `None` from [`parse`] means "ask the crate".
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Parsed {
    /// The calling code's digits (`86`).
    pub country_code: String,
    /// The national significant number (`13800138000`).
    pub national: String,
    /// The region whose plan the number is judged by (ISO 3166 alpha-2),
    /// the crate's pick among a shared code's; empty when none claims it
    /// (then `valid` is false).
    pub region: String,
    /// Whether the crate's validity rule holds for the national number.
    pub valid: bool,
}

/// One descriptor: possible lengths (empty: any) and its pattern anchored at
/// the start, as the crate's `Descriptor::is_match` reads it.
struct Pattern {
    lengths: Vec<u16>,
    re: Regex,
}

impl Pattern {
    fn new(desc: &Descriptor) -> Option<Self> {
        Some(Self {
            lengths: desc.possible_length().to_vec(),
            re: anchored(desc.national_number().as_str())?,
        })
    }

    fn is_match(&self, value: &str) -> bool {
        (self.lengths.is_empty() || self.lengths.contains(&(value.len() as u16)))
            && self.re.is_match(value)
    }
}

/// The crate compiles its patterns with `x` (ignore whitespace); a match
/// counts when it starts at 0.
fn anchored(pattern: &str) -> Option<Regex> {
    RegexBuilder::new(&format!("^(?:{pattern})"))
        .ignore_whitespace(true)
        .build()
        .ok()
}

struct Region {
    id: String,
    /// The first digits of its numbers, where its calling code is shared
    /// (the crate picks a shared code's region by them).
    leading_digits: Option<Regex>,
    national_prefix: Option<String>,
    prefix_for_parsing: Option<Regex>,
    general: Pattern,
    /// Every type the crate's `number_type` tries, in any order: validity
    /// only asks whether one matches.
    types: Vec<Pattern>,
}

impl Region {
    fn new(meta: &Metadata) -> Option<Self> {
        let d = meta.descriptors();
        let types = [
            d.premium_rate(),
            d.toll_free(),
            d.shared_cost(),
            d.voip(),
            d.personal_number(),
            d.pager(),
            d.uan(),
            d.voicemail(),
            d.fixed_line(),
            d.mobile(),
        ];
        Some(Self {
            id: meta.id().to_string(),
            leading_digits: match meta.leading_digits() {
                Some(p) => Some(anchored(p.as_str())?),
                None => None,
            },
            national_prefix: meta.national_prefix().map(str::to_string),
            prefix_for_parsing: match meta.national_prefix_for_parsing() {
                Some(p) => Some(anchored(p.as_str())?),
                None => None,
            },
            general: Pattern::new(d.general())?,
            types: types
                .into_iter()
                .flatten()
                .map(Pattern::new)
                .collect::<Option<_>>()?,
        })
    }

    /// Whether the crate would leave `national` as it is (strip no prefix).
    fn keeps(&self, national: &str) -> bool {
        let strips_prefix = self
            .national_prefix
            .as_deref()
            .is_some_and(|p| !p.is_empty() && national.starts_with(p));
        let parsing_matches = self
            .prefix_for_parsing
            .as_ref()
            .is_some_and(|re| re.is_match(national));
        !strips_prefix && !parsing_matches
    }

    fn is_valid(&self, national: &str) -> bool {
        self.general.is_match(national) && self.types.iter().any(|t| t.is_match(national))
    }
}

/// The geographic regions of one calling code, in the crate's order.
struct Code {
    regions: Vec<Region>,
}

impl Code {
    /// The region whose rules the crate applies to `national`, as its
    /// `validator::source_for` picks it: a code's one region; else the first
    /// whose leading digits start `national` or, for a region without any,
    /// under whose plan it is a number.
    fn source(&self, national: &str) -> Option<&Region> {
        if let [only] = self.regions.as_slice() {
            return Some(only);
        }
        self.regions.iter().find(|r| match &r.leading_digits {
            Some(leading) => leading.is_match(national),
            None => r.is_valid(national),
        })
    }
}

/// Calling codes whose every region is a geographic one, compiled on first
/// use. Shared codes (+1, +7, +44, ...) are here too: through the crate,
/// each of their parses would match a dozen patterns through its cache of
/// 100 under one lock, and a caller rotating them (or formatted numbers of
/// many countries) had every parse compile its patterns anew, about ten
/// times a parse's cost.
static CODES: LazyLock<HashMap<u16, OnceLock<Option<Code>>>> = LazyLock::new(|| {
    let mut codes = HashMap::new();
    for meta in DATABASE.iter() {
        let code = meta.country_code();
        let geographic = DATABASE.region(&code).is_some_and(|ids| {
            !ids.is_empty()
                && ids
                    .iter()
                    .all(|id| *id != "001" && id.parse::<phonenumber::country::Id>().is_ok())
        });
        if geographic {
            codes.insert(code, OnceLock::new());
        }
    }
    codes
});

fn calling_code(code: u16) -> Option<&'static Code> {
    let cell = CODES.get(&code)?;
    cell.get_or_init(|| {
        let ids = DATABASE.region(&code)?;
        let regions = ids
            .iter()
            .map(|id| DATABASE.by_id(*id).and_then(Region::new))
            .collect::<Option<Vec<_>>>()?;
        Some(Code { regions })
    })
    .as_ref()
}

/// Compile every code's patterns now rather than on a first request.
pub(super) fn warm_up() {
    for code in CODES.keys() {
        calling_code(*code);
    }
}

/// `raw` is trimmed and starts with `+`.
pub(super) fn parse(raw: &str) -> Option<Parsed> {
    let digits = raw.strip_prefix('+')?;
    if digits.len() <= MIN_NSN || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    if digits.starts_with('0') {
        return None;
    }
    // The crate takes the first 1-, 2- or 3-digit prefix that is a calling code.
    let (code_number, national) = (1..=MAX_CODE.min(digits.len())).find_map(|len| {
        let code: u16 = digits[..len].parse().ok()?;
        DATABASE.by_code(&code).map(|_| (code, &digits[len..]))
    })?;
    if !(MIN_NSN..=MAX_NSN).contains(&national.len()) {
        return None;
    }
    let calling = calling_code(code_number)?;
    if calling.regions.len() > 1 && national.starts_with('0') {
        // The crate reads a shared code's region without the zeros and
        // judges the number without them: not worth copying.
        return None;
    }
    let Some(region) = calling.source(national) else {
        // No region's rules: the crate strips nothing and finds it valid
        // nowhere.
        return Some(Parsed {
            country_code: code_number.to_string(),
            national: national.to_string(),
            region: String::new(),
            valid: false,
        });
    };
    if !region.keeps(national) {
        return None;
    }
    Some(Parsed {
        country_code: code_number.to_string(),
        national: national.to_string(),
        region: region.id.clone(),
        valid: region.is_valid(national),
    })
}
