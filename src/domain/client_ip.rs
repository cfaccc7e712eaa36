//! Client addresses as counted subjects: IPv4 as is, IPv6 grouped by /64 (one
//! customer's allocation), IPv4-mapped IPv6 and IPv4 translated into RFC
//! 6052's well-known prefix treated as IPv4. An IPv6 client is also counted
//! in its network (`sms.network_bits`, a /48 by default): one site, or one
//! free tunnel-broker allocation, holds 65,536 /64s.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::sync::LazyLock;

use ipnet::{IpNet, Ipv6Net};

/// A client's address, IPv4-mapped or translated IPv6 taken as the IPv4
/// address it carries; `subject_id` names the subject it counts under.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ClientIp(IpAddr);

impl ClientIp {
    /// Canonical form: an IPv4-mapped (`::ffff:a.b.c.d`) or translated
    /// (`64:ff9b::a.b.c.d`) IPv6 address becomes IPv4.
    pub fn new(addr: IpAddr) -> Self {
        match addr.to_canonical() {
            IpAddr::V6(v6) => Self(translated_ipv4(v6).map_or(IpAddr::V6(v6), IpAddr::V4)),
            v4 => Self(v4),
        }
    }

    /// An address as written by a caller: exactly what [`ADDRESS_PATTERN`]
    /// matches, nothing around it.
    pub fn parse(raw: &str) -> Option<Self> {
        raw.parse::<IpAddr>().ok().map(Self::new)
    }

    /// An IP subject as an admin names it: an address, or an IPv6 address
    /// with `/64` (the subject's own form, `2001:db8:1:2::/64`), as
    /// [`SUBJECT_PATTERN`] says. Another range is not a subject. A /64 is
    /// that /64 even in `64:ff9b::/96`: the subject translated clients
    /// counted under before they counted as IPv4, which an admin may still
    /// need to unblock or look up.
    pub fn parse_subject(raw: &str) -> Option<Self> {
        match raw.split_once('/') {
            Some((addr, "64")) => addr
                .parse::<Ipv6Addr>()
                .ok()
                .map(|v6| Self(IpAddr::V6(v6).to_canonical())),
            Some(_) => None,
            None => Self::parse(raw),
        }
    }

    /// The address itself.
    pub fn addr(&self) -> IpAddr {
        self.0
    }

    /// Whether a backend that passes this as its client's address passes
    /// its own: a loopback address is what a backend behind a proxy on its
    /// own host reads as every user's (`remote_addr`), and an unspecified
    /// one is a placeholder. Counted under it, a hundred strangers' typos
    /// would block every login, and an allow-listed `127.0.0.0/8` would
    /// take every user past every limit.
    pub fn names_no_client(&self) -> bool {
        self.0.is_loopback() || self.0.is_unspecified()
    }

    /// Whether one of `nets` (`server.trusted_proxies`, say) holds `raw` as
    /// it came (`64:ff9b::c000:20a`) or as it counts (`192.0.2.10`): a proxy
    /// reached through a translator is shown, logged and audited as the
    /// latter, and may be configured as either.
    pub fn in_any(raw: IpAddr, nets: &[IpNet]) -> bool {
        let came = raw.to_canonical();
        let counts = Self::new(came).0;
        nets.iter()
            .any(|net| net.contains(&came) || (counts != came && net.contains(&counts)))
    }

    /// The address as `Display` writes it; an IPv4 one without the
    /// formatting machinery (every audit row names its request's address).
    pub fn text(&self) -> String {
        match self.0 {
            IpAddr::V4(v4) => dotted(v4.octets()),
            v6 => v6.to_string(),
        }
    }

    /// What the address counts as: itself (IPv4), or its /64's first
    /// address (IPv6).
    pub fn counted_as(&self) -> IpAddr {
        match self.0 {
            IpAddr::V4(_) => self.0,
            IpAddr::V6(v6) => {
                let s = v6.segments();
                IpAddr::V6(Ipv6Addr::new(s[0], s[1], s[2], s[3], 0, 0, 0, 0))
            }
        }
    }

    /// The subject id: `203.0.113.7` or `2001:db8:1:2::/64`.
    pub fn subject_id(&self) -> String {
        match self.counted_as() {
            IpAddr::V4(v4) => dotted(v4.octets()),
            IpAddr::V6(net) => format!("{net}/64"),
        }
    }

