//! Fault injection: [`FaultInjector`] wraps any [`Datapath`] and is one itself
//! (the middleware-device idea of smoltcp's `FaultInjector`), so the code above
//! it runs unchanged while datagrams go missing on purpose. It is the one place
//! where dlcpd makes faults:
//!
//! - **receive loss** ([`FaultInjector::with_receive_loss`]): each received
//!   datagram is dropped with a seeded probability before anyone above sees it
//!   — `dlcpd demo --loss`, the hidden `dlcpd --debug-rx-loss` and the
//!   end-to-end tests show bounded loss this way without root or a lossy
//!   network. A dropped datagram is not silently eaten:
//!   [`FaultInjector::recv_reporting`] hands it to the caller as
//!   [`Fate::Dropped`], so the service counts it as before.
//! - **a full kernel send buffer** ([`FaultInjector::would_block`]): a loopback
//!   UDP socket never refuses a send (the loopback driver releases each
//!   packet's buffer charge as it transmits), so tests reach the would-block
//!   path this way. A wrapper sits above the datapath's own per-class queue,
//!   and the refusal has to happen below it (where the kernel would refuse),
//!   so the injector asks the wrapped datapath through
//!   [`Datapath::refuse_handovers`], the single entry point for it.
//!
//! Without faults configured the injector only passes calls through.

use std::io;
use std::net::SocketAddr;

use dlcp_proto::class::Class;
use dlcp_proto::rng::Rng;

use super::api::{Datapath, DatapathStats, Outgoing, SendOutcome};

/// Stream tag of the receive-loss generator (`"rx"`), so its sequence differs
/// from other generators seeded alike.
const RX_STREAM: u64 = 0x7278;

/// A fault the injector applies.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Injected {
    /// The configured receive loss.
    ReceiveLoss,
}

/// What the injector did with one received datagram.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fate {
    /// Passed on: deliver it.
    Delivered,
    /// Dropped by a fault: count it, do not deliver it.
    Dropped(Injected),
}

/// What the injector did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FaultStats {
    /// Received datagrams dropped by the receive loss.
    pub rx_dropped: u64,
}

/// A datapath with faults injected: see the [module documentation](self).
#[derive(Debug)]
pub struct FaultInjector<D = Box<dyn Datapath>> {
    inner: D,
    /// Receive loss: (parts per million, generator).
    rx_loss: Option<(u32, Rng)>,
    stats: FaultStats,
}

impl<D: Datapath> FaultInjector<D> {
    /// Wraps `inner`, with no faults yet.
    pub fn new(inner: D) -> FaultInjector<D> {
        FaultInjector { inner, rx_loss: None, stats: FaultStats::default() }
    }

    /// Drop each received datagram with probability `ppm / 10^6`, drawn from a
    /// generator determined by `seed` and `stream` (dlcpd uses its rank), so a
    /// run repeats. `ppm == 0` turns receive loss off.
    pub fn with_receive_loss(mut self, ppm: u32, seed: u64, stream: u64) -> FaultInjector<D> {
        self.rx_loss = (ppm > 0).then(|| (ppm, Rng::stream(seed, RX_STREAM, stream)));
        self
    }

    /// The next `attempts` hand-overs of `class`'s queued datagrams to the
    /// kernel (or NIC) fail as if its send buffer were full, without reaching
    /// it. Returns false if the wrapped datapath has no such point.
    pub fn would_block(&mut self, class: Class, attempts: u32) -> bool {
        self.inner.refuse_handovers(class, attempts)
    }

    /// Receives like [`Datapath::recv`], but hands the caller every datagram
    /// with its [`Fate`], those a fault dropped included, so the caller can
    /// count them. Returns what the wrapped datapath returned: datagrams
    /// received from the wire, dropped ones included.
    pub fn recv_reporting(&mut self, f: &mut dyn FnMut(SocketAddr, &[u8], Fate)) -> io::Result<usize> {
        let FaultInjector { inner, rx_loss, stats } = self;
        inner.recv(&mut |from: SocketAddr, bytes: &[u8]| {
            if let Some((ppm, rng)) = rx_loss.as_mut()
                && rng.below(1_000_000) < u64::from(*ppm)
            {
                stats.rx_dropped += 1;
                f(from, bytes, Fate::Dropped(Injected::ReceiveLoss));
            } else {
                f(from, bytes, Fate::Delivered);
            }
        })
    }

    /// What the injector did so far.
    pub fn fault_stats(&self) -> FaultStats {
        self.stats.clone()
    }

    /// The wrapped datapath.
    pub fn inner(&self) -> &D {
        &self.inner
    }

    /// The wrapped datapath, mutably.
    pub fn inner_mut(&mut self) -> &mut D {
        &mut self.inner
    }
}

impl<D: Datapath> From<D> for FaultInjector<D> {
    fn from(inner: D) -> FaultInjector<D> {
        FaultInjector::new(inner)
    }
}

impl<D: Datapath> Datapath for FaultInjector<D> {
    fn describe(&self) -> String {
        self.inner.describe()
    }

    fn local_addr(&self) -> SocketAddr {
        self.inner.local_addr()
    }

