//! The templates built into the binary, from `templates/`: the defaults, and
//! what a `templates_dir` file is laid over.

use std::path::PathBuf;

use super::{EmailKind, Source, Text};

const SMS: &[(&str, &str)] = &[
    ("en", include_str!("../../../templates/sms/en.txt")),
    ("zh-CN", include_str!("../../../templates/sms/zh-CN.txt")),
];

const EMAIL: &[(&str, EmailKind, &str)] = &[
    (
        "en",
        EmailKind::LockNotice,
        include_str!("../../../templates/email/en/lock_notice.txt"),
    ),
    (
        "en",
        EmailKind::AlertDigest,
        include_str!("../../../templates/email/en/alert_digest.txt"),
    ),
    (
        "zh-CN",
        EmailKind::LockNotice,
        include_str!("../../../templates/email/zh-CN/lock_notice.txt"),
    ),
    (
        "zh-CN",
        EmailKind::AlertDigest,
        include_str!("../../../templates/email/zh-CN/alert_digest.txt"),
    ),
];

/// Every compiled-in template; an error in one names its path in the
/// repository.
pub(super) fn sources() -> impl Iterator<Item = Source> {
    let sms = SMS.iter().map(|(locale, body)| (Text::Sms, *locale, *body));
    let email = EMAIL
        .iter()
        .map(|(locale, kind, body)| (Text::Email(*kind), *locale, *body));
    sms.chain(email).map(|(text, locale, body)| Source {
        text,
        locale: locale.to_string(),
        body: body.to_string(),
        origin: PathBuf::from(format!("templates/{} (compiled in)", text.name(locale))),
    })
}
