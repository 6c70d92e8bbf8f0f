//! The socket datapath's user-space side of sending and receiving: a class's
//! queue of copied datagrams ([`ClassQueue`]), the regrouping of datagrams by
//! destination, the plan that turns them into the messages of one `sendmmsg`
//! call (GSO super-packets included), and the split of a GRO-coalesced
//! receive buffer.
//! Pure bookkeeping: no system call, no socket.

use std::net::SocketAddr;

/// One datagram to hand over: queued (its bytes in a class queue's buffer)
/// or lent (in a caller's batch).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Pending {
    /// Destination, already in the socket's family (v4-mapped on IPv6).
    pub(super) dst: SocketAddr,
    /// Where its bytes are: the offset in the queue's buffer, or the index in
    /// the caller's batch.
    pub(super) off: usize,
    /// Datagram length.
    pub(super) len: usize,
}

/// A class's user-space queue: payloads back to back, in acceptance order.
#[derive(Debug, Default)]
pub(super) struct ClassQueue {
    /// The payloads, back to back.
    pub(super) buf: Vec<u8>,
    /// The datagrams, in sending order.
    pub(super) items: Vec<Pending>,
    /// The socket refused the head with would-block; cleared when drained.
    pub(super) blocked: bool,
}

impl ClassQueue {
    /// Appends one datagram to `dst`: the concatenation of `parts`.
    pub(super) fn push(&mut self, dst: SocketAddr, parts: &[&[u8]]) {
        let off = self.buf.len();
        for p in parts {
            self.buf.extend_from_slice(p);
        }
        self.items.push(Pending { dst, off, len: self.buf.len() - off });
    }

    /// Reorders the queue so that each destination's datagrams are adjacent
    /// (see [`regroup`]), laying the bytes out again in the new order.
    pub(super) fn group_by_destination(&mut self, scratch: &mut Regroup) {
        if !regroup(&mut self.items, scratch) {
            return;
        }
        let buf = &mut scratch.buf;
        buf.clear();
        for it in &mut self.items {
            let off = buf.len();
            buf.extend_from_slice(&self.buf[it.off..it.off + it.len]);
            it.off = off;
        }
        std::mem::swap(&mut self.buf, buf);
    }

    /// Forgets the first `n` items (sent or dropped), moving the rest to the front.
    pub(super) fn consume(&mut self, n: usize) {
        if n >= self.items.len() {
            self.items.clear();
            self.buf.clear();
            return;
        }
        if n == 0 {
            return;
        }
        let cut = self.items[n].off;
        self.buf.drain(..cut);
        self.items.drain(..n);
        for it in &mut self.items {
            it.off -= cut;
        }
    }
}

/// Most distinct destinations a class queue is regrouped for (see
/// [`ClassQueue::group_by_destination`]); a queue with more is sent as queued.
const MAX_REGROUP_DESTINATIONS: usize = 64;

/// Reorders `items` so that each destination's datagrams are adjacent
/// (destinations in order of first appearance, each one's datagrams in their
/// order), so that GSO can carry them in one message; only the descriptors
/// move. The protocol core interleaves destinations chunk by chunk (chunk 0
/// to every peer, then chunk 1, ...): without this, runs to one destination
/// were ~1 datagram long and GSO barely applied (2.3 segments per message,
/// most datagrams sent alone, on a 4-host allreduce). Returns false, leaving
/// `items` as they are, when they are grouped already or go to more than
/// [`MAX_REGROUP_DESTINATIONS`] destinations.
pub(super) fn regroup(items: &mut Vec<Pending>, scratch: &mut Regroup) -> bool {
    // Runs of equal destination, and the distinct destinations.
    let dsts = &mut scratch.dsts;
    dsts.clear();
    let mut runs = 0;
    let mut prev = None;
    for it in items.iter() {
        if prev != Some(it.dst) {
            runs += 1;
            prev = Some(it.dst);
            if !dsts.contains(&it.dst) {
                if dsts.len() == MAX_REGROUP_DESTINATIONS {
                    return false; // too many to bother; sent as given
                }
                dsts.push(it.dst);
            }
        }
    }
    if runs == dsts.len() {
        return false; // already grouped
    }
    let out = &mut scratch.items;
    out.clear();
    for &d in dsts.iter() {
        out.extend(items.iter().filter(|it| it.dst == d));
    }
    std::mem::swap(items, out);
    true
}

/// Scratch space of [`regroup`], kept between flushes.
#[derive(Debug, Default)]
pub(super) struct Regroup {
    dsts: Vec<SocketAddr>,
    buf: Vec<u8>,
    items: Vec<Pending>,
    /// [`order_by_path`]: per destination its last path and path changes so
    /// far, and the sort keys.
    seen: Vec<(SocketAddr, usize, u32)>,
    keyed: Vec<(u64, Pending)>,
}

