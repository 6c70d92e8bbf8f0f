//! The C ABI, declared by `client/include/dlcp.h` (keep the two in step: the
//! `c_abi` tests compile a C program against the header and check the numbers).
//!
//! Rules every entry point follows:
//! - **No panic crosses the boundary**: each body runs under `catch_unwind`; a
//!   panic becomes [`DLCP_ERR_INTERNAL`](ErrorCode::Internal).
//! - **Handles are never dereferenced**: a `dlcp_client*` is a token looked up in
//!   a process-wide registry, so NULL, garbage and detached handles give
//!   `DLCP_ERR_NULL_ARG` / `DLCP_ERR_BAD_HANDLE`, never undefined behaviour.
//!   Handle values are never reused.
//! - **Pointers from C are checked for NULL (and alignment)** before use, and
//!   output pointers are checked *before* the operation runs, so a bad output
//!   pointer never leaves a half-done operation behind.
//! - **Errors are negative codes** ([`ErrorCode`]); `dlcp_last_error` gives the
//!   message of the last failure (per handle, and per thread for calls without a
//!   live handle such as a failed `dlcp_attach`).
//! - Calls on one handle are serialised by a mutex, held while a call runs.
//!   `dlcp_wait` and `dlcp_wait_op` do not hold it while they sleep (they
//!   `poll` the completion doorbell and the control socket, then take the
//!   completion under the lock: [`wait_unlocked`]), so a thread waiting there
//!   does not delay another thread's calls on the handle. The blocking
//!   collectives (`dlcp_allreduce`, ..., `dlcp_barrier`) hold it from their
//!   submit to their completion, so no other thread's `dlcp_wait` takes
//!   their completion.

use std::cell::RefCell;
use std::collections::BTreeMap;
use std::ffi::{CStr, CString, OsStr, c_char, c_int};
use std::os::fd::AsRawFd;
use std::os::unix::ffi::OsStrExt;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use crate::{
    AttachArgs, BARRIER_TENSOR, Client, Completion, ElemType, Error, ErrorCode, Opcode, Options, Reduce,
    TensorId,
};

mod wait;
use wait::wait_unlocked;

/// Opaque client handle (`dlcp_client` in C). Never dereferenced by the library.
#[allow(non_camel_case_types)]
pub struct dlcp_client {
    _opaque: [u8; 0],
}

/// A tensor handle (`dlcp_tensor` in C): the id [`dlcp_alloc`] returned.
#[allow(non_camel_case_types)]
pub type dlcp_tensor = u32;

/// A completion (`dlcp_completion` in C), 48 bytes.
#[allow(non_camel_case_types)]
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct dlcp_completion {
    /// The op's sequence number (as returned by `dlcp_submit`).
    pub op_seq: u64,
    /// Cookie (0 for ops submitted through this ABI).
    pub cookie: u64,
    /// Time the daemon spent on the op, ns.
    pub duration_ns: u64,
    /// The tensor.
    pub tensor: dlcp_tensor,
    /// `DLCP_STATUS_*`.
    pub status: u32,
    /// Status detail (for `DLCP_STATUS_INVALID_DESCRIPTOR`: which rule was violated).
    pub detail: u32,
    /// Fraction delivered, ppm.
    pub delivered_ppm: u32,
    /// Packets repaired.
    pub repairs: u32,
    /// Zero.
    pub reserved: u32,
}

impl From<Completion> for dlcp_completion {
    fn from(c: Completion) -> Self {
        dlcp_completion {
            op_seq: c.op_seq,
            cookie: c.cookie,
            duration_ns: u64::try_from(c.duration.as_nanos()).unwrap_or(u64::MAX),
            tensor: c.tensor_id,
            status: c.status.to_raw(),
            detail: c.detail,
            delivered_ppm: c.delivered_ppm,
            repairs: c.repairs,
            reserved: 0,
        }
    }
}

/// Where a trainer stands in its job (`dlcp_world` in C), 24 bytes: see [`crate::World`].
#[allow(non_camel_case_types)]
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct dlcp_world {
    /// This trainer's global rank, `node_rank * local_world + local_rank`.
    pub rank: u32,
    /// The job's trainers on all hosts, `nodes * local_world`.
    pub size: u32,
    /// The daemon's rank among the job's daemons.
    pub node_rank: u32,
    /// The job's number of daemons (hosts).
    pub nodes: u32,
    /// This trainer's rank among the job's trainers on this host.
    pub local_rank: u32,
    /// The job's trainers on this host.
    pub local_world: u32,
}

