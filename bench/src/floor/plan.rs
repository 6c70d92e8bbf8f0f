//! What the floor moves: the shards and chunks of a tensor, the 12-byte header
//! that places a datagram, and the order datagrams are sent in.

use std::ops::Range;

/// Bytes of the floor header: magic, kind, source rank, spare byte, op (u32
/// LE), chunk index within its shard (u32 LE).
pub const HDR: usize = 12;
/// First byte of every floor datagram.
const MAGIC: u8 = 0xF1;
/// IPv4 + UDP header bytes.
pub const IP_UDP: usize = 28;
/// Largest UDP payload of one GSO message over IPv4.
pub const MAX_GSO_BYTES: usize = 65_507;

/// What a datagram carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// Reduce-scatter: a chunk of the receiver's shard, to be summed into it.
    Scatter = 0,
    /// All-gather: a chunk of the sender's reduced shard, to be copied.
    Gather = 1,
    /// The sender is ready for op `op` (a barrier between reps).
    Ready = 2,
}

/// A parsed floor header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Header {
    /// What the datagram carries.
    pub kind: Kind,
    /// The sender's rank.
    pub src: u8,
    /// The op (rep) it belongs to.
    pub op: u32,
    /// Chunk index within the shard.
    pub chunk: u32,
}

impl Header {
    /// The header's bytes.
    pub fn encode(&self) -> [u8; HDR] {
        let mut b = [0u8; HDR];
        b[0] = MAGIC;
        b[1] = self.kind as u8;
        b[2] = self.src;
        b[4..8].copy_from_slice(&self.op.to_le_bytes());
        b[8..12].copy_from_slice(&self.chunk.to_le_bytes());
        b
    }

    /// Parses the start of a datagram; None if it is no floor datagram.
    pub fn parse(d: &[u8]) -> Option<Header> {
        if d.len() < HDR || d[0] != MAGIC {
            return None;
        }
        let kind = match d[1] {
            0 => Kind::Scatter,
            1 => Kind::Gather,
            2 => Kind::Ready,
            _ => return None,
        };
        let word = |i: usize| u32::from_le_bytes([d[i], d[i + 1], d[i + 2], d[i + 3]]);
        Some(Header { kind, src: d[2], op: word(4), chunk: word(8) })
    }
}

/// f32 elements per datagram at `mtu`: the UDP payload minus the header, in
/// whole elements.
pub fn chunk_elems(mtu: usize) -> usize {
    mtu.saturating_sub(IP_UDP + HDR) / 4
}

/// GSO segments per message: `max` (dlcpd's `gso_max_segments`), and no more
/// than one 64 KiB UDP payload holds.
pub fn gso_segments(max: usize, datagram: usize) -> usize {
    max.min(MAX_GSO_BYTES / datagram.max(1)).max(1)
}

/// The transpose allreduce's geometry: shard `j` (host `j`'s) of `n` elements
/// over `hosts` hosts, cut in chunks of `chunk` elements.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Layout {
    /// Elements of the tensor.
    pub n: usize,
    /// Hosts.
    pub hosts: usize,
    /// Elements per chunk (datagram).
    pub chunk: usize,
}

impl Layout {
    /// Elements of shard `j`: `n / hosts`, the first `n % hosts` shards one more.
    pub fn shard(&self, j: usize) -> Range<usize> {
        let (q, r) = (self.n / self.hosts, self.n % self.hosts);
        let start = j * q + j.min(r);
        start..start + q + usize::from(j < r)
    }

    /// Chunks of shard `j`.
    pub fn chunks(&self, j: usize) -> usize {
        self.shard(j).len().div_ceil(self.chunk)
    }

    /// Elements of chunk `c` of shard `j` (None if there is no such chunk).
    pub fn chunk(&self, j: usize, c: usize) -> Option<Range<usize>> {
        let s = self.shard(j);
        let start = s.start.checked_add(c.checked_mul(self.chunk)?)?;
        (start < s.end).then(|| start..(start + self.chunk).min(s.end))
    }
}

/// One stream of datagrams: every chunk of shard `shard`, to host `dst`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Stream {
    /// Destination rank.
    pub dst: usize,
    /// The shard whose chunks are sent.
    pub shard: usize,
    /// Scatter or Gather.
    pub kind: Kind,
    /// Next chunk to send.
    pub next: usize,
    /// Chunks in the shard.
    pub end: usize,
}

/// One planned message: `count` chunks of stream `stream` from chunk `first`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Planned {
    /// Index into the streams.
    pub stream: usize,
    /// First chunk.
    pub first: usize,
    /// Chunks (GSO segments).
    pub count: usize,
}

