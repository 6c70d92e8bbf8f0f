//! `dlcp-bench floor`: the best a socket datapath can do on this testbed.
//!
//! One process per host moves the same bytes as a dlcp allreduce (the
//! transpose scheme): host `j` sends shard `k` of its tensor to host `k`, sums
//! what it receives into its own shard, then sends its reduced shard to every
//! other host, which copies it in place. Bare kernel UDP, as dlcpd's socket
//! datapath uses it: `sendmmsg` of GSO (`UDP_SEGMENT`) messages, each datagram
//! a 12-byte header and an iovec straight into the tensor (no user-space copy
//! on send), `recvmmsg` with `UDP_GRO` into 64 KiB slots, each datagram summed
//! (or copied) from the receive slot into the tensor. Datagrams fill the MTU.
//! No protocol, no MAC, no repair: a datagram that does not come within
//! `--idle-ms` is counted lost (run it on a clean network). The receive
//! buffer is large (`--rcvbuf`, default 64 MiB, forced as root) so that
//! a receiver behind its senders queues instead of dropping: there is no
//! flow control either.
//!
//! A READY barrier (tiny datagrams) starts every op, outside the timing, so
//! that no datagram of op k+1 reaches a host still in op k. Prints one JSON
//! line like `dlcp-bench trainer`: per-rep times, CPU seconds, the CPU
//! window (see `window.rs`), and the counters.

mod node;
mod plan;
mod sys;

use std::net::SocketAddrV4;
use std::time::Duration;

use node::{Node, Settings};

/// The floor's arguments.
struct Args {
    rank: usize,
    peers: Vec<SocketAddrV4>,
    mtu: usize,
    sizes: Vec<usize>,
    reps: usize,
    warmup: usize,
    seed: u64,
    gso_segments: usize,
    batch: usize,
    rcvbuf: usize,
    sndbuf: usize,
    dscp: u8,
    idle_ms: u64,
    barrier_s: u64,
}

fn parse_args(a: &[String]) -> Result<Args, String> {
    use crate::flag;
    let peers: String = flag(a, "--peers")?.ok_or("--peers is required")?;
    let peers = peers
        .split(',')
        .map(|p| {
            p.parse::<SocketAddrV4>().map_err(|_| format!("--peers: bad address '{p}' (want IPv4:port)"))
        })
        .collect::<Result<Vec<_>, _>>()?;
    let sizes: String = flag(a, "--sizes")?.ok_or("--sizes is required")?;
    let sizes = sizes
        .split(',')
        .filter(|s| !s.is_empty())
        .map(|s| {
            s.parse::<usize>().ok().filter(|&n| n > 0).ok_or(format!("--sizes: bad element count '{s}'"))
        })
        .collect::<Result<Vec<_>, _>>()?;
    let r = Args {
        rank: flag(a, "--rank")?.ok_or("--rank is required")?,
        peers,
        mtu: flag(a, "--mtu")?.unwrap_or(1500),
        sizes,
        reps: flag(a, "--reps")?.unwrap_or(5),
        warmup: flag(a, "--warmup")?.unwrap_or(1),
        seed: flag(a, "--seed")?.unwrap_or(1),
        gso_segments: flag(a, "--gso-segments")?.unwrap_or(16),
        batch: flag(a, "--batch")?.unwrap_or(32),
        rcvbuf: flag(a, "--rcvbuf")?.unwrap_or(64 << 20),
        sndbuf: flag(a, "--sndbuf")?.unwrap_or(4 << 20),
        dscp: flag(a, "--dscp")?.unwrap_or(0),
        idle_ms: flag(a, "--idle-ms")?.unwrap_or(500),
        barrier_s: flag(a, "--barrier-s")?.unwrap_or(60),
    };
    if r.peers.len() < 2 || r.peers.len() > 255 || r.rank >= r.peers.len() {
        return Err(format!(
            "--rank {} of {} peers: need 2..=255 peers and a rank among them",
            r.rank,
            r.peers.len()
        ));
    }
    if plan::chunk_elems(r.mtu) == 0 || r.mtu > 65_535 {
        return Err(format!("--mtu {} is out of range", r.mtu));
    }
    if !(1..=64).contains(&r.gso_segments) || !(1..=1024).contains(&r.batch) || r.dscp > 63 {
        return Err("--gso-segments must be 1..=64, --batch 1..=1024, --dscp 0..=63".into());
    }
    Ok(r)
}

