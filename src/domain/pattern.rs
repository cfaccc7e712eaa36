//! Regular expressions for the OpenAPI document's `pattern`s, written so that
//! ECMA 262 (JSON Schema's dialect), Python's `re` (schemathesis) and Rust's
//! `regex` (the tests that hold each parser equal to its pattern) read them
//! alike: ASCII below 0x100 as `\xNN` escapes, everything else as the
//! character itself, never `\u`, whose astral form differs between them.

use std::fmt::Write;

/// An inclusive range of code points.
pub type Range = (u32, u32);

fn push_char(out: &mut String, cp: u32) {
    match char::from_u32(cp) {
        Some(c) if cp >= 0x100 => out.push(c),
        _ => {
            let _ = write!(out, "\\x{cp:02x}");
        }
    }
}

/// General category Cc, the control characters (`char::is_control`).
pub const CONTROL: &[Range] = &[(0x00, 0x1f), (0x7f, 0x9f)];

/// Text with no control character anywhere.
pub fn without_control() -> String {
    format!("^[^{}]*$", class_members(CONTROL))
}

/// The members of a bracket expression (without the brackets) for `ranges`.
pub fn class_members(ranges: &[Range]) -> String {
    let mut out = String::new();
    for &(lo, hi) in ranges {
        push_char(&mut out, lo);
        if hi > lo {
            out.push('-');
            push_char(&mut out, hi);
        }
    }
    out
}

/// Unicode's White_Space (what `str::trim` removes): a name of nothing else
/// is blank.
pub const WHITE_SPACE: &[Range] = &[
    (0x09, 0x0d),
    (0x20, 0x20),
    (0x85, 0x85),
    (0xa0, 0xa0),
    (0x1680, 0x1680),
    (0x2000, 0x200a),
    (0x2028, 0x2029),
    (0x202f, 0x202f),
    (0x205f, 0x205f),
    (0x3000, 0x3000),
];

/// Some character that is not white space (unanchored).
pub fn not_blank() -> String {
    format!("[^{}]", class_members(WHITE_SPACE))
}

/// Unicode's Default_Ignorable_Code_Point (DerivedCoreProperties.txt): code
/// points that render as nothing, so a name with them looks like one without.
pub const DEFAULT_IGNORABLE: &[Range] = &[
    (0x00ad, 0x00ad),
    (0x034f, 0x034f),
    (0x061c, 0x061c),
    (0x115f, 0x1160),
    (0x17b4, 0x17b5),
    (0x180b, 0x180f),
    (0x200b, 0x200f),
    (0x202a, 0x202e),
    (0x2060, 0x206f),
    (0x3164, 0x3164),
    (0xfe00, 0xfe0f),
    (0xfeff, 0xfeff),
    (0xffa0, 0xffa0),
    (0xfff0, 0xfff8),
    (0x1bca0, 0x1bca3),
    (0x1d173, 0x1d17a),
    (0xe0000, 0xe0fff),
];

/// Whether `c` is in one of `ranges`.
pub fn in_ranges(ranges: &[Range], c: char) -> bool {
    let cp = c as u32;
    ranges.iter().any(|&(lo, hi)| (lo..=hi).contains(&cp))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ascii_is_escaped_and_the_rest_is_literal() {
        assert_eq!(class_members(&[(0, 0x1f), (0x20, 0x20)]), r"\x00-\x1f\x20");
        assert_eq!(class_members(&[(0x200b, 0x200f)]), "\u{200b}-\u{200f}");
        assert_eq!(class_members(&[(0xe0000, 0xe0fff)]), "\u{e0000}-\u{e0fff}");
    }
}