/// What a completion waiter polls (`dlcp_wait_fds`).
#[allow(non_camel_case_types)]
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct dlcp_fds {
    /// The completion doorbell (an eventfd): readable once a completion was
    /// posted since the library last drained it.
    pub completion: c_int,
    /// The control socket: readable when the daemon wrote to it or closed it.
    pub control: c_int,
}

/// Success.
pub const DLCP_OK: c_int = 0;
/// `dlcp_attach_env`: take this rank or world size from the environment.
pub const DLCP_FROM_ENV: u32 = u32::MAX;
/// `dlcp_attach_env`: take the job id from `$DLCP_JOB`.
pub const DLCP_JOB_FROM_ENV: u64 = u64::MAX;

struct Slot {
    client: Client,
    last_error: CString,
}

type Shared = Arc<Mutex<Slot>>;

static REGISTRY: Mutex<BTreeMap<usize, Shared>> = Mutex::new(BTreeMap::new());
/// Next handle value; steps of 16 so handles look like (never-dereferenced) pointers.
static NEXT_HANDLE: AtomicUsize = AtomicUsize::new(0x00d1_c000);

thread_local! {
    /// Message of the last failure on this thread.
    static LAST_ERROR: RefCell<CString> = RefCell::new(CString::default());
    /// Buffer `dlcp_last_error` returns a handle's message from.
    static RETURNED: RefCell<CString> = RefCell::new(CString::default());
}

fn registry() -> MutexGuard<'static, BTreeMap<usize, Shared>> {
    // Registry operations cannot leave the map inconsistent, so a poisoned lock is usable.
    REGISTRY.lock().unwrap_or_else(|p| p.into_inner())
}

/// A failed call: its code and message.
#[derive(Debug)]
struct Failure {
    code: ErrorCode,
    msg: String,
}

impl Failure {
    fn new(code: ErrorCode, msg: impl Into<String>) -> Failure {
        Failure { code, msg: msg.into() }
    }
}

impl From<Error> for Failure {
    fn from(e: Error) -> Failure {
        Failure { code: e.code(), msg: e.to_string() }
    }
}

fn to_cstring(s: String) -> CString {
    CString::new(s.replace('\0', "\\0")).unwrap_or_default()
}

fn record(op: &str, handle: *mut dlcp_client, f: &Failure) {
    let msg = to_cstring(format!("{op}: {}", f.msg));
    if let Some(shared) = registry().get(&handle.addr()).cloned() {
        shared.lock().unwrap_or_else(|p| p.into_inner()).last_error = msg.clone();
    }
    LAST_ERROR.with(|l| *l.borrow_mut() = msg);
}

fn panic_message(p: &(dyn std::any::Any + Send)) -> String {
    p.downcast_ref::<&str>()
        .map(|s| (*s).to_owned())
        .or_else(|| p.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "unknown panic payload".into())
}

/// Runs an entry point's body: catches panics, records failures, returns the code.
fn guard<T>(op: &str, handle: *mut dlcp_client, f: impl FnOnce() -> Result<T, Failure>) -> Result<T, c_int> {
    let r = catch_unwind(AssertUnwindSafe(f)).unwrap_or_else(|p| {
        Err(Failure::new(
            ErrorCode::Internal,
            format!("internal error (please report): {}", panic_message(&*p)),
        ))
    });
    r.map_err(|f| {
        // Recording allocates and locks; never let even that unwind into C.
        let _ = catch_unwind(AssertUnwindSafe(|| record(op, handle, &f)));
        f.code as c_int
    })
}

fn code_of(r: Result<(), c_int>) -> c_int {
    r.err().unwrap_or(DLCP_OK)
}

fn lookup(handle: *mut dlcp_client) -> Result<Shared, Failure> {
    if handle.is_null() {
        return Err(Failure::new(ErrorCode::NullArg, "client handle is NULL"));
    }
    registry().get(&handle.addr()).cloned().ok_or_else(|| {
        Failure::new(ErrorCode::BadHandle, format!("{handle:p} is not a live dlcp_client handle"))
    })
}

fn with_client<T>(
    handle: *mut dlcp_client,
    f: impl FnOnce(&mut Client) -> Result<T, Failure>,
) -> Result<T, Failure> {
    let shared = lookup(handle)?;
    let mut slot = shared.lock().map_err(|_| {
        Failure::new(ErrorCode::Internal, "an earlier call on this handle panicked; detach it")
    })?;
    f(&mut slot.client)
}

