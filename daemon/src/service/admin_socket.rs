//! The admin socket's connections, served by the event loop without waiting
//! for any client: each one's request line is read as it arrives (at most
//! [`MAX_REQUEST`] bytes), its reply written as the client takes it, and a
//! connection unfinished at its deadline (`control.request_timeout_ms`) is
//! closed. At most `control.max_admin_connections` are open at once; one more
//! is told so and closed at once. All of it is counted.
//!
//! Who may ask what, from the peer's `SO_PEERCRED` (and `SO_PEERGROUPS`): the
//! read-only requests (`stats`, `status`, `report`) for the daemon's user,
//! root and members of the socket's group; `reload`, which changes the
//! running daemon, for the daemon's user and root only.

use std::io::{self, Read, Write};
use std::os::fd::AsFd;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant as StdInstant};

use mio::net::{UnixListener, UnixStream};
use mio::{Interest, Registry, Token};

use super::admin::{ErrorReply, Request, to_json};
use super::counters::ServiceCounters;
use crate::shm::{PeerCred, PeerPolicy};

/// The first mio token of the admin connections: slot `i` is `ADMIN_CONN_BASE + i`.
pub(super) const ADMIN_CONN_BASE: usize = 1 << 13;
/// The longest request line accepted, in bytes.
pub const MAX_REQUEST: usize = 256;

/// What a peer may ask.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Access {
    /// Nothing (not the daemon's user, not root, not in the socket's group).
    None,
    /// `stats`, `status`, `report`.
    Read,
    /// Everything, `reload` too.
    Full,
}

/// Who may use the admin socket: `read` (the daemon's user, root, the socket's
/// group) and, for `reload`, the daemon's user and root.
#[derive(Debug, Clone)]
pub(super) struct AdminPolicy {
    /// Who may read.
    pub(super) read: PeerPolicy,
    /// The daemon's user.
    pub(super) owner: u32,
}

impl AdminPolicy {
    fn access(&self, peer: &PeerCred, stream: &UnixStream) -> Access {
        if peer.uid == self.owner || peer.uid == 0 {
            return Access::Full;
        }
        let groups = || crate::shm::control::peer_groups(stream.as_fd()).unwrap_or_default();
        if self.read.allows_peer(peer) || self.read.allows_peer_in(peer, &groups()) {
            Access::Read
        } else {
            Access::None
        }
    }
}

enum State {
    /// Reading the request line.
    Reading(Vec<u8>),
    /// Asked of the service; waiting for its reply.
    Asked,
    /// Writing the reply.
    Writing { out: Vec<u8>, at: usize },
}

struct Conn {
    stream: UnixStream,
    peer: PeerCred,
    access: Access,
    deadline: StdInstant,
    state: State,
}

/// The admin socket and its open connections.
pub(super) struct AdminSocket {
    listener: UnixListener,
    path: PathBuf,
    conns: Vec<Option<Conn>>,
    policy: AdminPolicy,
    timeout: Duration,
}

impl AdminSocket {
    /// Listen on `path` (a stale socket file there is replaced) with file mode
    /// `mode`, serving at most `max_conns` connections at once, each for at
    /// most `timeout`.
    pub(super) fn bind(
        path: PathBuf,
        mode: u32,
        policy: AdminPolicy,
        max_conns: usize,
        timeout: Duration,
    ) -> io::Result<AdminSocket> {
        use std::os::unix::fs::PermissionsExt;
        let _ = std::fs::remove_file(&path);
        let listener = UnixListener::bind(&path)?;
        let conns = (0..max_conns.max(1)).map(|_| None).collect();
        let s = AdminSocket { listener, path, conns, policy, timeout };
        std::fs::set_permissions(&s.path, std::fs::Permissions::from_mode(mode))?;
        Ok(s)
    }

    /// The socket's path.
    pub(super) fn path(&self) -> &Path {
        &self.path
    }

    /// Watch the socket for connections under `token`.
    pub(super) fn register(&mut self, registry: &Registry, token: Token) -> io::Result<()> {
        registry.register(&mut self.listener, token, Interest::READABLE)
    }

    /// Whether `t` is one of the connections' tokens.
    pub(super) fn owns(&self, t: usize) -> bool {
        (ADMIN_CONN_BASE..ADMIN_CONN_BASE + self.conns.len()).contains(&t)
    }

    /// Connections open now.
    pub(super) fn open(&self) -> usize {
        self.conns.iter().flatten().count()
    }

