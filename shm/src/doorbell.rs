//! Eventfd doorbells, so either side can sleep instead of spinning.
//!
//! Protocol (no lost wakeups): the producer publishes its ring tail (Release) and
//! *then* rings. The sleeper drains the doorbell, *then* re-checks the ring, and
//! only if it is still empty sleeps in `poll`. A publish that the re-check missed
//! happened after the drain, so its ring is still pending and wakes the poll.

use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::time::{Duration, Instant};

use rustix::event::{EventfdFlags, PollFd, PollFlags, Timespec};

/// One eventfd used as a doorbell (non-blocking, close-on-exec).
#[derive(Debug)]
pub struct Doorbell {
    fd: OwnedFd,
}

impl Doorbell {
    /// A new doorbell.
    pub fn new() -> io::Result<Doorbell> {
        Ok(Doorbell { fd: rustix::event::eventfd(0, EventfdFlags::CLOEXEC | EventfdFlags::NONBLOCK)? })
    }

    /// Wraps a received eventfd.
    pub fn from_fd(fd: OwnedFd) -> Doorbell {
        Doorbell { fd }
    }

    /// Rings: adds 1 to the counter. A saturated counter (`EAGAIN`) is already ringing.
    pub fn ring(&self) -> io::Result<()> {
        match rustix::io::write(&self.fd, &1u64.to_ne_bytes()) {
            Ok(_) | Err(rustix::io::Errno::AGAIN) => Ok(()),
            Err(e) => Err(e.into()),
        }
    }

    /// Resets the counter; returns how many rings it held (0 if none).
    pub fn drain(&self) -> io::Result<u64> {
        let mut buf = [0u8; 8];
        match rustix::io::read(&self.fd, &mut buf) {
            Ok(8) => Ok(u64::from_ne_bytes(buf)),
            Ok(_) => Err(io::Error::from(io::ErrorKind::InvalidData)),
            Err(rustix::io::Errno::AGAIN) => Ok(0),
            Err(e) => Err(e.into()),
        }
    }

    /// Sleeps until rung or `timeout` passes (`None`: forever). True if rung.
    /// Does not drain.
    pub fn wait(&self, timeout: Option<Duration>) -> io::Result<bool> {
        Ok(poll_readable(&[self.fd.as_fd()], timeout)?[0])
    }
}

impl AsFd for Doorbell {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }
}

/// Sleeps in `poll(2)` until one of `fds` is readable (or hung up / in error), or
/// `timeout` passes (`None`: forever). Returns, per fd, whether it is ready.
/// Retries on `EINTR` with the remaining time.
pub fn poll_readable(fds: &[BorrowedFd<'_>], timeout: Option<Duration>) -> io::Result<Vec<bool>> {
    let deadline = timeout.map(|t| Instant::now() + t);
    loop {
        let mut pfds: Vec<PollFd<'_>> = fds.iter().map(|fd| PollFd::new(fd, PollFlags::IN)).collect();
        let ts = match deadline {
            Some(d) => Some(
                Timespec::try_from(d.saturating_duration_since(Instant::now()))
                    .map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?,
            ),
            None => None,
        };
        match rustix::event::poll(&mut pfds, ts.as_ref()) {
            Ok(_) => return Ok(pfds.iter().map(|p| !p.revents().is_empty()).collect()),
            Err(rustix::io::Errno::INTR) => continue,
            Err(e) => return Err(e.into()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ring_wakes_wait_and_drain_resets() {
        let d = Doorbell::new().unwrap();
        assert!(!d.wait(Some(Duration::from_millis(1))).unwrap());
        assert_eq!(d.drain().unwrap(), 0);
        d.ring().unwrap();
        d.ring().unwrap();
        assert!(d.wait(Some(Duration::ZERO)).unwrap());
        assert_eq!(d.drain().unwrap(), 2);
        assert!(!d.wait(Some(Duration::ZERO)).unwrap());
    }

    #[test]
    fn wait_sleeps_until_another_thread_rings() {
        let d = Doorbell::new().unwrap();
        let t0 = Instant::now();
        std::thread::scope(|s| {
            s.spawn(|| {
                std::thread::sleep(Duration::from_millis(30));
                d.ring().unwrap();
            });
            assert!(d.wait(Some(Duration::from_secs(5))).unwrap());
        });
        let waited = t0.elapsed();
        assert!(waited >= Duration::from_millis(25) && waited < Duration::from_secs(4), "{waited:?}");
    }
}
