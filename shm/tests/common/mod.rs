//! Helpers shared by this crate's integration tests (`channel`, `hostile`): a
//! daemon-side serving loop in a thread, an in-process server/trainer pair,
//! child processes that are killed on drop, and deterministic test data.
#![allow(dead_code)]

use std::io::{BufRead, BufReader};
use std::os::fd::{AsFd, BorrowedFd};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdout, Command, Stdio};
use std::sync::Arc;
use std::sync::mpsc::{Receiver, Sender, channel};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use dlcp_shm::doorbell::{Doorbell, poll_readable};
use dlcp_shm::{
    Attachment, AttachmentStats, ChannelError, Liveness, PeerCred, Registration, ServerConfig, ShmServer,
    Status, Submission, TrainerChannel,
};

/// Bound for every wait in these tests.
pub const WAIT: Duration = Duration::from_secs(10);

/// Tensor id the test daemon holds without completing (an op "in flight").
pub const HOLD_TENSOR: u32 = 999;

/// What the daemon does to every element: result = x * 2 + 0.5 (exact in f32 for our data).
pub fn transform(x: f32) -> f32 {
    x * 2.0 + 0.5
}

/// Deterministic non-integer test data.
pub fn data(seed: u64, n: usize) -> Vec<f32> {
    let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            // Multiples of 1/1024 in [-512, 512): non-integer, and x*2+0.5 is exact.
            ((s >> 40) as i64 - (1 << 23)) as f32 / 16384.0 + 1.0 / 1024.0
        })
        .collect()
}

/// A server config on a fresh socket in `dir`, small geometry.
pub fn config(dir: &Path) -> ServerConfig {
    let mut cfg = ServerConfig::new(dir.join("dlcpd.sock"), 0o600);
    cfg.geometry = dlcp_shm::Geometry::new(16, 16, 8 << 20).unwrap();
    cfg.handshake_timeout = Duration::from_secs(2);
    cfg
}

/// Accepts one client in-process: the client attaches from a helper thread while
/// this thread accepts. Returns the server, the daemon side and the client.
pub fn pair(cfg: ServerConfig, job: u64) -> (ShmServer, Attachment, TrainerChannel) {
    let path = cfg.socket_path.clone();
    let mut server = ShmServer::bind(cfg).unwrap();
    let t = std::thread::spawn(move || TrainerChannel::attach(&path, job, 0, 1));
    let deadline = Instant::now() + WAIT;
    let att = loop {
        assert!(Instant::now() < deadline, "no connection");
        server.wait_acceptable(Some(WAIT)).unwrap();
        if let Some(a) = server.accept().unwrap() {
            break a;
        }
    };
    let client = t.join().unwrap().unwrap();
    (server, att, client)
}

/// Attaches one client to an already bound server (client in a helper thread).
pub fn attach_one(server: &mut ShmServer, job: u64, rank: u32, world: u32) -> (Attachment, TrainerChannel) {
    let path = server.socket_path().to_owned();
    let t = std::thread::spawn(move || TrainerChannel::attach(&path, job, rank, world));
    let deadline = Instant::now() + WAIT;
    let att = loop {
        assert!(Instant::now() < deadline, "no connection");
        server.wait_acceptable(Some(WAIT)).unwrap();
        if let Some(a) = server.accept().unwrap() {
            break a;
        }
    };
    (att, t.join().unwrap().unwrap())
}

/// Open fds of this process.
pub fn open_fds() -> usize {
    std::fs::read_dir("/proc/self/fd").unwrap().count()
}

/// Mappings of dlcp segments in this process.
pub fn segment_mappings() -> usize {
    std::fs::read_to_string("/proc/self/maps").unwrap().lines().filter(|l| l.contains("dlcp-seg-")).count()
}

/// Events the test daemon reports.
#[derive(Debug)]
pub enum Event {
    /// A trainer attached.
    Attached { id: u64, peer: PeerCred, reg: Registration },
    /// A connection was refused or failed.
    AcceptFailed(String),
    /// A descriptor was rejected.
    Rejected { id: u64, code: u32 },
    /// A valid op was served.
    Served { id: u64, op_seq: u64, len: u64 },
    /// An op was held (tensor HOLD_TENSOR).
    Held { id: u64, op_seq: u64 },
    /// Ring indices were corrupted.
    Corrupted { id: u64 },
    /// A completion could not be posted.
    CompleteFailed { id: u64, error: String },
    /// A trainer is gone; its segment was reclaimed and `pending_failed` held ops failed.
    Detached { id: u64, liveness: Liveness, stats: AttachmentStats, pending_failed: usize, live_after: usize },
}

