//! The control-socket protocol: the register request, the reply (with the segment
//! geometry, and the fds by `SCM_RIGHTS`), peer credentials and the peer policy.
//!
//! Messages are fixed-size and little-endian:
//!
//! Register (trainer → daemon, 32 bytes):
//!
//! | offset | size | field |
//! |-------:|-----:|-------|
//! | 0 | 4 | magic `"DLCR"` |
//! | 4 | 2 | protocol version (1) |
//! | 6 | 2 | kind (1 = register) |
//! | 8 | 8 | job id |
//! | 16 | 4 | local rank |
//! | 20 | 4 | local world size |
//! | 24 | 8 | reserved, zero |
//!
//! Reply (daemon → trainer, 128 bytes; accepted replies carry three fds —
//! memfd, submit doorbell, completion doorbell — in that order):
//!
//! | offset | size | field |
//! |-------:|-----:|-------|
//! | 0 | 4 | magic `"DLCA"` |
//! | 4 | 2 | protocol version (1) |
//! | 6 | 2 | kind (2 = accepted, 3 = rejected) |
//! | 8 | 4 | reject code ([`RejectReason`]), 0 if accepted |
//! | 12 | 4 | number of fds attached |
//! | 16 | 8 | attachment id (rejected: first detail of the reason, below) |
//! | 24 | 8 | total size (rejected: second detail of the reason) |
//! | 32 | 8 | submission ring offset |
//! | 40 | 8 | submission ring capacity |
//! | 48 | 8 | completion ring offset |
//! | 56 | 8 | completion ring capacity |
//! | 64 | 8 | arena offset |
//! | 72 | 8 | arena size |
//! | 80 | 4 | the daemon's rank in its job (`node.rank`), accepted only |
//! | 84 | 4 | the job's number of daemons (its `[[peers]]`), accepted only; 0 = not told |
//! | 88 | 40 | reserved, zero |
//!
//! Bytes 80..88 were reserved (zero) before they carried the daemon's place in
//! its job ([`JobPlace`]): a trainer reading zero daemons from an older daemon
//! knows it was not told. The protocol version stays 1.
//!
//! A rejection's details (zero unless said): rank in use (4) — the local rank;
//! world mismatch (5) — the job's local world size, then the one the trainer
//! registered; job mismatch (6) — the daemon's job id, then the one the trainer
//! registered; too many attachments (7) — the limit, then 1 if it is the
//! per-user one. (Daemons before the rank and world details sent zeros there.)
//!
//! After the reply, the daemon writes only notes on the socket (the trainer
//! writes nothing more): why an op failed ([`crate::notes`]), each sent just
//! before the op's failed completion is posted.

use std::io::{self, IoSlice, IoSliceMut, Read};
use std::mem::MaybeUninit;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};

use rustix::net::{
    RecvAncillaryBuffer, RecvAncillaryMessage, RecvFlags, SendAncillaryBuffer, SendAncillaryMessage,
    SendFlags,
};
use thiserror::Error;

use super::layout::Geometry;

/// Control protocol version.
pub const CONTROL_VERSION: u16 = 1;
/// Bytes of a register request.
pub const REGISTER_LEN: usize = 32;
/// Bytes of a reply.
pub const REPLY_LEN: usize = 128;
/// Number of fds an accepted reply carries.
pub const REPLY_FDS: usize = 3;
/// Largest local world size accepted.
pub const MAX_LOCAL_WORLD: u32 = 1024;

const REGISTER_MAGIC: [u8; 4] = *b"DLCR";
const REPLY_MAGIC: [u8; 4] = *b"DLCA";
const KIND_REGISTER: u16 = 1;
const KIND_ACCEPTED: u16 = 2;
const KIND_REJECTED: u16 = 3;

/// What a trainer says when it connects.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Registration {
    /// Job id (all trainers of one job on all hosts use the same one).
    pub job_id: u64,
    /// This trainer's rank among the job's trainers on this host.
    pub local_rank: u32,
    /// Number of the job's trainers on this host.
    pub local_world: u32,
}