    /// The network subject's id: the address's first `bits` bits
    /// (`2001:db8:1::/48`); `None` for an IPv4 client, which has none.
    pub fn network_id(&self, bits: u8) -> Option<String> {
        match self.0 {
            IpAddr::V4(_) => None,
            IpAddr::V6(v6) => network_text(v6, bits),
        }
    }

    /// A network subject as an admin names it: an IPv6 address with a
    /// length of [`NETWORK_BITS`] (`2001:db8:1::/48`, or any address in it),
    /// as [`NETWORK_PATTERN`] says; answered in the form
    /// [`Self::network_id`] gives.
    pub fn parse_network(raw: &str) -> Option<String> {
        let (addr, bits) = raw.split_once('/')?;
        // Digits only: `u8`'s parser would also take `+48`.
        if bits.is_empty() || bits.len() > 2 || !bits.bytes().all(|b| b.is_ascii_digit()) {
            return None;
        }
        network_text(addr.parse().ok()?, bits.parse().ok()?)
    }
}

/// The lengths a network subject may have (`sms.network_bits`): from a
/// regional registry's smallest allocation to one /64, the IP subject.
pub const NETWORK_BITS: std::ops::RangeInclusive<u8> = 32..=64;

/// `2001:db8:1::/48` for the first `bits` bits of `v6`, when `bits` is one
/// of [`NETWORK_BITS`].
fn network_text(v6: Ipv6Addr, bits: u8) -> Option<String> {
    if !NETWORK_BITS.contains(&bits) {
        return None;
    }
    Ipv6Net::new(v6, bits)
        .ok()
        .map(|net| net.trunc().to_string())
}

/// The IPv4 client behind an address of RFC 6052's well-known prefix,
/// `64:ff9b::/96`: a NAT64 or SIIT translator in front of the service
/// writes every IPv4 client into it, so counted per /64 they would all be
/// one subject, and one abuser among them would throttle or block the rest.
/// The prefix is reserved for translation (RFC 6052 §3.1), so no native
/// IPv6 client has such an address.
pub fn translated_ipv4(v6: Ipv6Addr) -> Option<Ipv4Addr> {
    let [.., w, x, y, z] = v6.octets();
    TRANSLATION_PREFIX
        .contains(&v6)
        .then(|| Ipv4Addr::new(w, x, y, z))
}

/// RFC 6052's well-known prefix, `64:ff9b::/96`.
pub const TRANSLATION_PREFIX: Ipv6Net =
    Ipv6Net::new_assert(Ipv6Addr::new(0x64, 0xff9b, 0, 0, 0, 0, 0, 0), 96);

/// An IPv4 address as `Ipv4Addr`'s `Display` writes it, without the
/// formatting machinery: a login formats its IP twice (the pair lock and the
/// IP's window), and `to_string` cost some 1,300 instructions each.
fn dotted(octets: [u8; 4]) -> String {
    let mut out = String::with_capacity(15);
    for (i, octet) in octets.into_iter().enumerate() {
        if i > 0 {
            out.push('.');
        }
        if octet >= 100 {
            out.push(char::from(b'0' + octet / 100));
        }
        if octet >= 10 {
            out.push(char::from(b'0' + octet / 10 % 10));
        }
        out.push(char::from(b'0' + octet % 10));
    }
    out
}

impl std::fmt::Display for ClientIp {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.0.fmt(f)
    }
}

/// An IPv4 address as the standard library reads one: four decimal
/// octets, no leading zeros.
const IPV4: &str = r"(?:(?:25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])\.){3}(?:25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])";
const HEX: &str = "[0-9A-Fa-f]{1,4}";

/// An IPv6 address as the standard library reads one: eight groups, or
/// fewer around one `::` that stands for at least one, and an IPv4 address
/// in place of the last two groups.
fn ipv6_pattern() -> String {
    // `n` groups, each followed by a colon.
    let groups = |n: usize| format!("(?:{HEX}:){{{n}}}");
    let mut forms = vec![
        format!("{}{HEX}", groups(7)),
        format!("{}{IPV4}", groups(6)),
    ];
    for head in 0..=7usize {
        let head_part = match head {
            0 => String::new(),
            n => format!("{HEX}(?::{HEX}){{{}}}", n - 1),
        };
        // The tail has room for 7 - head groups.
        let room = 7 - head;
        let mut tails = Vec::new();
        if room >= 1 {
            tails.push(format!("{HEX}(?::{HEX}){{0,{}}}", room - 1));
        }
        if room >= 2 {
            tails.push(format!("(?:{HEX}:){{0,{}}}{IPV4}", room - 2));
        }
        let tail_part = if tails.is_empty() {
            String::new()
        } else {
            format!("(?:{})?", tails.join("|"))
        };
        forms.push(format!("{head_part}::{tail_part}"));
    }
    format!("(?:{})", forms.join("|"))
}

