//! One host of the floor allreduce: a UDP socket, and the op loop that sends
//! and receives at once (non-blocking, one thread, like dlcpd's event loop).

use std::io;
use std::net::{SocketAddrV4, UdpSocket};
use std::os::fd::{AsFd, BorrowedFd};
use std::time::{Duration, Instant};

use super::plan::{self, HDR, Header, Kind, Layout, Planned, Stream};
use super::sys::{self, RxMeta, Segment, TxMsg};

/// Receive buffers per `recvmmsg` (dlcpd's default `batch`).
const RX_BATCH: usize = 32;
/// `recvmmsg` calls per receive turn before sending again.
const RX_ROUNDS: usize = 8;
/// A receive slot holds a whole GRO-coalesced UDP payload.
const RX_SLOT: usize = 1 << 16;
/// READY is sent again this often while a barrier waits.
const READY_EVERY: Duration = Duration::from_millis(5);

/// Settings of a floor node.
#[derive(Debug, Clone, Copy)]
pub struct Settings {
    /// f32 elements per datagram.
    pub chunk: usize,
    /// GSO segments per message.
    pub segs: usize,
    /// Messages per `sendmmsg`.
    pub batch: usize,
    /// With nothing sent or received for this long, the missing datagrams
    /// are counted lost and the op moves on (there is no repair).
    pub idle: Duration,
    /// A barrier waiting longer than this fails the run.
    pub barrier_timeout: Duration,
}

/// What a node counted over its life.
#[derive(Debug, Clone, Copy, Default)]
pub struct Counters {
    /// Datagrams given up on (never arrived before the idle timeout).
    pub lost: u64,
    /// Datagrams of an op already finished.
    pub stale: u64,
    /// Datagrams that are no floor datagram or do not fit their chunk.
    pub malformed: u64,
    /// Data datagrams sent.
    pub tx_datagrams: u64,
    /// `sendmmsg` calls that carried data.
    pub tx_calls: u64,
    /// Data datagrams received.
    pub rx_datagrams: u64,
    /// `recvmmsg` calls.
    pub rx_calls: u64,
}

/// The state of one op (rep).
struct Op {
    id: u32,
    layout: Layout,
    /// Data datagrams received of each phase, and needed.
    got: [u64; 2],
    need: [u64; 2],
    streams: Vec<Stream>,
    rr: usize,
    gathering: bool,
    /// The last send was refused with would-block.
    blocked: bool,
    /// Data of this op came from each peer (it passed the barrier).
    seen: Vec<bool>,
}

/// One host of the floor.
pub struct Node {
    rank: usize,
    hosts: usize,
    sock: UdpSocket,
    addrs: Vec<libc::sockaddr_in>,
    set: Settings,
    rx_buf: Vec<u8>,
    rx_meta: Vec<RxMeta>,
    /// Highest op each peer said READY for (-1: none yet).
    ready: Vec<i64>,
    /// What the node counted.
    pub counters: Counters,
}

impl Node {
    /// A node of rank `rank` over `sock` (opened by [`sys::open`]), peers at `addrs` (index = rank).
    pub fn new(rank: usize, sock: UdpSocket, addrs: &[SocketAddrV4], set: Settings) -> Node {
        Node {
            rank,
            hosts: addrs.len(),
            sock,
            addrs: addrs.iter().map(|a| sys::sockaddr(*a)).collect(),
            set,
            rx_buf: vec![0; RX_BATCH * RX_SLOT],
            rx_meta: vec![RxMeta::default(); RX_BATCH],
            ready: vec![-1; addrs.len()],
            counters: Counters::default(),
        }
    }

