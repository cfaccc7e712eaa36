//! Browser origins as `server.cors_origins` names them.

/// Whether `origin` is one `server.cors_origins` may hold: `*`, or a
/// scheme and host with an optional port and nothing after it.
pub fn valid_origin(origin: &str) -> bool {
    if origin == "*" {
        return true;
    }
    let Some((scheme, host)) = origin.split_once("://") else {
        return false;
    };
    matches!(scheme, "http" | "https")
        && !host.is_empty()
        && host
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | ':' | '[' | ']'))
}

#[cfg(test)]
mod tests {
    use super::valid_origin;

    #[test]
    fn origins_are_a_scheme_and_a_host_or_a_star() {
        for ok in [
            "*",
            "https://app.example.com",
            "http://localhost:5173",
            "https://[::1]:8443",
        ] {
            assert!(valid_origin(ok), "{ok}");
        }
        for bad in [
            "",
            "app.example.com",
            "https://app.example.com/",
            "ftp://x",
            "https://",
            "https://a b",
        ] {
            assert!(!valid_origin(bad), "{bad}");
        }
    }
}
