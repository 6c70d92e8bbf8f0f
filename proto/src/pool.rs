//! A small pool of `f32` buffers, reused across allreduce ops.
//!
//! An op of `n` elements needs `n` for its input, `n` for its result and
//! `(world − 1) / world · n` for the reduce-scatter receive buffers. Freshly
//! allocated, every one of those is a new anonymous mapping whose pages the
//! kernel faults in and clears on first touch: profiling the daemon on a 64 MiB
//! allreduce put ~14% of its CPU in page faults. Ops of a training job repeat
//! the same sizes, so the buffers of a finished op are kept here and handed to
//! the next one, already mapped.
//!
//! Bounds: at most [`MAX_BUFFERS`] buffers and [`MAX_BYTES`] bytes are kept, and
//! a buffer unused for [`IDLE`] is released ([`BufferPool::expire`]), so an idle
//! daemon gives the memory back.
//!
//! A buffer from [`BufferPool::take`] holds arbitrary finite-or-not `f32` values
//! from an earlier op: callers overwrite what they read (or ask for
//! [`BufferPool::take_zeroed`]).

use crate::time::{Duration, Instant};

/// Most buffers kept.
pub const MAX_BUFFERS: usize = 64;
/// Most bytes kept (sum of capacities).
pub const MAX_BYTES: usize = 1 << 30;
/// A buffer unused this long is released.
pub const IDLE: Duration = Duration::from_secs(2);

/// Reusable `Vec<f32>` buffers (see the module docs).
#[derive(Debug, Default)]
pub struct BufferPool {
    free: Vec<(Instant, Vec<f32>)>,
    bytes: usize,
    hits: u64,
    misses: u64,
}

impl BufferPool {
    /// An empty pool.
    pub fn new() -> BufferPool {
        BufferPool::default()
    }

    /// A buffer of exactly `len` elements with unspecified contents: the
    /// smallest kept buffer that fits, or a new zeroed one.
    pub fn take(&mut self, len: usize) -> Vec<f32> {
        let best = self
            .free
            .iter()
            .enumerate()
            .filter(|(_, (_, v))| v.capacity() >= len)
            .min_by_key(|(_, (_, v))| v.capacity())
            .map(|(i, _)| i);
        match best {
            Some(i) if len > 0 => {
                let (_, mut v) = self.free.swap_remove(i);
                self.bytes -= v.capacity() * 4;
                self.hits += 1;
                if v.len() >= len {
                    v.truncate(len);
                } else {
                    v.resize(len, 0.0);
                }
                v
            }
            _ => {
                self.misses += 1;
                vec![0.0; len]
            }
        }
    }

    /// A buffer of `len` zeros.
    pub fn take_zeroed(&mut self, len: usize) -> Vec<f32> {
        let mut v = self.take(len);
        v.fill(0.0);
        v
    }

    /// Gives `buf` back at `now`. Kept unless it would exceed the bounds (then
    /// the oldest buffers go first) or is empty.
    pub fn put(&mut self, now: Instant, buf: Vec<f32>) {
        let bytes = buf.capacity() * 4;
        if bytes == 0 || bytes > MAX_BYTES {
            return;
        }
        while !self.free.is_empty() && (self.free.len() >= MAX_BUFFERS || self.bytes + bytes > MAX_BYTES) {
            let oldest = (0..self.free.len()).min_by_key(|&i| self.free[i].0).unwrap_or(0);
            let (_, v) = self.free.swap_remove(oldest);
            self.bytes -= v.capacity() * 4;
        }
        self.bytes += bytes;
        self.free.push((now, buf));
    }

    /// Releases buffers unused for [`IDLE`] at `now`.
    pub fn expire(&mut self, now: Instant) {
        if self.free.iter().any(|(t, _)| *t + IDLE <= now) {
            self.free.retain(|(t, _)| *t + IDLE > now);
            self.bytes = self.free.iter().map(|(_, v)| v.capacity() * 4).sum();
        }
    }

    /// Buffers kept now.
    pub fn len(&self) -> usize {
        self.free.len()
    }

    /// True if no buffer is kept.
    pub fn is_empty(&self) -> bool {
        self.free.is_empty()
    }

    /// Bytes kept now.
    pub fn bytes(&self) -> usize {
        self.bytes
    }

    /// Takes served from a kept buffer, and takes that allocated.
    pub fn hits_misses(&self) -> (u64, u64) {
        (self.hits, self.misses)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reuses_the_smallest_fitting_buffer() {
        let mut p = BufferPool::new();
        let t = Instant::ZERO;
        let a = vec![1.0f32; 100];
        let b = vec![2.0f32; 1000];
        let (pa, pb) = (a.as_ptr(), b.as_ptr());
        p.put(t, b);
        p.put(t, a);
        assert_eq!(p.bytes(), 4400);
        let x = p.take(50);
        assert_eq!((x.len(), x.as_ptr()), (50, pa));
        let y = p.take(500);
        assert_eq!((y.len(), y.as_ptr()), (500, pb));
        assert!(p.is_empty());
        assert_eq!(p.bytes(), 0);
        assert_eq!(p.hits_misses(), (2, 0));
        // Nothing fits: a fresh zeroed buffer.
        let z = p.take(10);
        assert_eq!(z, vec![0.0; 10]);
        assert_eq!(p.hits_misses(), (2, 1));
    }

    #[test]
    fn grows_within_capacity_and_zeroes_on_request() {
        let mut p = BufferPool::new();
        let mut v = Vec::with_capacity(64);
        v.extend_from_slice(&[7.0f32; 8]);
        p.put(Instant::ZERO, v);
        let w = p.take(32);
        assert_eq!(w.len(), 32);
        assert_eq!(&w[..8], &[7.0; 8]);
        assert_eq!(&w[8..], &[0.0; 24]);
        p.put(Instant::ZERO, w);
        assert_eq!(p.take_zeroed(16), vec![0.0; 16]);
    }

    #[test]
    fn bounded_and_expires() {
        let mut p = BufferPool::new();
        for i in 0..(MAX_BUFFERS as u64 + 5) {
            p.put(Instant::from_nanos(i), vec![0.0; 10]);
        }
        assert_eq!(p.len(), MAX_BUFFERS);
        p.put(Instant::ZERO, Vec::new());
        assert_eq!(p.len(), MAX_BUFFERS);
        let late = Instant::from_nanos(10) + IDLE;
        p.expire(late);
        // The ones put at 0..=10 ns expired; the rest (put at 11.. ns) stay.
        assert_eq!(p.len(), MAX_BUFFERS + 5 - 11);
        assert_eq!(p.bytes(), p.len() * 40);
    }
}
