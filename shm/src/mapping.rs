//! The only module of the channel with `unsafe`: creating the sealed memfd,
//! mapping it, and every access to the mapped bytes.
//!
//! Nothing here hands out a reference to non-atomic shared memory. Accesses are:
//! - ring indices: `&AtomicU32` over aligned words at offsets from a trusted
//!   [`Geometry`](super::layout::Geometry) (never from a descriptor);
//! - descriptors and the header: word-by-word `AtomicU64` loads and stores, so a
//!   descriptor is copied out exactly once into a local value;
//! - tensor data: `ptr::copy_nonoverlapping` between the mapping and a private
//!   buffer, after a bounds check that returns an error instead of panicking;
//! - in-place tensor access for the trainer's C and Python users: a bounds-checked
//!   raw pointer ([`Mapping::f32_ptr`]), never dereferenced here; whoever does
//!   follows the contract on `TrainerChannel::data_ptr`.
//!
//! The other process is outside Rust's memory model. It may write any bytes at any
//! time; we never let that produce UB on our side: an atomic word read returns
//! *some* value, and a byte copy racing with the trainer's writes gives torn but
//! valid `f32` bit patterns (every bit pattern is a valid `f32`), which only harms
//! that trainer's own result.

use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

use rustix::fs::{FallocateFlags, MemfdFlags, SealFlags};
use rustix::mm::{MapFlags, ProtFlags};
use thiserror::Error;

/// A byte range that does not lie inside the mapping (or is misaligned for its type).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Error)]
#[error("{len} bytes at offset {offset} are outside the {size}-byte mapping or misaligned")]
pub struct OutOfBounds {
    /// Requested offset.
    pub offset: u64,
    /// Requested length in bytes.
    pub len: u64,
    /// Size of the mapping.
    pub size: u64,
}

/// Creates the memfd for a segment of `size` bytes: sized, its pages allocated up
/// front (so a later write cannot SIGBUS on a full tmpfs), then sealed against
/// shrinking, growing and further sealing.
pub fn create_sealed_memfd(name: &str, size: u64) -> io::Result<OwnedFd> {
    let fd = rustix::fs::memfd_create(name, MemfdFlags::CLOEXEC | MemfdFlags::ALLOW_SEALING)?;
    rustix::fs::ftruncate(&fd, size)?;
    rustix::fs::fallocate(&fd, FallocateFlags::empty(), 0, size)?;
    // SHRINK: a trainer cannot truncate the file under our mapping (SIGBUS).
    // GROW: the size is the geometry's, forever. SEAL: nobody can add seals later
    // (F_SEAL_WRITE/FUTURE_WRITE would otherwise let a trainer make our writes fail).
    rustix::fs::fcntl_add_seals(&fd, SealFlags::SHRINK | SealFlags::GROW | SealFlags::SEAL)?;
    Ok(fd)
}

/// A shared read-write mapping of a whole memfd. Unmapped on drop.
#[derive(Debug)]
pub struct Mapping {
    ptr: NonNull<u8>,
    len: usize,
}

// SAFETY: `Mapping` owns a MAP_SHARED region; all access through it goes via atomics
// or explicit copies through raw pointers, none of which depend on the thread.
unsafe impl Send for Mapping {}
// SAFETY: as above: `&Mapping` exposes only atomic access and copies, which are
// fine from several threads (the memory is shared with another process anyway).
unsafe impl Sync for Mapping {}

impl Mapping {
    /// Maps `len` bytes of `fd` shared and read-write. The caller has checked that
    /// the file is at least `len` bytes and sealed against shrinking (the daemon
    /// created it so; the client trusts the daemon).
    pub fn map(fd: BorrowedFd<'_>, len: u64) -> io::Result<Mapping> {
        let len_usize = usize::try_from(len).map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
        if len_usize == 0 {
            return Err(io::Error::from(io::ErrorKind::InvalidInput));
        }
        // SAFETY: a fresh mapping at an address the kernel picks (null hint, no
        // MAP_FIXED) cannot alias any existing Rust object. The fd stays valid for the
        // call; the mapping outlives the fd independently.
        let raw = unsafe {
            rustix::mm::mmap(
                core::ptr::null_mut(),
                len_usize,
                ProtFlags::READ | ProtFlags::WRITE,
                MapFlags::SHARED,
                fd,
                0,
            )?
        };
        let ptr = NonNull::new(raw.cast::<u8>()).ok_or_else(|| io::Error::from(io::ErrorKind::Other))?;
        Ok(Mapping { ptr, len: len_usize })
    }

