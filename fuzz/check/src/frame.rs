//! The DPDK datapath's frame parser (`dlcp::datapath::frame::parse`).
//!
//! Input: a mode byte, then either raw frame bytes (mode 0) or the fields of
//! a UDP frame (mode 1) or an ARP packet (mode 2) that dlcp's own writers
//! build, followed by a few edits ([`crate::mutate`]). Checked:
//! - `parse` never panics, with and without checksum verification;
//! - a parsed UDP payload range lies inside the frame, its headers written
//!   again (`UdpFrame::write`, software checksums) parse to the same values
//!   and pass verification;
//! - a parsed ARP packet written again parses to the same packet;
//! - an unedited frame from dlcp's writers parses back to what was written;
//! - what passes checksum verification is a subset of what parses without it
//!   (verification only ever turns a UDP frame into `Ignored`).

use std::net::{Ipv4Addr, SocketAddrV4};

use dlcp::datapath::frame::{self, Arp, ArpOp, Checksum, Mac, Parsed, UdpFrame};

use crate::input::{Input, mutate};

fn mac(input: &mut Input<'_>) -> Mac {
    let mut m = [0u8; 6];
    m.iter_mut().for_each(|b| *b = input.u8());
    Mac(m)
}

fn addr(input: &mut Input<'_>) -> SocketAddrV4 {
    SocketAddrV4::new(Ipv4Addr::from(input.u32()), input.u16())
}

/// Run one input.
pub fn check(data: &[u8]) {
    let mut input = Input::new(data);
    let mode = input.u8() % 3;
    let mut buf = vec![0u8; 70_000];
    let (mut f, built) = match mode {
        1 => {
            let uf = UdpFrame {
                src_mac: mac(&mut input),
                dst_mac: mac(&mut input),
                src: addr(&mut input),
                dst: addr(&mut input),
                dscp: input.u8() & 0x3f,
                ident: input.u16(),
                ttl: input.u8(),
            };
            let cksum = if input.bool() { Checksum::Software } else { Checksum::Offload };
            let payload = input.blob(1500).to_vec();
            let n = uf.write(&mut buf, &payload, cksum).expect("a 1500-byte payload fits");
            (
                buf[..n].to_vec(),
                Some(Parsed::Udp(expected_udp(&uf, payload.len()))).filter(|_| cksum == Checksum::Software),
            )
        }
        2 => {
            let arp = Arp {
                op: if input.bool() { ArpOp::Request } else { ArpOp::Reply },
                sender_mac: mac(&mut input),
                sender_ip: Ipv4Addr::from(input.u32()),
                target_mac: mac(&mut input),
                target_ip: Ipv4Addr::from(input.u32()),
            };
            let eth_dst = mac(&mut input);
            let n = arp.write(eth_dst, &mut buf).expect("room for an ARP frame");
            (buf[..n].to_vec(), Some(Parsed::Arp(arp)))
        }
        _ => (input.rest().to_vec(), None),
    };
    let before = f.clone();
    mutate(&mut input, &mut f, 8);
    let unverified = frame::parse(&f, false);
    let verified = frame::parse(&f, true);
    if f == before
        && let Some(want) = built
    {
        assert_eq!(verified, want, "a frame dlcp wrote does not parse back");
    }
    match (&verified, &unverified) {
        (Parsed::Udp(a), Parsed::Udp(b)) => assert_eq!(a, b),
        (Parsed::Udp(_), other) => panic!("verified UDP but unverified {other:?}"),
        (Parsed::Arp(a), Parsed::Arp(b)) => assert_eq!(a, b),
        (Parsed::Arp(_), other) => panic!("verified ARP but unverified {other:?}"),
        (Parsed::Ignored(_), _) => {}
    }
    match unverified {
        Parsed::Udp(rx) => {
            assert!(rx.payload.start <= rx.payload.end && rx.payload.end <= f.len(), "{rx:?} in {}", f.len());
            assert!(rx.dscp < 64);
            let payload = &f[rx.payload.clone()];
            let uf = UdpFrame {
                src_mac: rx.src_mac,
                dst_mac: rx.dst_mac,
                src: rx.src,
                dst: rx.dst,
                dscp: rx.dscp,
                ident: 0,
                ttl: 64,
            };
            let n = uf.write(&mut buf, payload, Checksum::Software).expect("a parsed payload fits again");
            let again = frame::parse(&buf[..n], true);
            let Parsed::Udp(rx2) = again else { panic!("rewritten UDP frame parses as {again:?}") };
            assert_eq!(
                (rx2.src, rx2.dst, rx2.dscp, rx2.src_mac, rx2.dst_mac),
                (rx.src, rx.dst, rx.dscp, rx.src_mac, rx.dst_mac)
            );
            assert_eq!(&buf[rx2.payload], payload);
        }
        Parsed::Arp(arp) => {
            let n = arp.write(Mac([0xff; 6]), &mut buf).expect("room for an ARP frame");
            assert_eq!(frame::parse(&buf[..n], true), Parsed::Arp(arp));
        }
        Parsed::Ignored(_) => {}
    }
}

/// What parsing the frame `uf` writes for a payload of `len` bytes must give.
fn expected_udp(uf: &UdpFrame, len: usize) -> frame::UdpRx {
    let start = frame::HEADERS_LEN;
    frame::UdpRx {
        src_mac: uf.src_mac,
        dst_mac: uf.dst_mac,
        src: uf.src,
        dst: uf.dst,
        dscp: uf.dscp,
        payload: start..start + len,
    }
}
