//! Who the client is behind trusted proxies: the one header the operator's
//! proxy sets, read right to left past the proxies, and never a header the
//! proxy does not own.
//!
//! Threat model: anyone may send any header. A proxy that *appends* to
//! `X-Forwarded-For` (nginx's `$proxy_add_x_forwarded_for`, HAProxy's
//! `option forwardfor`, Envoy) passes on whatever the client wrote before
//! its own entry, and passes other headers (`Forwarded`, `X-Real-IP`)
//! through untouched. So only the configured header is read, only from a
//! trusted peer, and only from the right: each entry right of the client was
//! written by a proxy we trust, and the first entry no trusted proxy wrote is
//! the client's address as the last trusted proxy saw it. What the client
//! wrote further left is never reached.
//!
//! A request never goes uncounted by what it sends: where the walk meets an
//! entry that names no address (`unknown`, garbage, an obfuscated
//! `Forwarded` node), the request counts under the trusted address that
//! handed it on ([`ClientAddress::Unusable`]). That address is a proxy the
//! operator runs; only requests whose proxies sent no usable header share it,
//! so it cannot be turned against a client whose address was forwarded.

use std::net::IpAddr;

use ipnet::IpNet;

use super::client_ip::{forwarded_for, parse_hop, ClientIp};

/// The header that names the client behind a trusted proxy
/// (`server.client_ip_header`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum ClientIpHeader {
    /// `X-Forwarded-For`: a list each proxy appends to. The default.
    #[default]
    XForwardedFor,
    /// `Forwarded` (RFC 7239): its `for=` parameters, as a list.
    Forwarded,
    /// A header the proxy sets to one address, replacing any the client
    /// sent (`X-Real-IP`, `CF-Connecting-IP`, `True-Client-IP`): the name,
    /// lower case.
    Single(String),
}

/// Request headers that a proxy never sets to the client's address: the
/// standard ones (RFC 9110, the fetch standard's), tollgate's own request
/// id, and `x-forwarded-for`'s siblings, a likely slip for it.
const NEVER_AN_ADDRESS: &[&str] = &[
    "accept",
    "accept-encoding",
    "accept-language",
    "authorization",
    "cache-control",
    "connection",
    "content-encoding",
    "content-length",
    "content-type",
    "cookie",
    "expect",
    "host",
    "origin",
    "proxy-authorization",
    "referer",
    "te",
    "transfer-encoding",
    "upgrade",
    "user-agent",
    "x-forwarded-host",
    "x-forwarded-port",
    "x-forwarded-proto",
    "x-request-id",
];

impl ClientIpHeader {
    /// From a header name, any case: `x-forwarded-for`, `forwarded`, or any
    /// other valid header name as a single-address header. `None` when the
    /// name is not a valid header name, or names a standard request header
    /// that never holds an address ([`NEVER_AN_ADDRESS`]): with `host` or
    /// `authorization` every request would count under the proxy's address,
    /// found only by the fallback metric.
    pub fn parse(name: &str) -> Option<Self> {
        let name = name.trim().to_ascii_lowercase();
        let token = |b: u8| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b);
        if name.is_empty() || !name.bytes().all(token) || NEVER_AN_ADDRESS.contains(&name.as_str())
        {
            return None;
        }
        Some(match name.as_str() {
            "x-forwarded-for" => Self::XForwardedFor,
            "forwarded" => Self::Forwarded,
            _ => Self::Single(name),
        })
    }

    /// The header's name, lower case.
    pub fn name(&self) -> &str {
        match self {
            Self::XForwardedFor => "x-forwarded-for",
            Self::Forwarded => "forwarded",
            Self::Single(name) => name,
        }
    }
}