/// What [`ClientIp::parse`] accepts, as the OpenAPI document's `pattern`.
pub static ADDRESS_PATTERN: LazyLock<String> =
    LazyLock::new(|| format!("^(?:{IPV4}|{})$", ipv6_pattern()));

/// What [`ClientIp::parse_subject`] accepts, as the OpenAPI document's `pattern`.
pub static SUBJECT_PATTERN: LazyLock<String> =
    LazyLock::new(|| format!("^(?:{IPV4}|{}(?:/64)?)$", ipv6_pattern()));

/// What [`ClientIp::parse_network`] accepts, as the OpenAPI document's
/// `pattern`: an IPv6 address, `/` and 32 to 64.
pub static NETWORK_PATTERN: LazyLock<String> =
    LazyLock::new(|| format!("^{}/(?:3[2-9]|[45][0-9]|6[0-4])$", ipv6_pattern()));

/// One hop of `X-Forwarded-For` or one `for=` of `Forwarded` (RFC 7239):
/// `203.0.113.7`, `203.0.113.7:443`, `2001:db8::1`, `[2001:db8::1]` or
/// `[2001:db8::1]:443`, optionally in double quotes. `unknown`, an obfuscated
/// identifier (`_hidden`) or anything else answers `None`: the hop names no
/// address.
pub fn parse_hop(raw: &str) -> Option<IpAddr> {
    let hop = raw.trim();
    let hop = hop
        .strip_prefix('"')
        .and_then(|h| h.strip_suffix('"'))
        .unwrap_or(hop);
    if let Ok(ip) = hop.parse::<IpAddr>() {
        return Some(ip);
    }
    if let Some(bracketed) = hop.strip_prefix('[') {
        let (addr, rest) = bracketed.split_once(']')?;
        let port_ok = rest.is_empty()
            || rest
                .strip_prefix(':')
                .is_some_and(|p| !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()));
        return addr
            .parse::<Ipv6Addr>()
            .ok()
            .filter(|_| port_ok)
            .map(IpAddr::V6);
    }
    // IPv4 with a port: exactly one colon.
    let (addr, port) = hop.split_once(':')?;
    if port.is_empty() || !port.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    addr.parse::<std::net::Ipv4Addr>().ok().map(IpAddr::V4)
}

/// The `for=` values of a `Forwarded` header (RFC 7239), in order: one per
/// element (`for=a, for=b`), parameters in any order, names in any case. An
/// element without `for=` (`proto=https`, garbage, nothing after a comma)
/// is an entry too, `""`, which names no address: skipping it would walk on
/// into what the client wrote (`domain::forwarding`).
pub fn forwarded_for(header: &str) -> impl Iterator<Item = &str> {
    header.split(',').map(|element| {
        element
            .split(';')
            .find_map(|pair| {
                let (name, value) = pair.split_once('=')?;
                name.trim()
                    .eq_ignore_ascii_case("for")
                    .then(|| value.trim())
            })
            .unwrap_or_default()
    })
}