/// Checks an output pointer before the operation runs.
fn check_out<T>(out: *mut T, what: &str) -> Result<(), Failure> {
    if out.is_null() {
        return Err(Failure::new(ErrorCode::NullArg, format!("{what} is NULL")));
    }
    if !out.is_aligned() {
        return Err(Failure::new(ErrorCode::InvalidArg, format!("{what} ({out:p}) is misaligned")));
    }
    Ok(())
}

/// Stores `v` through an output pointer already accepted by [`check_out`]
/// (a NULL optional pointer is skipped).
fn store<T>(out: *mut T, v: T) {
    if out.is_null() || !out.is_aligned() {
        return;
    }
    // SAFETY: non-null and aligned (checked just above); the header documents that
    // every output pointer must point to writable storage for one value of its type.
    unsafe { out.write(v) }
}

fn c_bytes<'a>(p: *const c_char, what: &str) -> Result<&'a [u8], Failure> {
    if p.is_null() {
        return Err(Failure::new(ErrorCode::NullArg, format!("{what} is NULL")));
    }
    // SAFETY: non-null (checked); the header documents that string arguments are
    // NUL-terminated and stay valid for the duration of the call.
    Ok(unsafe { CStr::from_ptr(p) }.to_bytes())
}

fn c_str<'a>(p: *const c_char, what: &str) -> Result<&'a str, Failure> {
    std::str::from_utf8(c_bytes(p, what)?)
        .map_err(|_| Failure::new(ErrorCode::InvalidArg, format!("{what} is not valid UTF-8")))
}

fn timeout(ms: i64) -> Duration {
    u64::try_from(ms).map(Duration::from_millis).unwrap_or(Duration::MAX)
}

/// Attaches to the daemon whose control socket is at `socket_path`, as local rank
/// `local_rank` of `local_world` trainers of job `job_id`. On success stores a new
/// handle in `*out`; on failure stores NULL there (if `out` is not NULL).
#[unsafe(no_mangle)]
pub extern "C" fn dlcp_attach(
    socket_path: *const c_char,
    job_id: u64,
    local_rank: u32,
    local_world: u32,
    out: *mut *mut dlcp_client,
) -> c_int {
    code_of(guard("dlcp_attach", core::ptr::null_mut(), || {
        check_out(out, "out (dlcp_client**)")?;
        store(out, core::ptr::null_mut());
        let path = OsStr::from_bytes(c_bytes(socket_path, "socket_path")?);
        register(Client::attach(path, job_id, local_rank, local_world)?, out);
        Ok(())
    }))
}

/// [`dlcp_attach`] with defaults from the environment, as the Python client's
/// `attach()`: a NULL `socket_path` is `$DLCP_SOCKET` (else the default
/// socket), `job_id == DLCP_JOB_FROM_ENV` is `$DLCP_JOB` (else 0),
/// `local_rank == DLCP_FROM_ENV` is `$LOCAL_RANK` (else 0) and
/// `local_world == DLCP_FROM_ENV` is `$LOCAL_WORLD_SIZE` (else 1). Any other
/// value is used as given.
#[unsafe(no_mangle)]
pub extern "C" fn dlcp_attach_env(
    socket_path: *const c_char,
    job_id: u64,
    local_rank: u32,
    local_world: u32,
    out: *mut *mut dlcp_client,
) -> c_int {
    code_of(guard("dlcp_attach_env", core::ptr::null_mut(), || {
        check_out(out, "out (dlcp_client**)")?;
        store(out, core::ptr::null_mut());
        let socket = match socket_path.is_null() {
            true => None,
            false => Some(OsStr::from_bytes(c_bytes(socket_path, "socket_path")?).into()),
        };
        let args = AttachArgs {
            socket,
            job: (job_id != DLCP_JOB_FROM_ENV).then_some(job_id),
            local_rank: (local_rank != DLCP_FROM_ENV).then_some(local_rank),
            local_world: (local_world != DLCP_FROM_ENV).then_some(local_world),
        };
        register(Client::attach_env(&args)?, out);
        Ok(())
    }))
}

fn register(client: Client, out: *mut *mut dlcp_client) {
    let id = NEXT_HANDLE.fetch_add(16, Ordering::Relaxed);
    let slot = Slot { client, last_error: CString::default() };
    registry().insert(id, Arc::new(Mutex::new(slot)));
    store(out, core::ptr::without_provenance_mut(id));
}