/// Destinations [`order_by_path`] tracks at most; with more it leaves the
/// order alone.
const MAX_PATH_ORDER_DESTINATIONS: usize = 64;

/// Orders one class's datagrams (`items`, in the order they were given) so
/// that each path's go out together — one `sendmmsg` per path — without
/// changing the order of any destination's datagrams.
///
/// A destination's datagrams change path only at a flowlet boundary (the
/// protocol's `paths` module), so they form a few segments, each on one path.
/// The key of a datagram is (its segment's index within its destination's
/// datagrams, its path): a stable sort by it puts every destination's first
/// segment before its second, and groups paths within each rank of
/// segments. A plain sort by path would send a flowlet's successor before
/// the flowlet's tail whenever the new path's index is the lower: on one
/// physical path (one switch, or one ECMP choice) that reordering alone
/// looked like a run of losses to the receiver's flow control, which halved
/// the sender's window (16 paths, 4 hosts, clean, 16 MiB: 250-275 window cuts
/// per daemon and run against 0 with one path).
///
/// Returns false, leaving `items` as they are, if they have more than
/// [`MAX_PATH_ORDER_DESTINATIONS`] destinations: the caller then sends
/// consecutive runs of one path in the given order.
pub(super) fn order_by_path(
    items: &mut [Pending],
    path: impl Fn(&Pending) -> usize,
    scratch: &mut Regroup,
) -> bool {
    let seen = &mut scratch.seen;
    let keyed = &mut scratch.keyed;
    seen.clear();
    keyed.clear();
    let mut last = 0;
    for it in items.iter() {
        let p = path(it);
        let at = if seen.get(last).is_some_and(|e| e.0 == it.dst) {
            last
        } else if let Some(i) = seen.iter().position(|e| e.0 == it.dst) {
            i
        } else {
            if seen.len() == MAX_PATH_ORDER_DESTINATIONS {
                return false;
            }
            seen.push((it.dst, p, 0));
            seen.len() - 1
        };
        last = at;
        let e = &mut seen[at];
        if e.1 != p {
            e.1 = p;
            e.2 += 1;
        }
        keyed.push(((u64::from(e.2) << 32) | p as u64, *it));
    }
    keyed.sort_by_key(|&(k, _)| k); // stable: each segment keeps its order
    for (dst, &(_, it)) in items.iter_mut().zip(keyed.iter()) {
        *dst = it;
    }
    true
}

/// One message of a `sendmmsg` call: `count` consecutive queue items starting
/// at `first`, sent as one GSO message of segment size `segment` when
/// `count > 1`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Group {
    /// Index of the first queue item.
    pub(super) first: usize,
    /// Queue items in the message.
    pub(super) count: usize,
    /// GSO segment size; 0 when the message is one datagram.
    pub(super) segment: usize,
    /// Payload bytes of the message.
    pub(super) bytes: usize,
}

/// Splits `items[start..]` into at most `batch` messages. With `gso =
/// Some((max_segments, max_payload))`, consecutive datagrams to one
/// destination of one size (plus at most one shorter, last one) share a
/// message, up to `max_segments` of them and `max_payload` bytes.
pub(super) fn plan(
    items: &[Pending],
    start: usize,
    batch: usize,
    gso: Option<(usize, usize)>,
    out: &mut Vec<Group>,
) {
    out.clear();
    let mut i = start;
    while out.len() < batch && i < items.len() {
        let first = items[i];
        let mut count = 1;
        let mut bytes = first.len;
        if let Some((max_segments, max_payload)) = gso
            && first.len > 0
        {
            while count < max_segments && i + count < items.len() {
                let next = items[i + count];
                if next.dst != first.dst
                    || next.len == 0
                    || next.len > first.len
                    || bytes + next.len > max_payload
                {
                    break;
                }
                count += 1;
                bytes += next.len;
                if next.len < first.len {
                    break; // a shorter datagram can only be the last segment
                }
            }
        }
        let segment = if count > 1 { first.len } else { 0 };
        out.push(Group { first: i, count, segment, bytes });
        i += count;
    }
}

/// The datagrams in a received buffer of `len` bytes coalesced at `segment`
/// bytes (0: not coalesced): ranges of `segment` bytes, the last one shorter.
pub(super) fn segments(len: usize, segment: usize) -> impl Iterator<Item = std::ops::Range<usize>> {
    let step = if segment == 0 || segment >= len { len.max(1) } else { segment };
    (0..len.max(1)).step_by(step).map(move |start| start..(start + step).min(len))
}