    /// Size of the mapping in bytes.
    pub fn len(&self) -> u64 {
        self.len as u64
    }

    /// Always false: a mapping is never empty.
    pub fn is_empty(&self) -> bool {
        false
    }

    fn check(&self, offset: u64, len: u64, align: u64) -> Result<usize, OutOfBounds> {
        let oob = OutOfBounds { offset, len, size: self.len as u64 };
        let end = offset.checked_add(len).ok_or(oob)?;
        if end > self.len as u64 || offset % align != 0 {
            return Err(oob);
        }
        Ok(offset as usize)
    }

    /// The atomic u32 at `offset`. Panics if `offset` is out of bounds or
    /// misaligned: offsets here come from a validated geometry, never from the peer.
    pub fn atomic_u32(&self, offset: u64) -> &AtomicU32 {
        let off = self.check(offset, 4, 4).expect("ring index offset from a validated geometry");
        // SAFETY: `off..off + 4` is inside the mapping (checked) and 4-aligned (checked,
        // and the mapping is page-aligned); the mapping lives as long as `&self`.
        // The only other accessor is the peer process, which our client code accesses
        // with atomics too; a hostile peer's plain stores are still single aligned
        // word writes at the hardware level, so a load returns some u32, never UB here.
        unsafe { AtomicU32::from_ptr(self.ptr.as_ptr().add(off).cast::<u32>()) }
    }

    fn atomic_u64(&self, off: usize) -> &AtomicU64 {
        // SAFETY: callers pass an offset checked to be in bounds and 8-aligned (see
        // `load_words`/`store_words`); same argument as in `atomic_u32`.
        unsafe { AtomicU64::from_ptr(self.ptr.as_ptr().add(off).cast::<u64>()) }
    }

    /// Copies `out.len()` words starting at `offset` out of the mapping with
    /// relaxed atomic loads (ordering comes from the ring index that guards them).
    pub fn load_words(&self, offset: u64, out: &mut [u64]) -> Result<(), OutOfBounds> {
        let off = self.check(offset, out.len() as u64 * 8, 8)?;
        for (i, w) in out.iter_mut().enumerate() {
            *w = self.atomic_u64(off + i * 8).load(Ordering::Relaxed);
        }
        Ok(())
    }

    /// Stores `words` starting at `offset` with relaxed atomic stores (published by
    /// the Release store of the ring index that follows).
    pub fn store_words(&self, offset: u64, words: &[u64]) -> Result<(), OutOfBounds> {
        let off = self.check(offset, words.len() as u64 * 8, 8)?;
        for (i, w) in words.iter().enumerate() {
            self.atomic_u64(off + i * 8).store(*w, Ordering::Relaxed);
        }
        Ok(())
    }

    /// Copies `out.len()` f32s from the mapping at byte `offset` into private memory.
    pub fn copy_out_f32(&self, offset: u64, out: &mut [f32]) -> Result<(), OutOfBounds> {
        let bytes = (out.len() as u64).checked_mul(4).ok_or(OutOfBounds {
            offset,
            len: u64::MAX,
            size: self.len as u64,
        })?;
        let off = self.check(offset, bytes, 4)?;
        // SAFETY: the source `off..off + bytes` is inside the mapping (checked above);
        // the destination is an exclusively borrowed private slice of exactly `bytes`
        // bytes, so the two cannot overlap. A byte copy needs no alignment. The peer
        // may write the source concurrently: we only get torn f32 bit patterns, all
        // of which are valid f32 values, and no reference to the source is formed.
        unsafe {
            core::ptr::copy_nonoverlapping(
                self.ptr.as_ptr().add(off),
                out.as_mut_ptr().cast::<u8>(),
                bytes as usize,
            );
        }
        Ok(())
    }

    /// Adds the `out.len()` f32s at byte `offset` of the mapping to `out`
    /// (`out[i] += mapped[i]`, in order), reading the mapping once: through a
    /// small private block at a time, so a sum of several arenas is one pass
    /// over each (the local reduce of K trainers).
    pub fn add_out_f32(&self, offset: u64, out: &mut [f32]) -> Result<(), OutOfBounds> {
        const BLOCK: usize = 1024;
        let bytes = (out.len() as u64).checked_mul(4).ok_or(OutOfBounds {
            offset,
            len: u64::MAX,
            size: self.len as u64,
        })?;
        let off = self.check(offset, bytes, 4)?;
        let mut block = [0f32; BLOCK];
        for (i, dst) in out.chunks_mut(BLOCK).enumerate() {
            let n = dst.len();
            // SAFETY: the source `off + i·BLOCK·4 ..` of `n · 4` bytes lies inside
            // `off..off + bytes`, inside the mapping (checked above); the
            // destination is the first `n` f32s of a private stack array, so they
            // cannot overlap. As in `copy_out_f32`: a concurrent peer write gives
            // torn but valid f32 bit patterns, and no reference to the source
            // is formed.
            unsafe {
                core::ptr::copy_nonoverlapping(
                    self.ptr.as_ptr().add(off + i * BLOCK * 4),
                    block.as_mut_ptr().cast::<u8>(),
                    n * 4,
                );
            }
            for (d, x) in dst.iter_mut().zip(&block[..n]) {
                *d += *x;
            }
        }
        Ok(())
    }

