//! Daemon side: the control-socket listener and one [`Attachment`] per trainer.

use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::fs::{FileTypeExt, PermissionsExt};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use thiserror::Error;

use super::claim::{Claim, RankTable};
use super::control::{self, JobPlace, PeerCred, PeerPolicy, Registration, RejectReason, Reply};
use super::doorbell::{Doorbell, poll_readable};
use super::handshake::Handshake;
use super::layout::{
    ArenaError, CompletionDesc, DESC_WORDS, DescError, Geometry, Limits, Status, Submission, SubmitDesc,
};
use super::mapping::{self, Mapping};
use super::notes::{OpFailedNote, Outbox};
use super::ring::{Consumer, Producer, RingError, RingLayout};

/// How the server is set up. The daemon fills it from `control.socket_path` /
/// `control.socket_mode` and its own defaults.
#[derive(Debug, Clone)]
pub struct ServerConfig {
    /// Path of the control socket.
    pub socket_path: PathBuf,
    /// Permission bits of the socket file (a trainer needs write permission to connect).
    pub socket_mode: u32,
    /// Geometry of every segment.
    pub geometry: Geometry,
    /// Bounds on descriptor fields.
    pub limits: Limits,
    /// Who may attach.
    pub policy: PeerPolicy,
    /// How long a connecting trainer has to send its register message.
    pub handshake_timeout: Duration,
    /// The only job whose trainers may attach (`None`: any job). Checked
    /// before a segment is created.
    pub job_id: Option<u64>,
    /// Attachments alive at once; one more is refused before its segment is created.
    pub max_attachments: usize,
    /// Attachments one uid may hold at once (0: no per-user limit).
    pub max_attachments_per_user: usize,
    /// The daemon's place in its job, told to every trainer it accepts.
    pub place: JobPlace,
}

impl ServerConfig {
    /// Defaults: 256-slot rings, a 64 MiB arena, same-user policy, 2 s
    /// handshake, any job, at most 64 attachments, no per-user limit, rank 0 of 1.
    pub fn new(socket_path: impl Into<PathBuf>, socket_mode: u32) -> ServerConfig {
        ServerConfig {
            socket_path: socket_path.into(),
            socket_mode,
            geometry: Geometry::new(256, 256, 64 << 20).expect("default geometry is valid"),
            limits: Limits::default(),
            policy: PeerPolicy::same_user(),
            handshake_timeout: Duration::from_secs(2),
            job_id: None,
            max_attachments: 64,
            max_attachments_per_user: 0,
            place: JobPlace::default(),
        }
    }
}

/// The server could not start.
#[derive(Debug, Error)]
pub enum BindError {
    /// Another live daemon answers on the socket path. Stop it or use another path.
    #[error("control socket {0} is in use by a live daemon")]
    InUse(PathBuf),
    /// Something that is not a socket is at the path; refusing to delete it.
    #[error("{0} exists and is not a socket; remove it or choose another control.socket_path")]
    NotASocket(PathBuf),
    /// bind/chmod failed.
    #[error("cannot bind control socket {path}: {source}")]
    Io {
        /// Socket path.
        path: PathBuf,
        /// Cause.
        source: io::Error,
    },
}

