//! `endpoint_allreduce*`: dlcpd's own per-datagram work, with no kernel and no
//! network. Four protocol endpoints, configured as a default `dlcpd.toml`
//! configures the daemon's (MTU 1500, authenticated; the `_jumbo` row sets
//! MTU 9000, the tuned `_noauth` row `packet_auth = "none"`), run an allreduce of a
//! 16 MiB tensor each on one thread; every datagram one builds (header, tag)
//! is copied once into a receive buffer, as a datapath's receive does, and
//! handed to its destination (tag check, parse, accumulate, bitmaps). The
//! figure is datagrams per second through that pipeline: each one built once
//! and received once, so it is the user-space datagram rate a core running
//! dlcpd could sustain with a free datapath (DPDK with a real NIC), against
//! the kernel's UDP send rate on the same core.
//!
//! Every op is checked: each rank's result must equal the average of the
//! inputs, bit for bit (the inputs are chosen so it is exact), so a
//! benchmark that stopped moving data fails instead of reporting a rate.

use std::time::{Duration, Instant};

use dlcp::config::Config;
use dlcp_proto::endpoint::{Endpoint, Event, OpId, OpOptions, ReduceOp, TxBatch};
use dlcp_proto::time::Instant as ProtoInstant;

use super::{Figure, mib};

/// Ranks in the pipeline: the testbed's four hosts.
pub const WORLD: u32 = 4;
/// Elements of each rank's tensor (16 MiB of f32).
const ELEMS: usize = 4 << 20;
/// Datagrams per `poll_transmit_batch` call (the daemon's `TX_BATCH`).
const TX_BATCH: usize = 64;
/// Bytes of a receive buffer: a jumbo datagram fits.
const BUF: usize = 9216;

/// What the endpoints run with: a default `dlcpd.toml` but for these keys.
#[derive(Debug, Clone, Copy)]
pub struct Setting {
    /// `[network] mtu`.
    pub mtu: u32,
    /// `[security] packet_auth = "none"` (a tuned setting) instead of the default.
    pub no_auth: bool,
}

/// The `dlcpd.toml` for rank `rank` of the four.
fn config(rank: u32, set: Setting) -> Result<Config, String> {
    let mut text = format!("[node]\nrank = {rank}\njob_id = 7\njob_secret = \"pipeline benchmark secret\"\n");
    if set.mtu != 1500 {
        text.push_str(&format!("\n[network]\nmtu = {}\n", set.mtu));
    }
    if set.no_auth {
        text.push_str("\n[security]\npacket_auth = \"none\"\n");
    }
    for r in 0..WORLD {
        text.push_str(&format!("\n[[peers]]\nrank = {r}\naddress = \"10.77.0.{}\"\nport = 7700\n", r + 1));
    }
    Config::from_str_named(&text, "pipeline.toml").map_err(|e| format!("pipeline config: {e}"))
}

/// The endpoints and the buffers between them.
struct Pipeline {
    eps: Vec<Endpoint>,
    batches: Vec<TxBatch>,
    /// Per destination: datagrams received, each in its own buffer (of
    /// [`BUF`] bytes: the datagram, then unused room) with its length.
    inbox: Vec<Vec<(Vec<u8>, usize)>>,
    /// Buffers to reuse.
    spare: Vec<Vec<u8>>,
    start: Instant,
    /// Datagrams moved from a sender to a receiver.
    moved: u64,
}

impl Pipeline {
    fn new(set: Setting) -> Result<Pipeline, String> {
        let start = Instant::now();
        let mut eps = Vec::new();
        for r in 0..WORLD {
            let cfg = config(r, set)?;
            let mut e = Endpoint::new(
                dlcp::service::endpoint_config(&cfg, 1, 0x9191_0000 + u64::from(r)),
                ProtoInstant::ZERO,
            );
            e.begin_run(ProtoInstant::ZERO);
            eps.push(e);
        }
        Ok(Pipeline {
            eps,
            batches: (0..WORLD).map(|_| TxBatch::new()).collect(),
            inbox: vec![Vec::new(); WORLD as usize],
            spare: Vec::new(),
            start,
            moved: 0,
        })
    }

    fn now(&self) -> ProtoInstant {
        ProtoInstant::from_nanos(u64::try_from(self.start.elapsed().as_nanos()).unwrap_or(u64::MAX))
    }

