//! Datagrams to send, where their bytes lie: a [`TxBatch`] is what one
//! [`Endpoint::poll_transmit_batch`](super::Endpoint::poll_transmit_batch)
//! call produced, and the [`TxView`] it returns lends each datagram as three
//! slices — header, payload, tag — that are sent back to back.
//!
//! A DATA datagram's payload is not copied: it is the chunk's bytes in the
//! op's own memory (reduce-scatter: the op's input, this rank's contribution
//! as the endpoint took it over; all-gather: the reduced result), which no
//! one else can write while the op runs and which the view borrows until it
//! is dropped. Headers, tags and the small payloads of control packets
//! (bitmaps, masks) are in the batch's own buffer. A datapath sends the three
//! slices with scatter-gather I/O (`sendmmsg` iovecs), so the payload is
//! touched once, by the kernel's (or the NIC's) copy; the tag is computed
//! over the same slices just before, while they are in cache.
//!
//! Payload elements are little-endian on the wire: viewing an `f32` slice as
//! its bytes is the wire form only on a little-endian host, which is why the
//! crate does not build on a big-endian one. An f16 or bf16 op sends from an
//! encoded copy of its input and of its reduced shard, made once each
//! (`allreduce::Op::payload`).

use std::ops::Range;

use crate::class::Class;
use crate::endpoint::allreduce::Buffer;
use crate::endpoint::api::OpKey;
use crate::endpoint::optable::OpTable;
use crate::wire::{self, MacKey, PacketAuth};

#[cfg(target_endian = "big")]
compile_error!("dlcp sends f32 payloads from memory as their wire bytes: little-endian hosts only");

/// Where a datagram's payload lies.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Payload {
    /// In the batch's buffer, right after the header (control packets).
    Inline(usize),
    /// Elements `start..start + len` of an op's input or result.
    Op { op: OpKey, buffer: Buffer, start: usize, len: usize },
}

/// One datagram of a batch: its destination and class, where its header
/// (and tag) lie in the batch's buffer, and where its payload lies.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Entry {
    dst: u32,
    class: Class,
    path: u8,
    /// Offset of the header in the batch's buffer; an inline payload and the
    /// tag follow it.
    off: usize,
    payload: Payload,
}

/// Where a datagram goes: rank `dst`, in `class`, on `path`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct To {
    pub dst: u32,
    pub class: Class,
    pub path: u8,
}

/// The datagrams of one [`Endpoint::poll_transmit_batch`](super::Endpoint::poll_transmit_batch)
/// call (see the module docs). Reuse one batch for every call: its buffers
/// keep their capacity.
#[derive(Debug, Default)]
pub struct TxBatch {
    bytes: Vec<u8>,
    entries: Vec<Entry>,
    /// Bytes of tag each datagram ends with (0 under `packet_auth = "none"`).
    tag_len: usize,
}

impl TxBatch {
    /// An empty batch.
    pub fn new() -> TxBatch {
        TxBatch::default()
    }

    /// Datagrams in the batch.
    pub(crate) fn len(&self) -> usize {
        self.entries.len()
    }

    /// Forget the datagrams of the last call; the next ones end with a tag
    /// of `auth`'s length.
    pub(crate) fn clear(&mut self, auth: PacketAuth) {
        self.bytes.clear();
        self.entries.clear();
        self.tag_len = auth.tag_len();
    }

    /// Room for a control datagram of up to `max_len` bytes at the end of the
    /// buffer: write it there, then [`TxBatch::push_inline`] its length.
    pub(crate) fn inline_room(&mut self, max_len: usize) -> &mut [u8] {
        let off = self.bytes.len();
        self.bytes.resize(off + max_len, 0);
        &mut self.bytes[off..]
    }

    /// A control datagram of `len` bytes (header, payload, room for the tag)
    /// was written into the room [`TxBatch::inline_room`] gave.
    pub(crate) fn push_inline(&mut self, dst: u32, class: Class, path: u8, len: usize) {
        let off = self.entries_end();
        self.bytes.truncate(off + len);
        let payload = Payload::Inline(len - wire::HEADER_LEN - self.tag_len);
        self.entries.push(Entry { dst, class, path, off, payload });
    }

    /// Give back the room of a control datagram that was not written.
    pub(crate) fn drop_room(&mut self) {
        let end = self.entries_end();
        self.bytes.truncate(end);
    }

    /// A DATA datagram on `path`: `header` (its [`wire::HEADER_LEN`] bytes),
    /// then elements `range` of `op`'s `buffer`.
    pub(crate) fn push_data(
        &mut self,
        to: To,
        header: &[u8],
        op: OpKey,
        buffer: Buffer,
        range: Range<usize>,
    ) {
        let off = self.entries_end();
        self.bytes.truncate(off);
        self.bytes.extend_from_slice(&header[..wire::HEADER_LEN]);
        self.bytes.resize(self.bytes.len() + self.tag_len, 0);
        let (start, len) = (range.start, range.len());
        let To { dst, class, path } = to;
        self.entries.push(Entry { dst, class, path, off, payload: Payload::Op { op, buffer, start, len } });
    }