/// One incoming connection did not become an attachment. The connection is closed;
/// the server keeps serving.
#[derive(Debug, Error)]
pub enum AcceptError {
    /// `accept(2)` itself failed (e.g. out of fds).
    #[error("accept on the control socket failed: {0}")]
    Accept(io::Error),
    /// `SO_PEERCRED` could not be read.
    #[error("cannot read peer credentials: {0}")]
    PeerCred(io::Error),
    /// The peer did not send a register message in time, or hung up.
    #[error("trainer pid {} did not complete the handshake: {source}", peer.pid)]
    Handshake {
        /// Peer.
        peer: PeerCred,
        /// Cause.
        source: io::Error,
    },
    /// Malformed register message.
    #[error("trainer pid {} sent a bad register message: {source}", peer.pid)]
    BadRequest {
        /// Peer.
        peer: PeerCred,
        /// What was wrong.
        source: control::RegisterError,
    },
    /// The peer policy refused this uid/gid.
    #[error("trainer pid {} uid {} gid {} refused by the peer policy", peer.pid, peer.uid, peer.gid)]
    PolicyDenied {
        /// Peer.
        peer: PeerCred,
    },
    /// The job's local rank is taken, or the job's trainers disagree on the local
    /// world size.
    #[error("trainer pid {} refused: {reason} (job {job:#x} rank {local_rank}/{local_world})", peer.pid)]
    Conflict {
        /// Peer.
        peer: PeerCred,
        /// [`RejectReason::RankInUse`] or [`RejectReason::WorldMismatch`] (with their values).
        reason: RejectReason,
        /// Job id.
        job: u64,
        /// Rank asked for.
        local_rank: u32,
        /// World size asked for.
        local_world: u32,
    },
    /// The registration is for another job, or the attachment limits are
    /// reached ([`RejectReason::JobMismatch`], [`RejectReason::TooManyAttachments`]);
    /// refused before any segment was created.
    #[error("trainer pid {} uid {} refused: {reason}", peer.pid, peer.uid)]
    Refused {
        /// Peer.
        peer: PeerCred,
        /// Why (sent to the trainer).
        reason: RejectReason,
    },
    /// Creating, mapping or sending the segment failed.
    #[error("cannot set up a segment for trainer pid {}: {source}", peer.pid)]
    Segment {
        /// Peer.
        peer: PeerCred,
        /// Cause.
        source: io::Error,
    },
}

/// Server-wide counters.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ServerStats {
    /// Attachments created.
    pub attached: u64,
    /// Connections refused by the policy.
    pub policy_denied: u64,
    /// Connections with a malformed register message.
    pub bad_requests: u64,
    /// Connections refused for a taken rank or a disagreeing world size.
    pub conflicts: u64,
    /// Connections refused for registering another job.
    pub wrong_job: u64,
    /// Connections refused at the attachment limits (in all or per user).
    pub over_limit: u64,
    /// Connections that failed otherwise (handshake timeout in [`ShmServer::accept`], resources).
    pub failed: u64,
}

/// The control-socket listener.
///
/// **Readiness model:** the listener is non-blocking; register [`AsFd`] with mio
/// (or use [`ShmServer::wait_acceptable`]). An event loop calls
/// [`ShmServer::accept_pending`] when it is readable, which checks the peer's
/// credentials and returns a [`Handshake`] without reading from it; it then
/// watches the handshake's fd, calls [`Handshake::read`] when readable, and
/// [`ShmServer::admit`] once the register message is in, which checks job,
/// limits and rank and only then creates the segment. Nothing blocks; the loop
/// owns the handshakes' deadlines ([`Handshake::deadline`]) and how many it
/// lets wait at once ([`ShmServer::refuse`] turns one away).
/// [`ShmServer::accept`] strings the steps together blocking, bounded by
/// `handshake_timeout` (for tests and simple servers).
#[derive(Debug)]
pub struct ShmServer {
    listener: UnixListener,
    cfg: ServerConfig,
    next_id: u64,
    stats: ServerStats,
    live: Arc<AtomicUsize>,
    ranks: Arc<Mutex<RankTable>>,
}

/// Best effort: tell the peer why it is refused (a fresh connection's buffer
/// holds the 128-byte reply; failures change nothing).
fn send_reject(stream: &UnixStream, why: RejectReason) {
    let _ = control::send_with_fds(stream.as_fd(), &Reply::Rejected(why).encode(), &[]);
}