impl std::fmt::Display for ClientIpHeader {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// Headers that name a client's address, by convention of some proxy or
/// CDN. A request that carries one came through a proxy (or claims to), so it
/// is a browser's, whatever its peer (`routes::caller`).
pub const CLIENT_ADDRESS_HEADERS: [&str; 12] = [
    "x-forwarded-for",
    "forwarded",
    "x-real-ip",
    "x-client-ip",
    "x-cluster-client-ip",
    "client-ip",
    "true-client-ip",
    "cf-connecting-ip",
    "fastly-client-ip",
    "x-envoy-external-address",
    "x-original-forwarded-for",
    "forwarded-for",
];

/// Which proxies are believed, and what they say (`[server]`).
#[derive(Debug, Clone, Default)]
pub struct ProxyTrust {
    /// `server.trusted_proxies`.
    pub proxies: Vec<IpNet>,
    /// `server.client_ip_header`.
    pub header: ClientIpHeader,
    /// `server.trusted_proxy_hops`: proxies trusted by their position,
    /// whatever their address: the peer, then `hops - 1` entries of a list
    /// header from the right.
    pub hops: u32,
}

/// The client's address, and how it was found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ClientAddress {
    /// The peer is not a trusted proxy: it is the client.
    Peer(IpAddr),
    /// The header named the client.
    Forwarded(IpAddr),
    /// A trusted proxy sent no such header: the request is its own (a health
    /// check, the backend on the proxy's host), or the proxy does not set the
    /// header the configuration names.
    NotForwarded(IpAddr),
    /// The header names no address where the walk needs one: counted under
    /// the trusted address that handed it on.
    Unusable(IpAddr),
}

impl ClientAddress {
    /// The address the request counts under.
    pub fn ip(self) -> IpAddr {
        match self {
            Self::Peer(ip) | Self::Forwarded(ip) | Self::NotForwarded(ip) | Self::Unusable(ip) => {
                ip
            }
        }
    }
}

impl ProxyTrust {
    /// Whether `ip` is one of `server.trusted_proxies`.
    pub fn is_trusted(&self, ip: IpAddr) -> bool {
        ClientIp::in_any(ip, &self.proxies)
    }

    /// Whether a request from `peer` has its header read at all: only a
    /// proxy's (by position or by `trusted_proxies`) is; anyone else is the
    /// client, whatever it sends.
    pub fn reads_header_from(&self, peer: IpAddr) -> bool {
        self.hops > 0 || self.is_trusted(peer)
    }

    /// The client of a request from `peer` whose configured header has
    /// `values` (each occurrence of the header, in order).
    pub fn client<'a>(
        &self,
        peer: IpAddr,
        values: impl IntoIterator<Item = &'a str>,
    ) -> ClientAddress {
        if !self.reads_header_from(peer) {
            return ClientAddress::Peer(peer);
        }
        let mut values = values.into_iter().peekable();
        if values.peek().is_none() {
            return ClientAddress::NotForwarded(peer);
        }
        match &self.header {
            ClientIpHeader::Single(_) => single(peer, values),
            ClientIpHeader::XForwardedFor => {
                self.walk(peer, values.flat_map(|v| v.split(',')).collect())
            }
            ClientIpHeader::Forwarded => self.walk(peer, values.flat_map(forwarded_for).collect()),
        }
    }

    /// Right to left from `peer` (already trusted): past the entries trusted
    /// by position, then past `trusted_proxies`; the first entry neither
    /// trusts is the client. When every entry is trusted, the left-most is:
    /// the first proxy's own peer, which sent no header.
    fn walk(&self, peer: IpAddr, hops: Vec<&str>) -> ClientAddress {
        let mut by_position = self.hops.saturating_sub(1);
        let mut last = peer;
        for hop in hops.iter().rev() {
            let Some(ip) = parse_hop(hop) else {
                return ClientAddress::Unusable(last);
            };
            let trusted = if by_position > 0 {
                by_position -= 1;
                true
            } else {
                self.is_trusted(ip)
            };
            if !trusted {
                return ClientAddress::Forwarded(ip);
            }
            last = ip;
        }
        ClientAddress::Forwarded(last)
    }
}

