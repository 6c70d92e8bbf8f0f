//! systemd's service notification protocol (`sd_notify(3)`), written out: one
//! datagram of `KEY=VALUE` lines to the Unix socket named by `$NOTIFY_SOCKET`
//! (a path, or an abstract name starting with `@`).
//!
//! dlcpd sends `READY=1` once its control socket, admin socket and datapath are
//! up, `WATCHDOG=1` from its event loop every half watchdog period
//! (`$WATCHDOG_USEC`, honoured only when `$WATCHDOG_PID` is unset or ours),
//! `RELOADING=1` … `READY=1` around a configuration reload, `STATUS=` lines a
//! human reads in `systemctl status`, and `STOPPING=1` when it starts draining.
//!
//! Why not a crate: the protocol is a dozen lines over `UnixDatagram`, and
//! writing it keeps the daemon free of `unsafe` and of a libsystemd link.
//! Without `$NOTIFY_SOCKET` (not started by systemd) every call is a no-op.

use std::io;
use std::os::unix::net::UnixDatagram;
use std::time::{Duration, Instant};

/// Where notifications go, and the watchdog schedule.
#[derive(Debug)]
pub struct Notifier {
    target: Option<(UnixDatagram, std::os::unix::net::SocketAddr)>,
    watchdog: Option<Duration>,
    last_ping: Option<Instant>,
    /// Datagrams that could not be sent (logged once).
    pub failures: u64,
}

impl Notifier {
    /// A notifier from the environment (`NOTIFY_SOCKET`, `WATCHDOG_USEC`,
    /// `WATCHDOG_PID`). Never fails: a bad variable is logged and ignored.
    pub fn from_env() -> Notifier {
        let socket = std::env::var_os("NOTIFY_SOCKET");
        let usec = std::env::var("WATCHDOG_USEC").ok();
        let pid = std::env::var("WATCHDOG_PID").ok();
        Notifier::new(socket.as_deref().and_then(|s| s.to_str()), usec.as_deref(), pid.as_deref())
    }

    /// A notifier for an explicit socket and watchdog settings (as the
    /// environment variables would give them).
    pub fn new(socket: Option<&str>, watchdog_usec: Option<&str>, watchdog_pid: Option<&str>) -> Notifier {
        let target = socket.filter(|s| !s.is_empty()).and_then(|s| match open(s) {
            Ok(t) => Some(t),
            Err(e) => {
                log::warn!("NOTIFY_SOCKET={s}: {e}; not notifying systemd");
                None
            }
        });
        let ours = watchdog_pid.is_none_or(|p| p.trim().parse::<u32>().ok() == Some(std::process::id()));
        let watchdog = watchdog_usec
            .and_then(|u| u.trim().parse::<u64>().ok())
            .filter(|&u| u > 0 && ours)
            .map(Duration::from_micros);
        Notifier { target, watchdog, last_ping: None, failures: 0 }
    }

    /// True if a notification socket is set.
    pub fn enabled(&self) -> bool {
        self.target.is_some()
    }

    /// The watchdog period systemd asked for, if any.
    pub fn watchdog(&self) -> Option<Duration> {
        self.watchdog
    }

    /// Send `state` (newline-separated `KEY=VALUE` lines). Errors are counted and
    /// logged once; the daemon never stops over a notification.
    pub fn notify(&mut self, state: &str) {
        let Some((sock, addr)) = &self.target else { return };
        if let Err(e) = sock.send_to_addr(state.as_bytes(), addr) {
            self.failures += 1;
            if self.failures == 1 {
                log::warn!("sd_notify {state:?}: {e} (further failures not logged)");
            }
        }
    }

    /// Send `WATCHDOG=1` if half the watchdog period passed since the last one.
    /// Call it from the event loop every turn.
    pub fn ping_watchdog(&mut self) {
        let Some(period) = self.watchdog else { return };
        if self.last_ping.is_none_or(|t| t.elapsed() >= period / 2) {
            self.last_ping = Some(Instant::now());
            self.notify("WATCHDOG=1");
        }
    }

    /// How long the loop may sleep before the next watchdog ping is due.
    pub fn next_ping_in(&self) -> Option<Duration> {
        let period = self.watchdog?;
        Some(self.last_ping.map_or(Duration::ZERO, |t| (period / 2).saturating_sub(t.elapsed())))
    }
}

/// `CLOCK_MONOTONIC` now in microseconds, for `MONOTONIC_USEC=` (reloads of a
/// `Type=notify-reload` service must carry it).
pub fn monotonic_usec() -> u64 {
    let ts = rustix::time::clock_gettime(rustix::time::ClockId::Monotonic);
    (ts.tv_sec as u64) * 1_000_000 + (ts.tv_nsec as u64) / 1_000
}

fn open(name: &str) -> io::Result<(UnixDatagram, std::os::unix::net::SocketAddr)> {
    let addr = if let Some(abs) = name.strip_prefix('@') {
        use std::os::linux::net::SocketAddrExt;
        std::os::unix::net::SocketAddr::from_abstract_name(abs.as_bytes())?
    } else if name.starts_with('/') {
        std::os::unix::net::SocketAddr::from_pathname(name)?
    } else {
        return Err(io::Error::new(io::ErrorKind::InvalidInput, "not an absolute path or @abstract name"));
    };
    let sock = UnixDatagram::unbound()?;
    sock.set_nonblocking(true)?;
    Ok((sock, addr))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sends_to_a_path_socket_and_paces_watchdog_pings() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("notify");
        let rx = UnixDatagram::bind(&path).unwrap();
        rx.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
        let mut n = Notifier::new(path.to_str(), Some("200000"), None);
        assert!(n.enabled());
        assert_eq!(n.watchdog(), Some(Duration::from_millis(200)));
        n.notify("READY=1\nSTATUS=up");
        let mut buf = [0u8; 256];
        let k = rx.recv(&mut buf).unwrap();
        assert_eq!(&buf[..k], b"READY=1\nSTATUS=up");
        n.ping_watchdog();
        n.ping_watchdog(); // too soon: not sent
        let k = rx.recv(&mut buf).unwrap();
        assert_eq!(&buf[..k], b"WATCHDOG=1");
        rx.set_nonblocking(true).unwrap();
        assert!(rx.recv(&mut buf).is_err(), "second ping within half the period must not be sent");
        assert!(n.next_ping_in().unwrap() <= Duration::from_millis(100));
    }

    #[test]
    fn abstract_socket_and_foreign_watchdog_pid() {
        let name = format!("dlcp-notify-test-{}", std::process::id());
        use std::os::linux::net::SocketAddrExt;
        let rx = UnixDatagram::bind_addr(&std::os::unix::net::SocketAddr::from_abstract_name(&name).unwrap())
            .unwrap();
        rx.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
        // WATCHDOG_PID of another process: no watchdog for us.
        let mut n = Notifier::new(Some(&format!("@{name}")), Some("1000000"), Some("1"));
        assert_eq!(n.watchdog(), None);
        n.notify("STOPPING=1");
        let mut buf = [0u8; 64];
        let k = rx.recv(&mut buf).unwrap();
        assert_eq!(&buf[..k], b"STOPPING=1");
    }

    #[test]
    fn without_a_socket_nothing_happens() {
        let mut n = Notifier::new(None, None, None);
        assert!(!n.enabled());
        n.notify("READY=1");
        n.ping_watchdog();
        assert_eq!(n.failures, 0);
        let mut bad = Notifier::new(Some("relative/path"), None, None);
        assert!(!bad.enabled());
        bad.notify("READY=1");
    }
}