impl ShmServer {
    /// Binds the control socket at `cfg.socket_path` with `cfg.socket_mode`.
    /// A stale socket left by a killed daemon is removed; a live one is an error.
    pub fn bind(cfg: ServerConfig) -> Result<ShmServer, BindError> {
        let path = cfg.socket_path.clone();
        let io_err = |source| BindError::Io { path: path.clone(), source };
        match std::fs::symlink_metadata(&path) {
            Ok(md) if md.file_type().is_socket() => {
                if UnixStream::connect(&path).is_ok() {
                    return Err(BindError::InUse(path));
                }
                log::info!("removing stale control socket {}", path.display());
                std::fs::remove_file(&path).map_err(io_err)?;
            }
            Ok(_) => return Err(BindError::NotASocket(path)),
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => return Err(io_err(e)),
        }
        // Bind under a temporary name, set the mode, then rename into place: the
        // socket is never reachable at `path` with the umask's permissions.
        let mut tmp_name = path.file_name().unwrap_or_default().to_os_string();
        tmp_name.push(format!(".{}.tmp", std::process::id()));
        let tmp = path.with_file_name(tmp_name);
        let _ = std::fs::remove_file(&tmp);
        let listener = UnixListener::bind(&tmp).map_err(io_err)?;
        let placed = std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(cfg.socket_mode))
            .and_then(|()| std::fs::rename(&tmp, &path));
        if let Err(e) = placed {
            let _ = std::fs::remove_file(&tmp);
            return Err(io_err(e));
        }
        listener.set_nonblocking(true).map_err(io_err)?;
        Ok(ShmServer {
            listener,
            cfg,
            next_id: 1,
            stats: ServerStats::default(),
            live: Arc::default(),
            ranks: Arc::default(),
        })
    }

    /// The socket path.
    pub fn socket_path(&self) -> &Path {
        &self.cfg.socket_path
    }

    /// Counters.
    pub fn stats(&self) -> ServerStats {
        self.stats
    }

    /// Attachments created by this server and not yet dropped.
    pub fn live_attachments(&self) -> usize {
        self.live.load(Ordering::Relaxed)
    }

    /// Sleeps until a connection is pending or `timeout` passes.
    pub fn wait_acceptable(&self, timeout: Option<Duration>) -> io::Result<bool> {
        Ok(poll_readable(&[self.listener.as_fd()], timeout)?[0])
    }

    /// Accepts one pending connection, if any, and turns it into an [`Attachment`]
    /// ([`ShmServer::accept_pending`], then [`Handshake::read`] waiting up to
    /// `handshake_timeout`, then [`ShmServer::admit`]). Blocks for as long as
    /// the peer takes to register, at most `handshake_timeout`: an event loop
    /// uses the steps instead.
    pub fn accept(&mut self) -> Result<Option<Attachment>, AcceptError> {
        let Some(mut hs) = self.accept_pending()? else { return Ok(None) };
        let peer = hs.peer();
        let complete = loop {
            match hs.read() {
                Ok(true) => break Ok(()),
                Ok(false) => match hs.wait() {
                    Ok(true) => {}
                    Ok(false) => {
                        break Err(io::Error::new(io::ErrorKind::TimedOut, "no register message in time"));
                    }
                    Err(e) => break Err(e),
                },
                Err(e) => break Err(e),
            }
        };
        match complete {
            Ok(()) => self.admit(hs).map(Some),
            Err(source) => {
                let e = AcceptError::Handshake { peer, source };
                self.count(&e);
                Err(e)
            }
        }
    }

    /// Accepts one pending connection, if any, without reading from it: reads
    /// `SO_PEERCRED` and applies the uid/gid policy (a refused peer gets a
    /// reject reply at once and never occupies a handshake). The
    /// [`Handshake`] is non-blocking, with a deadline `handshake_timeout` away.
    pub fn accept_pending(&mut self) -> Result<Option<Handshake>, AcceptError> {
        let stream = match self.listener.accept() {
            Ok((s, _)) => s,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(None),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => return Ok(None),
            Err(e) => return Err(AcceptError::Accept(e)),
        };
        let r = self.check_peer(stream);
        if let Err(e) = &r {
            self.count(e);
        }
        r.map(Some)
    }

    fn check_peer(&self, stream: UnixStream) -> Result<Handshake, AcceptError> {
        let peer = control::peer_cred(&stream).map_err(AcceptError::PeerCred)?;
        stream.set_nonblocking(true).map_err(|source| AcceptError::Handshake { peer, source })?;
        // Supplementary groups only matter when the primary uid/gid did not pass.
        let allowed = self.cfg.policy.allows_peer(&peer)
            || (!self.cfg.policy.gids.is_empty()
                && control::peer_groups(&stream).is_ok_and(|g| self.cfg.policy.allows_peer_in(&peer, &g)));
        if !allowed {
            send_reject(&stream, RejectReason::PolicyDenied);
            return Err(AcceptError::PolicyDenied { peer });
        }
        Ok(Handshake::new(stream, peer, Instant::now() + self.cfg.handshake_timeout))
    }

    /// Turns a handshake away with `why` (best effort: the peer may not be
    /// listening), e.g. [`RejectReason::Busy`] when too many are pending.
    pub fn refuse(&mut self, hs: Handshake, why: RejectReason) {
        send_reject(hs.stream(), why);
    }

    /// Turns a handshake whose register message is complete ([`Handshake::read`]
    /// returned `true`) into an [`Attachment`]. In this order, and all before
    /// any memory is set aside: the message parses, the policy hook agrees, the
    /// job is the server's (`job_id`), the attachment limits leave room (in all
    /// and for the peer's uid), the local rank is free and the local world
    /// agrees; then the segment is created and sent. A refused trainer gets a
    /// reject reply saying why.
    pub fn admit(&mut self, hs: Handshake) -> Result<Attachment, AcceptError> {
        let r = self.admit_checked(&hs);
        match &r {
            Ok(a) => {
                self.stats.attached += 1;
                log::info!(
                    "trainer attached: id {} pid {} uid {} gid {} job {:#x} local rank {}/{}",
                    a.id,
                    a.peer.pid,
                    a.peer.uid,
                    a.peer.gid,
                    a.registration.job_id,
                    a.registration.local_rank,
                    a.registration.local_world
                );
            }
            Err(e) => self.count(e),
        }
        r
    }

    /// Count and log a failed attach.
    fn count(&mut self, e: &AcceptError) {
        match e {
            AcceptError::PolicyDenied { .. } => self.stats.policy_denied += 1,
            AcceptError::BadRequest { .. } => self.stats.bad_requests += 1,
            AcceptError::Conflict { .. } => self.stats.conflicts += 1,
            AcceptError::Refused { reason: RejectReason::JobMismatch { .. }, .. } => {
                self.stats.wrong_job += 1
            }
            AcceptError::Refused { .. } => self.stats.over_limit += 1,
            _ => self.stats.failed += 1,
        }
        log::warn!("{e}");
    }

    fn admit_checked(&mut self, hs: &Handshake) -> Result<Attachment, AcceptError> {
        let (peer, stream) = (hs.peer(), hs.stream());
        let registration = match Registration::decode(hs.message()) {
            Ok(r) => r,
            Err(source) => {
                send_reject(stream, RejectReason::BadRequest);
                return Err(AcceptError::BadRequest { peer, source });
            }
        };
        let refuse = |reason: RejectReason| {
            send_reject(stream, reason);
            AcceptError::Refused { peer, reason }
        };
        if self.cfg.policy.hook.as_ref().is_some_and(|h| !h(&peer, &registration)) {
            send_reject(stream, RejectReason::PolicyDenied);
            return Err(AcceptError::PolicyDenied { peer });
        }
        if let Some(job) = self.cfg.job_id.filter(|&j| j != registration.job_id) {
            return Err(refuse(RejectReason::JobMismatch {
                daemon_job: job,
                trainer_job: registration.job_id,
            }));
        }
        if self.live_attachments() >= self.cfg.max_attachments {
            let limit = u32::try_from(self.cfg.max_attachments).unwrap_or(u32::MAX);
            return Err(refuse(RejectReason::TooManyAttachments { limit, per_user: false }));
        }
        let claimed = self.ranks.lock().unwrap_or_else(|p| p.into_inner()).claim(
            &registration,
            peer.uid,
            self.cfg.max_attachments_per_user,
        );
        match claimed {
            Err(reason @ RejectReason::TooManyAttachments { .. }) => return Err(refuse(reason)),
            Err(reason) => {
                send_reject(stream, reason);
                return Err(AcceptError::Conflict {
                    peer,
                    reason,
                    job: registration.job_id,
                    local_rank: registration.local_rank,
                    local_world: registration.local_world,
                });
            }
            Ok(()) => {}
        }
        // From here on, dropping `claim` releases the rank (on any error below too).
        self.live.fetch_add(1, Ordering::Relaxed);
        let claim = Claim::new(self.live.clone(), self.ranks.clone(), registration, peer.uid);
        let id = self.next_id;
        self.next_id += 1;
        let seg = |source| AcceptError::Segment { peer, source };
        let built = Attachment::create(id, peer, registration, &self.cfg, stream.try_clone().map_err(seg)?);
        let mut att = match built {
            Ok(a) => a,
            Err(e) => {
                send_reject(stream, RejectReason::Resources);
                return Err(seg(e));
            }
        };
        let reply = Reply::Accepted { attachment_id: id, geometry: self.cfg.geometry, place: self.cfg.place };
        control::send_with_fds(
            stream.as_fd(),
            &reply.encode(),
            &[att.memfd.as_fd(), att.submit_bell.as_fd(), att.complete_bell.as_fd()],
        )
        .map_err(seg)?;
        att.claim = Some(claim);
        Ok(att)
    }
}

