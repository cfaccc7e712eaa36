//! An IP range an operator wrote (a list entry, a trusted proxy), read as
//! requests' addresses count, and refused where it likely says something
//! other than what was meant. One reading for every such setting: a rule a
//! list entry refuses (`0.0.0.0/0`, a typo's host bits) must not pass as a
//! trusted proxy, where it would do more harm.

use std::net::Ipv6Addr;

use ipnet::{IpNet, Ipv6Net};

use super::client_ip::{parse_cidr, translated_ipv4, TRANSLATION_PREFIX};

/// Why a written range is not taken. The caller words the message: what a
/// range of every address would do differs by setting.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RangeRefusal {
    /// Neither an address nor a CIDR.
    NotARange,
    /// It holds RFC 6052's `64:ff9b::/96`, where a NAT64 or SIIT translator
    /// writes IPv4 clients: they count as their IPv4 addresses.
    HoldsTranslationPrefix,
    /// It is `::ffff:0:0/96`, every IPv4-mapped address: read as IPv4 it
    /// would be `0.0.0.0/0`.
    MappedPrefix,
    /// A /0: every IPv4 or IPv6 address.
    EveryAddress {
        /// Whether IPv4's.
        v4: bool,
    },
    /// Bits set right of the mask.
    HostBits {
        /// The mask's length.
        prefix_len: u8,
        /// The range the mask names.
        network: IpNet,
    },
}

/// A new range as requests' addresses count (`::ffff:203.0.113.0/120` is
/// `203.0.113.0/24`), or why it is not taken: as PostgreSQL's `cidr` and
/// Python's `ip_network` refuse host bits, `198.51.100.7/2` is refused
/// rather than taken as a quarter of the IPv4 internet.
pub fn checked_range(text: &str) -> Result<IpNet, RangeRefusal> {
    let net = canonical_range(text)?;
    if net.prefix_len() == 0 {
        return Err(RangeRefusal::EveryAddress {
            v4: net.addr().is_ipv4(),
        });
    }
    if net.trunc() != net {
        return Err(RangeRefusal::HostBits {
            prefix_len: net.prefix_len(),
            network: net.trunc(),
        });
    }
    Ok(net)
}

/// A range taken by an earlier version, as it was taken: host bits as its
/// network, a /0 in force. What no version took (the translators' /96, the
/// mapped /96) is refused still.
pub fn stored_range(text: &str) -> Result<IpNet, RangeRefusal> {
    canonical_range(text).map(|net| net.trunc())
}

fn canonical_range(text: &str) -> Result<IpNet, RangeRefusal> {
    let net = parse_cidr(text.trim()).ok_or(RangeRefusal::NotARange)?;
    if holds_the_translation_prefix(net) {
        return Err(RangeRefusal::HoldsTranslationPrefix);
    }
    if is_the_mapped_prefix(net) {
        return Err(RangeRefusal::MappedPrefix);
    }
    Ok(canonical(net))
}

/// Whether `net` is RFC 6052's well-known prefix or a range of up to /32
/// around it: such a range meant translated clients, which match it no
/// more (they count as IPv4), or, as the /96 itself, every IPv4 address.
/// Wider ranges (`::/31`) are about IPv6 at large and stay IPv6.
fn holds_the_translation_prefix(net: IpNet) -> bool {
    matches!(net, IpNet::V6(v6) if (32..=96).contains(&v6.prefix_len()) && v6.contains(&TRANSLATION_PREFIX))
}

/// Whether `net` is the IPv4-mapped /96 itself (`::ffff:0:0/96`, however
/// written), which `canonical` would make `0.0.0.0/0`: every IPv4 client,
/// for a range that named IPv6. Only the /96: unlike the translation
/// prefix, the ranges around it (`::/64`) hold clients of their own, `::1`
/// and `::`, which count as the subject `::/64`.
fn is_the_mapped_prefix(net: IpNet) -> bool {
    matches!(net, IpNet::V6(v6) if v6.prefix_len() == 96 && v6.contains(&MAPPED_PREFIX))
}

/// The IPv4-mapped addresses, `::ffff:0:0/96`.
const MAPPED_PREFIX: Ipv6Net = Ipv6Net::new_assert(Ipv6Addr::new(0, 0, 0, 0, 0, 0xffff, 0, 0), 96);

/// An IPv4-mapped (`::ffff:203.0.113.0/120`) or translated
/// (`64:ff9b::203.0.113.0/120`) IPv6 range as the IPv4 range it is:
/// requests carry such addresses as IPv4 (`ClientIp`), so the IPv6 form
/// would never match.
fn canonical(net: IpNet) -> IpNet {
    match net {
        IpNet::V6(v6) if v6.prefix_len() >= 96 => {
            let addr = v6.addr();
            match addr.to_ipv4_mapped().or_else(|| translated_ipv4(addr)) {
                Some(v4) => IpNet::new(v4.into(), v6.prefix_len() - 96).unwrap_or(net),
                None => net,
            }
        }
        net => net,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges_are_read_as_addresses_count_and_typos_refused() {
        let taken = [
            ("203.0.113.7", "203.0.113.7/32"),
            (" 2001:db8::/64 ", "2001:db8::/64"),
            ("::ffff:203.0.113.0/120", "203.0.113.0/24"),
            ("64:ff9b::203.0.113.7", "203.0.113.7/32"),
            ("::/31", "::/31"),
        ];
        for (text, want) in taken {
            assert_eq!(checked_range(text).map(|n| n.to_string()), Ok(want.into()));
        }
        let refused = [
            ("10.0.0.300", RangeRefusal::NotARange),
            ("64:ff9b::/96", RangeRefusal::HoldsTranslationPrefix),
            ("::ffff:0:0/96", RangeRefusal::MappedPrefix),
            ("0.0.0.0/0", RangeRefusal::EveryAddress { v4: true }),
            ("::/0", RangeRefusal::EveryAddress { v4: false }),
            (
                "198.51.100.7/2",
                RangeRefusal::HostBits {
                    prefix_len: 2,
                    network: "192.0.0.0/2".parse().unwrap(),
                },
            ),
        ];
        for (text, why) in refused {
            assert_eq!(checked_range(text), Err(why), "{text}");
        }
        assert_eq!(
            stored_range("198.51.100.7/2").map(|n| n.to_string()),
            Ok("192.0.0.0/2".into())
        );
        assert_eq!(
            stored_range("::/0").map(|n| n.to_string()),
            Ok("::/0".into())
        );
        assert_eq!(
            stored_range("64:ff9b::/96"),
            Err(RangeRefusal::HoldsTranslationPrefix)
        );
    }
}
