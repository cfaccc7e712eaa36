//! Property tests of the parsers that take outside input: phone numbers (the
//! fast path against the `phonenumber` crate), user names, forwarded hops and
//! durations. Each holds for any input proptest can think of, not just the
//! cases written out in the modules' own tests.

use proptest::prelude::*;

use super::client_ip::{forwarded_for, parse_hop};
use super::{PhoneNumber, Username};

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    /// Whatever the input, the fast path and the crate agree.
    #[test]
    fn phone_parsing_agrees_with_the_crate(digits in "[0-9]{3,16}", junk in "[ +()./-]{0,3}") {
        for raw in [format!("+{digits}"), format!("+{junk}{digits}"), format!("{junk}+{digits}")] {
            prop_assert_eq!(PhoneNumber::parse(&raw), PhoneNumber::parse_with_crate_for_tests(&raw), "{}", raw);
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
}