/// Plans up to `batch` messages of up to `segs` chunks each, taking the
/// unfinished streams in turn from `*rr` (one message each per turn, as
/// dlcpd's flush sends each destination's run in turn). Streams are not
/// advanced: [`commit`] does that for the messages the kernel took.
pub fn plan(streams: &[Stream], rr: &mut usize, batch: usize, segs: usize, out: &mut Vec<Planned>) {
    out.clear();
    let mut next: Vec<usize> = streams.iter().map(|s| s.next).collect();
    let n = streams.len();
    let mut idle = 0;
    while out.len() < batch && idle < n {
        let i = *rr % n;
        *rr = (*rr + 1) % n;
        let s = &streams[i];
        if next[i] >= s.end {
            idle += 1;
            continue;
        }
        idle = 0;
        let count = segs.min(s.end - next[i]);
        out.push(Planned { stream: i, first: next[i], count });
        next[i] += count;
    }
}

/// Advances the streams past the first `taken` planned messages.
pub fn commit(streams: &mut [Stream], planned: &[Planned], taken: usize) {
    for p in &planned[..taken] {
        streams[p.stream].next = streams[p.stream].next.max(p.first + p.count);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn header_round_trips_and_rejects_strangers() {
        let h = Header { kind: Kind::Gather, src: 3, op: 0xDEAD_BEEF, chunk: 77_000 };
        assert_eq!(Header::parse(&h.encode()), Some(h));
        let mut b = h.encode();
        b[0] = 0;
        assert_eq!(Header::parse(&b), None, "wrong magic");
        b = h.encode();
        b[1] = 9;
        assert_eq!(Header::parse(&b), None, "unknown kind");
        assert_eq!(Header::parse(&h.encode()[..HDR - 1]), None, "short");
    }

    #[test]
    fn datagrams_fill_the_mtu() {
        assert_eq!(chunk_elems(1500), 365); // 1472 - 12 = 1460 bytes
        assert_eq!(chunk_elems(9000), 2240); // 8972 - 12 = 8960 bytes
        assert_eq!(gso_segments(16, HDR + 4 * 365), 16);
        assert_eq!(gso_segments(16, HDR + 4 * 2240), 7); // 7 x 8972 <= 65507 < 8 x 8972
        assert_eq!(gso_segments(16, 70_000), 1);
    }

    #[test]
    fn shards_and_chunks_cover_every_element_once() {
        for (n, hosts, chunk) in [(1000, 4, 7), (10, 4, 365), (3, 4, 2), (1 << 20, 3, 2240), (4, 4, 1)] {
            let l = Layout { n, hosts, chunk };
            let mut seen = vec![0u8; n];
            for j in 0..hosts {
                let s = l.shard(j);
                assert!(s.len() == n / hosts || s.len() == n / hosts + 1, "{n} {hosts} {j}: {s:?}");
                for c in 0..l.chunks(j) {
                    let r = l.chunk(j, c).expect("chunk in range");
                    assert!(!r.is_empty() && r.len() <= chunk && r.start >= s.start && r.end <= s.end);
                    r.for_each(|i| seen[i] += 1);
                }
                assert_eq!(l.chunk(j, l.chunks(j)), None, "one past the last chunk");
            }
            assert!(seen.iter().all(|&x| x == 1), "{n} {hosts} {chunk}");
        }
        let l = Layout { n: 10, hosts: 2, chunk: 4 };
        assert_eq!(l.chunk(1, usize::MAX), None, "no overflow on a hostile chunk index");
    }

    #[test]
    fn plan_sends_every_chunk_once_in_turns() {
        let mk = |dst, end| Stream { dst, shard: dst, kind: Kind::Scatter, next: 0, end };
        let mut streams = vec![mk(1, 40), mk(2, 3), mk(3, 17)];
        let (mut rr, mut out, mut sent) = (0, Vec::new(), vec![vec![0u8; 40]; 3]);
        let mut calls = 0;
        loop {
            plan(&streams, &mut rr, 4, 5, &mut out);
            if out.is_empty() {
                break;
            }
            assert!(out.len() <= 4 && out.iter().all(|p| p.count >= 1 && p.count <= 5), "{out:?}");
            // The kernel takes only part of a batch now and then.
            let taken = if calls % 3 == 1 { out.len() / 2 } else { out.len() };
            for p in &out[..taken] {
                (p.first..p.first + p.count).for_each(|c| sent[p.stream][c] += 1);
            }
            commit(&mut streams, &out, taken);
            calls += 1;
            assert!(calls < 100, "plan does not finish");
        }
        for (i, s) in streams.iter().enumerate() {
            assert_eq!(s.next, s.end);
            assert!(sent[i][..s.end].iter().all(|&x| x == 1), "stream {i}: {:?}", &sent[i][..s.end]);
        }
        // Turns: the first batch holds a message of every stream.
        let mut fresh = vec![mk(1, 40), mk(2, 3), mk(3, 17)];
        plan(&fresh, &mut 0, 3, 5, &mut out);
        assert_eq!(out.iter().map(|p| p.stream).collect::<Vec<_>>(), vec![0, 1, 2]);
        commit(&mut fresh, &out, 3);
        assert_eq!(fresh.iter().map(|s| s.next).collect::<Vec<_>>(), vec![5, 3, 5]);
    }
}