impl AsFd for ShmServer {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.listener.as_fd()
    }
}

impl Drop for ShmServer {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.cfg.socket_path);
    }
}

/// Is the trainer still there?
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Liveness {
    /// Connected.
    Alive,
    /// The control socket closed (EOF): the trainer exited or was killed.
    Gone,
    /// The control socket failed (e.g. `ECONNRESET`): treat as gone.
    Broken(io::ErrorKind),
}

/// A submission-ring problem seen by the daemon.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum ChannelError {
    /// A descriptor failed validation. It was consumed and counted, and (if the
    /// completion ring had room) completed with [`Status::InvalidDescriptor`].
    #[error("rejected descriptor op {op_seq} cookie {cookie:#x}: {error}")]
    Rejected {
        /// The descriptor's op_seq (untrusted, for logs).
        op_seq: u64,
        /// The descriptor's cookie (untrusted, echoed back).
        cookie: u64,
        /// The violated rule.
        error: DescError,
    },
    /// The trainer wrote impossible ring indices. Nothing was consumed; the
    /// attachment should be detached.
    #[error(transparent)]
    Ring(#[from] RingError),
}

/// Posting a completion failed.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum CompleteError {
    /// The completion ring is full: the trainer is not consuming completions.
    /// Keep the completion and retry after the next wakeup, or detach.
    #[error("completion ring full (trainer is not consuming completions)")]
    Full,
    /// The trainer wrote impossible ring indices.
    #[error(transparent)]
    Ring(#[from] RingError),
}

