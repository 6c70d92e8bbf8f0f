//! Ethernet / IPv4 / UDP and ARP frames, built and parsed by dlcp itself for the
//! DPDK datapath (the kernel does this for the socket datapath). Pure code: no
//! I/O, nothing panics on any input after the length checks.

use std::fmt;
use std::net::{Ipv4Addr, SocketAddrV4};

/// Ethernet header length.
pub const ETH_LEN: usize = 14;
/// IPv4 header length (dlcp sends no options).
pub const IPV4_LEN: usize = 20;
/// UDP header length.
pub const UDP_LEN: usize = 8;
/// Ethernet + IPv4 + UDP.
pub const HEADERS_LEN: usize = ETH_LEN + IPV4_LEN + UDP_LEN;
/// Shortest Ethernet frame without FCS; shorter frames are padded.
pub const MIN_FRAME: usize = 60;
/// EtherType IPv4.
pub const ETHERTYPE_IPV4: u16 = 0x0800;
/// EtherType ARP.
pub const ETHERTYPE_ARP: u16 = 0x0806;
/// Broadcast MAC.
pub const BROADCAST: Mac = Mac([0xff; 6]);

/// An Ethernet MAC address.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Mac(pub [u8; 6]);

impl fmt::Debug for Mac {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

impl fmt::Display for Mac {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let m = self.0;
        write!(f, "{:02x}:{:02x}:{:02x}:{:02x}:{:02x}:{:02x}", m[0], m[1], m[2], m[3], m[4], m[5])
    }
}

/// Who computes the IPv4 and UDP checksums of a built frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Checksum {
    /// dlcp computes both in software.
    Software,
    /// The NIC does (IPv4 checksum left 0, UDP checksum holds the pseudo-header sum).
    Offload,
}

/// The Internet checksum's ones-complement sum of `data`, folded, starting from `init`.
pub fn ones_sum(init: u32, data: &[u8]) -> u32 {
    let mut s = init;
    let mut chunks = data.chunks_exact(2);
    for c in &mut chunks {
        s += u32::from(u16::from_be_bytes([c[0], c[1]]));
    }
    if let [b] = chunks.remainder() {
        s += u32::from(*b) << 8;
    }
    while s > 0xffff {
        s = (s & 0xffff) + (s >> 16);
    }
    s
}

fn pseudo_sum(src: Ipv4Addr, dst: Ipv4Addr, udp_len: u16) -> u32 {
    let mut p = [0u8; 12];
    p[0..4].copy_from_slice(&src.octets());
    p[4..8].copy_from_slice(&dst.octets());
    p[9] = 17;
    p[10..12].copy_from_slice(&udp_len.to_be_bytes());
    ones_sum(0, &p)
}

/// Everything a UDP frame needs besides its payload.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct UdpFrame {
    /// Source MAC (ours).
    pub src_mac: Mac,
    /// Destination MAC (the neighbour's).
    pub dst_mac: Mac,
    /// Source IPv4 address and UDP port.
    pub src: SocketAddrV4,
    /// Destination IPv4 address and UDP port.
    pub dst: SocketAddrV4,
    /// DSCP, 0 ..= 63 (the TOS byte is `dscp << 2`, ECN 0).
    pub dscp: u8,
    /// IPv4 identification.
    pub ident: u16,
    /// TTL.
    pub ttl: u8,
}

impl UdpFrame {
    /// Frame length for a payload of `payload_len` bytes (before padding).
    pub fn len_for(payload_len: usize) -> usize {
        HEADERS_LEN + payload_len
    }

    /// Write the frame for `payload` into `buf` (at least
    /// `max(len_for(payload.len()), MIN_FRAME)` bytes); returns the frame length.
    /// `None` if `buf` is too short or the payload does not fit an IPv4 packet.
    pub fn write(&self, buf: &mut [u8], payload: &[u8], cksum: Checksum) -> Option<usize> {
        self.write_parts(buf, &[payload], cksum)
    }