    fn fd(&self) -> BorrowedFd<'_> {
        self.sock.as_fd()
    }

    fn peers(&self) -> impl Iterator<Item = usize> + use<> {
        let rank = self.rank;
        (0..self.hosts).filter(move |&j| j != rank)
    }

    /// One allreduce of `t` (this host's input, replaced by the sum), op id
    /// `id` (ids increase by one per op): a barrier, then reduce-scatter and
    /// all-gather at once. Returns the time from the barrier to completion.
    pub fn allreduce(&mut self, t: &mut [f32], id: u32) -> Result<Duration, String> {
        let layout = Layout { n: t.len(), hosts: self.hosts, chunk: self.set.chunk };
        let mine = layout.chunks(self.rank) as u64;
        let others: u64 = self.peers().map(|j| layout.chunks(j) as u64).sum();
        let mut op = Op {
            id,
            layout,
            got: [0, 0],
            need: [mine * (self.hosts as u64 - 1), others],
            streams: Vec::new(),
            rr: 0,
            gathering: false,
            blocked: false,
            seen: vec![false; self.hosts],
        };
        self.barrier(&mut op, t)?;
        let t0 = Instant::now();
        op.streams = self
            .peers()
            .map(|j| Stream { dst: j, shard: j, kind: Kind::Scatter, next: 0, end: layout.chunks(j) })
            .collect();
        self.run(&mut op, t)?;
        Ok(t0.elapsed())
    }

    /// Waits until every peer is ready for `op` (said so, or sent its data).
    fn barrier(&mut self, op: &mut Op, t: &mut [f32]) -> Result<(), String> {
        let start = Instant::now();
        let mut said: Option<Instant> = None;
        loop {
            if said.is_none_or(|s| s.elapsed() >= READY_EVERY) {
                self.say_ready(op.id).map_err(|e| format!("send READY: {e}"))?;
                said = Some(Instant::now());
            }
            self.receive(op, t).map_err(|e| format!("receive: {e}"))?;
            let waiting: Vec<usize> =
                self.peers().filter(|&j| self.ready[j] < i64::from(op.id) && !op.seen[j]).collect();
            if waiting.is_empty() {
                return Ok(());
            }
            if start.elapsed() > self.set.barrier_timeout {
                return Err(format!("op {}: ranks {waiting:?} not ready after {:?}", op.id, start.elapsed()));
            }
            sys::wait(self.fd(), false, 2).map_err(|e| format!("poll: {e}"))?;
        }
    }

    fn say_ready(&self, id: u32) -> io::Result<()> {
        let h = Header { kind: Kind::Ready, src: self.rank as u8, op: id, chunk: 0 }.encode();
        let seg = [Segment { header: &h, payload: &[] }];
        let msgs: Vec<TxMsg<'_>> =
            self.peers().map(|j| TxMsg { dst: &self.addrs[j], segments: &seg, segment_size: 0 }).collect();
        match sys::send_batch(self.fd(), &msgs) {
            Err(e) if e.kind() != io::ErrorKind::WouldBlock => Err(e),
            _ => Ok(()),
        }
    }

    /// Sends and receives until the op is complete (or given up as lost).
    fn run(&mut self, op: &mut Op, t: &mut [f32]) -> Result<(), String> {
        let mut last = Instant::now();
        let mut planned = Vec::new();
        loop {
            let mut progress = 0;
            if sending(op) {
                progress += self.send(op, t, &mut planned).map_err(|e| format!("send: {e}"))?;
            }
            progress += self.receive(op, t).map_err(|e| format!("receive: {e}"))?;
            if !op.gathering && op.got[0] >= op.need[0] {
                self.start_gather(op);
            }
            if op.gathering && !sending(op) && op.got[1] >= op.need[1] {
                return Ok(());
            }
            if progress > 0 {
                last = Instant::now();
                continue;
            }
            if last.elapsed() >= self.set.idle {
                // No repair: what has not come is lost. Move on.
                let phase = usize::from(op.gathering);
                self.counters.lost += op.need[phase].saturating_sub(op.got[phase]);
                op.got[phase] = op.need[phase];
                if op.gathering {
                    op.streams.clear();
                }
                last = Instant::now();
                continue;
            }
            let left = self.set.idle.saturating_sub(last.elapsed()).as_millis().clamp(1, 10) as i32;
            sys::wait(self.fd(), sending(op) && op.blocked, left).map_err(|e| format!("poll: {e}"))?;
        }
    }

    /// This host's shard is reduced: send it to every peer.
    fn start_gather(&mut self, op: &mut Op) {
        op.gathering = true;
        let (rank, end) = (self.rank, op.layout.chunks(self.rank));
        op.streams.extend(self.peers().map(|j| Stream {
            dst: j,
            shard: rank,
            kind: Kind::Gather,
            next: 0,
            end,
        }));
    }

    /// One `sendmmsg` of the next planned messages; returns datagrams sent.
    fn send(&mut self, op: &mut Op, t: &[f32], planned: &mut Vec<Planned>) -> io::Result<usize> {
        plan::plan(&op.streams, &mut op.rr, self.set.batch, self.set.segs, planned);
        let (src, id) = (self.rank as u8, op.id);
        let headers: Vec<[u8; HDR]> = planned
            .iter()
            .flat_map(|p| {
                let kind = op.streams[p.stream].kind;
                (p.first..p.first + p.count)
                    .map(move |c| Header { kind, src, op: id, chunk: c as u32 }.encode())
            })
            .collect();
        let mut segments = Vec::with_capacity(headers.len());
        for p in planned.iter() {
            let s = op.streams[p.stream];
            for c in p.first..p.first + p.count {
                let r = op.layout.chunk(s.shard, c).expect("planned chunks exist");
                segments.push(Segment { header: &headers[segments.len()], payload: &t[r] });
            }
        }
        let segment_size = (HDR + 4 * self.set.chunk) as u16;
        let mut msgs = Vec::with_capacity(planned.len());
        let mut at = 0;
        for p in planned.iter() {
            let dst = &self.addrs[op.streams[p.stream].dst];
            msgs.push(TxMsg { dst, segments: &segments[at..at + p.count], segment_size });
            at += p.count;
        }
        let taken = match sys::send_batch(self.fd(), &msgs) {
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => 0,
            Err(e) => return Err(e),
        };
        op.blocked = taken < msgs.len();
        plan::commit(&mut op.streams, planned, taken);
        op.streams.retain(|s| s.next < s.end);
        op.rr = if op.streams.is_empty() { 0 } else { op.rr % op.streams.len() };
        let sent: usize = planned[..taken].iter().map(|p| p.count).sum();
        self.counters.tx_datagrams += sent as u64;
        self.counters.tx_calls += u64::from(taken > 0);
        Ok(sent)
    }

    /// Takes what has arrived (up to `RX_ROUNDS` calls); returns data datagrams handled.
    fn receive(&mut self, op: &mut Op, t: &mut [f32]) -> io::Result<usize> {
        let mut handled = 0;
        for _ in 0..RX_ROUNDS {
            self.counters.rx_calls += 1;
            let n = match sys::recv_batch(self.sock.as_fd(), &mut self.rx_buf, RX_SLOT, &mut self.rx_meta) {
                Ok(n) => n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(e),
            };
            for i in 0..n {
                let m = self.rx_meta[i];
                if m.truncated {
                    self.counters.malformed += 1;
                    continue;
                }
                let buf = &self.rx_buf[i * RX_SLOT..i * RX_SLOT + m.len];
                let step = if m.segment == 0 { m.len.max(1) } else { m.segment };
                for d in buf.chunks(step) {
                    handled += usize::from(handle(self.rank, op, t, &mut self.ready, &mut self.counters, d));
                }
            }
            if n < RX_BATCH {
                break;
            }
        }
        self.counters.rx_datagrams += handled as u64;
        Ok(handled)
    }
}

