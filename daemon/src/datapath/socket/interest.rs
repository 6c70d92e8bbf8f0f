//! Which of the datapath's sockets the event loop's poll watches, and for
//! what: each path's receive socket for readable, always; a class (send)
//! socket for readable only where receive steering is off (it receives
//! then), and for writable only while its queue holds datagrams the kernel
//! refused ([`Interests::set_writable`]).
//!
//! Why a class socket is not watched for writable all the time: the kernel
//! wakes a UDP socket's waiters each time it frees one of the socket's sent
//! packets (`sock_wfree` → `sock_def_write_space_wfree`, whenever the send
//! buffer is below half full — nearly always), and an epoll registration is
//! such a waiter. Its callback then runs once per datagram sent, under the
//! socket wait queue's lock with interrupts off, on whichever CPU frees the
//! packet: the sending host's, or the switch's (on the testbed the bridge's
//! netfilter hooks release every frame from its socket). TCP's write-space
//! callback wakes only a writer that found its buffer full, so the TCP peers
//! never pay it. With no registration the kernel skips the wake-up.

use std::io;
use std::os::fd::{AsRawFd, RawFd};

use log::warn;
use mio::unix::SourceFd;
use mio::{Interest, Registry, Token};
use socket2::Socket;

/// The datapath's registrations with one mio registry.
#[derive(Debug)]
pub(super) struct Interests {
    registry: Registry,
    first_token: usize,
    /// Receive steering is on: the class sockets receive nothing, so they
    /// are registered only while watched for writable.
    steered: bool,
    /// Sockets per path: the receive socket, then `classes` class sockets.
    classes: usize,
    /// Per class socket (index as the datapath's `tx`): watched for writable now.
    writable: Vec<bool>,
}

impl Interests {
    /// Registers the receive sockets `rx` (path `p`'s gets token
    /// `first_token + p × (1 + classes)`) and, unless `steered`, the class
    /// sockets `tx` for readable (path `p`'s class `c` gets the token after
    /// its receive socket's plus `c`); none is watched for writable yet.
    /// Returns the registrations and the tokens reserved.
    pub(super) fn register(
        registry: &Registry,
        first_token: usize,
        rx: &[Socket],
        tx: &[Socket],
        steered: bool,
    ) -> io::Result<(Interests, usize)> {
        let classes = tx.len() / rx.len().max(1);
        let me = Interests {
            registry: registry.try_clone()?,
            first_token,
            steered,
            classes,
            writable: vec![false; tx.len()],
        };
        for (p, s) in rx.iter().enumerate() {
            registry.register(
                &mut SourceFd(&s.as_raw_fd()),
                Token(first_token + p * (1 + classes)),
                Interest::READABLE,
            )?;
        }
        if !steered {
            for (qi, s) in tx.iter().enumerate() {
                registry.register(&mut SourceFd(&s.as_raw_fd()), me.token(qi), Interest::READABLE)?;
            }
        }
        Ok((me, rx.len() * (1 + classes)))
    }

    /// The token of class socket `qi`.
    fn token(&self, qi: usize) -> Token {
        Token(self.first_token + (qi / self.classes) * (1 + self.classes) + 1 + qi % self.classes)
    }

    /// Watch class socket `qi` (descriptor `fd`) for writable, or stop
    /// watching it. Registering an edge-triggered interest reports the
    /// socket at once if it is writable already, so a wake-up between the
    /// kernel's refusal and this call is not lost. A failure is logged: the
    /// event loop checks a blocked datapath again within a millisecond
    /// whatever the poll reports.
    pub(super) fn set_writable(&mut self, qi: usize, fd: RawFd, want: bool) {
        if self.writable[qi] == want {
            return;
        }
        let token = self.token(qi);
        let mut src = SourceFd(&fd);
        let r = match (want, self.steered) {
            (true, true) => self.registry.register(&mut src, token, Interest::WRITABLE),
            (true, false) => {
                self.registry.reregister(&mut src, token, Interest::READABLE | Interest::WRITABLE)
            }
            (false, true) => self.registry.deregister(&mut src),
            (false, false) => self.registry.reregister(&mut src, token, Interest::READABLE),
        };
        match r {
            Ok(()) => self.writable[qi] = want,
            Err(e) => warn!("socket datapath: class socket {qi}: cannot change its poll registration: {e}"),
        }
    }

    /// Removes every registration from `registry` (the one registered with;
    /// the sockets stay open).
    pub(super) fn deregister(self, registry: &Registry, rx: &[Socket], tx: &[Socket]) -> io::Result<()> {
        for s in rx {
            registry.deregister(&mut SourceFd(&s.as_raw_fd()))?;
        }
        for (qi, s) in tx.iter().enumerate() {
            if !self.steered || self.writable[qi] {
                registry.deregister(&mut SourceFd(&s.as_raw_fd()))?;
            }
        }
        Ok(())
    }

    /// Class sockets watched for writable now.
    pub(super) fn watched(&self) -> usize {
        self.writable.iter().filter(|&&w| w).count()
    }
}
