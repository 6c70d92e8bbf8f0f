//! A second shared mapping of the segment, used only to hand out raw pointers to
//! tensor buffers for in-place access from C and Python.
//!
//! The channel's own mapping (inside [`dlcp_shm::Client`]) never exposes a
//! pointer; it reads and writes the arena by explicit copies. Trainers in C and
//! Python want to write a gradient *once*, straight into the arena, so this module
//! maps the same memfd a second time (`MAP_SHARED`: the same physical pages) and
//! computes bounds-checked pointers into it. Nothing here dereferences those
//! pointers: whoever does (C code, numpy) follows the contract documented on
//! [`crate::Client::data_ptr`].
//!
//! Ordering: the trainer's plain stores through this mapping happen before the
//! `Release` store of the submission ring's tail made by the same thread in
//! [`crate::Client::submit`]; the daemon's result stores happen before its
//! `Release` of the completion tail, which the trainer loads with `Acquire`
//! before returning the completion. Both mappings alias the same pages, which
//! the CPU keeps coherent, so the ring's synchronisation covers this view too.

use std::io;
use std::os::fd::BorrowedFd;
use std::ptr::NonNull;

use dlcp_shm::Geometry;
use rustix::mm::{MapFlags, ProtFlags};

/// The whole segment mapped read-write; unmapped on drop.
#[derive(Debug)]
pub(crate) struct ArenaView {
    base: NonNull<u8>,
    len: usize,
    arena_offset: u64,
    arena_size: u64,
}

// SAFETY: the view owns a MAP_SHARED region and only computes addresses into it;
// it never reads or writes through them, so which thread holds it is irrelevant.
unsafe impl Send for ArenaView {}
// SAFETY: `&ArenaView` only offers address arithmetic (no access), fine from any thread.
unsafe impl Sync for ArenaView {}

impl ArenaView {
    /// Maps the whole segment behind `memfd` (the daemon sealed it against
    /// shrinking, and the channel client has checked its size against `g`).
    pub(crate) fn map(memfd: BorrowedFd<'_>, g: &Geometry) -> io::Result<ArenaView> {
        let len = usize::try_from(g.total_size).map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
        if len == 0 || g.arena_offset.checked_add(g.arena_size) != Some(g.total_size) {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "segment geometry does not end with the arena",
            ));
        }
        // SAFETY: a fresh mapping at an address the kernel chooses (null hint, no
        // MAP_FIXED) cannot overlap any existing Rust object; the fd is valid for the
        // duration of the call and the mapping does not depend on it afterwards.
        let raw = unsafe {
            rustix::mm::mmap(
                core::ptr::null_mut(),
                len,
                ProtFlags::READ | ProtFlags::WRITE,
                MapFlags::SHARED,
                memfd,
                0,
            )?
        };
        let base = NonNull::new(raw.cast::<u8>()).ok_or_else(|| io::Error::other("mmap returned null"))?;
        Ok(ArenaView { base, len, arena_offset: g.arena_offset, arena_size: g.arena_size })
    }

    /// Pointer to `len_elems` f32 at arena byte `offset`, if the whole range lies
    /// inside the arena and is 4-byte aligned.
    pub(crate) fn f32_ptr(&self, offset: u64, len_elems: u64) -> Option<NonNull<f32>> {
        let end = len_elems.checked_mul(4)?.checked_add(offset)?;
        if end > self.arena_size || offset % 4 != 0 {
            return None;
        }
        let abs = usize::try_from(self.arena_offset + offset).ok()?;
        // In bounds (checked above: arena_offset + end <= total_size == len), so
        // `wrapping_add` computes exactly the address inside the mapping; no access here.
        let p = self.base.as_ptr().wrapping_add(abs).cast::<f32>();
        NonNull::new(p)
    }
}

impl Drop for ArenaView {
    fn drop(&mut self) {
        // SAFETY: `base..base + len` is exactly the region mapped in `map`, unmapped
        // once (here). No Rust reference into it exists: the view only handed out raw
        // pointers, whose users were told they die with the client.
        let r = unsafe { rustix::mm::munmap(self.base.as_ptr().cast(), self.len) };
        debug_assert!(r.is_ok(), "munmap of our own mapping failed: {r:?}");
    }
}