    /// One round: every endpoint sends what it has, every endpoint receives
    /// what was sent to it, due timers fire. Returns the datagrams moved.
    fn round(&mut self) -> usize {
        let now = self.now();
        let mut n = 0;
        for r in 0..self.eps.len() {
            loop {
                let view = self.eps[r].poll_transmit_batch(now, TX_BATCH, &mut self.batches[r]);
                for d in view.iter() {
                    let mut buf = self.spare.pop().unwrap_or_else(|| vec![0u8; BUF]);
                    let len = d.write_to(&mut buf[..]);
                    if let Some(q) = self.inbox.get_mut(d.dst as usize) {
                        q.push((buf, len));
                    }
                }
                let sent = view.len();
                n += sent;
                if sent < TX_BATCH {
                    break;
                }
            }
        }
        for (r, q) in self.inbox.iter_mut().enumerate() {
            if q.is_empty() {
                continue;
            }
            let refs: Vec<&[u8]> = q.iter().map(|(b, len)| &b[..*len]).collect();
            self.eps[r].handle_datagrams(now, &refs);
            self.spare.extend(q.drain(..).map(|(b, _)| b));
        }
        for e in &mut self.eps {
            if e.poll_timeout().is_some_and(|t| t <= now) {
                e.handle_timeout(now);
            }
        }
        self.moved += n as u64;
        n
    }

    /// Run rounds until `done` holds; fails after `limit` of wall time.
    fn run_until(
        &mut self,
        limit: Duration,
        what: &str,
        mut done: impl FnMut(&Pipeline) -> bool,
    ) -> Result<(), String> {
        let t0 = Instant::now();
        while !done(self) {
            if self.round() == 0 && t0.elapsed() > limit {
                return Err(format!("endpoint pipeline: {what} did not happen within {limit:?}"));
            }
        }
        Ok(())
    }
}

/// Input of rank `r`: every element `r + 1`, except one element per 1 KiB
/// that is distinct, so a misplaced chunk changes the result. The average
/// of the four is exact in f32.
fn input(r: u32) -> Vec<f32> {
    (0..ELEMS)
        .map(|i| if i % 256 == 0 { (r + 1) as f32 * 4.0 + (i / 256 % 64) as f32 } else { (r + 1) as f32 })
        .collect()
}

/// The average of `inputs`, element by element.
fn expected(inputs: &[Vec<f32>]) -> Vec<f32> {
    (0..ELEMS).map(|i| inputs.iter().map(|v| v[i]).sum::<f32>() / WORLD as f32).collect()
}

/// Allreduce ops, one after another, until `dur` has passed (at least two);
/// returns (datagrams per second, ops, datagrams per op).
pub fn run(dur: Duration, set: Setting) -> Result<(f64, u64, u64), String> {
    let mut p = Pipeline::new(set)?;
    p.run_until(Duration::from_secs(5), "the HELLO handshake", |p| {
        p.eps.iter().all(|e| e.run().is_some_and(|(_, id)| id != 0))
    })?;
    let inputs: Vec<Vec<f32>> = (0..WORLD).map(input).collect();
    let want = expected(&inputs);
    let opts = OpOptions { reduce: ReduceOp::Average, ..OpOptions::default() };
    let (mut ops, mut moved, mut busy) = (0u64, 0u64, Duration::ZERO);
    let mut seq = 0;
    while ops < 2 || busy < dur {
        seq += 1;
        let id = OpId { run: 1, seq, tensor: 0 };
        // The inputs are cloned outside the timed part, as a daemon's
        // copy from the arena is not part of the datagram path.
        let mut fresh: Vec<Vec<f32>> = inputs.clone();
        let t0 = Instant::now();
        let m0 = p.moved;
        let now = p.now();
        for (r, e) in p.eps.iter_mut().enumerate() {
            e.start_allreduce(now, id, std::mem::take(&mut fresh[r]), opts)
                .map_err(|e| format!("endpoint pipeline: start op {seq}: {e:?}"))?;
        }
        let mut results: Vec<Option<Vec<f32>>> = vec![None; WORLD as usize];
        let mut failure = None;
        p.run_until(Duration::from_secs(10), "an op's completion", |p| {
            p.eps.iter().all(|e| e.ops_in_flight() == 0)
        })?;
        busy += t0.elapsed();
        moved += p.moved - m0;
        for (r, e) in p.eps.iter_mut().enumerate() {
            while let Some(ev) = e.poll_event() {
                match ev {
                    Event::OpComplete { id: got, result, .. } if got == id => results[r] = Some(result),
                    Event::OpFailed { error, .. } => failure = Some(format!("rank {r}: {error:?}")),
                    _ => {}
                }
            }
        }
        if let Some(f) = failure {
            return Err(format!("endpoint pipeline: op {seq} failed: {f}"));
        }
        for (r, res) in results.iter().enumerate() {
            let res =
                res.as_ref().ok_or_else(|| format!("endpoint pipeline: op {seq}: rank {r} has no result"))?;
            if res.iter().map(|v| v.to_bits()).ne(want.iter().map(|v| v.to_bits())) {
                return Err(format!("endpoint pipeline: op {seq}: rank {r}'s result is not the average"));
            }
        }
        ops += 1;
    }
    Ok((moved as f64 / busy.as_secs_f64(), ops, moved / ops))
}

