//! First-fit allocator over the arena (client side). Offsets and sizes are
//! multiples of [`ARENA_ALIGN`]; freed ranges coalesce with their neighbours.

use super::layout::ARENA_ALIGN;

/// Free-list allocator of arena byte ranges.
#[derive(Debug, Clone)]
pub struct ArenaAllocator {
    size: u64,
    /// Free ranges `(offset, len)`, sorted by offset, never adjacent.
    free: Vec<(u64, u64)>,
}

impl ArenaAllocator {
    /// All of `size` bytes free (`size` rounded down to the alignment).
    pub fn new(size: u64) -> ArenaAllocator {
        let size = size / ARENA_ALIGN * ARENA_ALIGN;
        ArenaAllocator { size, free: if size > 0 { vec![(0, size)] } else { Vec::new() } }
    }

    /// `bytes` rounded up to the alignment, or `None` on overflow / zero.
    pub fn rounded(bytes: u64) -> Option<u64> {
        if bytes == 0 {
            return None;
        }
        bytes.checked_add(ARENA_ALIGN - 1).map(|b| b / ARENA_ALIGN * ARENA_ALIGN)
    }

    /// Allocates `bytes` (rounded up); returns the offset, or `None` if no free
    /// range is large enough.
    pub fn alloc(&mut self, bytes: u64) -> Option<u64> {
        let need = Self::rounded(bytes)?;
        let i = self.free.iter().position(|&(_, len)| len >= need)?;
        let (off, len) = self.free[i];
        if len == need {
            self.free.remove(i);
        } else {
            self.free[i] = (off + need, len - need);
        }
        Some(off)
    }

    /// Returns `bytes` (rounded up, as allocated) at `offset` to the free list.
    /// Panics on a double free or a range that was never allocated (a bug in the caller).
    pub fn free(&mut self, offset: u64, bytes: u64) {
        let len = Self::rounded(bytes).expect("freeing a zero-length range");
        let end = offset + len;
        assert!(end <= self.size, "freeing past the arena");
        let i = self.free.partition_point(|&(o, _)| o < offset);
        if let Some(&(prev_off, prev_len)) = i.checked_sub(1).map(|j| &self.free[j]) {
            assert!(prev_off + prev_len <= offset, "double free");
        }
        if let Some(&(next_off, _)) = self.free.get(i) {
            assert!(end <= next_off, "double free");
        }
        self.free.insert(i, (offset, len));
        // Coalesce with the next, then with the previous.
        if i + 1 < self.free.len() && self.free[i].0 + self.free[i].1 == self.free[i + 1].0 {
            self.free[i].1 += self.free[i + 1].1;
            self.free.remove(i + 1);
        }
        if i > 0 && self.free[i - 1].0 + self.free[i - 1].1 == self.free[i].0 {
            self.free[i - 1].1 += self.free[i].1;
            self.free.remove(i);
        }
    }

    /// Largest free range.
    pub fn largest_free(&self) -> u64 {
        self.free.iter().map(|&(_, l)| l).max().unwrap_or(0)
    }

    /// Total free bytes.
    pub fn free_bytes(&self) -> u64 {
        self.free.iter().map(|&(_, l)| l).sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn first_fit_alignment_and_coalescing() {
        let mut a = ArenaAllocator::new(1024);
        let x = a.alloc(1).unwrap();
        let y = a.alloc(100).unwrap();
        let z = a.alloc(64).unwrap();
        assert_eq!((x, y, z), (0, 64, 192));
        assert_eq!(a.free_bytes(), 1024 - 256);
        assert_eq!(a.alloc(1024), None);
        a.free(y, 100);
        assert_eq!(a.alloc(64), Some(64), "first fit reuses the hole");
        a.free(64, 64);
        a.free(x, 1);
        a.free(z, 64);
        assert_eq!(a.free_bytes(), 1024);
        assert_eq!(a.largest_free(), 1024, "everything coalesced");
        assert_eq!(a.alloc(1024), Some(0));
        assert_eq!(a.alloc(1), None);
        assert_eq!(ArenaAllocator::rounded(u64::MAX), None);
        assert_eq!(a.alloc(0), None);
    }

    #[test]
    #[should_panic(expected = "double free")]
    fn double_free_is_caught() {
        let mut a = ArenaAllocator::new(1024);
        let x = a.alloc(64).unwrap();
        a.free(x, 64);
        a.free(x, 64);
    }
}