    /// [`UdpFrame::write`] for a payload that is the concatenation of `parts`
    /// (a datagram lent as header, payload and tag): each part is copied once,
    /// into its place in the frame.
    pub fn write_parts(&self, buf: &mut [u8], parts: &[&[u8]], cksum: Checksum) -> Option<usize> {
        let payload_len: usize = parts.iter().map(|p| p.len()).sum();
        let ip_len = IPV4_LEN + UDP_LEN + payload_len;
        let udp_len = u16::try_from(UDP_LEN + payload_len).ok()?;
        let ip_len16 = u16::try_from(ip_len).ok()?;
        let len = (ETH_LEN + ip_len).max(MIN_FRAME);
        let buf = buf.get_mut(..len)?;
        buf[ETH_LEN + ip_len..].fill(0);
        buf[0..6].copy_from_slice(&self.dst_mac.0);
        buf[6..12].copy_from_slice(&self.src_mac.0);
        buf[12..14].copy_from_slice(&ETHERTYPE_IPV4.to_be_bytes());
        let ip = &mut buf[ETH_LEN..ETH_LEN + IPV4_LEN];
        ip[0] = 0x45;
        ip[1] = (self.dscp & 0x3f) << 2;
        ip[2..4].copy_from_slice(&ip_len16.to_be_bytes());
        ip[4..6].copy_from_slice(&self.ident.to_be_bytes());
        ip[6..8].copy_from_slice(&0x4000u16.to_be_bytes()); // DF, no fragments
        ip[8] = self.ttl;
        ip[9] = 17;
        ip[10..12].fill(0);
        ip[12..16].copy_from_slice(&self.src.ip().octets());
        ip[16..20].copy_from_slice(&self.dst.ip().octets());
        if cksum == Checksum::Software {
            let c = !(ones_sum(0, ip) as u16);
            ip[10..12].copy_from_slice(&c.to_be_bytes());
        }
        let u = ETH_LEN + IPV4_LEN;
        buf[u..u + 2].copy_from_slice(&self.src.port().to_be_bytes());
        buf[u + 2..u + 4].copy_from_slice(&self.dst.port().to_be_bytes());
        buf[u + 4..u + 6].copy_from_slice(&udp_len.to_be_bytes());
        buf[u + 6..u + 8].fill(0);
        let mut at = u + 8;
        for p in parts {
            buf[at..at + p.len()].copy_from_slice(p);
            at += p.len();
        }
        let pseudo = pseudo_sum(*self.src.ip(), *self.dst.ip(), udp_len);
        let c = match cksum {
            Checksum::Offload => pseudo as u16, // the NIC adds the rest and complements
            Checksum::Software => {
                let c = !(ones_sum(pseudo, &buf[u..u + usize::from(udp_len)]) as u16);
                if c == 0 { 0xffff } else { c }
            }
        };
        buf[u + 6..u + 8].copy_from_slice(&c.to_be_bytes());
        Some(len)
    }
}

/// ARP operation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ArpOp {
    /// Who has `target_ip`?
    Request,
    /// `sender_ip` is at `sender_mac`.
    Reply,
}

/// An Ethernet/IPv4 ARP packet.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Arp {
    /// Request or reply.
    pub op: ArpOp,
    /// Sender hardware address.
    pub sender_mac: Mac,
    /// Sender protocol address.
    pub sender_ip: Ipv4Addr,
    /// Target hardware address (zero in requests).
    pub target_mac: Mac,
    /// Target protocol address.
    pub target_ip: Ipv4Addr,
}

impl Arp {
    /// Write the ARP frame (Ethernet destination `eth_dst`) into `buf`
    /// (≥ [`MIN_FRAME`] bytes); returns its length.
    pub fn write(&self, eth_dst: Mac, buf: &mut [u8]) -> Option<usize> {
        let buf = buf.get_mut(..MIN_FRAME)?;
        buf.fill(0);
        buf[0..6].copy_from_slice(&eth_dst.0);
        buf[6..12].copy_from_slice(&self.sender_mac.0);
        buf[12..14].copy_from_slice(&ETHERTYPE_ARP.to_be_bytes());
        let a = &mut buf[ETH_LEN..ETH_LEN + 28];
        a[0..2].copy_from_slice(&1u16.to_be_bytes()); // Ethernet
        a[2..4].copy_from_slice(&ETHERTYPE_IPV4.to_be_bytes());
        a[4] = 6;
        a[5] = 4;
        let op: u16 = match self.op {
            ArpOp::Request => 1,
            ArpOp::Reply => 2,
        };
        a[6..8].copy_from_slice(&op.to_be_bytes());
        a[8..14].copy_from_slice(&self.sender_mac.0);
        a[14..18].copy_from_slice(&self.sender_ip.octets());
        a[18..24].copy_from_slice(&self.target_mac.0);
        a[24..28].copy_from_slice(&self.target_ip.octets());
        Some(MIN_FRAME)
    }
}

/// A received UDP datagram's headers (payload at `payload` in the frame).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UdpRx {
    /// Source MAC.
    pub src_mac: Mac,
    /// Destination MAC.
    pub dst_mac: Mac,
    /// Source address and port.
    pub src: SocketAddrV4,
    /// Destination address and port.
    pub dst: SocketAddrV4,
    /// DSCP of the IPv4 header.
    pub dscp: u8,
    /// Byte range of the UDP payload within the frame.
    pub payload: std::ops::Range<usize>,
}

/// What a received frame is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Parsed {
    /// An IPv4 UDP datagram with valid headers and checksums.
    Udp(UdpRx),
    /// An ARP packet.
    Arp(Arp),
    /// Something dlcp does not handle, and why (counted, then dropped).
    Ignored(Ignore),
}