/// Why a register request is malformed.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum RegisterError {
    /// Not a register message.
    #[error("not a dlcp register message (bad magic or kind)")]
    BadMagic,
    /// A protocol version this daemon does not speak.
    #[error("control protocol version {0}, this daemon speaks {CONTROL_VERSION}")]
    BadVersion(u16),
    /// Reserved bytes are not zero.
    #[error("reserved register bytes are not zero")]
    Reserved,
    /// `local_world` is zero or too large, or `local_rank >= local_world`.
    #[error(
        "local rank {local_rank} / local world {local_world} is not a valid pair (world 1..={MAX_LOCAL_WORLD})"
    )]
    BadRank {
        /// Rank sent.
        local_rank: u32,
        /// World size sent.
        local_world: u32,
    },
}

impl Registration {
    /// The 32-byte request.
    pub fn encode(&self) -> [u8; REGISTER_LEN] {
        let mut b = [0u8; REGISTER_LEN];
        b[0..4].copy_from_slice(&REGISTER_MAGIC);
        b[4..6].copy_from_slice(&CONTROL_VERSION.to_le_bytes());
        b[6..8].copy_from_slice(&KIND_REGISTER.to_le_bytes());
        b[8..16].copy_from_slice(&self.job_id.to_le_bytes());
        b[16..20].copy_from_slice(&self.local_rank.to_le_bytes());
        b[20..24].copy_from_slice(&self.local_world.to_le_bytes());
        b
    }

    /// Parses and checks a request.
    pub fn decode(b: &[u8; REGISTER_LEN]) -> Result<Registration, RegisterError> {
        if b[0..4] != REGISTER_MAGIC || u16::from_le_bytes([b[6], b[7]]) != KIND_REGISTER {
            return Err(RegisterError::BadMagic);
        }
        let version = u16::from_le_bytes([b[4], b[5]]);
        if version != CONTROL_VERSION {
            return Err(RegisterError::BadVersion(version));
        }
        if b[24..32].iter().any(|&x| x != 0) {
            return Err(RegisterError::Reserved);
        }
        let r = Registration {
            job_id: u64::from_le_bytes(b[8..16].try_into().expect("8 bytes")),
            local_rank: u32::from_le_bytes(b[16..20].try_into().expect("4 bytes")),
            local_world: u32::from_le_bytes(b[20..24].try_into().expect("4 bytes")),
        };
        if r.local_world == 0 || r.local_world > MAX_LOCAL_WORLD || r.local_rank >= r.local_world {
            return Err(RegisterError::BadRank { local_rank: r.local_rank, local_world: r.local_world });
        }
        Ok(r)
    }
}

/// Why the daemon refused an attachment (sent as the reply's reject code).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Error)]
pub enum RejectReason {
    /// The peer's uid/gid is not allowed by the daemon's policy. Run the trainer as
    /// the daemon's user or in an allowed group.
    #[error(
        "peer credentials not allowed by the daemon's policy (run as the daemon's user or an allowed group)"
    )]
    PolicyDenied,
    /// The register message was malformed (bad version, rank, world size).
    #[error("malformed register message (check version, local rank < local world)")]
    BadRequest,
    /// The daemon could not create the segment (out of memory or fds).
    #[error("daemon could not create the shared-memory segment (resources)")]
    Resources,
    /// Another live trainer of this job already holds this local rank. Use another
    /// rank, or wait until the daemon has reclaimed the old trainer.
    #[error("this job's local rank {local_rank} is already attached (another live trainer holds it)")]
    RankInUse {
        /// The rank asked for.
        local_rank: u32,
    },
    /// Trainers of this job already attached with a different local world size.
    #[error("{}", world_text(*.job_world, *.trainer_world))]
    WorldMismatch {
        /// The local world size this job's trainers on this host registered (0: not told).
        job_world: u32,
        /// The one this trainer registered (0: not told).
        trainer_world: u32,
    },
    /// The trainer registered for a job this daemon does not serve (checked
    /// before any segment is created).
    #[error(
        "the trainer registered for job {trainer_job} but this daemon serves job {daemon_job} \
         (node.job_id): attach with the daemon's job id"
    )]
    JobMismatch {
        /// The job the daemon serves.
        daemon_job: u64,
        /// The job the trainer registered for.
        trainer_job: u64,
    },
    /// The daemon holds as many attachments as it may (`shm.max_attachments`),
    /// or this user does (`shm.max_attachments_per_user`).
    #[error("{}", too_many_text(*.limit, *.per_user))]
    TooManyAttachments {
        /// The limit reached.
        limit: u32,
        /// True if it is the per-user limit.
        per_user: bool,
    },
    /// Too many trainers are in the attach handshake at once
    /// (`control.max_pending_attaches`): retry in a moment.
    #[error(
        "too many attach handshakes in progress at the daemon (control.max_pending_attaches); retry in a moment"
    )]
    Busy,
    /// A code this build does not know.
    #[error("rejected with unknown code {0}")]
    Unknown(u32),
}