    /// Take every waiting connection; returns the requests already complete
    /// (connection slot and request), each to be answered with [`AdminSocket::reply`].
    pub(super) fn accept(
        &mut self,
        registry: &Registry,
        counters: &mut ServiceCounters,
    ) -> Vec<(usize, Request)> {
        let mut asked = Vec::new();
        loop {
            let stream = match self.listener.accept() {
                Ok((s, _)) => s,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => {
                    log::warn!("admin socket: {e}");
                    break;
                }
            };
            let Some(slot) = self.conns.iter().position(Option::is_none) else {
                counters.refused_admin_busy += 1;
                let busy = ErrorReply {
                    error: format!(
                        "busy: {} admin connections already open (control.max_admin_connections); retry",
                        self.conns.len()
                    ),
                };
                // Best effort, one non-blocking write into the fresh socket's buffer.
                let _ = (&stream).write(to_json(&busy).to_string().as_bytes());
                continue;
            };
            let peer = match crate::shm::control::peer_cred(stream.as_fd()) {
                Ok(p) => p,
                Err(e) => {
                    log::warn!("admin socket: cannot read peer credentials: {e}");
                    continue;
                }
            };
            let access = self.policy.access(&peer, &stream);
            let mut conn = Conn {
                stream,
                peer,
                access,
                deadline: StdInstant::now() + self.timeout,
                state: State::Reading(Vec::new()),
            };
            let token = Token(ADMIN_CONN_BASE + slot);
            if let Err(e) = registry.register(&mut conn.stream, token, Interest::READABLE) {
                log::warn!("admin socket: cannot watch a connection: {e}");
                continue;
            }
            self.conns[slot] = Some(conn);
            // The request usually came with the connection.
            asked.extend(self.advance(slot, registry, counters).map(|r| (slot, r)));
        }
        asked
    }

    /// Readiness on connection token `t`: read or write on; the request if it
    /// is complete now and the peer may ask it.
    pub(super) fn on_token(
        &mut self,
        t: usize,
        registry: &Registry,
        counters: &mut ServiceCounters,
    ) -> Option<(usize, Request)> {
        let slot = t.checked_sub(ADMIN_CONN_BASE)?;
        self.advance(slot, registry, counters).map(|r| (slot, r))
    }

    fn advance(
        &mut self,
        slot: usize,
        registry: &Registry,
        counters: &mut ServiceCounters,
    ) -> Option<Request> {
        let conn = self.conns.get_mut(slot)?.as_mut()?;
        let read = match &mut conn.state {
            State::Reading(buf) => read_line(&mut conn.stream, buf),
            State::Writing { .. } => {
                self.write(slot, registry);
                return None;
            }
            State::Asked => return None,
        };
        let reply = match read {
            Ok(None) => return None,
            Ok(Some(line)) => {
                let request = Request::parse(&line);
                match allowed(&request, conn.access, &conn.peer, self.policy.owner) {
                    Ok(()) => {
                        conn.state = State::Asked;
                        return Some(request);
                    }
                    Err(e) => {
                        if !matches!(request, Request::Invalid(_)) {
                            counters.refused_admin_denied += 1;
                            log::warn!("admin socket, pid {}: {}", conn.peer.pid, e.error);
                        }
                        to_json(&e)
                    }
                }
            }
            Err(e) => to_json(&ErrorReply { error: e }),
        };
        self.reply(slot, &reply, registry);
        None
    }

    /// Send `reply` on connection `slot` (as far as the client takes it now;
    /// the rest when it is writable), then close.
    pub(super) fn reply(&mut self, slot: usize, reply: &serde_json::Value, registry: &Registry) {
        let Some(conn) = self.conns.get_mut(slot).and_then(Option::as_mut) else { return };
        conn.state = State::Writing { out: reply.to_string().into_bytes(), at: 0 };
        let token = Token(ADMIN_CONN_BASE + slot);
        if registry.reregister(&mut conn.stream, token, Interest::WRITABLE).is_err() {
            self.close(slot, registry);
            return;
        }
        self.write(slot, registry);
    }

    fn write(&mut self, slot: usize, registry: &Registry) {
        let Some(conn) = self.conns.get_mut(slot).and_then(Option::as_mut) else { return };
        let State::Writing { out, at } = &mut conn.state else { return };
        while *at < out.len() {
            match conn.stream.write(&out[*at..]) {
                Ok(0) => break,
                Ok(n) => *at += n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(_) => break,
            }
        }
        self.close(slot, registry);
    }

    fn close(&mut self, slot: usize, registry: &Registry) {
        if let Some(mut conn) = self.conns.get_mut(slot).and_then(Option::take) {
            let _ = registry.deregister(&mut conn.stream);
        }
    }

