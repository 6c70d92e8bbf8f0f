//! Which configured peer a datagram's source address belongs to: a peer
//! sends from the source ports `port .. port + paths` of its `[[peers]]`
//! entry (one per path, `network.paths`), so a datagram is taken as that
//! peer's when it comes from the peer's address and a port in that range.
//! Anything else is from no configured peer (the endpoint then rejects a
//! datagram claiming a rank of the job as `unknown_source`, counted); one
//! from a peer's range still needs a valid tag from that peer.

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};

/// Peer ranks by source address (see the module docs).
#[derive(Debug, Clone)]
pub(super) struct Sources {
    /// Per address: the first port and the rank of each peer on it.
    by_ip: HashMap<IpAddr, Vec<(u16, u32)>>,
    paths: u16,
}

impl Sources {
    /// The peers at `peers` (by rank), each sending from `paths` ports.
    pub(super) fn new(peers: &[SocketAddr], paths: u16) -> Sources {
        let mut by_ip: HashMap<IpAddr, Vec<(u16, u32)>> = HashMap::new();
        for (rank, a) in peers.iter().enumerate() {
            by_ip.entry(canonical(a.ip())).or_default().push((a.port(), rank as u32));
        }
        Sources { by_ip, paths: paths.max(1) }
    }

    /// The rank of the peer that sends from `from` and the path (the source
    /// port's offset from the peer's port), if any.
    pub(super) fn peer(&self, from: SocketAddr) -> Option<(u32, u16)> {
        let peers = self.by_ip.get(&canonical(from.ip()))?;
        let port = from.port();
        peers
            .iter()
            .find(|&&(first, _)| port >= first && u32::from(port - first) < u32::from(self.paths))
            .map(|&(first, rank)| (rank, port - first))
    }
}

/// An IPv4 address for a v4-mapped IPv6 one.
fn canonical(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(ip, IpAddr::V4),
        v4 => v4,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_peer_is_known_by_its_address_and_port_range() {
        let a = |s: &str| s.parse::<SocketAddr>().unwrap();
        let s = Sources::new(&[a("10.0.0.1:7700"), a("10.0.0.1:7716"), a("10.0.0.2:7700")], 16);
        let rank = |from: &str| s.peer(a(from)).map(|p| p.0);
        assert_eq!(rank("10.0.0.1:7700"), Some(0));
        assert_eq!(rank("10.0.0.1:7715"), Some(0));
        assert_eq!(rank("10.0.0.1:7716"), Some(1));
        assert_eq!(rank("10.0.0.1:7731"), Some(1));
        assert_eq!(rank("10.0.0.1:7732"), None, "past the last peer's range");
        assert_eq!(rank("10.0.0.1:7699"), None);
        assert_eq!(rank("10.0.0.2:7715"), Some(2));
        assert_eq!(s.peer(a("10.0.0.1:7720")), Some((1, 4)), "peer 1's path 4");
        assert_eq!(rank("10.0.0.3:7700"), None, "not a configured address");
        assert_eq!(rank("[::ffff:10.0.0.2]:7701"), Some(2), "v4-mapped");
        let one = Sources::new(&[a("10.0.0.1:7700")], 1);
        assert_eq!((one.peer(a("10.0.0.1:7700")), one.peer(a("10.0.0.1:7701"))), (Some((0, 0)), None));
    }
}
