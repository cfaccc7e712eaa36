//! Text that people other than its writer read: the console, a CSV export,
//! a terminal tailing the log.

/// Whether `c` can make text look other than it is: the general categories
/// control (C1 included: U+009B introduces terminal escapes), format
/// (bidirectional overrides, zero-width characters, tags) and line or
/// paragraph separator. Where such text is kept, these become U+FFFD.
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
    )
}
