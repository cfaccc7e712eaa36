//! Browser origins as `server.cors_origins` names them.

/// Why an entry of `server.cors_origins` is refused.
#[derive(Debug, PartialEq, Eq)]
pub enum OriginError {
    /// Not `*` and not a scheme and host with an optional port.
    NotAnOrigin,
    /// An origin, but not as a browser writes it in its `Origin` header
    /// (upper case, a default port, a Unicode host), which actix-cors
    /// compares byte for byte: no browser would ever match it.
    NotAsBrowsersWriteIt(String),
}

/// Whether `origin` is one `server.cors_origins` may hold: `*`, or a
/// scheme and host with an optional port and nothing after it, written as
/// browsers write it.
pub fn check_origin(origin: &str) -> Result<(), OriginError> {
    if origin == "*" {
        return Ok(());
    }
    let Some((scheme, host)) = origin.split_once("://") else {
        return Err(OriginError::NotAnOrigin);
    };
    if !matches!(scheme.to_ascii_lowercase().as_str(), "http" | "https")
        || host.is_empty()
        || host.contains(['/', '?', '#', '@'])
    {
        return Err(OriginError::NotAnOrigin);
    }
    let url = url::Url::parse(origin).map_err(|_| OriginError::NotAnOrigin)?;
    let written = url.origin().ascii_serialization();
    if written == origin {
        Ok(())
    } else {
        Err(OriginError::NotAsBrowsersWriteIt(written))
    }
}

#[cfg(test)]
mod tests {
    use super::{check_origin, OriginError};

    #[test]
    fn origins_are_a_scheme_and_a_host_or_a_star() {
        for ok in [
            "*",
            "https://app.example.com",
            "http://localhost:5173",
            "https://[::1]:8443",
            "https://xn--bcher-kva.example",
        ] {
            assert_eq!(check_origin(ok), Ok(()), "{ok}");
        }
        for bad in [
            "",
            "app.example.com",
            "https://app.example.com/",
            "https://app.example.com?x",
            "https://user@app.example.com",
            "ftp://x",
            "https://",
            "https://a b",
        ] {
            assert_eq!(check_origin(bad), Err(OriginError::NotAnOrigin), "{bad}");
        }
    }

    #[test]
    fn an_origin_no_browser_writes_is_refused_with_the_form_they_do() {
        for (entry, form) in [
            ("https://SHOP.example.com", "https://shop.example.com"),
            ("HTTPS://shop.example.com", "https://shop.example.com"),
            ("https://shop2.example.com:443", "https://shop2.example.com"),
            ("http://localhost:80", "http://localhost"),
            ("https://bücher.example", "https://xn--bcher-kva.example"),
            ("https://[0:0::1]:8443", "https://[::1]:8443"),
        ] {
            assert_eq!(
                check_origin(entry),
                Err(OriginError::NotAsBrowsersWriteIt(form.to_string())),
                "{entry}"
            );
        }
    }
}