/// A single-address header: exactly one occurrence holding exactly one
/// address, or it names nothing.
fn single<'a>(peer: IpAddr, mut values: impl Iterator<Item = &'a str>) -> ClientAddress {
    let first = values.next().map(str::trim);
    match (first.and_then(|v| v.parse::<IpAddr>().ok()), values.next()) {
        (Some(ip), None) => ClientAddress::Forwarded(ip),
        _ => ClientAddress::Unusable(peer),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    fn trust(proxies: &[&str], header: &str, hops: u32) -> ProxyTrust {
        ProxyTrust {
            proxies: proxies.iter().map(|p| p.parse().unwrap()).collect(),
            header: ClientIpHeader::parse(header).unwrap(),
            hops,
        }
    }

    const PROXY: &str = "10.0.0.1";

    #[test]
    fn headers_are_named_in_any_case_and_checked() {
        assert_eq!(
            ClientIpHeader::parse("X-Forwarded-For"),
            Some(ClientIpHeader::XForwardedFor)
        );
        assert_eq!(
            ClientIpHeader::parse("FORWARDED"),
            Some(ClientIpHeader::Forwarded)
        );
        assert_eq!(
            ClientIpHeader::parse("CF-Connecting-IP"),
            Some(ClientIpHeader::Single("cf-connecting-ip".into()))
        );
        for bad in [
            "",
            "x real ip",
            "x-real-ip:",
            "é",
            "Host",
            "authorization",
            "Cookie",
        ] {
            assert_eq!(ClientIpHeader::parse(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn an_untrusted_peer_is_the_client_whatever_it_sends() {
        let t = trust(&["10.0.0.0/8"], "x-forwarded-for", 0);
        assert_eq!(
            t.client(ip("198.51.100.1"), ["6.6.6.6"]),
            ClientAddress::Peer(ip("198.51.100.1"))
        );
    }

    /// A proxy reached through a NAT64 or SIIT translator is trusted by the
    /// IPv4 address it is shown, logged and audited as, and by the address
    /// it came from; so are the hops it forwards.
    #[test]
    fn a_translated_proxy_is_trusted_by_either_form() {
        for proxies in [["192.0.2.0/24"], ["64:ff9b::192.0.2.0/120"]] {
            let t = trust(&proxies, "x-forwarded-for", 0);
            assert!(t.is_trusted(ip("64:ff9b::192.0.2.10")), "{proxies:?}");
            assert_eq!(
                t.client(
                    ip("64:ff9b::192.0.2.10"),
                    ["64:ff9b::192.0.2.11, 203.0.113.9"]
                ),
                ClientAddress::Forwarded(ip("203.0.113.9")),
                "{proxies:?}"
            );
        }
        let t = trust(&["192.0.2.0/24"], "x-forwarded-for", 0);
        assert!(!t.is_trusted(ip("64:ff9b::198.51.100.1")));
    }

    /// nginx's `$proxy_add_x_forwarded_for`: what the client sent, then the
    /// address nginx saw. Only the latter is believed.
    #[test]
    fn appended_x_forwarded_for_names_the_right_most_untrusted_hop() {
        let t = trust(&["10.0.0.0/8"], "x-forwarded-for", 0);
        for (header, client) in [
            ("203.0.113.9", "203.0.113.9"),
            ("6.6.6.6, 203.0.113.9", "203.0.113.9"),
            ("unknown, 203.0.113.9", "203.0.113.9"),
            ("6.6.6.6, 203.0.113.9, 10.1.2.3", "203.0.113.9"),
            ("10.9.9.9", "10.9.9.9"),
        ] {
            assert_eq!(
                t.client(ip(PROXY), [header]),
                ClientAddress::Forwarded(ip(client)),
                "{header}"
            );
        }
        // Split over several header lines, they read as one list.
        assert_eq!(
            t.client(ip(PROXY), ["6.6.6.6", "203.0.113.9, 10.1.2.3"]),
            ClientAddress::Forwarded(ip("203.0.113.9"))
        );
    }

    #[test]
    fn an_entry_that_names_nothing_counts_under_the_proxy_that_passed_it() {
        let t = trust(&["10.0.0.0/8"], "x-forwarded-for", 0);
        for (header, counted) in [
            ("unknown", PROXY),
            ("garbage", PROXY),
            ("", PROXY),
            ("203.0.113.9, unknown, 10.1.2.3", "10.1.2.3"),
        ] {
            assert_eq!(
                t.client(ip(PROXY), [header]),
                ClientAddress::Unusable(ip(counted)),
                "{header}"
            );
        }
        assert_eq!(
            t.client(ip(PROXY), std::iter::empty()),
            ClientAddress::NotForwarded(ip(PROXY))
        );
    }

    /// With `client_ip_header = "forwarded"` only `Forwarded` counts, and
    /// with the default only `X-Forwarded-For`: the other is the client's.
    #[test]
    fn only_the_configured_list_header_is_read() {
        let forwarded = trust(&["10.0.0.0/8"], "forwarded", 0);
        assert_eq!(
            forwarded.client(
                ip(PROXY),
                ["for=6.6.6.6, for=\"[2001:db8::1]:443\";proto=https"]
            ),
            ClientAddress::Forwarded(ip("2001:db8::1"))
        );
        assert_eq!(
            forwarded.client(ip(PROXY), ["for=unknown"]),
            ClientAddress::Unusable(ip(PROXY))
        );
    }

    /// An element that names no address is where the walk stops, as
    /// `unknown` is: the client's own `for=` left of it is never reached.
    #[test]
    fn a_forwarded_element_without_for_stops_the_walk() {
        let forwarded = trust(&["10.0.0.0/8"], "forwarded", 0);
        for header in [
            "for=6.6.6.20, proto=https",
            "for=6.6.6.9, by=203.0.113.76",
            "for=6.6.6.22,",
            "for=6.6.6.23, garbage",
            "for=6.6.6.24, for=10.0.0.7, proto=https",
        ] {
            assert_eq!(
                forwarded.client(ip(PROXY), [header]),
                ClientAddress::Unusable(ip(PROXY)),
                "{header}"
            );
        }
        assert_eq!(
            forwarded.client(ip(PROXY), ["for=6.6.6.6, for=203.0.113.9;proto=https"]),
            ClientAddress::Forwarded(ip("203.0.113.9"))
        );
        // Trusted by position, an element without for= is no proxy's
        // address either: the walk stops there too.
        let by_position = trust(&[], "forwarded", 2);
        assert_eq!(
            by_position.client(ip(PROXY), ["for=6.6.6.6, proto=https"]),
            ClientAddress::Unusable(ip(PROXY))
        );
        assert_eq!(
            by_position.client(ip(PROXY), ["for=6.6.6.6, for=203.0.113.9, for=192.0.2.1"]),
            ClientAddress::Forwarded(ip("203.0.113.9"))
        );
    }

    #[test]
    fn a_single_address_header_holds_exactly_one_address() {
        let t = trust(&["10.0.0.0/8"], "x-real-ip", 0);
        assert_eq!(
            t.client(ip(PROXY), [" 203.0.113.9 "]),
            ClientAddress::Forwarded(ip("203.0.113.9"))
        );
        for values in [
            vec!["203.0.113.9, 6.6.6.6"],
            vec!["203.0.113.9", "6.6.6.6"],
            vec!["unknown"],
            vec!["203.0.113.9:443"],
        ] {
            assert_eq!(
                t.client(ip(PROXY), values.clone()),
                ClientAddress::Unusable(ip(PROXY)),
                "{values:?}"
            );
        }
    }

    /// Envoy's `xff_num_trusted_hops`: two load balancers whose addresses
    /// are not known; the second is the peer, the first appended the
    /// client's address after what the client sent.
    #[test]
    fn hops_trusted_by_position_are_counted_from_the_right() {
        let t = trust(&[], "x-forwarded-for", 2);
        let lb2 = ip("172.16.0.2");
        assert_eq!(
            t.client(lb2, ["6.6.6.6, 203.0.113.9, 172.16.0.1"]),
            ClientAddress::Forwarded(ip("203.0.113.9"))
        );
        assert_eq!(
            t.client(lb2, ["203.0.113.9"]),
            ClientAddress::Forwarded(ip("203.0.113.9")),
            "fewer entries than hops: the left-most"
        );
        // One hop: the peer alone is trusted, by position.
        let one = trust(&[], "x-forwarded-for", 1);
        assert_eq!(
            one.client(lb2, ["6.6.6.6, 203.0.113.9"]),
            ClientAddress::Forwarded(ip("203.0.113.9"))
        );
        // Past the hops, trusted_proxies still apply.
        let both = trust(&["10.0.0.0/8"], "x-forwarded-for", 1);
        assert_eq!(
            both.client(lb2, ["203.0.113.9, 10.1.2.3"]),
            ClientAddress::Forwarded(ip("203.0.113.9"))
        );
    }
}
