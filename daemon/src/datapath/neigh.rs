//! The DPDK datapath's neighbour table: IPv4 address → MAC, from static
//! entries in the configuration and from what ARP and received datagrams
//! teach. A learned entry never replaces a static one (a forged or stale ARP
//! reply cannot redirect a configured peer's traffic), and the learned part
//! is bounded (a flood of ARP cannot grow it without limit).

use std::collections::{HashMap, HashSet};
use std::net::Ipv4Addr;

use super::frame::Mac;

/// See the module docs.
#[derive(Debug, Default)]
pub struct Neighbours {
    map: HashMap<Ipv4Addr, Mac>,
    statics: HashSet<Ipv4Addr>,
    max_learned: usize,
    /// ARP or datagrams that named another MAC for a static neighbour (ignored).
    pub static_conflicts: u64,
}

impl Neighbours {
    /// The static entries, and room for at most `max_learned` learned ones.
    pub fn new(statics: &[(Ipv4Addr, Mac)], max_learned: usize) -> Neighbours {
        let mut n = Neighbours { max_learned, ..Neighbours::default() };
        for &(ip, mac) in statics {
            n.add_static(ip, mac);
        }
        n
    }

    /// Add (or replace) a static entry.
    pub fn add_static(&mut self, ip: Ipv4Addr, mac: Mac) {
        self.map.insert(ip, mac);
        self.statics.insert(ip);
    }

    /// `ip` is at `mac`, as ARP or a received datagram says: kept unless
    /// `ip` is static (then counted if it disagrees) or the learned part is
    /// full and `ip` is new. `refresh`: an existing learned entry is updated
    /// (ARP); otherwise only a new one is added (a datagram's source).
    pub fn learn(&mut self, ip: Ipv4Addr, mac: Mac, refresh: bool) {
        if self.statics.contains(&ip) {
            if self.map.get(&ip) != Some(&mac) {
                self.static_conflicts += 1;
            }
            return;
        }
        let known = self.map.contains_key(&ip);
        let learned = self.map.len() - self.statics.len();
        if (known && refresh) || (!known && learned < self.max_learned) {
            self.map.insert(ip, mac);
        }
    }

    /// The MAC of `ip`, if known.
    pub fn get(&self, ip: &Ipv4Addr) -> Option<Mac> {
        self.map.get(ip).copied()
    }

    /// Entries known now.
    pub fn len(&self) -> usize {
        self.map.len()
    }

    /// Whether none is known.
    pub fn is_empty(&self) -> bool {
        self.map.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const A: Ipv4Addr = Ipv4Addr::new(10, 0, 0, 1);
    const B: Ipv4Addr = Ipv4Addr::new(10, 0, 0, 2);
    const C: Ipv4Addr = Ipv4Addr::new(10, 0, 0, 3);

    #[test]
    fn a_learned_mac_never_replaces_a_static_one() {
        let (good, forged) = (Mac([2, 0, 0, 0, 0, 1]), Mac([2, 0, 0, 0, 0, 0x66]));
        let mut n = Neighbours::new(&[(A, good)], 16);
        n.learn(A, forged, true);
        n.learn(A, forged, false);
        assert_eq!((n.get(&A), n.static_conflicts), (Some(good), 2));
        n.learn(A, good, true);
        assert_eq!(n.static_conflicts, 2, "agreeing news is no conflict");
    }

    #[test]
    fn learned_entries_are_bounded_and_refreshed_by_arp_only() {
        let (m1, m2) = (Mac([2, 0, 0, 0, 0, 1]), Mac([2, 0, 0, 0, 0, 2]));
        let mut n = Neighbours::new(&[], 1);
        n.learn(B, m1, false);
        n.learn(C, m1, true);
        assert_eq!((n.get(&B), n.get(&C)), (Some(m1), None), "the learned part is full");
        n.learn(B, m2, false);
        assert_eq!(n.get(&B), Some(m1), "a datagram's source does not move a known entry");
        n.learn(B, m2, true);
        assert_eq!(n.get(&B), Some(m2), "ARP does");
    }
}