fn world_text(job_world: u32, trainer_world: u32) -> String {
    if job_world == 0 {
        return "local world size differs from the one this job's other trainers registered".to_owned();
    }
    format!(
        "the trainer registered a local world size of {trainer_world} but this job's other trainers on this \
         host registered {job_world} (LOCAL_WORLD_SIZE): every trainer of a host gives the same one"
    )
}

fn too_many_text(limit: u32, per_user: bool) -> String {
    if per_user {
        format!(
            "this user already holds {limit} attachments, the daemon's limit per user \
             (shm.max_attachments_per_user); detach one first"
        )
    } else {
        format!(
            "the daemon already serves {limit} attachments, its limit (shm.max_attachments); \
             detach one first or raise the limit"
        )
    }
}

impl RejectReason {
    /// Wire code.
    pub fn code(self) -> u32 {
        match self {
            RejectReason::PolicyDenied => 1,
            RejectReason::BadRequest => 2,
            RejectReason::Resources => 3,
            RejectReason::RankInUse { .. } => 4,
            RejectReason::WorldMismatch { .. } => 5,
            RejectReason::JobMismatch { .. } => 6,
            RejectReason::TooManyAttachments { .. } => 7,
            RejectReason::Busy => 8,
            RejectReason::Unknown(c) => c,
        }
    }

    /// The two detail words sent with the code (see the module's table).
    pub fn details(self) -> [u64; 2] {
        match self {
            RejectReason::RankInUse { local_rank } => [u64::from(local_rank), 0],
            RejectReason::WorldMismatch { job_world, trainer_world } => {
                [u64::from(job_world), u64::from(trainer_world)]
            }
            RejectReason::JobMismatch { daemon_job, trainer_job } => [daemon_job, trainer_job],
            RejectReason::TooManyAttachments { limit, per_user } => [u64::from(limit), u64::from(per_user)],
            _ => [0, 0],
        }
    }

    /// From a wire code and its two detail words.
    pub fn from_wire(c: u32, details: [u64; 2]) -> RejectReason {
        let small = |d: u64| u32::try_from(d).unwrap_or(u32::MAX);
        match c {
            1 => RejectReason::PolicyDenied,
            2 => RejectReason::BadRequest,
            3 => RejectReason::Resources,
            4 => RejectReason::RankInUse { local_rank: small(details[0]) },
            5 => {
                RejectReason::WorldMismatch { job_world: small(details[0]), trainer_world: small(details[1]) }
            }
            6 => RejectReason::JobMismatch { daemon_job: details[0], trainer_job: details[1] },
            7 => RejectReason::TooManyAttachments { limit: small(details[0]), per_user: details[1] != 0 },
            8 => RejectReason::Busy,
            c => RejectReason::Unknown(c),
        }
    }
}

/// Where the daemon stands in its job: its rank among the job's daemons and
/// how many there are (told in the accepted reply, see the module's table).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct JobPlace {
    /// The daemon's rank (`node.rank`), `0..nodes`.
    pub node_rank: u32,
    /// The job's number of daemons (its `[[peers]]`); 0 from a daemon that
    /// predates this field (it does not say).
    pub nodes: u32,
}

impl Default for JobPlace {
    /// A daemon alone in its job: rank 0 of 1.
    fn default() -> Self {
        JobPlace { node_rank: 0, nodes: 1 }
    }
}