/// Per-attachment counters.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct AttachmentStats {
    /// Valid submissions taken off the ring.
    pub submissions: u64,
    /// Rejected descriptors, indexed by [`DescError::code`] (index 0 unused).
    pub rejected_by_code: [u64; DescError::COUNT + 1],
    /// Times the trainer's ring indices were found corrupted.
    pub ring_corruptions: u64,
    /// Completions posted.
    pub completions: u64,
    /// Completions that could not be posted (ring full or corrupted).
    pub completions_dropped: u64,
    /// Bytes the trainer sent on the control socket after registering (ignored).
    pub stray_control_bytes: u64,
    /// Times [`Attachment::next_submission`] left descriptors on the ring
    /// because the trainer had as many ops outstanding as its completion ring
    /// has room for, or a whole arena's bytes.
    pub throttled: u64,
    /// Failure reasons not told to the trainer (its control socket was full).
    pub reasons_dropped: u64,
}

impl AttachmentStats {
    /// All rejected descriptors.
    pub fn rejected(&self) -> u64 {
        self.rejected_by_code.iter().sum()
    }
}

/// What woke [`Attachment::wait`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Wakeup {
    /// The submit doorbell rang (submissions may be pending).
    pub doorbell: bool,
    /// The control socket is readable: check [`Attachment::liveness`].
    pub control: bool,
}

/// One trainer's channel, daemon side. Dropping it reclaims the segment (unmaps
/// it, closes the memfd and the doorbells); the trainer's own mapping stays valid
/// for the trainer but nobody serves it any more.
#[derive(Debug)]
pub struct Attachment {
    id: u64,
    peer: PeerCred,
    registration: Registration,
    geometry: Geometry,
    limits: Limits,
    stream: UnixStream,
    memfd: OwnedFd,
    map: Mapping,
    sq: Consumer,
    cq: Producer,
    submit_bell: Doorbell,
    complete_bell: Doorbell,
    stats: AttachmentStats,
    created: Instant,
    claim: Option<Claim>,
    /// Failure reasons the control socket could not take yet.
    notes: Outbox,
    /// Submissions taken off the ring and not completed yet, and their bytes.
    outstanding: u32,
    outstanding_bytes: u64,
}

impl Attachment {
    fn create(
        id: u64,
        peer: PeerCred,
        registration: Registration,
        cfg: &ServerConfig,
        stream: UnixStream,
    ) -> io::Result<Attachment> {
        let g = cfg.geometry;
        let name = format!("dlcp-seg-{id}");
        let (memfd, map) = mapping::create_and_map(&name, g.total_size)?;
        let header = g.header(id, registration.job_id, registration.local_rank, registration.local_world);
        map.store_words(0, &header.to_words()).map_err(|e| io::Error::other(e.to_string()))?;
        Ok(Attachment {
            id,
            peer,
            registration,
            geometry: g,
            limits: cfg.limits,
            stream,
            memfd,
            map,
            sq: Consumer::new(RingLayout { ctl: g.sq_offset, capacity: g.sq_capacity }),
            cq: Producer::new(RingLayout { ctl: g.cq_offset, capacity: g.cq_capacity }),
            submit_bell: Doorbell::new()?,
            complete_bell: Doorbell::new()?,
            stats: AttachmentStats::default(),
            created: Instant::now(),
            claim: None,
            notes: Outbox::default(),
            outstanding: 0,
            outstanding_bytes: 0,
        })
    }

