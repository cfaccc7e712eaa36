//! Text that people other than its writer read: the console, a CSV export,
//! a terminal tailing the log.

use super::pattern::{in_ranges, DEFAULT_IGNORABLE};

/// Whether `c` can make text look other than it is: the general categories
/// control (C1 included: U+009B introduces terminal escapes), format
/// (bidirectional overrides, zero-width characters, tags) and line or
/// paragraph separator, and every default-ignorable code point: those
/// outside the format category draw nothing too (a name of Hangul fillers
/// reads as blank; `ann\u{fe0f}@example.com` as `ann@example.com`, so an
/// emoji's variation selector goes as well). Where such text is kept, these
/// become U+FFFD.
pub fn disguises(c: char) -> bool {
    use unicode_properties::{GeneralCategory, UnicodeGeneralCategory};
    // Most user agents are ASCII: no table search per character for them.
    if c.is_ascii() {
        return c.is_ascii_control();
    }
    matches!(
        c.general_category(),
        GeneralCategory::Control
            | GeneralCategory::Format
            | GeneralCategory::LineSeparator
            | GeneralCategory::ParagraphSeparator
    ) || in_ranges(DEFAULT_IGNORABLE, c)
}

/// `text` with every character that [`disguises`] it shown as U+FFFD.
pub fn undisguised(text: &str) -> String {
    text.replace(disguises, "\u{FFFD}")
}

#[cfg(test)]
mod tests {
    use super::disguises;

    #[test]
    fn what_draws_nothing_disguises_and_what_draws_a_letter_does_not() {
        for invisible in [
            '\u{034f}',
            '\u{115f}',
            '\u{1160}',
            '\u{17b4}',
            '\u{180f}',
            '\u{3164}',
            '\u{fe0f}',
            '\u{ffa0}',
            '\u{e0001}',
            '\u{e0100}',
            '\u{200b}',
            '\u{202e}',
            '\u{9b}',
            '\u{2028}',
        ] {
            assert!(disguises(invisible), "{invisible:?}");
        }
        for visible in [
            'a', 'é', '\u{3131}', '\u{ac00}', '\u{2764}', 'ж', '\u{ff21}', ' ',
        ] {
            assert!(!disguises(visible), "{visible:?}");
        }
    }
}