/// The daemon's reply, without the fds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reply {
    /// Attached: here is the geometry (the fds come with it).
    Accepted {
        /// Attachment id.
        attachment_id: u64,
        /// Segment geometry.
        geometry: Geometry,
        /// The daemon's place in its job.
        place: JobPlace,
    },
    /// Refused.
    Rejected(RejectReason),
}

/// A reply that does not parse.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[error("malformed reply from the daemon: {0}")]
pub struct BadReply(pub &'static str);

impl Reply {
    /// The 128-byte reply.
    pub fn encode(&self) -> [u8; REPLY_LEN] {
        let mut b = [0u8; REPLY_LEN];
        b[0..4].copy_from_slice(&REPLY_MAGIC);
        b[4..6].copy_from_slice(&CONTROL_VERSION.to_le_bytes());
        match self {
            Reply::Accepted { attachment_id, geometry: g, place } => {
                b[6..8].copy_from_slice(&KIND_ACCEPTED.to_le_bytes());
                b[12..16].copy_from_slice(&(REPLY_FDS as u32).to_le_bytes());
                let words = [
                    *attachment_id,
                    g.total_size,
                    g.sq_offset,
                    g.sq_capacity as u64,
                    g.cq_offset,
                    g.cq_capacity as u64,
                    g.arena_offset,
                    g.arena_size,
                ];
                for (i, w) in words.iter().enumerate() {
                    b[16 + 8 * i..24 + 8 * i].copy_from_slice(&w.to_le_bytes());
                }
                b[80..84].copy_from_slice(&place.node_rank.to_le_bytes());
                b[84..88].copy_from_slice(&place.nodes.to_le_bytes());
            }
            Reply::Rejected(r) => {
                b[6..8].copy_from_slice(&KIND_REJECTED.to_le_bytes());
                b[8..12].copy_from_slice(&r.code().to_le_bytes());
                let [d0, d1] = r.details();
                b[16..24].copy_from_slice(&d0.to_le_bytes());
                b[24..32].copy_from_slice(&d1.to_le_bytes());
            }
        }
        b
    }

    /// Parses a reply; an accepted one must describe a valid geometry.
    pub fn decode(b: &[u8; REPLY_LEN]) -> Result<Reply, BadReply> {
        if b[0..4] != REPLY_MAGIC {
            return Err(BadReply("bad magic"));
        }
        if u16::from_le_bytes([b[4], b[5]]) != CONTROL_VERSION {
            return Err(BadReply("unsupported protocol version"));
        }
        let u64_at = |i: usize| u64::from_le_bytes(b[16 + 8 * i..24 + 8 * i].try_into().expect("8 bytes"));
        match u16::from_le_bytes([b[6], b[7]]) {
            KIND_ACCEPTED => {
                let cap = |v: u64| u32::try_from(v).map_err(|_| BadReply("ring capacity out of range"));
                let g = Geometry::new(cap(u64_at(3))?, cap(u64_at(5))?, u64_at(7))
                    .map_err(|_| BadReply("invalid geometry"))?;
                let claimed = [u64_at(1), u64_at(2), u64_at(4), u64_at(6)];
                if claimed != [g.total_size, g.sq_offset, g.cq_offset, g.arena_offset] {
                    return Err(BadReply("geometry offsets disagree with capacities"));
                }
                let u32_at = |i: usize| u32::from_le_bytes(b[i..i + 4].try_into().expect("4 bytes"));
                let place = JobPlace { node_rank: u32_at(80), nodes: u32_at(84) };
                if place.nodes != 0 && place.node_rank >= place.nodes {
                    return Err(BadReply("the daemon's rank is not below its job's number of daemons"));
                }
                Ok(Reply::Accepted { attachment_id: u64_at(0), geometry: g, place })
            }
            KIND_REJECTED => Ok(Reply::Rejected(RejectReason::from_wire(
                u32::from_le_bytes(b[8..12].try_into().expect("4")),
                [u64_at(0), u64_at(1)],
            ))),
            _ => Err(BadReply("unknown kind")),
        }
    }
}

/// Sends `bytes` in one message with `fds` attached by `SCM_RIGHTS`.
pub fn send_with_fds(sock: BorrowedFd<'_>, bytes: &[u8], fds: &[BorrowedFd<'_>]) -> io::Result<()> {
    let mut space = [MaybeUninit::<u8>::uninit(); rustix::cmsg_space!(ScmRights(REPLY_FDS))];
    let mut control = SendAncillaryBuffer::new(&mut space);
    if !fds.is_empty() && !control.push(SendAncillaryMessage::ScmRights(fds)) {
        return Err(io::Error::new(io::ErrorKind::InvalidInput, "too many fds for one message"));
    }
    let n = rustix::net::sendmsg(sock, &[IoSlice::new(bytes)], &mut control, SendFlags::NOSIGNAL)?;
    if n != bytes.len() {
        // Fds went with the first byte; send the rest plainly.
        let mut rest = &bytes[n..];
        while !rest.is_empty() {
            let m = rustix::net::send(sock, rest, SendFlags::NOSIGNAL)?;
            rest = &rest[m..];
        }
    }
    Ok(())
}

