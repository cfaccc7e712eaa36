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
//! An IPv6 /64 is one customer's allocation, but a customer may hold a
//! /56 (256 of them) and anyone a tunnel broker's free /48: each /64 at its
//! own cap, eight of them filled the public listener and two the admin
//! one. So an IPv6 /48 has a cap of its own too, `network_cap` (twice an
//! address's on the public listener, once on the admin one), as the
//! admin sign-in throttle counts a /48 (and the SMS network windows by
//! default, `sms.network_bits`). A fixed /48, not a setting: a carrier
//! that puts many devices in one /48 and reaches tollgate directly needs a
//! higher `max_connections_per_ip`.
//!
//! An address inside `server.trusted_proxies` is not counted: a proxy
//! carries many clients on few addresses, and each of its requests is
//! limited by the client address it forwards. It gets the listener's cap
//! only. A connection over the cap is closed at once (see `hook`).

use std::collections::HashMap;
use std::net::{IpAddr, Ipv6Addr};
use std::sync::Arc;

use ipnet::{IpNet, Ipv6Net};
use parking_lot::Mutex;

use crate::domain::ClientIp;

/// The prefix an IPv6 network's connections are counted under.
const NETWORK_BITS: u8 = 48;

/// The open connections of each address, shared by the listener's workers.
pub struct PerIp {
    cap: u32,
    network_cap: u32,
    trusted: Vec<IpNet>,
    open: Mutex<Open>,
}

/// Open connections by address and by IPv6 network.
#[derive(Default)]
struct Open {
    addresses: HashMap<IpAddr, u32>,
    networks: HashMap<Ipv6Addr, u32>,
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

/// One counted connection of an address (and of its IPv6 network).
pub struct Slot {
    owner: Arc<PerIp>,
    key: IpAddr,
    network: Option<Ipv6Addr>,
}

impl PerIp {
    /// At most `cap` connections per address and `network_cap` per IPv6
    /// /48; none counted from an address inside `trusted`
    /// (`server.trusted_proxies`).
    pub fn new(cap: u32, network_cap: u32, trusted: Vec<IpNet>) -> Arc<Self> {
        Arc::new(Self {
            cap,
            network_cap,
            trusted,
            open: Mutex::new(Open::default()),
        })
    }

    /// Count a connection from `peer`, unless its address is at the cap.
    pub fn admit(self: &Arc<Self>, peer: IpAddr) -> Admission {
        if ClientIp::in_any(peer, &self.trusted) {
            return Admission::Trusted;
        }
        let key = counted_as(peer);
        let network = network_of(key);
        let mut open = self.open.lock();
        let full = |count: Option<&u32>, cap: u32| count.copied().unwrap_or(0) >= cap;
        if full(open.addresses.get(&key), self.cap)
            || network.is_some_and(|net| full(open.networks.get(&net), self.network_cap))
        {
            return Admission::Refused;
        }
        *open.addresses.entry(key).or_insert(0) += 1;
        if let Some(net) = network {
            *open.networks.entry(net).or_insert(0) += 1;
        }
        Admission::Counted(Slot {
            owner: self.clone(),
            key,
            network,
        })
    }

    /// Open connections of the address `peer` counts under.
    pub fn open(&self, peer: IpAddr) -> u32 {
        let key = counted_as(peer);
        self.open.lock().addresses.get(&key).copied().unwrap_or(0)
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        let mut open = self.owner.open.lock();
        release(&mut open.addresses, self.key);
        if let Some(net) = self.network {
            release(&mut open.networks, net);
        }
    }
}

/// One connection of `key` closed; a key with nothing open takes no memory.
fn release<K: std::hash::Hash + Eq>(counts: &mut HashMap<K, u32>, key: K) {
    if let Some(count) = counts.get_mut(&key) {
        *count -= 1;
        if *count == 0 {
            counts.remove(&key);
        }
    }
}

/// The IPv6 network an address counted as `key` is in: its first
/// [`NETWORK_BITS`]; none for IPv4 (mapped and translated clients are IPv4
/// by now).
fn network_of(key: IpAddr) -> Option<Ipv6Addr> {
    match key {
        IpAddr::V4(_) => None,
        IpAddr::V6(v6) => Ipv6Net::new(v6, NETWORK_BITS).ok().map(|net| net.network()),
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
        let per_ip = PerIp::new(2, 4, vec![]);
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
        let per_ip = PerIp::new(1, 3, vec![]);
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
        let per_ip = PerIp::new(1, 2, vec![]);
        let _one = counted(per_ip.admit(ip("64:ff9b::203.0.113.7")));
        let _other = counted(per_ip.admit(ip("64:ff9b::203.0.113.8")));
        assert!(matches!(
            per_ip.admit(ip("203.0.113.7")),
            Admission::Refused
        ));
    }

    #[test]
    fn trusted_proxies_are_not_counted() {
        let per_ip = PerIp::new(1, 2, vec!["10.0.0.0/8".parse().unwrap()]);
        for _ in 0..5 {
            assert!(matches!(per_ip.admit(ip("10.1.2.3")), Admission::Trusted));
        }
        assert_eq!(per_ip.open(ip("10.1.2.3")), 0);
    }

    #[test]
    fn closed_addresses_are_forgotten() {
        let per_ip = PerIp::new(3, 6, vec![]);
        let slots: Vec<Slot> = (0..3)
            .map(|_| counted(per_ip.admit(ip("192.0.2.1"))))
            .collect();
        let v6: Vec<Slot> = (1..=3)
            .map(|n| counted(per_ip.admit(ip(&format!("2001:db8:1:{n}::1")))))
            .collect();
        drop(slots);
        drop(v6);
        let open = per_ip.open.lock();
        assert!(open.addresses.is_empty() && open.networks.is_empty());
    }

    /// A customer's /56, or a tunnel broker's /48, is many /64s: each at
    /// its own cap they filled a listener. The /48 has a cap of its own.
    #[test]
    fn an_ipv6_slash_48_is_capped_whatever_its_slash_64s() {
        let per_ip = PerIp::new(1, 2, vec![]);
        let first = counted(per_ip.admit(ip("2001:db8:1:1::1")));
        let _second = counted(per_ip.admit(ip("2001:db8:1:2::1")));
        assert!(matches!(
            per_ip.admit(ip("2001:db8:1:3::1")),
            Admission::Refused
        ));
        // Another /48 is not affected, nor is IPv4.
        let _other = counted(per_ip.admit(ip("2001:db8:2:1::1")));
        let _v4 = counted(per_ip.admit(ip("203.0.113.7")));
        drop(first);
        let _third = counted(per_ip.admit(ip("2001:db8:1:3::1")));
    }
}