/// Stores where the trainer stands in its job in `*out`: its global rank, the
/// job's world size, the daemon's rank and number of daemons, its local rank
/// and local world. `DLCP_ERR_PROTOCOL` from a daemon too old to say.
#[unsafe(no_mangle)]
pub extern "C" fn dlcp_get_world(c: *mut dlcp_client, out: *mut dlcp_world) -> c_int {
    code_of(guard("dlcp_get_world", c, || {
        check_out(out, "out (dlcp_world*)")?;
        let w = with_client(c, |cl| Ok(cl.world()?))?;
        store(
            out,
            dlcp_world {
                rank: w.rank(),
                size: w.size(),
                node_rank: w.node_rank,
                nodes: w.nodes,
                local_rank: w.local_rank,
                local_world: w.local_world,
            },
        );
        Ok(())
    }))
}

/// Detaches and invalidates the handle: the daemon reclaims the segment and every
/// pointer from `dlcp_tensor_data` dies. NULL is a no-op; a handle that is not
/// live gives `DLCP_ERR_BAD_HANDLE`.
#[unsafe(no_mangle)]
pub extern "C" fn dlcp_detach(c: *mut dlcp_client) -> c_int {
    code_of(guard("dlcp_detach", core::ptr::null_mut(), || {
        if c.is_null() {
            return Ok(());
        }
        let removed = registry().remove(&c.addr());
        // Dropped here, outside the registry lock (or later by a thread still inside a call).
        match removed {
            Some(shared) => {
                drop(shared);
                Ok(())
            }
            None => {
                Err(Failure::new(ErrorCode::BadHandle, format!("{c:p} is not a live dlcp_client handle")))
            }
        }
    }))
}

/// Allocates a named f32 tensor of `len_elems` elements in the shared arena and
/// stores its handle in `*out_tensor`.
#[unsafe(no_mangle)]
pub extern "C" fn dlcp_alloc(
    c: *mut dlcp_client,
    name: *const c_char,
    len_elems: u64,
    out_tensor: *mut dlcp_tensor,
) -> c_int {
    code_of(guard("dlcp_alloc", c, || {
        check_out(out_tensor, "out_tensor")?;
        let name = c_str(name, "name")?;
        let id = with_client(c, |cl| Ok(cl.alloc(name, len_elems)?))?;
        store(out_tensor, id.0);
        Ok(())
    }))
}

/// Stores the tensor's length in elements in `*out_len`.
#[unsafe(no_mangle)]
pub extern "C" fn dlcp_tensor_len(c: *mut dlcp_client, tensor: dlcp_tensor, out_len: *mut u64) -> c_int {
    code_of(guard("dlcp_tensor_len", c, || {
        check_out(out_len, "out_len")?;
        let n = with_client(c, |cl| {
            cl.tensor(TensorId(tensor))
                .map(|t| t.len_elems)
                .ok_or_else(|| Error::UnknownTensor(tensor).into())
        })?;
        store(out_len, n);
        Ok(())
    }))
}

/// Pointer to the tensor's elements inside the shared arena, or NULL on error
/// (see `dlcp_last_error`). Valid until `dlcp_detach`. Do not read or write it
/// between `dlcp_submit` of this tensor and the receipt of its completion.
#[unsafe(no_mangle)]
pub extern "C" fn dlcp_tensor_data(c: *mut dlcp_client, tensor: dlcp_tensor) -> *mut f32 {
    guard("dlcp_tensor_data", c, || with_client(c, |cl| Ok(cl.data_ptr(TensorId(tensor))?)))
        .map(|p| p.as_ptr())
        .unwrap_or(core::ptr::null_mut())
}

fn options(layer: u32, layers: u32, budget_ppm: u32, flags: u32) -> Options {
    Options { layer, layers, budget_ppm, flags, ..Options::default() }
}

/// [`options`] with the reduction `op` (`enum dlcp_op`: 0 sum, 1 average).
fn options_op(layer: u32, layers: u32, budget_ppm: u32, flags: u32, op: u32) -> Result<Options, Failure> {
    let reduce = u8::try_from(op).ok().and_then(Reduce::from_raw).ok_or_else(|| {
        Failure::new(
            ErrorCode::InvalidArg,
            format!("op: unknown reduction {op} (DLCP_SUM 0, DLCP_AVERAGE 1)"),
        )
    })?;
    Ok(Options { reduce, ..options(layer, layers, budget_ppm, flags) })
}