/// Receives exactly `buf.len()` bytes and the fds sent with them (close-on-exec).
/// Fds beyond [`REPLY_FDS`] are closed by the kernel (truncated control data).
pub fn recv_with_fds(sock: BorrowedFd<'_>, buf: &mut [u8]) -> io::Result<Vec<OwnedFd>> {
    let mut space = [MaybeUninit::<u8>::uninit(); rustix::cmsg_space!(ScmRights(REPLY_FDS))];
    let mut control = RecvAncillaryBuffer::new(&mut space);
    let msg = rustix::net::recvmsg(sock, &mut [IoSliceMut::new(buf)], &mut control, RecvFlags::CMSG_CLOEXEC)?;
    let mut fds = Vec::new();
    for m in control.drain() {
        if let RecvAncillaryMessage::ScmRights(it) = m {
            fds.extend(it);
        }
    }
    if msg.bytes == 0 {
        return Err(io::Error::from(io::ErrorKind::UnexpectedEof));
    }
    let mut got = msg.bytes;
    let mut file = SockReader(sock);
    while got < buf.len() {
        let n = file.read(&mut buf[got..])?;
        if n == 0 {
            return Err(io::Error::from(io::ErrorKind::UnexpectedEof));
        }
        got += n;
    }
    Ok(fds)
}

struct SockReader<'a>(BorrowedFd<'a>);

impl Read for SockReader<'_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        Ok(rustix::net::recv(self.0, buf, RecvFlags::empty())?.0)
    }
}

/// Credentials of the process at the other end of a Unix socket, from `SO_PEERCRED`
/// (taken by the kernel at `connect` time; they cannot be forged by the peer).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PeerCred {
    /// Peer process id.
    pub pid: i32,
    /// Peer user id.
    pub uid: u32,
    /// Peer group id.
    pub gid: u32,
}

/// Reads `SO_PEERCRED` of a connected Unix socket.
pub fn peer_cred(sock: impl AsFd) -> io::Result<PeerCred> {
    let c = rustix::net::sockopt::socket_peercred(sock)?;
    Ok(PeerCred { pid: c.pid.as_raw_nonzero().get(), uid: c.uid.as_raw(), gid: c.gid.as_raw() })
}

/// Reads `SO_PEERGROUPS` of a connected Unix socket: the supplementary groups
/// the peer had when it connected (Linux ≥ 4.13).
#[allow(unsafe_code)]
pub fn peer_groups(sock: impl AsFd) -> io::Result<Vec<u32>> {
    use std::os::fd::AsRawFd;
    let fd = sock.as_fd();
    let mut buf = vec![0u32; 64];
    loop {
        let mut len = libc::socklen_t::try_from(buf.len() * 4).unwrap_or(libc::socklen_t::MAX);
        // SAFETY: `buf` is valid for writes of `len` bytes (u32 is the kernel's
        // gid_t), `len` is a live socklen_t, and `fd` is borrowed for the call.
        let r = unsafe {
            libc::getsockopt(
                fd.as_raw_fd(),
                libc::SOL_SOCKET,
                libc::SO_PEERGROUPS,
                buf.as_mut_ptr().cast(),
                &mut len,
            )
        };
        if r == 0 {
            buf.truncate(len as usize / 4);
            return Ok(buf);
        }
        let e = io::Error::last_os_error();
        // ERANGE: `len` now holds the size needed (NGROUPS_MAX is 65536).
        if e.raw_os_error() == Some(libc::ERANGE) && buf.len() < 65_536 {
            buf.resize((len as usize / 4).max(buf.len() * 2).min(65_536), 0);
            continue;
        }
        return Err(e);
    }
}

