//! The C ABI's waits without the handle's mutex ([`wait_unlocked`]), used by
//! `dlcp_wait` and `dlcp_wait_op`.

use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::time::{Duration, Instant};

use dlcp_shm::doorbell::poll_readable;

use super::{Failure, dlcp_client, lookup};
use crate::{Client, Error, ErrorCode, TrainerError};

/// The longest an unlocked waiter sleeps in `poll` before it looks again: how
/// soon it notices that another thread detached the handle.
const POLL_SLICE: Duration = Duration::from_secs(1);
/// How long an unlocked waiter holds the handle to read the control socket
/// once `poll` found it readable (a daemon's note, or the daemon gone).
const CONTROL_WAIT: Duration = Duration::from_millis(5);

/// Waits up to `timeout` for what `take` takes, without holding the handle's
/// mutex while it sleeps. Each round looks up the handle (a handle detached by
/// another thread ends the wait with `DLCP_ERR_BAD_HANDLE` within
/// [`POLL_SLICE`]), calls `take(client, look)` under the mutex (`look` zero, or
/// [`CONTROL_WAIT`] after the control socket woke it, so a daemon's close is
/// read), and — if `take` timed out — `poll`s duplicates of the client's
/// completion doorbell and control socket with the mutex released. No wake-up
/// is lost: a `take` that finds nothing drains the doorbell before its last
/// look at the ring, so a completion posted after that rings it again (the
/// doorbell protocol). Duplicates, because the client and its descriptors may
/// be dropped by a `dlcp_detach` while this thread sleeps.
pub(super) fn wait_unlocked<T>(
    handle: *mut dlcp_client,
    timeout: Duration,
    mut take: impl FnMut(&mut Client, Duration) -> Result<T, Failure>,
) -> Result<T, Failure> {
    let deadline = Instant::now().checked_add(timeout);
    let mut look = Duration::ZERO;
    let mut first = true;
    loop {
        let (fds, left): ([OwnedFd; 2], Option<Duration>) = {
            let shared = lookup(handle).map_err(|f| match first {
                true => f,
                false => Failure::new(
                    f.code,
                    format!("{} (detached by another thread while this one waited)", f.msg),
                ),
            })?;
            first = false;
            let mut slot = shared.lock().map_err(|_| {
                Failure::new(ErrorCode::Internal, "an earlier call on this handle panicked; detach it")
            })?;
            match take(&mut slot.client, look) {
                Err(f) if f.code == ErrorCode::Timeout => {}
                done => return done,
            }
            let left = deadline.map(|d| d.saturating_duration_since(Instant::now()));
            if left == Some(Duration::ZERO) {
                return Err(Error::from(TrainerError::Timeout(timeout)).into());
            }
            let [bell, control] = slot.client.completion_fds();
            let dup = |fd: BorrowedFd<'_>| {
                fd.try_clone_to_owned().map_err(|e| {
                    Failure::new(ErrorCode::Io, format!("cannot duplicate a wait descriptor: {e}"))
                })
            };
            ([dup(bell)?, dup(control)?], left)
        };
        let slice = left.map_or(POLL_SLICE, |l| l.min(POLL_SLICE));
        let ready = poll_readable(&[fds[0].as_fd(), fds[1].as_fd()], Some(slice))
            .map_err(|e| Failure::new(ErrorCode::Io, format!("poll: {e}")))?;
        look = if ready[1] { CONTROL_WAIT } else { Duration::ZERO };
    }
}
