//! # The shared-memory channel between trainers and the daemon
//!
//! A trainer process connects to the daemon's Unix **control socket**, registers
//! (job id, local rank, local world size) and receives, by `SCM_RIGHTS`, three fds:
//! a sealed **memfd** holding its segment, a **submit doorbell** and a **completion
//! doorbell** (eventfds). Gradients then move through the segment without further
//! syscalls beyond the doorbells. Modelled on machnet (rings of buffer indices
//! into an arena, memfd over a Unix socket, socket close = app gone) and iceoryx2
//! (SPSC queues with every ordering commented, crashed peers detected and their
//! memory reclaimed, one error enum per operation).
//!
//! ## Segment layout
//!
//! One memfd per attachment. Every region starts on a 4096-byte boundary; all
//! multi-byte values are native-endian (both sides share the host).
//!
//! | offset | size | region | contents |
//! |-------:|-----:|--------|----------|
//! | 0 | 128 (page reserved) | header | 16 × u64: magic `"DLCPSHM1"`, version, header size, total size, sq offset, sq capacity, cq offset, cq capacity, sq/cq descriptor sizes, arena offset, arena size, attachment id, job id, local rank, local world ([`layout::SegmentHeader`]) |
//! | 4096 | 128 + 64·sq_cap, page-rounded | submission ring | `head` u32 @+0 (own cache line, written by the daemon), `tail` u32 @+64 (own cache line, written by the trainer), ([`layout::RingCtl`]), then `sq_cap` × 64-byte [`layout::SubmitDesc`] |
//! | after sq | 128 + 64·cq_cap, page-rounded | completion ring | same control block (daemon writes `tail`, trainer writes `head`), then `cq_cap` × 64-byte [`layout::CompletionDesc`] |
//! | after cq | arena_size (multiple of 4096) | buffer arena | tensors, each at a 64-byte-aligned offset chosen by the trainer's allocator |
//!
//! Offsets are a pure function of (sq capacity, cq capacity, arena size)
//! ([`layout::Geometry::new`]); both sides recompute them and compare: the trainer
//! checks the header against the geometry in the attach reply and against the
//! memfd's size. The daemon never reads the header back — it keeps its own
//! [`Geometry`] — so a trainer scribbling on it harms only itself.
//!
//! ## Hostile trainers
//!
//! A trainer may be buggy or hostile; it must not be able to crash the daemon,
//! make it read or write outside that trainer's own arena, or touch another
//! trainer's memory:
//! - the memfd is sealed `F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL` (and its pages
//!   allocated up front), so no truncation can SIGBUS the daemon and no later seal
//!   can make the daemon's writes fail. `F_SEAL_WRITE` is *not* set and cannot
//!   be: the trainer writes its tensors into the arena. The risk that remains is
//!   the trainer's own memory: it can rewrite or punch holes into its segment
//!   (`fallocate(PUNCH_HOLE)`; holes read back as zeros, never a SIGBUS on
//!   shmem) at any time, which changes only what its own ops contribute. The
//!   daemon reads a contribution once into memory it owns before anything of
//!   it goes on the wire (the gather phase is sent from daemon memory only),
//!   so replicas never diverge and no repair loop follows
//!   (`tests/daemon_concurrent_writer.rs`);
//! - each descriptor is copied out of its slot once (eight relaxed `AtomicU64`
//!   loads) and only the private copy is validated ([`layout::SubmitDesc::validate`],
//!   one [`DescError`] variant per rule) and used;
//! - ring indices: each side keeps a private shadow of its own index and reads only
//!   the peer's, checking `tail - head <= capacity` ([`ring`]); a wild index is a
//!   [`RingError`], never an out-of-bounds slot;
//! - tensor bytes are only ever copied with `ptr::copy_nonoverlapping` after a
//!   bounds check ([`Attachment::copy_from_arena`] / [`Attachment::copy_to_arena`]);
//!   no `&[f32]` / `&mut [f32]` is ever formed over shared memory;
//! - every rejection is counted ([`AttachmentStats`]) and answered with an
//!   [`Status::InvalidDescriptor`] completion carrying the error code, and the
//!   rule's text as the op's failure reason ([`notes`]).
//!
//! ## Failure reasons
//!
//! A completion carries a status and a number; why an op failed (the ranks a
//! timeout waited on, the descriptor field rejected) travels as a note on the
//! control socket, written just before the failed completion is posted
//! ([`Attachment::send_reason`]) and read by the trainer without blocking when it
//! sees that completion ([`TrainerChannel::failure_reason`]). The daemon never
//! blocks on it: a few notes wait for a full socket, more are dropped and
//! counted (see [`notes`]).
//!
//! All `unsafe` is in [`mapping`], each block with a `SAFETY:` comment.
//!
//! ## Wakeups
//!
//! No side spins. The producer publishes the ring tail and then rings the peer's
//! eventfd; the consumer drains the eventfd, re-checks the ring, and only then
//! sleeps in `poll` (see [`doorbell`]). The daemon can register
//! [`Attachment::doorbell_fd`] and [`Attachment::control_fd`] with mio.
//!
//! The accepted attach reply also tells the trainer where the daemon stands in
//! its job ([`JobPlace`]: its rank and the number of daemons), from which the
//! client derives the trainer's global rank and world size.
//!
//! ## Server model
//!
//! [`ShmServer`] is non-blocking: its listener fd ([`std::os::fd::AsFd`]) goes into the
//! daemon's event loop; on readiness [`ShmServer::accept_pending`] checks the peer
//! and hands back a [`Handshake`], which the loop watches and reads without
//! blocking; [`ShmServer::admit`] then checks the registration (job, attachment
//! limits, rank) before any segment is created ([`ShmServer::accept`] does all
//! of it blocking, bounded by `handshake_timeout`). An attachment takes at most
//! as many submissions as its completion ring has room for
//! ([`Attachment::next_submission`]), so no completion is dropped. The control connection closing
//! ([`Attachment::liveness`] → `Gone`/`Broken`) means the trainer is gone: the
//! daemon fails its pending ops and drops the [`Attachment`], which unmaps the
//! segment and closes its fds. Peers are checked with `SO_PEERCRED` against a
//! [`PeerPolicy`] (same uid as the daemon, allowed gids, optional hook).
//!
//! ## The two ends, and who builds on them
//!
//! - daemon end: [`ShmServer`] and one [`Attachment`] per trainer ([`server`]);
//! - trainer end: [`TrainerChannel`] ([`trainer`]), one per attachment, holding the
//!   one mapping of the segment, the rings, the doorbells and the one tensor
//!   registry of the arena: `attach`, `alloc` a named tensor, `write` / `data_ptr`,
//!   `submit`, `wait_completion`, `read`.
//!
//! What trainers program against is not this crate but `dlcp_client::Client`
//! (Rust, C ABI, Python), a thin layer over [`TrainerChannel`] that adds the user
//! rules (typed handles, argument checks, busy tensors, waiting for one op) and
//! keeps no channel state of its own. The `debug-hooks` cargo feature (off by
//! default, enabled by the tests) adds hooks that make a [`TrainerChannel`] behave
//! like a buggy or hostile trainer.
//!
//! ```no_run
//! use std::time::Duration;
//! use dlcp_shm::{Liveness, ServerConfig, ShmServer, Status, SubmitOptions, TrainerChannel};
//!
//! // Daemon side (normally inside the event loop).
//! let mut server = ShmServer::bind(ServerConfig::new("/run/dlcp/dlcpd.sock", 0o660))?;
//! server.wait_acceptable(None)?;
//! if let Some(mut att) = server.accept()? {
//!     att.wait(Some(Duration::from_secs(1)))?;
//!     while let Ok(Some(sub)) = att.next_submission() {
//!         let grad = att.copy_from_arena(sub.span.offset, sub.span.len_elems)?;
//!         // ... reduce ...
//!         att.copy_to_arena(sub.span.offset, &grad)?;
//!         att.complete_submission(&sub, Status::Ok, 1_000_000, 0, Duration::ZERO)?;
//!     }
//!     if att.liveness() != Liveness::Alive {
//!         drop(att); // reclaims the segment
//!     }
//! }
//!
//! // Trainer side.
//! let mut trainer = TrainerChannel::attach("/run/dlcp/dlcpd.sock", 0x10b, 0, 1)?;
//! let t = trainer.alloc("layer3.grad", 4096)?;
//! trainer.write(&t, &vec![0.5; 4096])?;
//! trainer.submit(&t, SubmitOptions { tensor_id: 3, layer: 3, layers: 12, budget_ppm: 10_000, ..Default::default() })?;
//! let done = trainer.wait_completion(Duration::from_secs(30))?;
//! assert_eq!(done.status, Status::Ok);
//! let reduced = trainer.read(&t)?;
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

#![deny(unsafe_code)]

pub mod alloc;
mod claim;
pub mod control;
pub mod doorbell;
pub mod handshake;
pub mod layout;
#[allow(unsafe_code)]
pub mod mapping;
pub mod notes;
pub mod ring;
pub mod server;
pub mod trainer;

pub use control::{JobPlace, PeerCred, PeerPolicy, Registration, RejectReason};
pub use handshake::Handshake;
pub use layout::{
    ArenaError, CompletionDesc, DescError, ElemType, Geometry, Limits, Opcode, Reduce, Status, Submission,
    SubmitDesc,
};
pub use ring::RingError;
pub use server::{
    AcceptError, Attachment, AttachmentStats, BindError, ChannelError, CompleteError, Liveness, ServerConfig,
    ServerStats, ShmServer, Wakeup,
};
pub use trainer::{AttachError, Completion, SubmitOptions, Tensor, TensorId, TrainerChannel, TrainerError};