fn sending(op: &Op) -> bool {
    !op.streams.is_empty()
}

/// Handles one datagram; true if it was data of the current op.
fn handle(rank: usize, op: &mut Op, t: &mut [f32], ready: &mut [i64], c: &mut Counters, d: &[u8]) -> bool {
    let Some(h) = Header::parse(d) else {
        c.malformed += 1;
        return false;
    };
    let src = usize::from(h.src);
    if src >= ready.len() || src == rank {
        c.malformed += 1;
        return false;
    }
    if h.kind == Kind::Ready {
        ready[src] = ready[src].max(i64::from(h.op));
        return false;
    }
    if h.op != op.id {
        c.stale += 1;
        return false;
    }
    let shard = if h.kind == Kind::Scatter { rank } else { src };
    let payload = &d[HDR..];
    let Some(r) = op.layout.chunk(shard, h.chunk as usize).filter(|r| r.len() * 4 == payload.len()) else {
        c.malformed += 1;
        return false;
    };
    let dst = &mut t[r];
    let words = payload.chunks_exact(4).map(|b| f32::from_ne_bytes([b[0], b[1], b[2], b[3]]));
    if h.kind == Kind::Scatter {
        dst.iter_mut().zip(words).for_each(|(x, v)| *x += v);
        op.got[0] += 1;
    } else {
        dst.iter_mut().zip(words).for_each(|(x, v)| *x = v);
        op.got[1] += 1;
    }
    op.seen[src] = true;
    true
}