    /// Attachment id (also in the segment header).
    pub fn id(&self) -> u64 {
        self.id
    }

    /// The trainer's `SO_PEERCRED`.
    pub fn peer(&self) -> PeerCred {
        self.peer
    }

    /// What the trainer registered as.
    pub fn registration(&self) -> Registration {
        self.registration
    }

    /// The segment geometry.
    pub fn geometry(&self) -> Geometry {
        self.geometry
    }

    /// Counters.
    pub fn stats(&self) -> AttachmentStats {
        AttachmentStats { reasons_dropped: self.notes.dropped(), ..self.stats }
    }

    /// Tells the trainer why op (`op_seq`, `tensor_id`) failed (a note on the
    /// control socket, see [`crate::notes`]); call it just before posting the
    /// failed completion. Never blocks: false if the note was dropped.
    pub fn send_reason(&mut self, op_seq: u64, tensor_id: u32, reason: &str) -> bool {
        let note = OpFailedNote { op_seq, tensor_id, reason: reason.to_owned() };
        self.notes.send(self.stream.as_fd(), &note)
    }

    /// Ring occupancy now, for metrics: (submissions waiting, completions the
    /// trainer has not taken yet, entries per ring). A corrupted ring reads as full.
    pub fn ring_occupancy(&self) -> (u32, u32, u32) {
        let g = self.geometry;
        let cap = g.cq_capacity;
        let sq = self.sq.available(&self.map).unwrap_or(g.sq_capacity);
        let cq = self.cq.free_slots(&self.map).map_or(cap, |f| cap.saturating_sub(f));
        (sq, cq, cap)
    }

    /// When the attachment was created.
    pub fn created(&self) -> Instant {
        self.created
    }