pub fn main(args: &[String]) -> Result<(), String> {
    let a = parse_args(args)?;
    let chunk = plan::chunk_elems(a.mtu);
    let datagram = plan::HDR + 4 * chunk;
    let segs = plan::gso_segments(a.gso_segments, datagram);
    let (sock, opened) = sys::open(a.peers[a.rank], a.rcvbuf, a.sndbuf, a.dscp)
        .map_err(|e| format!("UDP socket on {}: {e}", a.peers[a.rank]))?;
    let set = Settings {
        chunk,
        segs,
        batch: a.batch,
        idle: Duration::from_millis(a.idle_ms),
        barrier_timeout: Duration::from_secs(a.barrier_s),
    };
    let mut node = Node::new(a.rank, sock, &a.peers, set);
    let inputs: Vec<Vec<f32>> =
        a.sizes.iter().enumerate().map(|(i, &n)| crate::trainer::input(a.seed + i as u64, n)).collect();
    let mut tensors: Vec<Vec<f32>> = a.sizes.iter().map(|&n| vec![0.0; n]).collect();
    let cpu0 = crate::cpu_seconds();
    let m0 = crate::window::start();
    let mut id = 0u32;
    let mut results = Vec::new();
    for (input, t) in inputs.iter().zip(tensors.iter_mut()) {
        let mut times = Vec::new();
        for rep in 0..a.warmup + a.reps {
            t.copy_from_slice(input);
            let d = node.allreduce(t, id)?;
            id += 1;
            if rep >= a.warmup {
                times.push(d.as_secs_f64());
            }
        }
        results.push(format!("{{\"elems\":{},\"times\":{}}}", t.len(), crate::trainer::secs(&times)));
    }
    let m1 = crate::window::end();
    let cpu = crate::cpu_seconds() - cpu0;
    let c = node.counters;
    println!(
        "{{\"system\":\"floor\",\"rank\":{},\"cpu_s\":{cpu:.3},\"mtu\":{},\"datagram_bytes\":{datagram},\
         \"gso_segments\":{segs},\"batch\":{},\"rcvbuf\":{},\"sndbuf\":{},\"lost\":{},\"stale\":{},\
         \"malformed\":{},\"tx_datagrams\":{},\"tx_calls\":{},\"rx_datagrams\":{},\"rx_calls\":{},\
         \"window\":{},\"results\":[{}]}}",
        a.rank,
        a.mtu,
        a.batch,
        opened.rcvbuf,
        opened.sndbuf,
        c.lost,
        c.stale,
        c.malformed,
        c.tx_datagrams,
        c.tx_calls,
        c.rx_datagrams,
        c.rx_calls,
        crate::window::json(&m0, &m1),
        results.join(",")
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::Ipv4Addr;

    fn strings(v: &[&str]) -> Vec<String> {
        v.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn arguments_parse_and_bad_ones_are_refused() {
        let a =
            parse_args(&strings(&["--rank", "1", "--peers", "10.0.0.1:7,10.0.0.2:7", "--sizes", "10,20"]))
                .expect("valid");
        assert_eq!(
            (a.rank, a.peers.len(), a.sizes.clone(), a.mtu, a.gso_segments),
            (1, 2, vec![10, 20], 1500, 16)
        );
        for bad in [
            vec!["--rank", "2", "--peers", "10.0.0.1:7,10.0.0.2:7", "--sizes", "1"],
            vec!["--rank", "0", "--peers", "10.0.0.1:7", "--sizes", "1"],
            vec!["--rank", "0", "--peers", "10.0.0.1,10.0.0.2:7", "--sizes", "1"],
            vec!["--rank", "0", "--peers", "10.0.0.1:7,10.0.0.2:7", "--sizes", "0"],
            vec!["--rank", "0", "--peers", "10.0.0.1:7,10.0.0.2:7", "--sizes", "1", "--mtu", "40"],
            vec!["--rank", "0", "--peers", "10.0.0.1:7,10.0.0.2:7", "--sizes", "1", "--gso-segments", "0"],
            vec!["--peers", "10.0.0.1:7,10.0.0.2:7", "--sizes", "1"],
        ] {
            assert!(parse_args(&strings(&bad)).is_err(), "{bad:?} must be refused");
        }
    }

    /// Three nodes on loopback: every rank ends with the element-wise sum
    /// (small integers, so the sum is exact in any order), op after op.
    fn loopback(mtu: usize, n: usize, hosts: usize) {
        let chunk = plan::chunk_elems(mtu);
        let set = Settings {
            chunk,
            segs: plan::gso_segments(16, plan::HDR + 4 * chunk),
            batch: 8,
            idle: Duration::from_secs(5),
            barrier_timeout: Duration::from_secs(30),
        };
        let socks: Vec<_> = (0..hosts)
            .map(|_| {
                sys::open(SocketAddrV4::new(Ipv4Addr::LOCALHOST, 0), 8 << 20, 1 << 20, 0).expect("socket").0
            })
            .collect();
        let addrs: Vec<SocketAddrV4> = socks
            .iter()
            .map(|s| match s.local_addr().expect("addr") {
                std::net::SocketAddr::V4(a) => a,
                other => panic!("{other}"),
            })
            .collect();
        let input = move |r: usize, op: u32| -> Vec<f32> {
            (0..n).map(|i| ((i * 7 + r * 13 + op as usize) % 101) as f32).collect()
        };
        let threads: Vec<_> = socks
            .into_iter()
            .enumerate()
            .map(|(r, s)| {
                let addrs = addrs.clone();
                std::thread::spawn(move || {
                    let mut node = Node::new(r, s, &addrs, set);
                    let mut outs = Vec::new();
                    for op in 0..3u32 {
                        let mut t = input(r, op);
                        node.allreduce(&mut t, op).expect("allreduce");
                        outs.push(t);
                    }
                    (outs, node.counters)
                })
            })
            .collect();
        for (r, th) in threads.into_iter().enumerate() {
            let (outs, c) = th.join().expect("node thread");
            assert_eq!((c.lost, c.malformed), (0, 0), "rank {r}: {c:?}");
            for (op, t) in outs.iter().enumerate() {
                let inputs: Vec<Vec<f32>> = (0..hosts).map(|h| input(h, op as u32)).collect();
                let want: Vec<f32> = (0..n).map(|i| inputs.iter().map(|x| x[i]).sum()).collect();
                assert!(t == &want, "rank {r} op {op}: wrong sum (mtu {mtu}, n {n})");
            }
        }
    }

    #[test]
    fn loopback_allreduce_sums_exactly_at_both_mtus() {
        loopback(1500, 200_003, 3);
        loopback(9000, 100_000, 3);
        loopback(1500, 3, 4); // fewer elements than hosts: one shard is empty
    }
}
