//! The OpenAPI schemas of the values the domain parses, built from the
//! parsers' own patterns, so that the document accepts exactly what the
//! routes accept (schemathesis holds the two equal over every route). A
//! phone number's validity is the numbering plan's, which no pattern can
//! state: its schema says `format: phone` and gives the syntax in words.

use utoipa::openapi::schema::{Object, ObjectBuilder, SchemaFormat, SchemaType, Type};
use utoipa::ToSchema;

use crate::audit::query::Cursor;
use crate::domain::{client_ip, email, locale, pattern, phone, username, Locale};
use crate::error::{ApiError, ErrorBody};

/// The longest `code` taken by `/sms/verify`, in characters.
pub const CODE_MAX_CHARS: usize = 64;

fn text(pattern: &str) -> ObjectBuilder {
    ObjectBuilder::new()
        .schema_type(Type::String)
        .pattern(Some(pattern))
}

/// The same, or `null` (an optional body field).
fn nullable(schema: ObjectBuilder) -> Object {
    schema
        .schema_type(SchemaType::Array(vec![Type::String, Type::Null]))
        .build()
}

/// A phone number: `format: phone` and the syntax in words, not as a
/// `pattern`. A generator that met a pattern would make numbers of the right
/// form that no numbering plan has; with the format alone, schemathesis
/// draws real numbers (the test registers the format) and a client
/// generator takes a string.
pub fn phone() -> Object {
    ObjectBuilder::new()
        .schema_type(Type::String)
        .max_length(Some(phone::MAX_LEN))
        .format(Some(SchemaFormat::Custom("phone".into())))
        .description(Some(format!(
            "A phone number in international form: `+`, the country code and the number, \
             digits that spaces, dots, dashes and parentheses may group (`{}`). It must be a \
             number of its country's numbering plan (libphonenumber's metadata): one that is \
             not answers 400 `invalid_phone`.",
            phone::PATTERN
        )))
        .examples(["+8613800138000"])
        .build()
}

/// An IP list entry: an address or a CIDR (`format: cidr`; an address is
/// taken as a /32 or /128).
pub fn cidr() -> Object {
    ObjectBuilder::new()
        .schema_type(Type::String)
        .max_length(Some(64))
        .format(Some(SchemaFormat::Custom("cidr".into())))
        .description(Some(
            "An IPv4 or IPv6 address, or a CIDR (`198.51.100.0/24`, `2001:db8::/32`).",
        ))
        .examples(["198.51.100.0/24"])
        .build()
}

/// A phone list entry: a number, or a prefix ending in `*`.
pub fn phone_entry() -> Object {
    ObjectBuilder::new()
        .schema_type(Type::String)
        .max_length(Some(phone::MAX_LEN))
        .format(Some(SchemaFormat::Custom("phone-entry".into())))
        .description(Some(
            "A phone number as `/sms/send` takes it (of its country's numbering plan), or a \
             prefix: `+`, 1 to 15 digits, then `*` (`+88213*`).",
        ))
        .examples(["+88213*"])
        .build()
}

/// The `code` of `/sms/verify`.
pub fn code() -> Object {
    text(&pattern::not_blank())
        .min_length(Some(1))
        .max_length(Some(CODE_MAX_CHARS))
        .description(Some(
            "The code as the user typed it; white space around it is ignored. \
             A wrong code answers 200 with `valid: false`.",
        ))
        .examples(["123456"])
        .build()
}

/// A login name, as `Username::parse` takes it.
pub fn user() -> Object {
    text(&username::PATTERN)
        .min_length(Some(1))
        .max_length(Some(username::MAX_CHARS))
        .description(Some(
            "The login name, counted as one subject whatever its case, width or invisible \
             characters (NFKC, default-ignorables dropped, case folded). No control \
             characters; at least one character that is neither white space nor invisible. \
             Pass the account your backend found (its id or stored login), not the name as \
             typed: accents stay apart here, and a lookup that folds them would give one \
             account many users.",
        ))
        .examples(["alice"])
        .build()
}

/// An admin's note on a list entry (`lists::checked_note`).
pub fn note() -> Object {
    text(&pattern::without_control())
        .max_length(Some(crate::lists::MAX_NOTE_CHARS))
        .description(Some(
            "Why the entry is added: one line of at most 256 characters, no control \
             characters (a newline or a tab included); spaces at either end are trimmed.",
        ))
        .examples(["abuse"])
        .build()
}

