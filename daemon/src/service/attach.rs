//! Trainers attaching: the control socket's listener and the handshakes in
//! progress, driven by the event loop without ever waiting for a trainer.
//!
//! A connection is accepted and its peer checked at once
//! ([`ShmServer::accept_pending`]); its register message is then read as it
//! arrives, under a mio token of its own. A complete one is admitted
//! ([`ShmServer::admit`]: job, attachment limits and rank are checked before
//! any segment is created) and handed to the caller as an [`Attachment`]. At
//! most `control.max_pending_attaches` handshakes wait at once (one more is
//! turned away with [`RejectReason::Busy`]); one still incomplete after
//! `control.request_timeout_ms` is closed. Both are counted.

use std::os::fd::{AsFd, AsRawFd, BorrowedFd};
use std::time::Instant as StdInstant;

use mio::unix::SourceFd;
use mio::{Interest, Registry, Token};

use super::counters::ServiceCounters;
use crate::shm::{AcceptError, Attachment, Handshake, RejectReason, ShmServer};

/// The first mio token of the handshakes: pending slot `i` is `HANDSHAKE_BASE + i`.
pub(super) const HANDSHAKE_BASE: usize = 1 << 12;

/// The control socket and the handshakes in progress on it.
pub(super) struct Attach {
    shm: ShmServer,
    /// One slot per handshake allowed at once.
    pending: Vec<Option<Handshake>>,
}

impl Attach {
    /// Handshakes on `shm`, at most `max_pending` at once.
    pub(super) fn new(shm: ShmServer, max_pending: usize) -> Attach {
        Attach { shm, pending: (0..max_pending.max(1)).map(|_| None).collect() }
    }

    /// The listening socket (register it with mio).
    pub(super) fn listener(&self) -> BorrowedFd<'_> {
        self.shm.as_fd()
    }

    /// Whether `t` is one of the handshakes' tokens.
    pub(super) fn owns(&self, t: usize) -> bool {
        (HANDSHAKE_BASE..HANDSHAKE_BASE + self.pending.len()).contains(&t)
    }

    /// Attachments the control socket created since start.
    pub(super) fn shm_attached(&self) -> u64 {
        self.shm.stats().attached
    }

    /// Handshakes in progress.
    pub(super) fn pending(&self) -> usize {
        self.pending.iter().flatten().count()
    }

    /// Take every connection waiting on the listener. Those whose register
    /// message is already in are admitted at once: their attachments are
    /// returned; the others wait under their own token.
    pub(super) fn accept(&mut self, registry: &Registry, counters: &mut ServiceCounters) -> Vec<Attachment> {
        let mut ready = Vec::new();
        loop {
            let hs = match self.shm.accept_pending() {
                Ok(Some(hs)) => hs,
                Ok(None) => break,
                Err(e) => {
                    // Refused by the policy (logged by the server), or accept failed.
                    counters.trainers_refused += 1;
                    if let AcceptError::Accept(_) = e {
                        log::warn!("{e}");
                        break;
                    }
                    continue;
                }
            };
            let Some(slot) = self.pending.iter().position(Option::is_none) else {
                counters.refused_attach_busy += 1;
                log::warn!(
                    "trainer pid {} turned away: {} attach handshakes already in progress \
                     (control.max_pending_attaches)",
                    hs.peer().pid,
                    self.pending.len()
                );
                self.shm.refuse(hs, RejectReason::Busy);
                continue;
            };
            let token = Token(HANDSHAKE_BASE + slot);
            if let Err(e) =
                registry.register(&mut SourceFd(&hs.as_fd().as_raw_fd()), token, Interest::READABLE)
            {
                log::error!("cannot watch trainer pid {}'s handshake: {e}", hs.peer().pid);
                counters.trainers_refused += 1;
                continue;
            }
            self.pending[slot] = Some(hs);
            // The register message usually came with the connection.
            ready.extend(self.advance(slot, registry, counters));
        }
        ready
    }

    /// Readiness on handshake token `t`: read on; the attachment if the
    /// handshake completed and was admitted.
    pub(super) fn on_token(
        &mut self,
        t: usize,
        registry: &Registry,
        counters: &mut ServiceCounters,
    ) -> Option<Attachment> {
        self.advance(t.checked_sub(HANDSHAKE_BASE)?, registry, counters)
    }

    fn advance(
        &mut self,
        slot: usize,
        registry: &Registry,
        counters: &mut ServiceCounters,
    ) -> Option<Attachment> {
        let hs = self.pending.get_mut(slot)?.as_mut()?;
        let done = match hs.read() {
            Ok(false) => return None,
            Ok(true) => true,
            Err(e) => {
                log::info!("trainer pid {} left during the attach handshake: {e}", hs.peer().pid);
                false
            }
        };
        let hs = self.pending[slot].take()?;
        let _ = registry.deregister(&mut SourceFd(&hs.as_fd().as_raw_fd()));
        if !done {
            counters.trainers_refused += 1;
            return None;
        }
        match self.shm.admit(hs) {
            Ok(att) => Some(att),
            Err(_) => {
                // Logged and counted by reason in the server; the trainer was told why.
                counters.trainers_refused += 1;
                None
            }
        }
    }

    /// Close the handshakes still incomplete at their deadline.
    pub(super) fn expire(&mut self, now: StdInstant, registry: &Registry, counters: &mut ServiceCounters) {
        for slot in &mut self.pending {
            if slot.as_ref().is_some_and(|hs| hs.deadline() <= now) {
                let hs = slot.take().expect("checked above");
                let _ = registry.deregister(&mut SourceFd(&hs.as_fd().as_raw_fd()));
                counters.refused_attach_timeout += 1;
                log::warn!(
                    "trainer pid {} sent no register message in time (control.request_timeout_ms); closed",
                    hs.peer().pid
                );
            }
        }
    }
}