/// Allocates a named tensor of `len_elems` elements of `dtype` (`enum
/// dlcp_dtype`: 1 f32, 2 f16, 3 bf16) in the shared arena and stores its
/// handle in `*out_tensor`.
#[unsafe(no_mangle)]
pub extern "C" fn dlcp_alloc_dtype(
    c: *mut dlcp_client,
    name: *const c_char,
    len_elems: u64,
    dtype: u32,
    out_tensor: *mut dlcp_tensor,
) -> c_int {
    code_of(guard("dlcp_alloc_dtype", c, || {
        check_out(out_tensor, "out_tensor")?;
        let name = c_str(name, "name")?;
        let t = u16::try_from(dtype).ok().and_then(ElemType::from_raw).ok_or_else(|| {
            Failure::new(
                ErrorCode::InvalidArg,
                format!("dtype: unknown dtype {dtype} (DLCP_F32 1, DLCP_F16 2, DLCP_BF16 3)"),
            )
        })?;
        let id = with_client(c, |cl| Ok(cl.alloc_typed(name, len_elems, t)?))?;
        store(out_tensor, id.0);
        Ok(())
    }))
}

/// Stores the tensor's element type (`enum dlcp_dtype`) in `*out_dtype`.
#[unsafe(no_mangle)]
pub extern "C" fn dlcp_tensor_dtype(c: *mut dlcp_client, tensor: dlcp_tensor, out_dtype: *mut u32) -> c_int {
    code_of(guard("dlcp_tensor_dtype", c, || {
        check_out(out_dtype, "out_dtype")?;
        let t = with_client(c, |cl| {
            cl.tensor(TensorId(tensor)).map(|t| t.dtype).ok_or_else(|| Error::UnknownTensor(tensor).into())
        })?;
        store(out_dtype, t as u32);
        Ok(())
    }))
}

/// `dlcp_submit` with a reduction `op` (`enum dlcp_op`).
#[unsafe(no_mangle)]
pub extern "C" fn dlcp_submit_op(
    c: *mut dlcp_client,
    tensor: dlcp_tensor,
    layer: u32,
    layers: u32,
    budget_ppm: u32,
    flags: u32,
    op: u32,
    out_op_seq: *mut u64,
) -> c_int {
    submit_with("dlcp_submit_op", c, tensor, || options_op(layer, layers, budget_ppm, flags, op), out_op_seq)
}

/// `dlcp_allreduce` with a reduction `op` (`enum dlcp_op`).
#[unsafe(no_mangle)]
pub extern "C" fn dlcp_allreduce_op(
    c: *mut dlcp_client,
    tensor: dlcp_tensor,
    layer: u32,
    layers: u32,
    budget_ppm: u32,
    flags: u32,
    op: u32,
    timeout_ms: i64,
    out: *mut dlcp_completion,
) -> c_int {
    let opts = || options_op(layer, layers, budget_ppm, flags, op);
    allreduce_with("dlcp_allreduce_op", c, tensor, opts, timeout_ms, out)
}

/// Submits an allreduce of `tensor`; stores its op sequence number in
/// `*out_op_seq` (which may be NULL). The result replaces the tensor's contents
/// when the completion arrives.
#[unsafe(no_mangle)]
pub extern "C" fn dlcp_submit(
    c: *mut dlcp_client,
    tensor: dlcp_tensor,
    layer: u32,
    layers: u32,
    budget_ppm: u32,
    flags: u32,
    out_op_seq: *mut u64,
) -> c_int {
    submit_with("dlcp_submit", c, tensor, || Ok(options(layer, layers, budget_ppm, flags)), out_op_seq)
}

/// The body of `dlcp_submit` and `dlcp_submit_op` (`name` is the one called).
fn submit_with(
    name: &str,
    c: *mut dlcp_client,
    tensor: dlcp_tensor,
    opts: impl FnOnce() -> Result<Options, Failure>,
    out_op_seq: *mut u64,
) -> c_int {
    code_of(guard(name, c, || {
        if !out_op_seq.is_null() {
            check_out(out_op_seq, "out_op_seq")?;
        }
        let o = opts()?;
        let seq = with_client(c, |cl| Ok(cl.submit(TensorId(tensor), o)?))?;
        store(out_op_seq, seq);
        Ok(())
    }))
}

/// What a completion just received reports as a failure, with the daemon's
/// reason (`None` if it is OK): the C wrappers make it the handle's last error.
fn failure_of(cl: &mut Client, done: Completion) -> Option<Failure> {
    cl.check(TensorId(done.tensor_id), done).err().map(Failure::from)
}