/// A daemon-side serving loop in a thread: accepts trainers, serves each op by
/// copying the tensor out, applying [`transform`] and copying it back, completes it,
/// and reclaims trainers whose control socket closes. Sleeps in `poll`; never spins.
pub struct TestDaemon {
    pub path: PathBuf,
    pub events: Receiver<Event>,
    stop: Arc<Doorbell>,
    thread: Option<JoinHandle<()>>,
}

impl TestDaemon {
    pub fn start(cfg: ServerConfig) -> TestDaemon {
        let path = cfg.socket_path.clone();
        let server = ShmServer::bind(cfg).unwrap();
        let stop = Arc::new(Doorbell::new().unwrap());
        let (tx, events) = channel();
        let stop2 = stop.clone();
        let thread = std::thread::spawn(move || serve(server, &stop2, tx));
        TestDaemon { path, events, stop, thread: Some(thread) }
    }

    /// The next event matching `pred`, skipping others; panics after [`WAIT`].
    pub fn expect<T>(&self, what: &str, mut pred: impl FnMut(&Event) -> Option<T>) -> T {
        let deadline = Instant::now() + WAIT;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.events.recv_timeout(left) {
                Ok(e) => {
                    if let Some(t) = pred(&e) {
                        return t;
                    }
                }
                Err(_) => panic!("timed out waiting for {what}"),
            }
        }
    }
}

impl Drop for TestDaemon {
    fn drop(&mut self) {
        let _ = self.stop.ring();
        if let Some(t) = self.thread.take() {
            let r = t.join();
            if r.is_err() && !std::thread::panicking() {
                panic!("daemon thread panicked");
            }
        }
    }
}

struct Served {
    att: Attachment,
    held: Vec<Submission>,
}

fn serve(mut server: ShmServer, stop: &Doorbell, tx: Sender<Event>) {
    let mut atts: Vec<Served> = Vec::new();
    loop {
        let ready = {
            let mut fds: Vec<BorrowedFd<'_>> = vec![server.as_fd(), stop.as_fd()];
            for a in &atts {
                fds.push(a.att.doorbell_fd());
                fds.push(a.att.control_fd());
            }
            poll_readable(&fds, Some(Duration::from_secs(1))).unwrap()
        };
        if ready[1] {
            return;
        }
        if ready[0] {
            loop {
                match server.accept() {
                    Ok(Some(a)) => {
                        let _ =
                            tx.send(Event::Attached { id: a.id(), peer: a.peer(), reg: a.registration() });
                        atts.push(Served { att: a, held: Vec::new() });
                    }
                    Ok(None) => break,
                    Err(e) => {
                        let _ = tx.send(Event::AcceptFailed(e.to_string()));
                    }
                }
            }
        }
        let mut gone = Vec::new();
        for (i, s) in atts.iter_mut().enumerate() {
            let control = ready.get(2 + 2 * i + 1).copied().unwrap_or(false);
            // Drains the doorbell (zero timeout) so poll sleeps next time.
            let _ = s.att.wait(Some(Duration::ZERO));
            serve_ring(s, &tx);
            if control {
                let l = s.att.liveness();
                if l != Liveness::Alive {
                    gone.push((i, l));
                }
            }
        }
        for (i, liveness) in gone.into_iter().rev() {
            let s = atts.remove(i);
            let (id, stats, pending_failed) = (s.att.id(), s.att.stats(), s.held.len());
            drop(s); // reclaims the segment; the held ops fail (their trainer is gone)
            let live_after = server.live_attachments();
            let _ = tx.send(Event::Detached { id, liveness, stats, pending_failed, live_after });
        }
    }
}