    /// End of the last datagram's bytes in the buffer.
    fn entries_end(&self) -> usize {
        self.entries.last().map_or(0, |e| {
            let inline = match e.payload {
                Payload::Inline(n) => n,
                Payload::Op { .. } => 0,
            };
            e.off + wire::HEADER_LEN + inline + self.tag_len
        })
    }

    /// Compute every datagram's tag over its header and payload where they
    /// lie, into the room after its header (left zero when packets are not
    /// authenticated, `packet_auth = "none"`).
    pub(crate) fn seal(&mut self, key: &MacKey, ops: &OpTable) {
        if key.auth() == PacketAuth::None || self.tag_len == 0 {
            return;
        }
        for i in 0..self.entries.len() {
            let e = self.entries[i];
            let tag = {
                let d = view_entry(&self.bytes, ops, e, self.tag_len);
                key.tag_parts(d.header, d.payload)
            };
            let at = e.off + wire::HEADER_LEN + inline_len(e);
            self.bytes[at..at + wire::TAG_LEN].copy_from_slice(&tag);
        }
    }
}

fn inline_len(e: Entry) -> usize {
    match e.payload {
        Payload::Inline(n) => n,
        Payload::Op { .. } => 0,
    }
}

/// One datagram to send, as the slices to send back to back: `header`,
/// `payload`, `tag` (see the module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Datagram<'a> {
    /// Destination rank.
    pub dst: u32,
    /// Priority class.
    pub class: Class,
    /// The path to send it on ([`crate::endpoint::Transmit::path`]).
    pub path: u8,
    /// The [`wire::HEADER_LEN`]-byte header.
    pub header: &'a [u8],
    /// The payload (may be empty).
    pub payload: &'a [u8],
    /// The tag: [`wire::TAG_LEN`] bytes, or none under `packet_auth = "none"`.
    pub tag: &'a [u8],
}

impl<'a> Datagram<'a> {
    /// Length on the wire.
    pub fn len(&self) -> usize {
        self.header.len() + self.payload.len() + self.tag.len()
    }

    /// Never true: a datagram has at least a header.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The three slices, in order.
    pub fn parts(&self) -> [&'a [u8]; 3] {
        [self.header, self.payload, self.tag]
    }

    /// Copy the datagram into `buf` (at least [`Datagram::len`] bytes) as one
    /// contiguous datagram; returns its length.
    ///
    /// # Panics
    /// If `buf` is too short.
    pub fn write_to(&self, buf: &mut [u8]) -> usize {
        let mut at = 0;
        for p in self.parts() {
            buf[at..at + p.len()].copy_from_slice(p);
            at += p.len();
        }
        at
    }
}

/// The datagram `e` of a batch whose buffer is `bytes`.
fn view_entry<'a>(bytes: &'a [u8], ops: &'a OpTable, e: Entry, tag_len: usize) -> Datagram<'a> {
    let inline = inline_len(e);
    let header = &bytes[e.off..e.off + wire::HEADER_LEN];
    let tag_at = e.off + wire::HEADER_LEN + inline;
    let payload: &[u8] = match e.payload {
        Payload::Inline(n) => &bytes[e.off + wire::HEADER_LEN..e.off + wire::HEADER_LEN + n],
        Payload::Op { op, buffer, start, len } => match ops.by_key(op) {
            Some(op) => op.payload(buffer, start, len),
            // Cannot happen: the view borrows the endpoint, no op ends meanwhile.
            None => &[],
        },
    };
    let tag = &bytes[tag_at..tag_at + tag_len];
    Datagram { dst: e.dst, class: e.class, path: e.path, header, payload, tag }
}

/// The datagrams of one [`Endpoint::poll_transmit_batch`](super::Endpoint::poll_transmit_batch)
/// call, in the order they must reach the network. It borrows the endpoint
/// (the DATA payloads are in its ops' memory): drop it before calling the
/// endpoint again.
#[derive(Debug, Clone, Copy)]
pub struct TxView<'a> {
    batch: &'a TxBatch,
    ops: &'a OpTable,
}

impl<'a> TxView<'a> {
    pub(crate) fn new(batch: &'a TxBatch, ops: &'a OpTable) -> TxView<'a> {
        TxView { batch, ops }
    }

    /// Datagrams in the batch.
    pub fn len(&self) -> usize {
        self.batch.entries.len()
    }

    /// Whether the batch is empty (nothing to send now).
    pub fn is_empty(&self) -> bool {
        self.batch.entries.is_empty()
    }

    /// Datagram `i`.
    ///
    /// # Panics
    /// If `i >= self.len()`.
    pub fn get(&self, i: usize) -> Datagram<'a> {
        view_entry(&self.batch.bytes, self.ops, self.batch.entries[i], self.batch.tag_len)
    }

    /// Every datagram, in order.
    pub fn iter(&self) -> impl ExactSizeIterator<Item = Datagram<'a>> + 'a {
        let v = *self;
        (0..v.len()).map(move |i| v.get(i))
    }
}
