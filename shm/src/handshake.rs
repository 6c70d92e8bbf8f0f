//! One trainer connection in the attach handshake: accepted, its peer checked,
//! its register message not read in full yet. Read without blocking, so a
//! trainer that connects and stays silent costs the daemon one descriptor until
//! its deadline, never a wait ([`crate::ShmServer::accept_pending`] makes one,
//! [`crate::ShmServer::admit`] turns a complete one into an attachment).

use std::io::{self, Read};
use std::os::fd::{AsFd, BorrowedFd};
use std::os::unix::net::UnixStream;
use std::time::{Duration, Instant};

use super::control::{PeerCred, REGISTER_LEN};
use super::doorbell::poll_readable;

/// A connection whose register message is still arriving.
#[derive(Debug)]
pub struct Handshake {
    stream: UnixStream,
    peer: PeerCred,
    msg: [u8; REGISTER_LEN],
    got: usize,
    deadline: Instant,
}

impl Handshake {
    /// A connection from `peer` (non-blocking) that has until `deadline` to register.
    pub(crate) fn new(stream: UnixStream, peer: PeerCred, deadline: Instant) -> Handshake {
        Handshake { stream, peer, msg: [0; REGISTER_LEN], got: 0, deadline }
    }

    /// The trainer's `SO_PEERCRED`.
    pub fn peer(&self) -> PeerCred {
        self.peer
    }

    /// When the handshake must be complete.
    pub fn deadline(&self) -> Instant {
        self.deadline
    }

    /// Reads what has arrived, without blocking. `Ok(true)` once the whole
    /// register message is in; `Ok(false)` while more is to come; an error if
    /// the peer hung up (`UnexpectedEof`) or the socket failed. Bytes after the
    /// message are left unread.
    pub fn read(&mut self) -> io::Result<bool> {
        while self.got < REGISTER_LEN {
            match (&self.stream).read(&mut self.msg[self.got..]) {
                Ok(0) => return Err(io::Error::from(io::ErrorKind::UnexpectedEof)),
                Ok(n) => self.got += n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(false),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        Ok(true)
    }

    /// Sleeps until the peer sends more or the deadline passes; `false` at the
    /// deadline. (For [`crate::ShmServer::accept`], the blocking convenience;
    /// an event loop watches [`AsFd`] instead.)
    pub fn wait(&self) -> io::Result<bool> {
        let left = self.deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Ok(false);
        }
        Ok(poll_readable(&[self.stream.as_fd()], Some(left.max(Duration::from_millis(1))))?[0])
    }

    /// The complete register message (valid after [`Handshake::read`] said so).
    pub(crate) fn message(&self) -> &[u8; REGISTER_LEN] {
        &self.msg
    }

    /// The connection.
    pub(crate) fn stream(&self) -> &UnixStream {
        &self.stream
    }
}

impl AsFd for Handshake {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.stream.as_fd()
    }
}