fn ip_text() -> ObjectBuilder {
    text(&client_ip::ADDRESS_PATTERN)
        .description(Some(
            "An IPv4 or IPv6 address, without brackets, port or zone.",
        ))
        .examples(["203.0.113.7"])
}

/// An IP address (the admin event filter's `ip`).
pub fn ip_address() -> Object {
    ip_text().build()
}

/// The body's `ip`: an address, or `null` for none.
pub fn optional_ip_address() -> Object {
    nullable(ip_text().description(Some(
        "The client's IPv4 or IPv6 address; honoured only on requests authenticated \
         with an API key. A loopback or unspecified address names no client: the call \
         counts as one without `ip`, in no address's window or list.",
    )))
}

/// An IP subject's id in an admin path.
pub fn ip_subject() -> Object {
    text(&client_ip::SUBJECT_PATTERN)
        .description(Some(
            "An IPv4 address, or an IPv6 address or its /64 (`2001:db8:1:2::/64`, the \
             subject's own form, `/` written `%2F` or as is): an IPv6 address counts in its /64, \
             an IPv4-mapped or translated one (`::ffff:203.0.113.7`, `64:ff9b::203.0.113.7`) \
             as the IPv4 address it carries.",
        ))
        .examples(["203.0.113.7"])
        .build()
}

/// A network subject's id in an admin path.
pub fn network_subject() -> Object {
    text(&client_ip::NETWORK_PATTERN)
        .description(Some(
            "An IPv6 network with its length, 32 to 64 (`2001:db8:1::/48`, `/` written `%2F` \
             or as is); any address in it names it. `/sms/send` counts an IPv6 client in its \
             network of `sms.network_bits` bits.",
        ))
        .examples(["2001:db8:1::/48"])
        .build()
}

/// A number prefix subject's id in an admin path.
pub fn prefix() -> Object {
    text(r"^\+?[0-9]{1,15}$")
        .description(Some(
            "The first digits of E.164 numbers, with or without the `+`.",
        ))
        .examples(["+8613800"])
        .build()
}

/// A country subject's id in an admin path.
pub fn country() -> Object {
    text(r"^[A-Za-z]{2}$")
        .description(Some(
            "An ISO 3166 alpha-2 region code (`CN`), either case: the region of the \
             phone numbers the SMS pumping guard counts together.",
        ))
        .examples(["CN"])
        .build()
}

/// The body's `notify_email`, or `null`.
pub fn optional_email() -> Object {
    nullable(
        text(&email::PATTERN)
            .max_length(Some(email::MAX_LEN))
            .description(Some(
                "Where to tell the account's owner that it was locked (one email per lock): \
                 an ASCII `local@domain`, the domain with a dot.",
            ))
            .examples(["alice@example.com"]),
    )
}

/// The admin event list's `cursor`.
pub fn cursor() -> Object {
    text(Cursor::PATTERN)
        .description(Some("`next_cursor` of the previous page."))
        .build()
}

/// A free-text filter: anything but control characters.
pub fn filter_text() -> Object {
    text(r"^[^\x00-\x1f\x7f-\x9f]+$").build()
}

/// The language of the text sent (the SMS, the lockout notice), or null.
pub fn optional_locale() -> Object {
    nullable(
        text(locale::PATTERN)
            .description(Some(
                "Language tag of the text sent (`zh-CN`); a locale without texts falls back to `en`.",
            ))
            .examples(["zh-CN"]),
    )
}

/// An optional `locale` of a body, checked as the document's pattern says.
pub fn locale(raw: Option<String>) -> Result<Option<Locale>, ApiError> {
    raw.map(|l| Locale::parse(&l).map_err(|e| ApiError::InvalidRequest(e.to_string())))
        .transpose()
}

/// A `rate_limited` error: the error body with `retry_after_secs` and `rule`
/// always present. Documentation only; `ApiError` serialises [`ErrorBody`].
#[derive(ToSchema)]
#[allow(dead_code)]
pub struct RateLimitedError {
    #[serde(flatten)]
    error: ErrorBody,
    /// Whole seconds until a retry can pass; the same as the `Retry-After` header.
    #[schema(minimum = 1, example = 1800)]
    retry_after_secs: u64,
    /// The rule that denied, `<subject kind> <limit>/<window>`.
    #[schema(example = "phone 5/1h")]
    rule: String,
}