/// Why a received frame was dropped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ignore {
    /// Shorter than its headers claim.
    Truncated,
    /// Not IPv4 or ARP (e.g. IPv6, LLDP).
    OtherEtherType,
    /// IPv4 but not UDP.
    NotUdp,
    /// IPv4 with options, a fragment, or a bad version/length.
    BadIpv4,
    /// IPv4 header checksum wrong.
    BadIpChecksum,
    /// UDP checksum wrong.
    BadUdpChecksum,
    /// ARP that is not Ethernet/IPv4.
    BadArp,
}

/// Parse a received frame. `verify_cksum`: check the IPv4 and UDP checksums in
/// software (false when the NIC already verified them).
pub fn parse(f: &[u8], verify_cksum: bool) -> Parsed {
    use Parsed::Ignored;
    if f.len() < ETH_LEN {
        return Ignored(Ignore::Truncated);
    }
    let dst_mac = Mac(f[0..6].try_into().unwrap_or_default());
    let src_mac = Mac(f[6..12].try_into().unwrap_or_default());
    match u16::from_be_bytes([f[12], f[13]]) {
        ETHERTYPE_ARP => parse_arp(&f[ETH_LEN..]),
        ETHERTYPE_IPV4 => {
            let ip = &f[ETH_LEN..];
            if ip.len() < IPV4_LEN {
                return Ignored(Ignore::Truncated);
            }
            if ip[0] != 0x45 {
                return Ignored(Ignore::BadIpv4);
            }
            let total = usize::from(u16::from_be_bytes([ip[2], ip[3]]));
            if total < IPV4_LEN + UDP_LEN {
                return Ignored(if ip[9] == 17 { Ignore::BadIpv4 } else { Ignore::NotUdp });
            }
            if total > ip.len() {
                return Ignored(Ignore::Truncated);
            }
            if u16::from_be_bytes([ip[6], ip[7]]) & 0x3fff != 0 {
                return Ignored(Ignore::BadIpv4); // fragment
            }
            if ip[9] != 17 {
                return Ignored(Ignore::NotUdp);
            }
            if verify_cksum && ones_sum(0, &ip[..IPV4_LEN]) != 0xffff {
                return Ignored(Ignore::BadIpChecksum);
            }
            let src_ip = Ipv4Addr::new(ip[12], ip[13], ip[14], ip[15]);
            let dst_ip = Ipv4Addr::new(ip[16], ip[17], ip[18], ip[19]);
            let udp = &ip[IPV4_LEN..total];
            let ulen = usize::from(u16::from_be_bytes([udp[4], udp[5]]));
            if ulen < UDP_LEN || ulen > udp.len() {
                return Ignored(Ignore::Truncated);
            }
            let stored = u16::from_be_bytes([udp[6], udp[7]]);
            if verify_cksum
                && stored != 0
                && ones_sum(pseudo_sum(src_ip, dst_ip, ulen as u16), &udp[..ulen]) != 0xffff
            {
                return Ignored(Ignore::BadUdpChecksum);
            }
            let start = ETH_LEN + IPV4_LEN + UDP_LEN;
            Parsed::Udp(UdpRx {
                src_mac,
                dst_mac,
                src: SocketAddrV4::new(src_ip, u16::from_be_bytes([udp[0], udp[1]])),
                dst: SocketAddrV4::new(dst_ip, u16::from_be_bytes([udp[2], udp[3]])),
                dscp: ip[1] >> 2,
                payload: start..start + ulen - UDP_LEN,
            })
        }
        _ => Ignored(Ignore::OtherEtherType),
    }
}

