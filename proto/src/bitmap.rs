//! A growable-once bitmap of chunk indices with a population count.
//!
//! Used for "which chunks of a transfer arrived" and for the gather-phase mask.
//! Its wire form is a sequence of segments: a segment carries the bits of chunks
//! `[start, start + 8 * bytes.len())`, least significant bit first within a byte.

/// A fixed-length set of chunk indices.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Bitmap {
    words: Vec<u64>,
    len: u32,
    ones: u32,
}

impl Bitmap {
    /// An empty (all zero) bitmap of `len` bits.
    pub fn new(len: u32) -> Bitmap {
        Bitmap { words: vec![0; (len as usize).div_ceil(64)], len, ones: 0 }
    }

    /// A bitmap with every bit set.
    pub fn full(len: u32) -> Bitmap {
        let mut b = Bitmap::new(len);
        for i in 0..len {
            b.set(i);
        }
        b
    }

    /// Heap bytes the bitmap holds (its words).
    pub fn heap_bytes(&self) -> usize {
        self.words.capacity() * 8
    }

    /// Number of bits.
    pub fn len(&self) -> u32 {
        self.len
    }

    /// True if the bitmap has no bits at all.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Number of set bits.
    pub fn count_ones(&self) -> u32 {
        self.ones
    }

    /// Number of clear bits.
    pub fn count_zeros(&self) -> u32 {
        self.len - self.ones
    }

    /// True if every bit is set.
    pub fn is_full(&self) -> bool {
        self.ones == self.len
    }

    /// Value of bit `i` (false when out of range).
    pub fn get(&self, i: u32) -> bool {
        i < self.len && self.words[(i / 64) as usize] & (1u64 << (i % 64)) != 0
    }

    /// Set bit `i`; returns true if it was clear. Out-of-range indices are ignored.
    pub fn set(&mut self, i: u32) -> bool {
        if i >= self.len {
            return false;
        }
        let w = &mut self.words[(i / 64) as usize];
        let m = 1u64 << (i % 64);
        if *w & m == 0 {
            *w |= m;
            self.ones += 1;
            true
        } else {
            false
        }
    }

    /// Clear bit `i`; returns true if it was set.
    pub fn clear(&mut self, i: u32) -> bool {
        if i >= self.len {
            return false;
        }
        let w = &mut self.words[(i / 64) as usize];
        let m = 1u64 << (i % 64);
        if *w & m != 0 {
            *w &= !m;
            self.ones -= 1;
            true
        } else {
            false
        }
    }

    /// Indices of set bits, ascending.
    pub fn iter_ones(&self) -> impl Iterator<Item = u32> + '_ {
        (0..self.len).filter(|&i| self.get(i))
    }

    /// Indices of clear bits, ascending.
    pub fn iter_zeros(&self) -> impl Iterator<Item = u32> + '_ {
        (0..self.len).filter(|&i| !self.get(i))
    }

    /// Set every bit that is set in `other` (bitwise or). Lengths must match;
    /// extra bits of a longer `other` are ignored.
    pub fn union_with(&mut self, other: &Bitmap) {
        for i in other.iter_ones() {
            self.set(i);
        }
    }

    /// Number of segments of at most `seg_bytes` bytes needed to carry this bitmap.
    pub fn segment_count(len: u32, seg_bytes: usize) -> u32 {
        let bits_per_seg = (seg_bytes as u64 * 8).max(8);
        (u64::from(len).div_ceil(bits_per_seg)).max(1) as u32
    }

    /// Write segment `seg` (of `seg_bytes` bytes each) into `out`; returns
    /// `(first_bit, bytes_written)`.
    pub fn write_segment(&self, seg: u32, seg_bytes: usize, out: &mut [u8]) -> (u32, usize) {
        let bits_per_seg = (seg_bytes * 8) as u64;
        let start = u64::from(seg) * bits_per_seg;
        let end = (start + bits_per_seg).min(u64::from(self.len));
        let nbytes = (end.saturating_sub(start)).div_ceil(8) as usize;
        let out = &mut out[..nbytes];
        out.fill(0);
        for i in start..end {
            if self.get(i as u32) {
                let k = (i - start) as usize;
                out[k / 8] |= 1 << (k % 8);
            }
        }
        (start as u32, nbytes)
    }

    /// Set the bits of a received segment starting at `first_bit`. Bits beyond
    /// `len` are ignored (a hostile segment cannot grow the bitmap). Returns the
    /// number of bits newly set.
    pub fn merge_segment(&mut self, first_bit: u32, bytes: &[u8]) -> u32 {
        let mut added = 0;
        for (k, &b) in bytes.iter().enumerate() {
            if b == 0 {
                continue;
            }
            for bit in 0..8 {
                if b & (1 << bit) != 0 {
                    let i = u64::from(first_bit) + (k as u64) * 8 + bit;
                    if i < u64::from(self.len) && self.set(i as u32) {
                        added += 1;
                    }
                }
            }
        }
        added
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn set_clear_count() {
        let mut b = Bitmap::new(130);
        assert!(b.set(0) && b.set(129) && !b.set(129) && !b.set(130));
        assert_eq!(b.count_ones(), 2);
        assert!(b.clear(0) && !b.clear(0));
        assert_eq!(b.iter_ones().collect::<Vec<_>>(), vec![129]);
        assert_eq!(b.count_zeros(), 129);
        assert!(Bitmap::full(65).is_full());
    }

    #[test]
    fn segments_round_trip() {
        let mut b = Bitmap::new(1000);
        for i in (0..1000).step_by(7) {
            b.set(i);
        }
        let n = Bitmap::segment_count(1000, 16);
        assert_eq!(n, 8);
        let mut c = Bitmap::new(1000);
        let mut buf = [0u8; 16];
        for s in 0..n {
            let (first, len) = b.write_segment(s, 16, &mut buf);
            c.merge_segment(first, &buf[..len]);
        }
        assert_eq!(b, c);
        // A hostile segment far out of range sets nothing.
        assert_eq!(c.merge_segment(u32::MAX - 3, &[0xff; 4]), 0);
    }
}