    fn send(&mut self, dst: SocketAddr, class: Class, datagram: &[u8]) -> io::Result<SendOutcome> {
        self.inner.send(dst, class, datagram)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.inner.flush()
    }

    fn send_batch(&mut self, batch: &[Outgoing<'_>]) -> io::Result<()> {
        self.inner.send_batch(batch)
    }

    /// Delivers what no fault dropped (see [`FaultInjector::recv_reporting`]).
    fn recv(&mut self, f: &mut dyn FnMut(SocketAddr, &[u8])) -> io::Result<usize> {
        self.recv_reporting(&mut |from, bytes, fate| {
            if fate == Fate::Delivered {
                f(from, bytes);
            }
        })
    }

    fn rx_pending(&self) -> bool {
        self.inner.rx_pending()
    }

    fn wants_writable(&self) -> bool {
        self.inner.wants_writable()
    }

    fn register(&mut self, registry: &mio::Registry, first_token: usize) -> io::Result<usize> {
        self.inner.register(registry, first_token)
    }

    fn stats(&self) -> DatapathStats {
        self.inner.stats()
    }

    fn poll_hint(&self) -> Option<std::time::Duration> {
        self.inner.poll_hint()
    }

    fn detail_json(&self) -> Option<serde_json::Value> {
        self.inner.detail_json()
    }

    fn set_marking(&mut self, dscp: [u8; 8], so_priority: [u8; 8]) -> io::Result<bool> {
        self.inner.set_marking(dscp, so_priority)
    }

    fn refuse_handovers(&mut self, class: Class, attempts: u32) -> bool {
        self.inner.refuse_handovers(class, attempts)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A datapath that receives `n` numbered datagrams per call and records sends.
    #[derive(Default)]
    struct Script {
        n: u8,
        refused: Option<(Class, u32)>,
    }

    impl Datapath for Script {
        fn describe(&self) -> String {
            "script".into()
        }
        fn local_addr(&self) -> SocketAddr {
            "127.0.0.1:1".parse().unwrap()
        }
        fn send(&mut self, _: SocketAddr, _: Class, _: &[u8]) -> io::Result<SendOutcome> {
            Ok(SendOutcome::Sent)
        }
        fn flush(&mut self) -> io::Result<()> {
            Ok(())
        }
        fn send_batch(&mut self, _: &[Outgoing<'_>]) -> io::Result<()> {
            Ok(())
        }
        fn recv(&mut self, f: &mut dyn FnMut(SocketAddr, &[u8])) -> io::Result<usize> {
            for i in 0..self.n {
                f(self.local_addr(), &[i]);
            }
            Ok(usize::from(self.n))
        }
        fn wants_writable(&self) -> bool {
            false
        }
        fn register(&mut self, _: &mio::Registry, _: usize) -> io::Result<usize> {
            Ok(0)
        }
        fn stats(&self) -> DatapathStats {
            DatapathStats::default()
        }
        fn refuse_handovers(&mut self, class: Class, attempts: u32) -> bool {
            self.refused = Some((class, attempts));
            true
        }
    }

    #[test]
    fn receive_loss_reports_every_drop_and_repeats_with_its_seed() {
        let run = |seed| {
            let mut fi = FaultInjector::new(Script { n: 200, ..Script::default() })
                .with_receive_loss(250_000, seed, 3);
            let (mut kept, mut dropped) = (Vec::new(), Vec::new());
            let n = fi
                .recv_reporting(&mut |_, b, fate| match fate {
                    Fate::Delivered => kept.push(b[0]),
                    Fate::Dropped(Injected::ReceiveLoss) => dropped.push(b[0]),
                })
                .unwrap();
            assert_eq!(n, 200, "the wire's count, drops included");
            assert_eq!(kept.len() + dropped.len(), 200);
            assert_eq!(fi.fault_stats().rx_dropped, dropped.len() as u64);
            (kept, dropped)
        };
        let (kept, dropped) = run(7);
        assert!((25..=80).contains(&dropped.len()), "about a quarter dropped: {}", dropped.len());
        assert_eq!(run(7), (kept.clone(), dropped), "same seed, same drops");
        assert_ne!(run(8).0, kept, "another seed, other drops");
    }

    #[test]
    fn without_faults_everything_passes_through() {
        let mut fi = FaultInjector::new(Script { n: 5, ..Script::default() }).with_receive_loss(0, 1, 1);
        let mut got = Vec::new();
        assert_eq!(fi.recv(&mut |_, b| got.push(b[0])).unwrap(), 5);
        assert_eq!(got, [0, 1, 2, 3, 4]);
        assert_eq!(fi.fault_stats(), FaultStats::default());
        assert_eq!(fi.describe(), "script");
    }

    #[test]
    fn would_block_is_asked_of_the_wrapped_datapath_even_boxed() {
        let mut s = FaultInjector::new(Script::default());
        assert!(s.would_block(Class::CONTROL, 2));
        assert_eq!(s.inner().refused, Some((Class::CONTROL, 2)));
        // Through `Box<dyn Datapath>` (how the service holds it): the box forwards.
        let mut boxed = FaultInjector::new(Box::new(Script::default()) as Box<dyn Datapath>);
        assert!(boxed.would_block(Class::CONTROL, 3));
    }
}