fn serve_ring(s: &mut Served, tx: &Sender<Event>) {
    let id = s.att.id();
    loop {
        match s.att.next_submission() {
            Ok(None) => return,
            Ok(Some(sub)) => {
                if sub.tensor_id == HOLD_TENSOR {
                    s.held.push(sub);
                    let _ = tx.send(Event::Held { id, op_seq: sub.op_seq });
                    continue;
                }
                let t0 = Instant::now();
                let mut v = s.att.copy_from_arena(sub.span.offset, sub.span.len_elems).unwrap();
                for x in &mut v {
                    *x = transform(*x);
                }
                s.att.copy_to_arena(sub.span.offset, &v).unwrap();
                match s.att.complete_submission(&sub, Status::Ok, 1_000_000, 0, t0.elapsed()) {
                    Ok(()) => {
                        let _ = tx.send(Event::Served { id, op_seq: sub.op_seq, len: sub.span.len_elems });
                    }
                    Err(e) => {
                        let _ = tx.send(Event::CompleteFailed { id, error: e.to_string() });
                    }
                }
            }
            Err(ChannelError::Rejected { error, .. }) => {
                let _ = tx.send(Event::Rejected { id, code: error.code() });
            }
            Err(ChannelError::Ring(_)) => {
                let _ = tx.send(Event::Corrupted { id });
                return;
            }
        }
    }
}

/// A child process of this test binary, SIGKILLed and reaped on drop.
pub struct ChildGuard {
    pub child: Child,
    pub stdout: BufReader<ChildStdout>,
}

impl ChildGuard {
    /// Runs this test binary's test `entry` as a child with `DLCP_SHM_CHILD=mode`
    /// and `DLCP_SHM_SOCK=socket`.
    pub fn spawn(entry: &str, mode: &str, socket: &Path) -> ChildGuard {
        let mut child = Command::new(std::env::current_exe().unwrap())
            .args([entry, "--exact", "--nocapture", "--test-threads=1"])
            .env("DLCP_SHM_CHILD", mode)
            .env("DLCP_SHM_SOCK", socket)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap();
        let stdout = BufReader::new(child.stdout.take().unwrap());
        ChildGuard { child, stdout }
    }

    pub fn pid(&self) -> i32 {
        self.child.id() as i32
    }

    /// Reads stdout until a line starting with `CHILD:` + `tag`; returns the rest.
    pub fn expect_line(&mut self, tag: &str) -> String {
        let want = format!("CHILD:{tag}");
        let mut line = String::new();
        loop {
            line.clear();
            let n = self.stdout.read_line(&mut line).unwrap();
            assert!(n > 0, "child exited before printing {want}");
            if let Some(rest) = line.trim_end().strip_prefix(&want) {
                return rest.trim().to_owned();
            }
        }
    }

    /// Waits (bounded) for the child to exit; returns whether it succeeded.
    pub fn wait_success(&mut self) -> bool {
        let deadline = Instant::now() + WAIT;
        loop {
            if let Some(st) = self.child.try_wait().unwrap() {
                return st.success();
            }
            assert!(Instant::now() < deadline, "child did not exit");
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for ChildGuard {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Round-trips tensors of `sizes` through a served attachment and checks every bit.
pub fn round_trip(client: &mut TrainerChannel, seed: u64, sizes: &[usize]) {
    for (k, &n) in sizes.iter().enumerate() {
        let name = format!("t{seed}-{k}");
        let t = client.alloc(&name, n as u64).unwrap();
        let input = data(seed * 1000 + k as u64, n);
        client.write(&t, &input).unwrap();
        let opts = dlcp_shm::SubmitOptions {
            tensor_id: k as u32,
            layer: k as u32,
            layers: sizes.len() as u32,
            budget_ppm: 10_000,
            cookie: 0xC0FFEE00 + k as u64,
            ..Default::default()
        };
        let seq = client.submit(&t, opts).unwrap();
        let c = client.wait_completion(WAIT).unwrap();
        assert_eq!(c.status, Status::Ok, "size {n}");
        assert_eq!((c.op_seq, c.cookie, c.tensor_id), (seq, opts.cookie, k as u32));
        assert_eq!(c.delivered_ppm, 1_000_000);
        let out = client.read(&t).unwrap();
        let want: Vec<u32> = input.iter().map(|&x| transform(x).to_bits()).collect();
        let got: Vec<u32> = out.iter().map(|x| x.to_bits()).collect();
        assert!(got == want, "size {n}: result differs from the daemon's transform");
        client.free(&name).unwrap();
    }
}
