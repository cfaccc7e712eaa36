//! `SCAN MATCH` patterns.

/// Escape the `SCAN MATCH` glob characters.
pub(super) fn glob_escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        if matches!(c, '*' | '?' | '[' | ']' | '\\') {
            out.push('\\');
        }
        out.push(c);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn glob_characters_in_a_prefix_are_escaped() {
        assert_eq!(glob_escape("tg*[x]?"), "tg\\*\\[x\\]\\?");
    }
}