    /// Raw pointer to `len_elems` f32 at byte `offset`, checked to lie inside the
    /// mapping and to be 4-aligned. Nothing here dereferences it and no reference
    /// is formed; it stays valid as long as the mapping (the caller's contract for
    /// using it is on `TrainerChannel::data_ptr`).
    pub fn f32_ptr(&self, offset: u64, len_elems: u64) -> Result<NonNull<f32>, OutOfBounds> {
        let bytes =
            len_elems.checked_mul(4).ok_or(OutOfBounds { offset, len: u64::MAX, size: self.len as u64 })?;
        let off = self.check(offset, bytes, 4)?;
        // SAFETY: `off..off + bytes` lies inside the mapping (checked above), so the
        // offset pointer stays within the one mapped object and cannot wrap.
        let p = unsafe { self.ptr.add(off) };
        Ok(p.cast::<f32>())
    }

    /// Copies `out.len()` bytes from the mapping at byte `offset` (a multiple
    /// of `align`) into private memory: tensors of 2-byte elements (f16, bf16).
    pub fn copy_out_bytes(&self, offset: u64, out: &mut [u8], align: u64) -> Result<(), OutOfBounds> {
        let off = self.check(offset, out.len() as u64, align)?;
        // SAFETY: the source `off..off + out.len()` is inside the mapping (checked
        // above); the destination is an exclusively borrowed private slice, so the
        // two cannot overlap. A concurrent peer write gives torn bytes, every one
        // of them a valid u8, and no reference to the source is formed.
        unsafe { core::ptr::copy_nonoverlapping(self.ptr.as_ptr().add(off), out.as_mut_ptr(), out.len()) }
        Ok(())
    }

    /// Copies the bytes `src` into the mapping at byte `offset` (a multiple of `align`).
    pub fn copy_in_bytes(&self, offset: u64, src: &[u8], align: u64) -> Result<(), OutOfBounds> {
        let off = self.check(offset, src.len() as u64, align)?;
        // SAFETY: the destination `off..off + src.len()` is inside the mapping
        // (checked); the source is a private slice, never inside the mapping, so
        // no overlap; no reference to the destination is formed.
        unsafe { core::ptr::copy_nonoverlapping(src.as_ptr(), self.ptr.as_ptr().add(off), src.len()) }
        Ok(())
    }

    /// Raw pointer to `bytes` bytes at byte `offset` (a multiple of `align`),
    /// checked to lie inside the mapping; as [`Mapping::f32_ptr`], nothing
    /// here dereferences it.
    pub fn byte_ptr(&self, offset: u64, bytes: u64, align: u64) -> Result<NonNull<u8>, OutOfBounds> {
        let off = self.check(offset, bytes, align)?;
        // SAFETY: `off..off + bytes` lies inside the mapping (checked above), so the
        // offset pointer stays within the one mapped object and cannot wrap.
        Ok(unsafe { self.ptr.add(off) })
    }

    /// Copies `src` into the mapping at byte `offset`.
    pub fn copy_in_f32(&self, offset: u64, src: &[f32]) -> Result<(), OutOfBounds> {
        let bytes = (src.len() as u64).checked_mul(4).ok_or(OutOfBounds {
            offset,
            len: u64::MAX,
            size: self.len as u64,
        })?;
        let off = self.check(offset, bytes, 4)?;
        // SAFETY: the destination `off..off + bytes` is inside the mapping (checked);
        // the source is a private slice of `bytes` bytes, not inside the mapping (we
        // never form slices over it), so no overlap. No reference to the destination
        // is formed, so a concurrent peer access is not UB on our side.
        unsafe {
            core::ptr::copy_nonoverlapping(
                src.as_ptr().cast::<u8>(),
                self.ptr.as_ptr().add(off),
                bytes as usize,
            );
        }
        Ok(())
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: `ptr`/`len` are exactly what mmap returned, unmapped only here; no
        // reference into the mapping outlives `&self` (all are tied to its borrow).
        let r = unsafe { rustix::mm::munmap(self.ptr.as_ptr().cast(), self.len) };
        if let Err(e) = r {
            log::error!("munmap of a shared-memory segment failed: {e}");
        }
    }
}