/// Waits for the next completion of any op: `timeout_ms < 0` waits indefinitely,
/// `0` only polls. `DLCP_OK` means `*out` holds a completion — check its status;
/// a failed one also sets `dlcp_last_error(c)` to why it failed. Does not hold
/// the handle while it sleeps ([`wait_unlocked`]).
#[unsafe(no_mangle)]
pub extern "C" fn dlcp_wait(c: *mut dlcp_client, timeout_ms: i64, out: *mut dlcp_completion) -> c_int {
    code_of(guard("dlcp_wait", c, || {
        check_out(out, "out_completion")?;
        let (done, failed) = wait_unlocked(c, timeout(timeout_ms), |cl, look| {
            let done = cl.wait(look)?;
            Ok((done, failure_of(cl, done)))
        })?;
        store(out, done.into());
        if let Some(f) = failed {
            record("dlcp_wait", c, &f);
        }
        Ok(())
    }))
}

/// Stores in `*out` the descriptors a completion waiter may `poll` for
/// readability itself, beside descriptors of its own (an event loop;
/// `dlcp_wait` does the same inside and does not hold the handle while it
/// sleeps either, [`wait_unlocked`]). When
/// either is readable, call `dlcp_wait` with timeout 0 until it gives
/// `DLCP_ERR_TIMEOUT` (when only `control` is readable, a timeout of a few
/// milliseconds: that is how a daemon that closed it is noticed), then poll
/// again; no completion is missed (`dlcp_wait` drains the doorbell before its
/// last look). The descriptors belong to the handle: valid until
/// `dlcp_detach`, never to be read, written or closed by the caller.
#[unsafe(no_mangle)]
pub extern "C" fn dlcp_wait_fds(c: *mut dlcp_client, out: *mut dlcp_fds) -> c_int {
    code_of(guard("dlcp_wait_fds", c, || {
        check_out(out, "out (dlcp_fds*)")?;
        let [completion, control] = with_client(c, |cl| Ok(cl.completion_fds().map(|fd| fd.as_raw_fd())))?;
        store(out, dlcp_fds { completion, control });
        Ok(())
    }))
}

/// Waits for the completion of op `op_seq` (others arriving meanwhile are kept
/// for `dlcp_wait`). Timeouts as for `dlcp_wait`.
#[unsafe(no_mangle)]
pub extern "C" fn dlcp_wait_op(
    c: *mut dlcp_client,
    op_seq: u64,
    timeout_ms: i64,
    out: *mut dlcp_completion,
) -> c_int {
    code_of(guard("dlcp_wait_op", c, || {
        check_out(out, "out_completion")?;
        let (done, failed) = wait_unlocked(c, timeout(timeout_ms), |cl, look| {
            let done = cl.wait_for(op_seq, look)?;
            Ok((done, failure_of(cl, done)))
        })?;
        store(out, done.into());
        if let Some(f) = failed {
            record("dlcp_wait_op", c, &f);
        }
        Ok(())
    }))
}

/// Submits an allreduce of `tensor` and waits for it. `DLCP_OK` only if it
/// completed with `DLCP_STATUS_OK`; `DLCP_ERR_OP_FAILED` if it completed with
/// another status. `*out` (which may be NULL) receives the completion in both cases.
#[unsafe(no_mangle)]
pub extern "C" fn dlcp_allreduce(
    c: *mut dlcp_client,
    tensor: dlcp_tensor,
    layer: u32,
    layers: u32,
    budget_ppm: u32,
    flags: u32,
    timeout_ms: i64,
    out: *mut dlcp_completion,
) -> c_int {
    let opts = || Ok(options(layer, layers, budget_ppm, flags));
    allreduce_with("dlcp_allreduce", c, tensor, opts, timeout_ms, out)
}

/// The body of `dlcp_allreduce` and `dlcp_allreduce_op` (`name` is the one called).
fn allreduce_with(
    name: &str,
    c: *mut dlcp_client,
    tensor: dlcp_tensor,
    opts: impl FnOnce() -> Result<Options, Failure>,
    timeout_ms: i64,
    out: *mut dlcp_completion,
) -> c_int {
    let none = (core::ptr::null_mut(), core::ptr::null_mut());
    collective_with(name, c, Some(tensor), opts, timeout_ms, out, none)
}