/// The figures (default; MTU 9000; MTU 1500 without packet authentication,
/// tuned), against the kernel's UDP send rate on one core (`udp_pps`).
/// `only` picks one row by name.
pub fn figures(dur: Duration, udp_pps: f64, only: Option<&str>) -> Result<Vec<Figure>, String> {
    let rows = [
        (
            "endpoint_allreduce",
            "datagrams through 4 protocol endpoints (default config: MTU 1500, AES-GMAC), each built once \
             and received once, allreduce of 16 MiB per rank, one core, no kernel",
            Setting { mtu: 1500, no_auth: false },
        ),
        (
            "endpoint_allreduce_jumbo",
            "datagrams through 4 protocol endpoints (MTU 9000, AES-GMAC), each built once and received \
             once, allreduce of 16 MiB per rank, one core, no kernel",
            Setting { mtu: 9000, no_auth: false },
        ),
        (
            "endpoint_allreduce_noauth",
            "datagrams through 4 protocol endpoints (tuned: MTU 1500, packet_auth = none), each built once \
             and received once, allreduce of 16 MiB per rank, one core, no kernel",
            Setting { mtu: 1500, no_auth: true },
        ),
    ];
    let mut out = Vec::new();
    if let Some(o) = only
        && !rows.iter().any(|(name, _, _)| *name == o)
    {
        let names: Vec<&str> = rows.iter().map(|(name, _, _)| *name).collect();
        return Err(format!("--only {o}: the figures that run alone are {}", names.join(", ")));
    }
    for (name, what, set) in rows {
        if only.is_some_and(|o| o != name) {
            continue;
        }
        let (pps, ops, per_op) = run(dur, set)?;
        let ws = u64::from(WORLD) * (ELEMS as u64) * 4 * 3;
        out.push(Figure {
            name,
            what,
            dlcp: pps,
            peer_name: "kernel UDP send 1472 B, one core",
            peer: udp_pps,
            unit: "pkt/s",
            ws_bytes: ws,
            working_set: format!(
                "{} (inputs, results, accumulators); {ops} ops of {per_op} datagrams",
                mib(ws)
            ),
        });
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_pipeline_moves_whole_ops_and_checks_them() {
        let (pps, ops, per_op) =
            run(Duration::from_millis(1), Setting { mtu: 1500, no_auth: false }).unwrap();
        assert!(ops >= 2);
        // 16 MiB per rank in chunks of the config's size (1,372 B at MTU
        // 1500): each rank sends 3/4 of its tensor to the owners and gets 3/4
        // of the result back.
        let chunk = |set| config(0, set).unwrap().chunk_bytes() as usize;
        let data = 2 * 3 * (ELEMS * 4).div_ceil(chunk(Setting { mtu: 1500, no_auth: false })) as u64;
        assert!(per_op >= data && per_op < data + data / 10, "{per_op} datagrams per op, {data} of data");
        assert!(pps > 0.0);
        // MTU 9000 without authentication: about a sixth of the datagrams.
        let jumbo_set = Setting { mtu: 9000, no_auth: true };
        let (_, _, jumbo) = run(Duration::from_millis(1), jumbo_set).unwrap();
        let data = 2 * 3 * (ELEMS * 4).div_ceil(chunk(jumbo_set)) as u64;
        assert!(
            jumbo >= data && jumbo < data + data / 5,
            "{jumbo} datagrams per op at MTU 9000, {data} of data"
        );
    }
}
