//! Client addresses as counted subjects: IPv4 as is, IPv6 grouped by /64 (one
//! customer's allocation), IPv4-mapped IPv6 treated as IPv4.

use std::net::{IpAddr, Ipv6Addr};

use ipnet::IpNet;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ClientIp(IpAddr);

impl ClientIp {
    pub fn new(addr: IpAddr) -> Self {
        Self(addr.to_canonical())
    }

    pub fn parse(raw: &str) -> Option<Self> {
        raw.trim().parse::<IpAddr>().ok().map(Self::new)
    }

    /// The subject id: `203.0.113.7` or `2001:db8:1:2::/64`.
    pub fn subject_id(&self) -> String {
        match self.0 {
            IpAddr::V4(v4) => v4.to_string(),
            IpAddr::V6(v6) => {
                let s = v6.segments();
                let net = Ipv6Addr::new(s[0], s[1], s[2], s[3], 0, 0, 0, 0);
                format!("{net}/64")
            }
        }
    }
}

impl std::fmt::Display for ClientIp {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.0.fmt(f)
    }
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
    }

    #[test]
    fn cidrs_accept_single_addresses() {
        assert_eq!(parse_cidr("10.0.0.0/8").unwrap().to_string(), "10.0.0.0/8");
        assert_eq!(parse_cidr("10.1.2.3").unwrap().to_string(), "10.1.2.3/32");
        assert!(parse_cidr("nope").is_none());
    }
}