/// Submit + wait of any collective (`tensor` None: a barrier): the body of
/// `dlcp_allreduce*`, `dlcp_reduce_scatter`, `dlcp_allgather`,
/// `dlcp_broadcast` and `dlcp_barrier` (`name` is the one called). `*out`
/// and the shard's `(*offset, *len)` are optional (NULL); the shard is
/// stored when the op completed OK.
fn collective_with(
    name: &str,
    c: *mut dlcp_client,
    tensor: Option<dlcp_tensor>,
    opts: impl FnOnce() -> Result<Options, Failure>,
    timeout_ms: i64,
    out: *mut dlcp_completion,
    shard: (*mut u64, *mut u64),
) -> c_int {
    code_of(guard(name, c, || {
        if !out.is_null() {
            check_out(out, "out_completion")?;
        }
        for (p, what) in [(shard.0, "out_shard_offset"), (shard.1, "out_shard_len")] {
            if !p.is_null() {
                check_out(p, what)?;
            }
        }
        let o = opts()?;
        let (done, checked) = with_client(c, |cl| {
            let (seq, id) = match tensor {
                Some(t) => (cl.submit(TensorId(t), o)?, TensorId(t)),
                None => (cl.submit_barrier(o)?, BARRIER_TENSOR),
            };
            let done = cl.wait_for(seq, timeout(timeout_ms))?;
            Ok((done, cl.check(id, done)))
        })?;
        store(out, done.into());
        let report = checked.map_err(Failure::from)?;
        store(shard.0, report.shard_offset);
        store(shard.1, report.shard_len);
        Ok(())
    }))
}

/// Reduce-scatter `tensor` (reduction `op`, `enum dlcp_op`) and wait: this
/// host's shard, `*out_shard_offset .. + *out_shard_len` (both optional),
/// holds the reduced values; the rest of the tensor is left as it was.
#[unsafe(no_mangle)]
pub extern "C" fn dlcp_reduce_scatter(
    c: *mut dlcp_client,
    tensor: dlcp_tensor,
    layer: u32,
    layers: u32,
    budget_ppm: u32,
    flags: u32,
    op: u32,
    timeout_ms: i64,
    out: *mut dlcp_completion,
    out_shard_offset: *mut u64,
    out_shard_len: *mut u64,
) -> c_int {
    let opts = || Ok(options_op(layer, layers, budget_ppm, flags, op)?.collective(Opcode::ReduceScatter));
    let shard = (out_shard_offset, out_shard_len);
    collective_with("dlcp_reduce_scatter", c, Some(tensor), opts, timeout_ms, out, shard)
}

/// Allgather `tensor` and wait: this host contributes its shard,
/// `*out_shard_offset .. + *out_shard_len` (both optional); the whole tensor
/// is replaced by every host's shard. `budget_ppm`: its one phase's budget.
#[unsafe(no_mangle)]
pub extern "C" fn dlcp_allgather(
    c: *mut dlcp_client,
    tensor: dlcp_tensor,
    layer: u32,
    layers: u32,
    budget_ppm: u32,
    timeout_ms: i64,
    out: *mut dlcp_completion,
    out_shard_offset: *mut u64,
    out_shard_len: *mut u64,
) -> c_int {
    let opts = || Ok(options(layer, layers, budget_ppm, 0).collective(Opcode::Allgather));
    let shard = (out_shard_offset, out_shard_len);
    collective_with("dlcp_allgather", c, Some(tensor), opts, timeout_ms, out, shard)
}

/// Broadcast `tensor` from local rank 0 of the host of daemon rank `root`
/// and wait: every trainer's tensor is replaced by it (exact with budget 0).
#[unsafe(no_mangle)]
pub extern "C" fn dlcp_broadcast(
    c: *mut dlcp_client,
    tensor: dlcp_tensor,
    root: u32,
    layer: u32,
    layers: u32,
    budget_ppm: u32,
    timeout_ms: i64,
    out: *mut dlcp_completion,
) -> c_int {
    let opts = || Ok(options(layer, layers, budget_ppm, 0).collective(Opcode::Broadcast).root(root));
    let none = (core::ptr::null_mut(), core::ptr::null_mut());
    collective_with("dlcp_broadcast", c, Some(tensor), opts, timeout_ms, out, none)
}

/// Wait until every trainer of the job has entered this barrier (no tensor).
#[unsafe(no_mangle)]
pub extern "C" fn dlcp_barrier(c: *mut dlcp_client, timeout_ms: i64, out: *mut dlcp_completion) -> c_int {
    let none = (core::ptr::null_mut(), core::ptr::null_mut());
    collective_with("dlcp_barrier", c, None, || Ok(Options::default()), timeout_ms, out, none)
}