/// An extra attach check: gets the peer's credentials and registration, says yes or no.
pub type PeerHook = std::sync::Arc<dyn Fn(&PeerCred, &Registration) -> bool + Send + Sync>;

/// Who may attach. A peer is allowed if its uid is in `uids` or its (primary) gid
/// is in `gids`, and then `hook` (if any) agrees.
#[derive(Clone)]
pub struct PeerPolicy {
    /// Allowed user ids.
    pub uids: Vec<u32>,
    /// Allowed group ids.
    pub gids: Vec<u32>,
    /// Extra check, e.g. a per-job allow list; called after the uid/gid rule passed.
    pub hook: Option<PeerHook>,
}

impl std::fmt::Debug for PeerPolicy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PeerPolicy")
            .field("uids", &self.uids)
            .field("gids", &self.gids)
            .field("hook", &self.hook.is_some())
            .finish()
    }
}

impl PeerPolicy {
    /// Only the daemon's own user.
    pub fn same_user() -> PeerPolicy {
        PeerPolicy { uids: vec![rustix::process::getuid().as_raw()], gids: Vec::new(), hook: None }
    }

    /// Also allow members (by primary gid) of `gid`.
    pub fn with_gid(mut self, gid: u32) -> PeerPolicy {
        self.gids.push(gid);
        self
    }

    /// Whether `peer` registering `reg` may attach.
    pub fn allows(&self, peer: &PeerCred, reg: &Registration) -> bool {
        self.allows_peer(peer) && self.hook.as_ref().is_none_or(|h| h(peer, reg))
    }

    /// The uid/gid rule alone: checked as soon as a peer connects, before reading
    /// anything from it, so a refused user cannot even occupy the handshake.
    pub fn allows_peer(&self, peer: &PeerCred) -> bool {
        self.uids.contains(&peer.uid) || self.gids.contains(&peer.gid)
    }