/// The pure parts above as functions of plain values, for the fuzz targets
/// (`fuzz/`) and nothing else: not an API.
#[doc(hidden)]
pub mod fuzzing {
    use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4};
    use std::ops::Range;

    use super::{Pending, plan, segments};

    /// The datagrams of a received buffer of `len` bytes that GRO coalesced
    /// at `segment` bytes (0: not coalesced), as the receive path splits it.
    pub fn gro_segments(len: usize, segment: usize) -> Vec<Range<usize>> {
        segments(len, segment).collect()
    }

    /// The messages the send path makes of `datagrams` — `(destination
    /// port, length)`, laid out back to back — from index `start`, at most
    /// `batch` of them, with `gso = Some((max_segments, max_payload))`: each
    /// message as `(first, count, segment, bytes)`.
    pub fn gso_plan(
        datagrams: &[(u16, usize)],
        start: usize,
        batch: usize,
        gso: Option<(usize, usize)>,
    ) -> Vec<(usize, usize, usize, usize)> {
        let mut off = 0;
        let items: Vec<Pending> = datagrams
            .iter()
            .map(|&(port, len)| {
                let dst = SocketAddr::V4(SocketAddrV4::new(Ipv4Addr::LOCALHOST, port));
                off += len;
                Pending { dst, off: off - len, len }
            })
            .collect();
        let mut out = Vec::new();
        plan(&items, start, batch, gso, &mut out);
        out.iter().map(|g| (g.first, g.count, g.segment, g.bytes)).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::{Ipv4Addr, SocketAddrV4};

    fn item(port: u16, off: usize, len: usize) -> Pending {
        Pending { dst: SocketAddr::V4(SocketAddrV4::new(Ipv4Addr::LOCALHOST, port)), off, len }
    }

    fn items(spec: &[(u16, usize)]) -> Vec<Pending> {
        let mut off = 0;
        spec.iter()
            .map(|&(port, len)| {
                let it = item(port, off, len);
                off += len;
                it
            })
            .collect()
    }

    #[test]
    fn plan_without_gso_is_one_message_per_datagram() {
        let v = items(&[(1, 100); 5]);
        let mut g = Vec::new();
        plan(&v, 0, 3, None, &mut g);
        assert_eq!(
            g.iter().map(|g| (g.first, g.count, g.segment)).collect::<Vec<_>>(),
            vec![(0, 1, 0), (1, 1, 0), (2, 1, 0)]
        );
        plan(&v, 3, 3, None, &mut g);
        assert_eq!(g.len(), 2);
    }

    #[test]
    fn plan_groups_equal_sizes_per_destination_and_caps_segments() {
        // 5 × 100 to port 1, a short tail of 40, then 3 × 100 to port 2, then 200 to port 2.
        let v = items(&[
            (1, 100),
            (1, 100),
            (1, 100),
            (1, 100),
            (1, 100),
            (1, 40),
            (2, 100),
            (2, 100),
            (2, 100),
            (2, 200),
        ]);
        let mut g = Vec::new();
        plan(&v, 0, 10, Some((4, 65_507)), &mut g);
        let got: Vec<_> = g.iter().map(|g| (g.first, g.count, g.segment, g.bytes)).collect();
        assert_eq!(got, vec![(0, 4, 100, 400), (4, 2, 100, 140), (6, 3, 100, 300), (9, 1, 0, 200)]);
    }

    #[test]
    fn plan_respects_payload_limit_and_zero_length() {
        let v = items(&[(1, 30_000), (1, 30_000), (1, 30_000), (1, 0), (1, 0)]);
        let mut g = Vec::new();
        plan(&v, 0, 10, Some((64, 65_507)), &mut g);
        let got: Vec<_> = g.iter().map(|g| (g.first, g.count)).collect();
        assert_eq!(got, vec![(0, 2), (2, 1), (3, 1), (4, 1)]);
    }

    #[test]
    fn group_by_destination_keeps_each_destinations_order() {
        let mut q = ClassQueue::default();
        let a: SocketAddr = "10.0.0.1:1".parse().unwrap();
        let b: SocketAddr = "10.0.0.2:1".parse().unwrap();
        let c: SocketAddr = "10.0.0.3:1".parse().unwrap();
        let order = [(a, 1u8), (b, 2), (a, 3), (c, 4), (b, 5), (a, 6)];
        for (d, tag) in order {
            q.push(d, &[&[tag; 3]]);
        }
        let mut scratch = Regroup::default();
        q.group_by_destination(&mut scratch);
        let got: Vec<(SocketAddr, u8)> = q.items.iter().map(|it| (it.dst, q.buf[it.off])).collect();
        assert_eq!(got, vec![(a, 1), (a, 3), (a, 6), (b, 2), (b, 5), (c, 4)]);
        for it in &q.items {
            assert_eq!(&q.buf[it.off..it.off + it.len], &[q.buf[it.off]; 3]);
        }
        // Already grouped: untouched (same buffer).
        let ptr = q.buf.as_ptr();
        q.group_by_destination(&mut scratch);
        assert_eq!(q.buf.as_ptr(), ptr);
        assert_eq!(q.items.len(), 6);
    }

    #[test]
    fn order_by_path_keeps_each_destinations_order() {
        // Destination 1 changes path 5 -> 2 (a flowlet boundary); 2 stays on
        // 9; 3 is on 5, then on 2 and back on 5.
        let spec = [(1, 5), (1, 5), (2, 9), (1, 2), (3, 5), (2, 9), (3, 2), (3, 5), (1, 2)];
        let mut v = items(&spec.map(|(d, _)| (d, 10)));
        for (i, it) in v.iter_mut().enumerate() {
            it.off = i;
        }
        let path = |it: &Pending| spec[it.off].1;
        let mut scratch = Regroup::default();
        assert!(order_by_path(&mut v, path, &mut scratch));
        let order: Vec<usize> = v.iter().map(|it| it.off).collect();
        // First segments by path (2 none, 5: d1, d3; 9: d2), then second
        // segments (2: d1, d3), then d3's third (5).
        assert_eq!(order, [0, 1, 4, 2, 5, 3, 6, 8, 7]);
        for d in 1..=3u16 {
            let offs: Vec<usize> = v.iter().filter(|it| it.dst.port() == d).map(|it| it.off).collect();
            assert!(offs.windows(2).all(|w| w[0] < w[1]), "destination {d} reordered: {offs:?}");
        }
        // Paths come in runs: four sends, where a sort by path alone gives
        // three but sends d1's path-2 segment before its path-5 one.
        let runs = 1 + v.windows(2).filter(|w| path(&w[0]) != path(&w[1])).count();
        assert_eq!(runs, 4);
    }

    #[test]
    fn order_by_path_leaves_many_destinations_alone() {
        let spec: Vec<(u16, usize)> = (0..=MAX_PATH_ORDER_DESTINATIONS as u16).map(|d| (d + 1, 1)).collect();
        let mut v = items(&spec);
        let before = v.clone();
        assert!(!order_by_path(&mut v, |it| usize::from(it.dst.port()) % 3, &mut Regroup::default()));
        assert_eq!(v, before);
    }

    #[test]
    fn regroup_moves_only_descriptors() {
        // A lent batch: `off` is the datagram's index in the caller's batch.
        let mut v = items(&[(1, 10), (2, 10), (1, 10), (3, 10), (2, 10)]);
        for (i, it) in v.iter_mut().enumerate() {
            it.off = i;
        }
        let mut scratch = Regroup::default();
        assert!(regroup(&mut v, &mut scratch));
        let got: Vec<(u16, usize)> = v.iter().map(|it| (it.dst.port(), it.off)).collect();
        assert_eq!(got, [(1, 0), (1, 2), (2, 1), (2, 4), (3, 3)]);
        assert!(!regroup(&mut v, &mut scratch), "already grouped");
    }

    #[test]
    fn plan_stops_at_batch() {
        let v = items(&[(1, 10), (2, 10), (3, 10), (4, 10)]);
        let mut g = Vec::new();
        plan(&v, 1, 2, Some((16, 65_507)), &mut g);
        assert_eq!(g.iter().map(|g| g.first).collect::<Vec<_>>(), vec![1, 2]);
    }

    #[test]
    fn queue_consume_keeps_order_and_offsets() {
        let mut q = ClassQueue::default();
        let a = SocketAddr::V4(SocketAddrV4::new(Ipv4Addr::LOCALHOST, 9));
        q.push(a, &[b"one"]);
        q.push(a, &[b"tw", b"o!"]);
        q.push(a, &[b"three"]);
        q.consume(1);
        assert_eq!(q.items.len(), 2);
        let it = q.items[0];
        assert_eq!(&q.buf[it.off..it.off + it.len], b"two!");
        let it = q.items[1];
        assert_eq!(&q.buf[it.off..it.off + it.len], b"three");
        q.consume(5);
        assert!(q.items.is_empty() && q.buf.is_empty());
    }

    #[test]
    fn gro_segments_split_with_a_short_tail() {
        let v = |len, seg| segments(len, seg).collect::<Vec<_>>();
        assert_eq!(v(0, 0), vec![0..0]);
        assert_eq!(v(0, 100), vec![0..0]);
        assert_eq!(v(250, 0), vec![0..250]);
        assert_eq!(v(250, 250), vec![0..250]);
        assert_eq!(v(250, 400), vec![0..250]);
        assert_eq!(v(250, 100), vec![0..100, 100..200, 200..250]);
        assert_eq!(v(300, 100), vec![0..100, 100..200, 200..300]);
        assert_eq!(v(3, 1), vec![0..1, 1..2, 2..3]);
    }
}
