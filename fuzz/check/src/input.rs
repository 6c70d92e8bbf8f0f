//! Reading a fuzz input as a stream of small decisions ([`Input`]), and
//! editing a valid message with some of them ([`mutate`]).

/// A fuzz input read as a stream of small decisions. Reading past the end
/// yields zeros (and empty slices), so every input is a complete script.
#[derive(Debug, Clone)]
pub struct Input<'a> {
    data: &'a [u8],
}

impl<'a> Input<'a> {
    /// Read `data` from its start.
    pub fn new(data: &'a [u8]) -> Input<'a> {
        Input { data }
    }

    /// Whether everything was read.
    pub fn is_empty(&self) -> bool {
        self.data.is_empty()
    }

    /// One byte (0 at the end).
    pub fn u8(&mut self) -> u8 {
        match self.data.split_first() {
            Some((&b, rest)) => {
                self.data = rest;
                b
            }
            None => 0,
        }
    }

    /// A little-endian u16.
    pub fn u16(&mut self) -> u16 {
        u16::from_le_bytes([self.u8(), self.u8()])
    }

    /// A little-endian u32.
    pub fn u32(&mut self) -> u32 {
        u32::from(self.u16()) | u32::from(self.u16()) << 16
    }

    /// A little-endian u64.
    pub fn u64(&mut self) -> u64 {
        u64::from(self.u32()) | u64::from(self.u32()) << 32
    }

    /// A bool (lowest bit of a byte).
    pub fn bool(&mut self) -> bool {
        self.u8() & 1 == 1
    }

    /// A value in `0..n` (`n > 0`) from one byte, or two if `n > 256`.
    pub fn below(&mut self, n: usize) -> usize {
        assert!(n > 0);
        if n <= 256 { usize::from(self.u8()) % n } else { usize::from(self.u16()) % n }
    }

    /// One of `items` (not empty).
    pub fn pick<T: Copy>(&mut self, items: &[T]) -> T {
        items[self.below(items.len())]
    }

    /// Up to `n` bytes (fewer at the end).
    pub fn bytes(&mut self, n: usize) -> &'a [u8] {
        let (a, b) = self.data.split_at(n.min(self.data.len()));
        self.data = b;
        a
    }

    /// A length-prefixed byte string of at most `max` bytes.
    pub fn blob(&mut self, max: usize) -> &'a [u8] {
        let n = self.below(max + 1);
        self.bytes(n)
    }

    /// Everything left.
    pub fn rest(&mut self) -> &'a [u8] {
        std::mem::take(&mut self.data)
    }
}

/// Apply up to `n` edits read from `input` to `buf`: overwrite a byte, flip a
/// bit, truncate, or append a byte. The common way a check turns a valid
/// message into a slightly wrong one.
pub fn mutate(input: &mut Input<'_>, buf: &mut Vec<u8>, n: usize) {
    let edits = input.below(n + 1);
    for _ in 0..edits {
        let op = input.u8();
        let at = if buf.is_empty() { 0 } else { input.below(buf.len()) };
        match op % 4 {
            0 if !buf.is_empty() => buf[at] = input.u8(),
            1 if !buf.is_empty() => buf[at] ^= 1 << (input.u8() % 8),
            2 => buf.truncate(at),
            _ => buf.push(input.u8()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn input_reads_zeros_past_the_end() {
        let mut i = Input::new(&[1, 2, 3]);
        assert_eq!(i.u16(), 0x0201);
        assert_eq!(i.u32(), 3);
        assert!(i.is_empty());
        assert_eq!(i.bytes(4), &[] as &[u8]);
        assert_eq!(i.below(7), 0);
    }
}