    /// The control socket (readable on EOF: register it with mio for disconnects).
    pub fn control_fd(&self) -> BorrowedFd<'_> {
        self.stream.as_fd()
    }

    /// The submit doorbell (readable when the trainer rang: register it with mio).
    pub fn doorbell_fd(&self) -> BorrowedFd<'_> {
        self.submit_bell.as_fd()
    }

    /// Sleeps until the trainer rings or its control socket becomes readable
    /// (usually: closed), or `timeout` passes. Drains the doorbell; the caller then
    /// drains the ring with [`next_submission`](Self::next_submission) and checks
    /// [`liveness`](Self::liveness) if `control` is set.
    pub fn wait(&mut self, timeout: Option<Duration>) -> io::Result<Wakeup> {
        // Drain first, then look at the ring: see the doorbell module's protocol.
        self.submit_bell.drain()?;
        if self.sq.available(&self.map).unwrap_or(1) > 0 {
            return Ok(Wakeup { doorbell: true, control: false });
        }
        let ready = poll_readable(&[self.submit_bell.as_fd(), self.stream.as_fd()], timeout)?;
        if ready[0] {
            self.submit_bell.drain()?;
        }
        Ok(Wakeup { doorbell: ready[0], control: ready[1] })
    }

    /// Non-blocking check of the control socket. EOF or an error means the trainer
    /// is gone: drop the attachment (reclaiming the segment) and fail its pending ops.
    pub fn liveness(&mut self) -> Liveness {
        let mut buf = [0u8; 256];
        // Bounded: a trainer streaming bytes at us cannot keep us here.
        for _ in 0..16 {
            match io::Read::read(&mut &self.stream, &mut buf) {
                Ok(0) => return Liveness::Gone,
                Ok(n) => self.stats.stray_control_bytes += n as u64,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Liveness::Alive,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Liveness::Broken(e.kind()),
            }
        }
        Liveness::Alive
    }

    /// Ops taken off the ring and not completed yet ([`Attachment::complete_submission`]
    /// ends one), and their bytes.
    pub fn outstanding(&self) -> (u32, u64) {
        (self.outstanding, self.outstanding_bytes)
    }

    /// Whether one more submission may be taken: its completion must find a
    /// free slot after those of every outstanding op (so no completion is ever
    /// dropped for a full ring), and the outstanding ops hold less than an
    /// arena's bytes (so a trainer cannot make the daemon copy its arena out
    /// many times over by resubmitting). A trainer that keeps at most a
    /// completion ring's worth of ops in flight, on distinct tensors of its
    /// arena (as `TrainerChannel` and the client do), never meets either.
    fn has_room(&self) -> bool {
        // With wild completion-ring indices only the ring's size bounds the ops
        // (their completions then fail, reported by `complete`).
        let free = self.cq.free_slots(&self.map).unwrap_or(self.geometry.cq_capacity);
        free > self.outstanding && self.outstanding_bytes < self.geometry.arena_size
    }

    /// Takes the next descriptor off the submission ring: copied out once, then
    /// validated. `Ok(None)` when the ring is empty, or when the trainer has
    /// as many ops outstanding as it may (see [`AttachmentStats::throttled`]):
    /// the rest waits on the ring, back-pressure instead of dropped completions
    /// or unbounded copies.
    pub fn next_submission(&mut self) -> Result<Option<Submission>, ChannelError> {
        if !self.has_room() {
            if self.sq.available(&self.map).unwrap_or(0) > 0 {
                self.stats.throttled += 1;
            }
            return Ok(None);
        }
        let words = match self.sq.pop(&self.map) {
            Ok(Some(w)) => w,
            Ok(None) => return Ok(None),
            Err(e) => {
                self.stats.ring_corruptions += 1;
                log::warn!("attachment {} (pid {}): {e}", self.id, self.peer.pid);
                return Err(e.into());
            }
        };
        let desc = SubmitDesc::from_words(words);
        match desc.validate(self.geometry.arena_size, &self.limits) {
            Ok(s) => {
                self.stats.submissions += 1;
                self.outstanding += 1;
                self.outstanding_bytes += s.span.bytes();
                Ok(Some(s))
            }
            Err(error) => {
                self.stats.rejected_by_code[error.code() as usize] += 1;
                log::warn!("attachment {} (pid {}): rejected descriptor: {error}", self.id, self.peer.pid);
                self.send_reason(desc.op_seq, desc.tensor_id, &format!("rejected descriptor: field {error}"));
                let c = CompletionDesc {
                    cookie: desc.cookie,
                    op_seq: desc.op_seq,
                    tensor_id: desc.tensor_id,
                    status: Status::InvalidDescriptor.to_raw(),
                    detail: error.code(),
                    ..CompletionDesc::default()
                };
                let _ = self.complete(c);
                Err(ChannelError::Rejected { op_seq: desc.op_seq, cookie: desc.cookie, error })
            }
        }
    }

    /// The absolute offset of `len_elems` elements of `size` bytes at arena
    /// byte `offset` (a multiple of `size`), if they lie inside the arena.
    fn span_check(&self, offset: u64, len_elems: u64, size: u64) -> Result<u64, ArenaError> {
        let err = self.arena_error(offset, len_elems);
        let end = len_elems.checked_mul(size).and_then(|b| b.checked_add(offset)).ok_or(err)?;
        if end > self.geometry.arena_size || offset % size != 0 {
            return Err(err);
        }
        Ok(self.geometry.arena_offset + offset)
    }

    fn arena_error(&self, offset: u64, len_elems: u64) -> ArenaError {
        ArenaError { offset, len_elems, arena_size: self.geometry.arena_size }
    }

    /// Copies `len_elems` f32 at arena byte `offset` out of shared memory.
    pub fn copy_from_arena(&self, offset: u64, len_elems: u64) -> Result<Vec<f32>, ArenaError> {
        let abs = self.span_check(offset, len_elems, 4)?;
        let mut out = vec![0f32; len_elems as usize];
        self.map.copy_out_f32(abs, &mut out).map_err(|_| self.arena_error(offset, len_elems))?;
        Ok(out)
    }

    /// Copies `out.len()` f32 at arena byte `offset` into `out` (no allocation).
    pub fn copy_from_arena_into(&self, offset: u64, out: &mut [f32]) -> Result<(), ArenaError> {
        let len_elems = out.len() as u64;
        let abs = self.span_check(offset, len_elems, 4)?;
        self.map.copy_out_f32(abs, out).map_err(|_| self.arena_error(offset, len_elems))
    }

    /// Adds the `out.len()` f32 at arena byte `offset` to `out`, in order
    /// (`out[i] += arena[i]`): the local reduce of several trainers reads each
    /// arena once, straight into the sum (no allocation, no private copy).
    pub fn add_from_arena_into(&self, offset: u64, out: &mut [f32]) -> Result<(), ArenaError> {
        let len_elems = out.len() as u64;
        let abs = self.span_check(offset, len_elems, 4)?;
        self.map.add_out_f32(abs, out).map_err(|_| self.arena_error(offset, len_elems))
    }

    /// Copies `data` into the arena at byte `offset`.
    pub fn copy_to_arena(&self, offset: u64, data: &[f32]) -> Result<(), ArenaError> {
        let len_elems = data.len() as u64;
        let abs = self.span_check(offset, len_elems, 4)?;
        self.map.copy_in_f32(abs, data).map_err(|_| self.arena_error(offset, len_elems))
    }

    /// Copies `out.len() / 2` 2-byte elements (f16, bf16) at arena byte
    /// `offset` into `out`, as their raw bytes.
    pub fn copy_u16s_from_arena_into(&self, offset: u64, out: &mut [u8]) -> Result<(), ArenaError> {
        let len_elems = out.len() as u64 / 2;
        let abs = self.span_check(offset, len_elems, 2)?;
        self.map
            .copy_out_bytes(abs, &mut out[..len_elems as usize * 2], 2)
            .map_err(|_| self.arena_error(offset, len_elems))
    }

    /// Copies the raw 2-byte elements (f16, bf16) `data` into the arena at byte `offset`.
    pub fn copy_u16s_to_arena(&self, offset: u64, data: &[u8]) -> Result<(), ArenaError> {
        let len_elems = data.len() as u64 / 2;
        let abs = self.span_check(offset, len_elems, 2)?;
        self.map
            .copy_in_bytes(abs, &data[..len_elems as usize * 2], 2)
            .map_err(|_| self.arena_error(offset, len_elems))
    }

    /// Posts a completion and rings the trainer's completion doorbell.
    pub fn complete(&mut self, c: CompletionDesc) -> Result<(), CompleteError> {
        let words: [u64; DESC_WORDS] = c.to_words();
        let r = match self.cq.push(&self.map, &words) {
            Ok(true) => Ok(()),
            Ok(false) => Err(CompleteError::Full),
            Err(e) => {
                self.stats.ring_corruptions += 1;
                Err(CompleteError::Ring(e))
            }
        };
        match &r {
            Ok(()) => {
                self.stats.completions += 1;
                if let Err(e) = self.complete_bell.ring() {
                    log::warn!("attachment {}: completion doorbell: {e}", self.id);
                }
            }
            Err(_) => self.stats.completions_dropped += 1,
        }
        r
    }

    /// Completes a valid submission with `status` and the given report, which
    /// ends it as outstanding (whether or not the completion could be posted).
    pub fn complete_submission(
        &mut self,
        s: &Submission,
        status: Status,
        delivered_ppm: u32,
        repairs: u32,
        duration: Duration,
    ) -> Result<(), CompleteError> {
        let duration_ns = u64::try_from(duration.as_nanos()).unwrap_or(u64::MAX);
        self.complete_submission_with(
            s,
            CompletionDesc { delivered_ppm, repairs, duration_ns, ..s.completion(status) },
        )
    }

    /// Completes a valid submission with `c` (built from
    /// [`Submission::completion`], e.g. with the shard of a reduce-scatter),
    /// which ends it as outstanding (whether or not `c` could be posted).
    pub fn complete_submission_with(
        &mut self,
        s: &Submission,
        c: CompletionDesc,
    ) -> Result<(), CompleteError> {
        self.outstanding = self.outstanding.saturating_sub(1);
        self.outstanding_bytes = self.outstanding_bytes.saturating_sub(s.span.bytes());
        self.complete(c)
    }
}

impl Drop for Attachment {
    fn drop(&mut self) {
        if self.claim.is_some() {
            log::info!(
                "attachment {} (pid {}) reclaimed: {} submissions, {} rejected",
                self.id,
                self.peer.pid,
                self.stats.submissions,
                self.stats.rejected()
            );
        }
    }
}