/// A CIDR, or a single address taken as /32 or /128.
pub fn parse_cidr(raw: &str) -> Option<IpNet> {
    let raw = raw.trim();
    raw.parse::<IpNet>()
        .ok()
        .or_else(|| raw.parse::<IpAddr>().ok().map(IpNet::from))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loopback_and_unspecified_addresses_name_no_client() {
        for raw in [
            "127.0.0.1",
            "127.8.9.10",
            "::1",
            "0.0.0.0",
            "::",
            "::ffff:127.0.0.1",
        ] {
            let ip = ClientIp::parse(raw).expect(raw);
            assert!(ip.names_no_client(), "{raw}");
        }
        for raw in ["198.51.100.7", "10.0.0.1", "2001:db8::1", "::2", "fe80::1"] {
            let ip = ClientIp::parse(raw).expect(raw);
            assert!(!ip.names_no_client(), "{raw}");
        }
    }

    #[test]
    fn the_text_is_what_display_writes() {
        for raw in [
            "203.0.113.7",
            "0.0.0.0",
            "255.255.255.255",
            "10.0.5.99",
            "2001:db8::1",
            "::1",
        ] {
            let ip = ClientIp::parse(raw).expect("an address");
            assert_eq!(ip.text(), ip.to_string(), "{raw}");
        }
    }

    #[test]
    fn an_ipv4_id_is_what_display_writes_for_every_octet() {
        for octet in 0..=255u8 {
            for addr in [
                std::net::Ipv4Addr::new(octet, 0, 255, octet),
                std::net::Ipv4Addr::new(10, octet, octet, 9),
            ] {
                let id = ClientIp::new(IpAddr::V4(addr)).subject_id();
                assert_eq!(id, addr.to_string());
            }
        }
    }

    #[test]
    fn an_ipv6_client_is_in_its_network_and_an_ipv4_one_in_none() {
        let ip = |raw| ClientIp::parse(raw).expect("an address");
        assert_eq!(
            ip("2001:db8:1:2:aaaa::1").network_id(48).as_deref(),
            Some("2001:db8:1::/48")
        );
        assert_eq!(
            ip("2001:db8:1:2ff:aaaa::1").network_id(56).as_deref(),
            Some("2001:db8:1:200::/56")
        );
        assert_eq!(
            ip("2001:db8:1:2:aaaa::1").network_id(64).as_deref(),
            Some("2001:db8:1:2::/64")
        );
        // Mapped and translated IPv4 clients are IPv4: no network.
        for raw in ["203.0.113.7", "::ffff:203.0.113.7", "64:ff9b::203.0.113.7"] {
            assert_eq!(ip(raw).network_id(48), None, "{raw}");
        }
        // Outside the lengths a network may have.
        assert_eq!(ip("2001:db8::1").network_id(31), None);
        assert_eq!(ip("2001:db8::1").network_id(65), None);
    }

    #[test]
    fn an_admin_names_a_network_by_any_address_in_it_with_its_length() {
        for (raw, id) in [
            ("2001:db8:1::/48", Some("2001:db8:1::/48")),
            ("2001:DB8:1:2:aaaa::1/48", Some("2001:db8:1::/48")),
            ("2001:db8::/32", Some("2001:db8::/32")),
            ("2001:db8:1:2::/64", Some("2001:db8:1:2::/64")),
            ("2001:db8:1::", None),
            ("2001:db8:1::/31", None),
            ("2001:db8:1::/65", None),
            ("2001:db8:1::/+48", None),
            ("2001:db8:1::/048", None),
            ("203.0.113.0/24", None),
            ("/48", None),
        ] {
            assert_eq!(ClientIp::parse_network(raw).as_deref(), id, "{raw}");
        }
    }

    #[test]
    fn ipv6_is_grouped_by_64_and_mapped_ipv4_is_plain_ipv4() {
        assert_eq!(
            ClientIp::parse("203.0.113.7").unwrap().subject_id(),
            "203.0.113.7"
        );
        assert_eq!(
            ClientIp::parse("2001:db8:1:2:aaaa::1")
                .unwrap()
                .subject_id(),
            "2001:db8:1:2::/64"
        );
        assert_eq!(
            ClientIp::parse("::ffff:198.51.100.4").unwrap().subject_id(),
            "198.51.100.4"
        );
        assert!(ClientIp::parse("300.1.1.1").is_none());
        // The deprecated IPv4-compatible form and the like are plain IPv6
        // (docs/security.md): one bucket, not the IPv4 address.
        for raw in ["::203.0.113.7", "::ffff:0:203.0.113.7", "::1", "::"] {
            assert_eq!(ClientIp::parse(raw).unwrap().subject_id(), "::/64", "{raw}");
        }
    }

    #[test]
    fn translated_ipv4_counts_as_the_ipv4_client_it_carries() {
        for (raw, v4) in [
            ("64:ff9b::203.0.113.7", "203.0.113.7"),
            ("64:ff9b::c633:6404", "198.51.100.4"),
            ("64:FF9B:0:0:0:0:cb00:7107", "203.0.113.7"),
        ] {
            let ip = ClientIp::parse(raw).expect("an address");
            assert_eq!(ip.addr(), v4.parse::<IpAddr>().unwrap(), "{raw}");
            assert_eq!(ip.subject_id(), v4, "{raw}");
            assert_eq!(ip.text(), v4, "{raw}");
            assert_eq!(
                ClientIp::parse_subject(raw).unwrap().subject_id(),
                v4,
                "{raw}"
            );
            // With /64 it names the /64 such clients counted under before.
            let before = ClientIp::parse_subject(&format!("{raw}/64")).unwrap();
            assert_eq!(before.subject_id(), "64:ff9b::/64", "{raw}");
        }
        // Two translated clients are two subjects, not one /64.
        assert_ne!(
            ClientIp::parse("64:ff9b::203.0.113.7")
                .unwrap()
                .counted_as(),
            ClientIp::parse("64:ff9b::203.0.113.8")
                .unwrap()
                .counted_as()
        );
        // Only the /96 itself: its neighbours, and the local-use 64:ff9b:1::/48
        // (RFC 8215, whose IPv4 sits where its operator's prefix length puts
        // it), stay IPv6 grouped by /64.
        for raw in [
            "64:ff9b:0:0:1::203.0.113.7",
            "64:ff9b::1:cb00:7107",
            "64:ff9b:1::203.0.113.7",
            "64:ff9a::203.0.113.7",
            "2001:db8::203.0.113.7",
        ] {
            let ip = ClientIp::parse(raw).expect("an address");
            assert!(ip.addr().is_ipv6(), "{raw}");
            assert!(ip.subject_id().ends_with("/64"), "{raw}");
        }
    }

    #[test]
    fn a_range_holds_an_address_as_it_came_or_as_it_counts() {
        let translated: IpAddr = "64:ff9b::192.0.2.10".parse().unwrap();
        let nets =
            |nets: &[&str]| -> Vec<IpNet> { nets.iter().map(|n| n.parse().unwrap()).collect() };
        for net in ["192.0.2.0/24", "64:ff9b::/96", "64:ff9b::192.0.2.10/128"] {
            assert!(ClientIp::in_any(translated, &nets(&[net])), "{net}");
        }
        let mapped: IpAddr = "::ffff:192.0.2.10".parse().unwrap();
        assert!(ClientIp::in_any(mapped, &nets(&["192.0.2.0/24"])));
        assert!(ClientIp::in_any(
            translated,
            &nets(&["10.0.0.0/8", "192.0.2.0/24"])
        ));
        assert!(!ClientIp::in_any(translated, &[]));
        assert!(!ClientIp::in_any(translated, &nets(&["192.0.3.0/24"])));
    }

    #[test]
    fn hops_take_ports_brackets_and_quotes_and_name_nothing_else() {
        let v4: IpAddr = "2.2.2.2".parse().unwrap();
        let v6: IpAddr = "2001:db8::1".parse().unwrap();
        for (raw, expected) in [
            ("2.2.2.2", Some(v4)),
            (" 2.2.2.2:443 ", Some(v4)),
            ("\"2.2.2.2:443\"", Some(v4)),
            ("2001:db8::1", Some(v6)),
            ("[2001:db8::1]", Some(v6)),
            ("[2001:db8::1]:443", Some(v6)),
            ("\"[2001:db8::1]:4711\"", Some(v6)),
            ("unknown", None),
            ("_hidden", None),
            ("2.2.2.2:", None),
            ("2.2.2.2:http", None),
            ("[2001:db8::1]:", None),
            ("[2.2.2.2]", None),
            ("", None),
        ] {
            assert_eq!(parse_hop(raw), expected, "{raw:?}");
        }
    }

    #[test]
    fn forwarded_yields_every_elements_for_in_order() {
        let header = r#"for=192.0.2.60;proto=http;by=203.0.113.43, For="[2001:db8:cafe::17]:4711", proto=https"#;
        assert_eq!(
            forwarded_for(header).collect::<Vec<_>>(),
            ["192.0.2.60", r#""[2001:db8:cafe::17]:4711""#, ""]
        );
    }

    #[test]
    fn cidrs_accept_single_addresses() {
        assert_eq!(parse_cidr("10.0.0.0/8").unwrap().to_string(), "10.0.0.0/8");
        assert_eq!(parse_cidr("10.1.2.3").unwrap().to_string(), "10.1.2.3/32");
        assert!(parse_cidr("nope").is_none());
    }
}
