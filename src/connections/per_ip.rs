//! Connections per client address, counted at accept: on the public
//! listener `server.max_connections_per_ip`, on the admin listener
//! `server.admin_max_connections_per_ip` (both derived by
//! `connections::budget` when unset).
//!
//! The address is the TCP peer's: at accept no header has been read, and a
//! forwarded address could be made up anyway. It counts as the rate limits
//! count it (`ClientIp`): an IPv6 client per /64 (one customer's
//! allocation), an IPv4-mapped or translated one as its IPv4 address.
//!
//! An address inside `server.trusted_proxies` is not counted: a proxy
//! carries many clients on few addresses, and each of its requests is
//! limited by the client address it forwards. It gets the listener's cap
//! only. A connection over the cap is closed at once (see `hook`).

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::Arc;

use ipnet::IpNet;
use parking_lot::Mutex;

use crate::domain::ClientIp;

/// The open connections of each address, shared by the listener's workers.
pub struct PerIp {
    cap: u32,
    trusted: Vec<IpNet>,
    open: Mutex<HashMap<IpAddr, u32>>,
}

/// Whether a new connection from an address may stay.
pub enum Admission {
    /// Under the cap; the slot frees itself when dropped with the connection.
    Counted(Slot),
    /// A trusted proxy: not counted.
    Trusted,
    /// At the cap already: close it.
    Refused,
}

/// One counted connection of an address.
pub struct Slot {
    owner: Arc<PerIp>,
    key: IpAddr,
}

impl PerIp {
    /// At most `cap` connections per address; none counted from an address
    /// inside `trusted` (`server.trusted_proxies`).
    pub fn new(cap: u32, trusted: Vec<IpNet>) -> Arc<Self> {
        Arc::new(Self {
            cap,
            trusted,
            open: Mutex::new(HashMap::new()),
        })
    }

    /// Count a connection from `peer`, unless its address is at the cap.
    pub fn admit(self: &Arc<Self>, peer: IpAddr) -> Admission {
        if ClientIp::in_any(peer, &self.trusted) {
            return Admission::Trusted;
        }
        let key = counted_as(peer);
        let mut open = self.open.lock();
        let count = open.entry(key).or_insert(0);
        if *count >= self.cap {
            return Admission::Refused;
        }
        *count += 1;
        Admission::Counted(Slot {
            owner: self.clone(),
            key,
        })
    }

    /// Open connections of the address `peer` counts under.
    pub fn open(&self, peer: IpAddr) -> u32 {
        let key = counted_as(peer);
        self.open.lock().get(&key).copied().unwrap_or(0)
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        let mut open = self.owner.open.lock();
        if let Some(count) = open.get_mut(&self.key) {
            *count -= 1;
            // An address with nothing open takes no memory.
            if *count == 0 {
                open.remove(&self.key);
            }
        }
    }
}

/// The address an address counts under, as the rate limits count it: IPv6
/// cut to its /64, IPv4-mapped or translated as IPv4.
fn counted_as(addr: IpAddr) -> IpAddr {
    ClientIp::new(addr).counted_as()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(text: &str) -> IpAddr {
        text.parse().unwrap()
    }

    fn counted(admission: Admission) -> Slot {
        match admission {
            Admission::Counted(slot) => slot,
            Admission::Trusted => panic!("trusted, not counted"),
            Admission::Refused => panic!("refused"),
        }
    }

    #[test]
    fn an_address_at_the_cap_is_refused_until_one_of_its_connections_closes() {
        let per_ip = PerIp::new(2, vec![]);
        let first = counted(per_ip.admit(ip("203.0.113.7")));
        let _second = counted(per_ip.admit(ip("203.0.113.7")));
        assert!(matches!(
            per_ip.admit(ip("203.0.113.7")),
            Admission::Refused
        ));
        // Another address is not affected.
        let _other = counted(per_ip.admit(ip("203.0.113.8")));
        drop(first);
        let _third = counted(per_ip.admit(ip("203.0.113.7")));
        assert_eq!(per_ip.open(ip("203.0.113.7")), 2);
    }

    #[test]
    fn an_ipv6_slash_64_counts_as_one_address_and_mapped_ipv4_as_ipv4() {
        let per_ip = PerIp::new(1, vec![]);
        let _one = counted(per_ip.admit(ip("2001:db8:1:2::1")));
        assert!(matches!(
            per_ip.admit(ip("2001:db8:1:2:ffff::9")),
            Admission::Refused
        ));
        let _next_64 = counted(per_ip.admit(ip("2001:db8:1:3::1")));
        let _v4 = counted(per_ip.admit(ip("::ffff:198.51.100.1")));
        assert!(matches!(
            per_ip.admit(ip("198.51.100.1")),
            Admission::Refused
        ));
    }

    #[test]
    fn translated_ipv4_clients_count_apart_and_as_their_ipv4() {
        // Behind a NAT64 or SIIT translator every IPv4 client is in
        // 64:ff9b::/96, one /64: counted per /64, one of them held the cap
        // for all.
        let per_ip = PerIp::new(1, vec![]);
        let _one = counted(per_ip.admit(ip("64:ff9b::203.0.113.7")));
        let _other = counted(per_ip.admit(ip("64:ff9b::203.0.113.8")));
        assert!(matches!(
            per_ip.admit(ip("203.0.113.7")),
            Admission::Refused
        ));
    }

    #[test]
    fn trusted_proxies_are_not_counted() {
        let per_ip = PerIp::new(1, vec!["10.0.0.0/8".parse().unwrap()]);
        for _ in 0..5 {
            assert!(matches!(per_ip.admit(ip("10.1.2.3")), Admission::Trusted));
        }
        assert_eq!(per_ip.open(ip("10.1.2.3")), 0);
    }

    #[test]
    fn closed_addresses_are_forgotten() {
        let per_ip = PerIp::new(3, vec![]);
        let slots: Vec<Slot> = (0..3)
            .map(|_| counted(per_ip.admit(ip("192.0.2.1"))))
            .collect();
        drop(slots);
        assert!(per_ip.open.lock().is_empty());
    }
}
