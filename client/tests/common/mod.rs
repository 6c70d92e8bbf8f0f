//! Test helpers: a **fake reducer** standing in for the daemon.
//!
//! `FakeReducer` runs the daemon's real shared-memory server ([`ShmServer`]) in a
//! thread of the test process. It accepts any number of attachments and, for each
//! valid submission, copies the tensor out of the arena, **doubles** every
//! element, copies it back and completes the op with `Status::Ok` — a stand-in for
//! the allreduce (it is NOT one: nothing crosses hosts), enough to prove the client
//! path attach → write in place → submit → completion → result visible end to end.
//!
//! A reduce-scatter or allgather completes with a made-up shard (elements
//! `len/4 .. len/4 + len/2`: [`fake_shard`]); a barrier has no tensor to double.
//!
//! Two budgets trigger other behaviour so error paths can be tested:
//! [`HOLD_BUDGET_PPM`] (never completed: timeouts) and [`PEER_DOWN_BUDGET_PPM`]
//! (completed with `Status::PeerDown`, tensor untouched).
#![allow(dead_code)]

use std::os::fd::AsFd;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::thread::JoinHandle;
use std::time::Duration;

use dlcp_shm::doorbell::poll_readable;
use dlcp_shm::{
    Attachment, ChannelError, CompletionDesc, Geometry, Liveness, Opcode, ServerConfig, ShmServer, Status,
};

/// Bound for every wait in these tests.
pub const WAIT: Duration = Duration::from_secs(10);
/// Submissions with this budget are taken off the ring and never completed.
pub const HOLD_BUDGET_PPM: u32 = 99_999;
/// Submissions with this budget complete with `Status::PeerDown`, tensor untouched.
pub const PEER_DOWN_BUDGET_PPM: u32 = 99_998;
/// Delivered fraction the fake reports for every successful op.
pub const FAKE_DELIVERED_PPM: u32 = 999_000;
/// Repairs the fake reports.
pub const FAKE_REPAIRS: u32 = 3;

/// The daemon-side stand-in: serves attachments in a thread until dropped.
pub struct FakeReducer {
    dir: tempfile::TempDir,
    path: PathBuf,
    stop: Arc<AtomicBool>,
    served: Arc<AtomicU64>,
    thread: Option<JoinHandle<()>>,
}

impl FakeReducer {
    /// Starts on a fresh socket with a small segment (16-slot rings, 8 MiB arena).
    pub fn start() -> FakeReducer {
        FakeReducer::with_geometry(Geometry::new(16, 16, 8 << 20).unwrap())
    }

    /// Starts with the given segment geometry.
    pub fn with_geometry(geometry: Geometry) -> FakeReducer {
        FakeReducer::with(geometry, None)
    }

    /// Starts serving job `job` only, as a daemon does (`node.job_id`): an
    /// attachment for another job is refused, naming both.
    pub fn for_job(job: u64) -> FakeReducer {
        FakeReducer::with(Geometry::new(16, 16, 8 << 20).unwrap(), Some(job))
    }

    fn with(geometry: Geometry, job: Option<u64>) -> FakeReducer {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("dlcpd.sock");
        let mut cfg = ServerConfig::new(&path, 0o600);
        cfg.geometry = geometry;
        cfg.job_id = job;
        let server = ShmServer::bind(cfg).unwrap();
        let stop = Arc::new(AtomicBool::new(false));
        let served = Arc::new(AtomicU64::new(0));
        let thread = {
            let (stop, served) = (stop.clone(), served.clone());
            std::thread::spawn(move || serve(server, &stop, &served))
        };
        FakeReducer { dir, path, stop, served, thread: Some(thread) }
    }

    /// The control socket path.
    pub fn socket(&self) -> &Path {
        &self.path
    }

    /// A directory that lives as long as the reducer (for test artefacts).
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// Ops doubled and completed with `Status::Ok` so far.
    pub fn served(&self) -> u64 {
        self.served.load(Ordering::Relaxed)
    }

    /// Stops serving and drops every attachment (the clients see the daemon gone).
    pub fn stop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            t.join().unwrap();
        }
    }
}

impl Drop for FakeReducer {
    fn drop(&mut self) {
        self.stop();
    }
}

fn serve(mut server: ShmServer, stop: &AtomicBool, served: &AtomicU64) {
    let mut atts: Vec<Attachment> = Vec::new();
    while !stop.load(Ordering::Relaxed) {
        let ready = {
            let mut fds = vec![server.as_fd()];
            for a in &atts {
                fds.push(a.doorbell_fd());
                fds.push(a.control_fd());
            }
            poll_readable(&fds, Some(Duration::from_millis(20))).unwrap()
        };
        if ready[0] {
            // A refused or broken handshake is the client's problem; keep serving.
            if let Ok(Some(a)) = server.accept() {
                atts.push(a);
            }
        }
        atts.retain_mut(|a| {
            // Drains the doorbell (so poll sleeps again) without blocking.
            if a.wait(Some(Duration::ZERO)).is_err() {
                return false;
            }
            loop {
                let sub = match a.next_submission() {
                    Ok(Some(sub)) => sub,
                    Ok(None) => break,
                    // Rejected descriptors were completed with InvalidDescriptor already.
                    Err(ChannelError::Rejected { .. }) => continue,
                    Err(ChannelError::Ring(_)) => return false,
                };
                match sub.budget_ppm {
                    HOLD_BUDGET_PPM => {}
                    PEER_DOWN_BUDGET_PPM => {
                        let _ = a.complete_submission(&sub, Status::PeerDown, 0, 0, Duration::ZERO);
                    }
                    _ => {
                        let mut x = a.copy_from_arena(sub.span.offset, sub.span.len_elems).unwrap();
                        x.iter_mut().for_each(|v| *v *= 2.0);
                        a.copy_to_arena(sub.span.offset, &x).unwrap();
                        // Counted before completing, so a client that saw the completion sees the count.
                        served.fetch_add(1, Ordering::Relaxed);
                        let (shard_offset, shard_len) = match sub.opcode {
                            Opcode::ReduceScatter | Opcode::Allgather => fake_shard(sub.span.len_elems),
                            _ => (0, 0),
                        };
                        let c = CompletionDesc {
                            delivered_ppm: FAKE_DELIVERED_PPM,
                            repairs: FAKE_REPAIRS,
                            duration_ns: 5_000,
                            shard_offset,
                            shard_len,
                            ..sub.completion(Status::Ok)
                        };
                        let _ = a.complete_submission_with(&sub, c);
                    }
                }
            }
            a.liveness() == Liveness::Alive
        });
    }
}

/// The shard the fake reducer reports for a reduce-scatter or allgather of
/// `len` elements: (offset, length).
pub fn fake_shard(len: u64) -> (u64, u64) {
    (len / 4, len / 2)
}

/// Deterministic non-integer data whose doubles are exact.
pub fn data(seed: u64, n: usize) -> Vec<f32> {
    let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            ((s >> 40) as i64 - (1 << 23)) as f32 / 16384.0 + 1.0 / 1024.0
        })
        .collect()
}

/// The directory holding `libdlcp_client.{so,a}` for this test build: cargo puts
/// the lib's artefacts next to the test executable (`target/<profile>/deps`) and
/// uplifts copies to its parent.
pub fn lib_dir() -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    let deps = exe.parent().unwrap().to_path_buf();
    for dir in [deps.clone(), deps.parent().unwrap().to_path_buf()] {
        if dir.join("libdlcp_client.so").exists() {
            return dir;
        }
    }
    panic!("libdlcp_client.so not found next to {}", exe.display());
}

/// The workspace root.
pub fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap().to_path_buf()
}