fn parse_arp(a: &[u8]) -> Parsed {
    if a.len() < 28 {
        return Parsed::Ignored(Ignore::Truncated);
    }
    if a[0..2] != [0, 1] || a[2..4] != ETHERTYPE_IPV4.to_be_bytes() || a[4] != 6 || a[5] != 4 {
        return Parsed::Ignored(Ignore::BadArp);
    }
    let op = match u16::from_be_bytes([a[6], a[7]]) {
        1 => ArpOp::Request,
        2 => ArpOp::Reply,
        _ => return Parsed::Ignored(Ignore::BadArp),
    };
    let mac = |s: &[u8]| Mac(s.try_into().unwrap_or_default());
    Parsed::Arp(Arp {
        op,
        sender_mac: mac(&a[8..14]),
        sender_ip: Ipv4Addr::new(a[14], a[15], a[16], a[17]),
        target_mac: mac(&a[18..24]),
        target_ip: Ipv4Addr::new(a[24], a[25], a[26], a[27]),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frame() -> UdpFrame {
        UdpFrame {
            src_mac: Mac([2, 0, 0, 0, 0, 1]),
            dst_mac: Mac([2, 0, 0, 0, 0, 2]),
            src: "10.77.0.1:7700".parse().unwrap(),
            dst: "10.77.0.2:7701".parse().unwrap(),
            dscp: 46,
            ident: 0x1234,
            ttl: 64,
        }
    }

    #[test]
    fn udp_roundtrip_with_software_checksums() {
        let payload: Vec<u8> = (0..1000u32).map(|i| (i * 7) as u8).collect();
        let mut buf = [0u8; 2048];
        let n = frame().write(&mut buf, &payload, Checksum::Software).unwrap();
        assert_eq!(n, HEADERS_LEN + payload.len());
        assert_eq!(buf[ETH_LEN + 1], 46 << 2);
        let Parsed::Udp(u) = parse(&buf[..n], true) else { panic!("not udp") };
        assert_eq!(u.src, frame().src);
        assert_eq!(u.dst, frame().dst);
        assert_eq!(u.dscp, 46);
        assert_eq!(u.src_mac, frame().src_mac);
        assert_eq!(&buf[u.payload], &payload[..]);
    }

    #[test]
    fn known_ipv4_checksum() {
        // Header from RFC 1071-style worked example (Wikipedia's IPv4 checksum example).
        let h = [
            0x45, 0x00, 0x00, 0x73, 0x00, 0x00, 0x40, 0x00, 0x40, 0x11, 0x00, 0x00, 0xc0, 0xa8, 0x00, 0x01,
            0xc0, 0xa8, 0x00, 0xc7,
        ];
        assert_eq!(!(ones_sum(0, &h) as u16), 0xb861);
    }

    #[test]
    fn short_payload_is_padded_and_still_parses() {
        let mut buf = [0xaau8; 128];
        let n = frame().write(&mut buf, b"hi", Checksum::Software).unwrap();
        assert_eq!(n, MIN_FRAME);
        assert!(buf[HEADERS_LEN + 2..n].iter().all(|&b| b == 0));
        let Parsed::Udp(u) = parse(&buf[..n], true) else { panic!() };
        assert_eq!(&buf[u.payload], b"hi");
    }

    #[test]
    fn corruption_is_detected() {
        let mut buf = [0u8; 256];
        let n = frame().write(&mut buf, &[9u8; 100], Checksum::Software).unwrap();
        let mut b = buf;
        b[ETH_LEN + 8] ^= 1; // TTL
        assert_eq!(parse(&b[..n], true), Parsed::Ignored(Ignore::BadIpChecksum));
        assert!(matches!(parse(&b[..n], false), Parsed::Udp(_)));
        let mut b = buf;
        b[HEADERS_LEN + 50] ^= 0x80;
        assert_eq!(parse(&b[..n], true), Parsed::Ignored(Ignore::BadUdpChecksum));
        for cut in 0..n {
            // Never panics; never accepts a cut datagram as whole.
            if let Parsed::Udp(u) = parse(&buf[..cut], true) {
                panic!("accepted truncated frame of {cut} bytes: {u:?}");
            }
        }
    }

    #[test]
    fn offload_leaves_pseudo_header_sum() {
        let mut buf = [0u8; 256];
        let n = frame().write(&mut buf, &[1u8; 30], Checksum::Offload).unwrap();
        assert_eq!(&buf[ETH_LEN + 10..ETH_LEN + 12], &[0, 0]);
        let p = pseudo_sum(*frame().src.ip(), *frame().dst.ip(), (UDP_LEN + 30) as u16) as u16;
        assert_eq!(u16::from_be_bytes([buf[40], buf[41]]), p);
        // Unverified parse still works (the NIC would have filled them in).
        assert!(matches!(parse(&buf[..n], false), Parsed::Udp(_)));
    }

    #[test]
    fn arp_roundtrip() {
        let a = Arp {
            op: ArpOp::Request,
            sender_mac: Mac([2, 0, 0, 0, 0, 1]),
            sender_ip: "10.0.0.1".parse().unwrap(),
            target_mac: Mac::default(),
            target_ip: "10.0.0.2".parse().unwrap(),
        };
        let mut buf = [0u8; 64];
        let n = a.write(BROADCAST, &mut buf).unwrap();
        assert_eq!(n, MIN_FRAME);
        assert_eq!(parse(&buf[..n], true), Parsed::Arp(a));
        buf[ETH_LEN + 7] = 9;
        assert_eq!(parse(&buf[..n], true), Parsed::Ignored(Ignore::BadArp));
    }

    #[test]
    fn other_traffic_is_ignored_not_panicking() {
        assert_eq!(parse(&[0u8; 5], true), Parsed::Ignored(Ignore::Truncated));
        let mut b = [0u8; 60];
        b[12] = 0x86;
        b[13] = 0xdd;
        assert_eq!(parse(&b, true), Parsed::Ignored(Ignore::OtherEtherType));
    }
}