    /// The uid/gid rule with the peer's supplementary groups too (a trainer in
    /// the socket's group as a secondary group is allowed).
    pub fn allows_peer_in(&self, peer: &PeerCred, groups: &[u32]) -> bool {
        self.allows_peer(peer) || groups.iter().any(|g| self.gids.contains(g))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::net::UnixStream;

    #[test]
    fn register_round_trip_and_rejections() {
        let r = Registration { job_id: 0x1122_3344_5566_7788, local_rank: 1, local_world: 2 };
        assert_eq!(Registration::decode(&r.encode()), Ok(r));
        let mut b = r.encode();
        b[0] = b'X';
        assert_eq!(Registration::decode(&b), Err(RegisterError::BadMagic));
        let mut b = r.encode();
        b[4] = 9;
        assert_eq!(Registration::decode(&b), Err(RegisterError::BadVersion(9)));
        let mut b = r.encode();
        b[31] = 1;
        assert_eq!(Registration::decode(&b), Err(RegisterError::Reserved));
        for (rank, world) in [(2, 2), (0, 0), (0, MAX_LOCAL_WORLD + 1)] {
            let b = Registration { local_rank: rank, local_world: world, ..r }.encode();
            assert_eq!(
                Registration::decode(&b),
                Err(RegisterError::BadRank { local_rank: rank, local_world: world })
            );
        }
    }

    #[test]
    fn reply_round_trip_and_rejections() {
        let g = Geometry::new(16, 32, 1 << 16).unwrap();
        let a = Reply::Accepted { attachment_id: 5, geometry: g, place: JobPlace { node_rank: 2, nodes: 3 } };
        assert_eq!(Reply::decode(&a.encode()), Ok(a));
        let mut old = a.encode();
        old[80..88].fill(0); // an older daemon: reserved bytes
        let Ok(Reply::Accepted { place, .. }) = Reply::decode(&old) else { panic!("an old reply decodes") };
        assert_eq!(place, JobPlace { node_rank: 0, nodes: 0 });
        let mut wild = a.encode();
        wild[80] = 3; // rank 3 of 3
        assert!(Reply::decode(&wild).is_err());
        for r in [
            RejectReason::PolicyDenied,
            RejectReason::BadRequest,
            RejectReason::Resources,
            RejectReason::RankInUse { local_rank: 3 },
            RejectReason::WorldMismatch { job_world: 2, trainer_world: 4 },
            RejectReason::JobMismatch { daemon_job: 7, trainer_job: 0x1_0000_0009 },
            RejectReason::TooManyAttachments { limit: 64, per_user: false },
            RejectReason::TooManyAttachments { limit: 3, per_user: true },
            RejectReason::Busy,
        ] {
            assert_eq!(Reply::decode(&Reply::Rejected(r).encode()), Ok(Reply::Rejected(r)));
        }
        let world = RejectReason::WorldMismatch { job_world: 2, trainer_world: 4 }.to_string();
        assert!(
            world.contains("local world size of 4 but this job's other trainers on this host registered 2")
        );
        let job = RejectReason::JobMismatch { daemon_job: 7, trainer_job: 9 }.to_string();
        assert!(job.contains("registered for job 9 but this daemon serves job 7"), "{job}");
        let cap = RejectReason::TooManyAttachments { limit: 64, per_user: false }.to_string();
        assert!(cap.contains("64 attachments") && cap.contains("shm.max_attachments"), "{cap}");
        let per = RejectReason::TooManyAttachments { limit: 3, per_user: true }.to_string();
        assert!(per.contains("3 attachments") && per.contains("shm.max_attachments_per_user"), "{per}");
        let mut b = a.encode();
        b[16 + 8 * 2] ^= 0x10; // sq offset
        assert!(Reply::decode(&b).is_err());
        let mut b = a.encode();
        b[16 + 8 * 3] = 3; // capacity 3
        assert!(Reply::decode(&b).is_err());
        let mut b = a.encode();
        b[6] = 7;
        assert!(Reply::decode(&b).is_err());
    }

    #[test]
    fn fds_pass_over_a_socket_pair_and_peer_cred_is_ours() {
        let (a, b) = UnixStream::pair().unwrap();
        let e1 = rustix::event::eventfd(7, rustix::event::EventfdFlags::empty()).unwrap();
        let e2 = rustix::event::eventfd(9, rustix::event::EventfdFlags::empty()).unwrap();
        let msg = [42u8; REPLY_LEN];
        send_with_fds(a.as_fd(), &msg, &[e1.as_fd(), e2.as_fd()]).unwrap();
        let mut buf = [0u8; REPLY_LEN];
        let fds = recv_with_fds(b.as_fd(), &mut buf).unwrap();
        assert_eq!(buf, msg);
        assert_eq!(fds.len(), 2);
        let mut v = [0u8; 8];
        rustix::io::read(&fds[1], &mut v).unwrap();
        assert_eq!(u64::from_ne_bytes(v), 9, "the second fd is the second eventfd");

        let cred = peer_cred(&b).unwrap();
        assert_eq!(cred.pid, std::process::id() as i32);
        assert_eq!(cred.uid, rustix::process::getuid().as_raw());
        assert_eq!(cred.gid, rustix::process::getgid().as_raw());
        let reg = Registration { job_id: 1, local_rank: 0, local_world: 1 };
        assert!(PeerPolicy::same_user().allows(&cred, &reg));
        let other = PeerPolicy { uids: vec![cred.uid + 1], gids: vec![], hook: None };
        assert!(!other.allows(&cred, &reg));
        assert!(other.clone().with_gid(cred.gid).allows(&cred, &reg));
        let hooked = PeerPolicy {
            hook: Some(std::sync::Arc::new(|_: &PeerCred, r: &Registration| r.job_id != 1)),
            ..PeerPolicy::same_user()
        };
        assert!(!hooked.allows(&cred, &reg));
    }
}
