//! Handing one class's datagrams to its socket: the `sendmmsg` loop shared by
//! the two ways the socket datapath sends — a class queue's copied datagrams
//! (`flush`) and a caller's lent ones (`send_batch`, from where they lie). It
//! plans the messages of each call (GSO super-packets of consecutive
//! datagrams to one destination of one size, see [`plan`]), makes the call,
//! counts, and handles the kernel's answers: would-block stops the hand-over,
//! a refused GSO message switches GSO off and is sent again without it, a
//! hard error drops that message (counted).

use std::io;
use std::net::SocketAddr;
use std::os::fd::BorrowedFd;

use log::{debug, warn};
use socket2::SockAddr;

use super::config::SocketStats;
use super::queue::{Group, Pending, plan};
use super::sys;
use crate::datapath::api::DatapathStats;

/// One class socket and its settings.
pub(super) struct Link<'a> {
    /// The class's socket.
    pub fd: BorrowedFd<'a>,
    /// The class.
    pub class: usize,
    /// Messages per `sendmmsg`.
    pub batch: usize,
    /// Segments per GSO message, and bytes per GSO message.
    pub gso_limits: (usize, usize),
    /// The local address (for log lines).
    pub local: SocketAddr,
}

/// What a hand-over counts and changes.
pub(super) struct Tally<'a> {
    /// Packets, bytes, calls, errors.
    pub stats: &'a mut DatapathStats,
    /// GSO use (and `gso_active`, which a refusal clears).
    pub extra: &'a mut SocketStats,
    /// Fault injection: hand-overs of this class still to refuse.
    pub refusals: &'a mut u32,
}

/// How far a hand-over got.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Handed {
    /// Items handed over (or dropped by a hard error): `items[..done]`.
    pub done: usize,
    /// The socket would block: `items[done..]` wait.
    pub blocked: bool,
}

/// Hand `items` to `link`'s socket in order until all are handed over or the
/// socket would block. `bytes(item)` gives an item's datagram as the slices
/// to send back to back; `groups` is scratch space.
pub(super) fn hand_over<'d>(
    link: &Link<'_>,
    tally: Tally<'_>,
    items: &[Pending],
    bytes: &dyn Fn(&Pending) -> [&'d [u8]; 3],
    groups: &mut Vec<Group>,
) -> Handed {
    let mut head = 0;
    let blocked = loop {
        if head == items.len() {
            break false;
        }
        let gso = tally.extra.gso_active.then_some(link.gso_limits);
        plan(items, head, link.batch, gso, groups);
        let result = if *tally.refusals > 0 {
            *tally.refusals -= 1;
            Err(io::Error::from(io::ErrorKind::WouldBlock))
        } else {
            tally.stats.tx_syscalls += 1;
            send(link, items, bytes, groups)
        };
        match result {
            Ok(0) => break true, // cannot happen with messages to send; do not spin
            Ok(k) => {
                let c = link.class;
                for g in &groups[..k.min(groups.len())] {
                    tally.stats.tx_packets[c] += g.count as u64;
                    tally.stats.tx_bytes[c] += g.bytes as u64;
                    if g.count > 1 {
                        tally.extra.gso_sends += 1;
                        tally.extra.gso_segments += g.count as u64;
                    }
                }
                let last = groups[k.min(groups.len()) - 1];
                head = last.first + last.count;
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => break true,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) if groups[0].count > 1 && sys::is_gso_refusal(&e) => {
                tally.extra.gso_active = false;
                tally.extra.gso_fallbacks += 1;
                warn!(
                    "socket datapath {}: the kernel refused a UDP GSO send ({e}); GSO off, sending plain datagrams",
                    link.local
                );
            }
            Err(e) => {
                let g = groups[0];
                tally.stats.tx_errors += g.count as u64;
                debug!(
                    "socket datapath {}: class {} send of {} datagram(s) to {} failed: {e}",
                    link.local, link.class, g.count, items[g.first].dst
                );
                head = g.first + g.count;
            }
        }
    };
    Handed { done: head, blocked }
}

/// One `sendmmsg` of the planned `groups`: each group one message whose
/// payload is its items' slices back to back.
fn send<'d>(
    link: &Link<'_>,
    items: &[Pending],
    bytes: &dyn Fn(&Pending) -> [&'d [u8]; 3],
    groups: &[Group],
) -> io::Result<usize> {
    let dsts: Vec<SockAddr> = groups.iter().map(|g| SockAddr::from(items[g.first].dst)).collect();
    let mut parts: Vec<&[u8]> = Vec::with_capacity(groups.iter().map(|g| 3 * g.count).sum());
    let mut bounds = Vec::with_capacity(groups.len() + 1);
    for g in groups {
        bounds.push(parts.len());
        for it in &items[g.first..g.first + g.count] {
            parts.extend(bytes(it).into_iter().filter(|p| !p.is_empty()));
        }
    }
    bounds.push(parts.len());
    let msgs: Vec<sys::TxMsg<'_>> = groups
        .iter()
        .enumerate()
        .map(|(i, g)| sys::TxMsg {
            dst: &dsts[i],
            parts: &parts[bounds[i]..bounds[i + 1]],
            segment: g.segment as u16,
        })
        .collect();
    sys::send_batch(link.fd, &msgs)
}