    /// Close the connections unfinished at their deadline.
    pub(super) fn expire(&mut self, now: StdInstant, registry: &Registry, counters: &mut ServiceCounters) {
        for slot in 0..self.conns.len() {
            let Some(conn) = self.conns[slot].as_ref() else { continue };
            // A request the service is answering is never left half done.
            if conn.deadline <= now && !matches!(conn.state, State::Asked) {
                counters.refused_admin_timeout += 1;
                log::info!(
                    "admin connection from pid {} unfinished after control.request_timeout_ms; closed",
                    conn.peer.pid
                );
                self.close(slot, registry);
            }
        }
    }
}

impl Drop for AdminSocket {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

/// Read what has arrived into `buf`: the request line once a newline or the
/// end of the stream is in, `None` while more is to come, an error message for
/// a request that is too long or not text.
///
/// Generic over the reader for the fuzz target (`fuzz/`), which delivers a
/// request in arbitrary pieces, with `WouldBlock` and `Interrupted` between
/// them. (Public only for it, through [`super::fuzzing`].)
#[doc(hidden)]
pub fn read_line(stream: &mut impl Read, buf: &mut Vec<u8>) -> Result<Option<String>, String> {
    let mut chunk = [0u8; MAX_REQUEST];
    let eof = loop {
        match stream.read(&mut chunk) {
            Ok(0) => break true,
            Ok(n) => {
                buf.extend_from_slice(&chunk[..n]);
                if buf.contains(&b'\n') || buf.len() > MAX_REQUEST {
                    break false;
                }
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => break false,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(format!("cannot read the request: {e}")),
        }
    };
    let line = match buf.iter().position(|&b| b == b'\n') {
        Some(i) => &buf[..i],
        None if eof => &buf[..],
        None if buf.len() > MAX_REQUEST => {
            return Err(format!(
                "request longer than {MAX_REQUEST} bytes (one line: stats, status, reload, report OP TENSOR)"
            ));
        }
        None => return Ok(None),
    };
    if line.len() > MAX_REQUEST {
        return Err(format!(
            "request longer than {MAX_REQUEST} bytes (one line: stats, status, reload, report OP TENSOR)"
        ));
    }
    Ok(Some(String::from_utf8_lossy(line).into_owned()))
}

/// Whether a peer with `access` may ask `request`; the error reply if not
/// (an invalid request is answered with its own error).
fn allowed(request: &Request, access: Access, peer: &PeerCred, owner: u32) -> Result<(), ErrorReply> {
    match (request, access) {
        (Request::Invalid(e), _) => Err(e.clone()),
        (_, Access::Full) | (Request::Stats | Request::Status | Request::Report(_), Access::Read) => Ok(()),
        (Request::Reload, Access::Read) => Err(ErrorReply {
            error: format!(
                "permission denied: reload changes the running daemon and is for its own user \
                 (uid {owner}) and root only; uid {} may read (stats, status, report) as a member \
                 of the socket's group (control.socket_group)",
                peer.uid
            ),
        }),
        (_, Access::None) => Err(ErrorReply {
            error: format!(
                "permission denied: uid {} gid {} is not the daemon's user (uid {owner}), root, or a \
                 member of the socket's group (control.socket_group)",
                peer.uid, peer.gid
            ),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn peer(uid: u32) -> PeerCred {
        PeerCred { pid: 1, uid, gid: uid }
    }

    #[test]
    fn reads_for_the_group_reload_for_the_owner_and_root() {
        use dlcp_proto::endpoint::OpId;
        let report = Request::Report(OpId { run: 0, seq: 1, tensor: 2 });
        for r in [&Request::Stats, &Request::Status, &report, &Request::Reload] {
            assert!(allowed(r, Access::Full, &peer(5), 5).is_ok(), "{r:?}");
            assert!(allowed(r, Access::None, &peer(9), 5).is_err(), "{r:?}");
        }
        for r in [&Request::Stats, &Request::Status, &report] {
            assert!(allowed(r, Access::Read, &peer(9), 5).is_ok(), "{r:?}");
        }
        let e = allowed(&Request::Reload, Access::Read, &peer(9), 5).unwrap_err().error;
        assert!(e.contains("reload") && e.contains("uid 5") && e.contains("uid 9 may read"), "{e}");
        let e = allowed(&Request::Stats, Access::None, &peer(9), 5).unwrap_err().error;
        assert!(e.starts_with("permission denied: uid 9"), "{e}");
        let bad = Request::parse("bogus");
        let e = allowed(&bad, Access::None, &peer(9), 5).unwrap_err().error;
        assert!(e.contains("unknown request"), "{e}");
    }
}