/// Stores the op sequence number the next submit will use in `*out_seq`.
#[unsafe(no_mangle)]
pub extern "C" fn dlcp_next_op_seq(c: *mut dlcp_client, out_seq: *mut u64) -> c_int {
    code_of(guard("dlcp_next_op_seq", c, || {
        check_out(out_seq, "out_seq")?;
        let seq = with_client(c, |cl| Ok(cl.next_op_seq()))?;
        store(out_seq, seq);
        Ok(())
    }))
}

/// Sets the op sequence number the next submit uses (every trainer of a job must
/// submit the same sequence of ops; after a failure they agree where to continue).
/// `DLCP_ERR_INVALID_ARG` if an op in flight has a sequence number `>= seq`.
#[unsafe(no_mangle)]
pub extern "C" fn dlcp_set_next_op_seq(c: *mut dlcp_client, seq: u64) -> c_int {
    code_of(guard("dlcp_set_next_op_seq", c, || with_client(c, |cl| Ok(cl.set_next_op_seq(seq)?))))
}

/// Static description of an error code (any int; never NULL).
#[unsafe(no_mangle)]
pub extern "C" fn dlcp_strerror(code: c_int) -> *const c_char {
    if code == DLCP_OK {
        return c"success".as_ptr();
    }
    ErrorCode::from_raw(code).map(|e| e.message()).unwrap_or(c"unknown dlcp error code").as_ptr()
}

/// Static name of a completion status (`"ok"`, `"timeout"`, ...; never NULL).
#[unsafe(no_mangle)]
pub extern "C" fn dlcp_status_str(status: u32) -> *const c_char {
    match status {
        0 => c"ok",
        1 => c"invalid_descriptor",
        2 => c"timeout",
        3 => c"peer_down",
        4 => c"shutdown",
        _ => c"unknown",
    }
    .as_ptr()
}

/// Message of the last failed call on handle `c`, or, for `c == NULL`, of the
/// last failed call on this thread (e.g. a failed `dlcp_attach`). `""` if none.
/// Never NULL; valid until the next `dlcp_*` call on this thread.
#[unsafe(no_mangle)]
pub extern "C" fn dlcp_last_error(c: *mut dlcp_client) -> *const c_char {
    let r = catch_unwind(AssertUnwindSafe(|| {
        if c.is_null() {
            return LAST_ERROR.with(|l| l.borrow().as_ptr());
        }
        let msg = match registry().get(&c.addr()).cloned() {
            Some(shared) => shared.lock().unwrap_or_else(|p| p.into_inner()).last_error.clone(),
            None => to_cstring(format!("dlcp_last_error: {c:p} is not a live dlcp_client handle")),
        };
        RETURNED.with(|r| {
            *r.borrow_mut() = msg;
            r.borrow().as_ptr()
        })
    }));
    r.unwrap_or(c"internal error while reading the last error".as_ptr())
}

/// The library version, e.g. `"0.1.0"` (static, never NULL).
#[unsafe(no_mangle)]
pub extern "C" fn dlcp_version() -> *const c_char {
    const V: &CStr = match CStr::from_bytes_with_nul(concat!(env!("CARGO_PKG_VERSION"), "\0").as_bytes()) {
        Ok(v) => v,
        Err(_) => c"unknown",
    };
    V.as_ptr()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_panic_becomes_an_internal_error_with_a_message() {
        let r: Result<(), c_int> = guard("dlcp_test", core::ptr::null_mut(), || panic!("boom"));
        assert_eq!(r, Err(ErrorCode::Internal as c_int));
        // SAFETY: dlcp_last_error never returns NULL and its string is NUL-terminated.
        let msg = unsafe { CStr::from_ptr(dlcp_last_error(core::ptr::null_mut())) };
        assert_eq!(msg.to_str().unwrap(), "dlcp_test: internal error (please report): boom");
    }

    #[test]
    fn completion_is_48_bytes_with_the_header_offsets() {
        assert_eq!(size_of::<dlcp_completion>(), 48);
        assert_eq!(core::mem::offset_of!(dlcp_completion, tensor), 24);
        assert_eq!(core::mem::offset_of!(dlcp_completion, reserved), 44);
    }

    #[test]
    fn version_is_the_crate_version() {
        // SAFETY: static NUL-terminated string.
        let v = unsafe { CStr::from_ptr(dlcp_version()) };
        assert_eq!(v.to_str().unwrap(), crate::VERSION);
    }
}