/// Maps a freshly created memfd (test and daemon convenience).
pub fn create_and_map(name: &str, size: u64) -> io::Result<(OwnedFd, Mapping)> {
    let fd = create_sealed_memfd(name, size)?;
    let map = Mapping::map(fd.as_fd(), size)?;
    Ok((fd, map))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sealed_memfd_refuses_resize_and_new_seals() {
        let (fd, map) = create_and_map("dlcp-test", 8192).unwrap();
        let seals = rustix::fs::fcntl_get_seals(&fd).unwrap();
        assert!(seals.contains(SealFlags::SHRINK | SealFlags::GROW | SealFlags::SEAL));
        assert!(rustix::fs::ftruncate(&fd, 0).is_err());
        assert!(rustix::fs::ftruncate(&fd, 1 << 20).is_err());
        assert!(rustix::fs::fcntl_add_seals(&fd, SealFlags::WRITE).is_err());
        // Still usable after the failed attempts.
        map.copy_in_f32(4096, &[1.5, 2.5]).unwrap();
        let mut out = [0f32; 2];
        map.copy_out_f32(4096, &mut out).unwrap();
        assert_eq!(out, [1.5, 2.5]);
    }

    #[test]
    fn accesses_are_bounds_checked() {
        let (_fd, map) = create_and_map("dlcp-test", 4096).unwrap();
        let mut out = [0f32; 4];
        assert!(map.copy_out_f32(4096 - 16, &mut out).is_ok());
        assert!(map.copy_out_f32(4096 - 12, &mut out).is_err());
        assert!(map.copy_out_f32(u64::MAX - 3, &mut out).is_err());
        assert!(map.copy_out_f32(2, &mut out).is_err(), "misaligned");
        assert!(map.copy_in_f32(4096, &[1.0]).is_err());
        let mut w = [0u64; 8];
        assert!(map.load_words(4096 - 64, &mut w).is_ok());
        assert!(map.load_words(4096 - 56, &mut w).is_err());
        assert!(map.store_words(4, &w).is_err(), "misaligned");
        map.store_words(64, &[1, 2, 3]).unwrap();
        let mut r = [0u64; 3];
        map.load_words(64, &mut r).unwrap();
        assert_eq!(r, [1, 2, 3]);
    }

    #[test]
    fn add_out_adds_in_order_across_blocks_and_is_bounds_checked() {
        let (_fd, map) = create_and_map("dlcp-test", 16384).unwrap();
        let src: Vec<f32> = (0..2500).map(|i| i as f32 * 0.5 - 7.0).collect();
        map.copy_in_f32(64, &src).unwrap();
        let mut out: Vec<f32> = (0..2500).map(|i| 1e8 - i as f32).collect();
        let want: Vec<f32> = out.iter().zip(&src).map(|(o, x)| o + x).collect();
        map.add_out_f32(64, &mut out).unwrap();
        assert_eq!(out, want);
        assert!(map.add_out_f32(16384 - 12, &mut [0f32; 4]).is_err());
        assert!(map.add_out_f32(2, &mut [0f32; 1]).is_err(), "misaligned");
    }

    #[test]
    fn f32_pointers_are_bounds_checked_and_alias_the_copies() {
        let (_fd, map) = create_and_map("dlcp-test", 4096).unwrap();
        assert!(map.f32_ptr(4096 - 16, 4).is_ok());
        assert!(map.f32_ptr(4096 - 12, 4).is_err());
        assert!(map.f32_ptr(2, 1).is_err(), "misaligned");
        assert!(map.f32_ptr(0, u64::MAX).is_err());
        let p = map.f32_ptr(64, 2).unwrap();
        map.copy_in_f32(64, &[3.5, 4.5]).unwrap();
        // SAFETY: `p` points to 2 f32 inside `map`, which outlives this read; nothing
        // else accesses them concurrently.
        assert_eq!(unsafe { p.add(1).read_volatile() }, 4.5);
    }

    #[test]
    fn two_mappings_of_one_memfd_share_bytes() {
        let (fd, a) = create_and_map("dlcp-test", 4096).unwrap();
        let b = Mapping::map(fd.as_fd(), 4096).unwrap();
        a.atomic_u32(128).store(42, Ordering::Release);
        assert_eq!(b.atomic_u32(128).load(Ordering::Acquire), 42);
    }
}
