//! SMS texts per locale from `templates/sms/<locale>.txt`, compiled in.

const SMS_TEMPLATES: &[(&str, &str)] = &[
    ("en", include_str!("../../templates/sms/en.txt")),
    ("zh-CN", include_str!("../../templates/sms/zh-CN.txt")),
];

/// The locale actually used: an exact match, then the language alone
/// (`zh-TW` → none, `en-GB` → `en`), then `en`.
pub fn resolve_locale(requested: Option<&str>) -> &'static str {
    let requested = requested.unwrap_or("en");
    if let Some((name, _)) = SMS_TEMPLATES
        .iter()
        .find(|(name, _)| name.eq_ignore_ascii_case(requested))
    {
        return name;
    }
    let language = requested.split(['-', '_']).next().unwrap_or("");
    SMS_TEMPLATES
        .iter()
        .find(|(name, _)| name.eq_ignore_ascii_case(language))
        .map(|(name, _)| *name)
        .unwrap_or("en")
}

/// Renders the SMS body; returns the locale used and the text.
pub fn render_sms(requested_locale: Option<&str>, code: &str, ttl_secs: u64) -> (&'static str, String) {
    let locale = resolve_locale(requested_locale);
    let template = SMS_TEMPLATES
        .iter()
        .find(|(name, _)| *name == locale)
        .map(|(_, text)| *text)
        .unwrap_or(SMS_TEMPLATES[0].1);
    let body = template
        .trim_end()
        .replace("{{code}}", code)
        .replace("{{ttl_minutes}}", &ttl_secs.div_ceil(60).to_string());
    (locale, body)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn locales_fall_back_to_language_then_english() {
        assert_eq!(resolve_locale(Some("zh-CN")), "zh-CN");
        assert_eq!(resolve_locale(Some("en-GB")), "en");
        assert_eq!(resolve_locale(Some("fr")), "en");
        assert_eq!(resolve_locale(None), "en");
    }

    #[test]
    fn the_code_and_ttl_are_rendered() {
        let (_, body) = render_sms(Some("en"), "123456", 300);
        assert!(body.contains("123456") && body.contains("5 minutes"), "{body}");
    }
}
