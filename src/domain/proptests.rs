//! Property tests of the parsers that take outside input: phone numbers (the
//! fast path against the `phonenumber` crate), user names, forwarded hops and
//! durations. Each holds for any input proptest can think of, not just the
//! cases written out in the modules' own tests.

use proptest::prelude::*;

use std::sync::LazyLock;

use regex::Regex;

use super::client_ip::{
    forwarded_for, parse_hop, ADDRESS_PATTERN, NETWORK_PATTERN, SUBJECT_PATTERN,
};
use super::{phone, username, ClientIp, PhoneNumber, Username};

static IP_ADDRESS: LazyLock<Regex> = LazyLock::new(|| Regex::new(&ADDRESS_PATTERN).unwrap());
static IP_SUBJECT: LazyLock<Regex> = LazyLock::new(|| Regex::new(&SUBJECT_PATTERN).unwrap());
static IP_NETWORK: LazyLock<Regex> = LazyLock::new(|| Regex::new(&NETWORK_PATTERN).unwrap());
static PHONE_SYNTAX: LazyLock<Regex> = LazyLock::new(|| Regex::new(phone::PATTERN).unwrap());
static USER: LazyLock<Regex> = LazyLock::new(|| Regex::new(&username::PATTERN).unwrap());

/// Text that looks like an IP address more often than not: groups of hex
/// digits and decimal octets joined by colons and dots, now and then `/64`.
fn address_like() -> impl Strategy<Value = String> {
    let part = prop_oneof![
        "[0-9a-fA-F]{0,5}",
        "(25[0-6]|1[0-9]{2}|0?[0-9]{1,2})",
        Just(String::new()),
    ];
    let sep = prop_oneof![Just(":"), Just("::"), Just("."), Just(":::")];
    (
        proptest::collection::vec((part, sep), 0..10),
        prop_oneof![Just(""), Just("/64"), Just("/48")],
    )
        .prop_map(|(parts, suffix)| {
            let mut s: String = parts
                .into_iter()
                .map(|(p, sep)| format!("{p}{sep}"))
                .collect();
            s.pop();
            s + suffix
        })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    /// Whatever the input, the fast path and the crate agree on `+` and
    /// digits; grouped, a number reads as its digits do, or is refused, and
    /// where the crate reads the grouped text itself it reads the same.
    /// (The crate refuses some groupings the documented pattern allows,
    /// `+14-012000000`, `+464(20000000`: they read as their digits; and
    /// reads some it refuses as digits, `+049-201000`: refused, as the
    /// digits are.)
    #[test]
    fn phone_parsing_agrees_with_the_crate(
        digits in "[0-9]{3,16}",
        junk in "[ +()./-]{0,3}",
        grouping in "[ ().-]{1,2}",
        cut in 1usize..16,
    ) {
        let plain_text = format!("+{digits}");
        let plain = PhoneNumber::parse(&plain_text);
        prop_assert_eq!(&plain, &PhoneNumber::parse_with_crate_for_tests(&plain_text), "{}", plain_text);
        let (head, tail) = digits.split_at(cut.min(digits.len()));
        for raw in [
            format!("+{junk}{digits}"),
            format!("{junk}+{digits}"),
            format!("+{head}{grouping}{tail}"),
        ] {
            let ours = PhoneNumber::parse(&raw);
            prop_assert!(ours == plain || ours.is_err(), "{}: {:?} against {:?}", raw, ours, plain);
            // Only where the crate reads the digits themselves: it reads
            // `+049-201000` as +49 201000 and refuses `+049201000`, and no
            // calling code starts with 0.
            if let (Ok(theirs), true) = (PhoneNumber::parse_with_crate_for_tests(&raw), plain.is_ok()) {
                prop_assert_eq!(ours, Ok(theirs), "{}", raw);
            }
        }
    }

    /// Any string parses or is refused without a panic, and a parsed
    /// number's E.164 parses to itself.
    #[test]
    fn phone_parsing_never_panics_and_is_idempotent(raw in "\\PC{0,40}") {
        if let Ok(phone) = PhoneNumber::parse(&raw) {
            let again = PhoneNumber::parse(phone.e164());
            prop_assert_eq!(again, Ok(phone));
        }
    }

    /// A name's normal form is its own normal form, and invisible code points
    /// or case never make two subjects of one name.
    #[test]
    fn user_names_have_one_form(name in "[a-zA-Z0-9ßÄäÉé_.-]{1,20}", at in 0usize..20) {
        let Ok(plain) = Username::parse(&name) else { return Ok(()) };
        prop_assert_eq!(Username::parse(plain.as_str()), Ok(plain.clone()));
        let mut spiked: String = name.chars().take(at).collect();
        spiked.push('\u{200b}');
        spiked.extend(name.chars().skip(at));
        prop_assert_eq!(Username::parse(&spiked), Ok(plain.clone()));
        prop_assert_eq!(Username::parse(&name.to_uppercase()), Ok(plain));
    }

    /// An address with or without a port, brackets or quotes is the address.
    #[test]
    fn forwarded_hops_name_their_address(a in any::<[u8; 4]>(), v6 in any::<[u16; 8]>(), port in 1u16..) {
        let ip4 = std::net::Ipv4Addr::from(a);
        let ip6 = std::net::Ipv6Addr::from(v6);
        for hop in [ip4.to_string(), format!("{ip4}:{port}"), format!("\"{ip4}:{port}\"")] {
            prop_assert_eq!(parse_hop(&hop), Some(ip4.into()), "{}", hop);
        }
        for hop in [ip6.to_string(), format!("[{ip6}]"), format!("[{ip6}]:{port}"), format!("\"[{ip6}]:{port}\"")] {
            prop_assert_eq!(parse_hop(&hop), Some(ip6.into()), "{}", hop);
        }
        let header = format!("for={ip4};proto=https, for=\"[{ip6}]:{port}\"");
        let hops: Vec<_> = forwarded_for(&header).filter_map(parse_hop).collect();
        prop_assert_eq!(hops, vec![std::net::IpAddr::from(ip4), ip6.into()]);
    }

    /// Garbage never parses as a hop, and never panics.
    #[test]
    fn hops_that_are_not_addresses_name_nothing(raw in "[a-zA-Z_]{1,12}") {
        prop_assert_eq!(parse_hop(&raw), None);
    }

    /// The OpenAPI document's IP patterns are what the parsers take: every
    /// address the standard library prints, and text that nearly is one.
    #[test]
    fn the_ip_patterns_are_what_the_parsers_take(
        v4 in any::<[u8; 4]>(), v6 in any::<[u16; 8]>(), zeros in 0usize..8, near in address_like(),
        bits in 0u8..=130,
    ) {
        let mut groups = v6;
        groups[zeros..].iter_mut().take(3).for_each(|g| *g = 0);
        let six = std::net::Ipv6Addr::from(groups);
        let mapped = format!("::ffff:{}", std::net::Ipv4Addr::from(v4));
        let full = groups.map(|g| format!("{g:x}")).join(":");
        for raw in [std::net::Ipv4Addr::from(v4).to_string(), six.to_string(), mapped, full, near] {
            prop_assert_eq!(ClientIp::parse(&raw).is_some(), IP_ADDRESS.is_match(&raw), "address {:?}", raw);
            prop_assert_eq!(ClientIp::parse_subject(&raw).is_some(), IP_SUBJECT.is_match(&raw), "subject {:?}", raw);
            let with_64 = format!("{raw}/64");
            prop_assert_eq!(ClientIp::parse_subject(&with_64).is_some(), IP_SUBJECT.is_match(&with_64), "subject {:?}", with_64);
            let network = format!("{raw}/{bits}");
            prop_assert_eq!(ClientIp::parse_network(&network).is_some(), IP_NETWORK.is_match(&network), "network {:?}", network);
        }
    }

    /// The phone pattern is the syntax `PhoneNumber::parse` takes: what it
    /// refuses as malformed fails the pattern, and the pattern refuses only
    /// what it refuses.
    #[test]
    fn the_phone_pattern_is_the_syntax_parse_takes(raw in "[ +0-9().a\t-]{0,34}") {
        let documented = PHONE_SYNTAX.is_match(&raw) && raw.len() <= phone::MAX_LEN;
        match PhoneNumber::parse(&raw) {
            Ok(_) => prop_assert!(documented, "{:?} parsed but fails the pattern", raw),
            Err(phone::PhoneError::Invalid) if documented => {
                // A number of the right form that the numbering plan refuses.
                let plan = phonenumber::parse(None, raw.trim_matches(' '));
                prop_assert!(!plan.is_ok_and(|n| phonenumber::is_valid(&n)), "{:?}", raw);
            }
            Err(_) => prop_assert!(!documented, "{:?} refused but fits the pattern", raw),
        }
    }

    /// The user pattern is what `Username::parse` accepts, for names that mix
    /// letters with white space, invisible and control characters.
    #[test]
    fn the_user_pattern_is_what_parse_takes(
        raw in "[a\u{e9}\u{fdfa} \t\n\u{85}\u{a0}\u{3000}\u{200b}\u{feff}\u{e0001}\u{3164}\u{0}\u{9f}]{0,6}",
    ) {
        let documented = USER.is_match(&raw) && raw.chars().count() <= username::MAX_CHARS;
        prop_assert_eq!(Username::parse(&raw).is_ok(), documented, "{:?}", raw);
    }

    /// Whatever a generator makes from the documented IP and user patterns
    /// (as schemathesis does from the OpenAPI document) is accepted.
    #[test]
    fn text_made_from_the_patterns_is_accepted(
        subject in from_pattern(&SUBJECT_PATTERN),
        network in from_pattern(&NETWORK_PATTERN),
        address in from_pattern(&ADDRESS_PATTERN),
        user in from_pattern(&username::PATTERN),
    ) {
        prop_assert!(ClientIp::parse_subject(&subject).is_some(), "{:?}", subject);
        prop_assert!(ClientIp::parse_network(&network).is_some(), "{:?}", network);
        prop_assert!(ClientIp::parse(&address).is_some(), "{:?}", address);
        if user.chars().count() <= username::MAX_CHARS {
            // Or too long once normalised, which no pattern can say.
            let parsed = Username::parse(&user);
            prop_assert!(
                parsed.is_ok() || parsed == Err(username::UsernameError::TooLongNormalised),
                "{:?}",
                user
            );
        }
    }
}

/// Strings matching `pattern` (anchored with `^…$`).
fn from_pattern(pattern: &str) -> proptest::string::RegexGeneratorStrategy<String> {
    let inner = pattern
        .strip_prefix('^')
        .and_then(|p| p.strip_suffix('$'))
        .unwrap();
    proptest::string::string_regex(inner).unwrap()
}
