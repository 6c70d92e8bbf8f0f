//! Why an op failed, told on the control socket: the daemon's reason text for
//! a failed completion (a completion itself carries only a status and a
//! number), so a trainer can say `waiting on ranks [1]` where the daemon's log
//! does.
//!
//! After the attach reply the daemon writes these notes on the control socket,
//! each just before it posts the failed completion it explains, so a trainer
//! that sees a failed completion finds the note already in its socket buffer.
//! One note (daemon → trainer, little-endian):
//!
//! | offset | size | field |
//! |-------:|-----:|-------|
//! | 0 | 4 | magic `"DLCN"` |
//! | 4 | 2 | protocol version (1) |
//! | 6 | 2 | kind (4 = op failed) |
//! | 8 | 8 | op seq |
//! | 16 | 4 | tensor id |
//! | 20 | 2 | reason length `n`, at most [`MAX_REASON`] |
//! | 22 | 2 | reserved, zero |
//! | 24 | `n` | reason, UTF-8 |
//!
//! Both ends are bounded. The daemon never blocks on a trainer: a note the
//! socket cannot take now waits in an [`Outbox`] of at most [`OUTBOX_NOTES`]
//! notes, and one more is dropped and counted. The trainer keeps the last
//! [`INBOX_NOTES`] reasons ([`Inbox`]), read without blocking when it sees a
//! failed completion.

use std::collections::VecDeque;
use std::os::fd::BorrowedFd;

use rustix::net::{RecvFlags, SendFlags};

use super::control::CONTROL_VERSION;

/// Bytes of a note before its reason.
pub const NOTE_HEADER: usize = 24;
/// Longest reason sent, in bytes (a longer one is cut at a character boundary).
pub const MAX_REASON: usize = 480;
/// Notes the daemon keeps for a trainer whose socket is full; one more is dropped.
pub const OUTBOX_NOTES: usize = 16;
/// Reasons a trainer keeps until asked for; the oldest goes first.
pub const INBOX_NOTES: usize = 64;

const NOTE_MAGIC: [u8; 4] = *b"DLCN";
const KIND_OP_FAILED: u16 = 4;

/// Why op (`op_seq`, `tensor_id`) failed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OpFailedNote {
    /// The op's sequence number.
    pub op_seq: u64,
    /// The op's tensor id.
    pub tensor_id: u32,
    /// What happened, as the daemon's log says it.
    pub reason: String,
}

/// `s` cut to at most `max` bytes at a character boundary.
fn cut(s: &str, max: usize) -> &str {
    let mut end = s.len().min(max);
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    &s[..end]
}

impl OpFailedNote {
    /// The note's bytes (the reason cut to [`MAX_REASON`]).
    pub fn encode(&self) -> Vec<u8> {
        let reason = cut(&self.reason, MAX_REASON).as_bytes();
        let mut b = vec![0u8; NOTE_HEADER + reason.len()];
        b[0..4].copy_from_slice(&NOTE_MAGIC);
        b[4..6].copy_from_slice(&CONTROL_VERSION.to_le_bytes());
        b[6..8].copy_from_slice(&KIND_OP_FAILED.to_le_bytes());
        b[8..16].copy_from_slice(&self.op_seq.to_le_bytes());
        b[16..20].copy_from_slice(&self.tensor_id.to_le_bytes());
        b[20..22].copy_from_slice(&(reason.len() as u16).to_le_bytes());
        b[NOTE_HEADER..].copy_from_slice(reason);
        b
    }

    /// Parses the note at the start of `b`: `Ok(None)` if it is not complete
    /// yet, else the note and its length.
    pub fn decode(b: &[u8]) -> Result<Option<(OpFailedNote, usize)>, BadNote> {
        if b.len() < NOTE_HEADER {
            return Ok(None);
        }
        let u16_at = |i: usize| u16::from_le_bytes([b[i], b[i + 1]]);
        if b[0..4] != NOTE_MAGIC || u16_at(6) != KIND_OP_FAILED {
            return Err(BadNote("bad magic or kind"));
        }
        if u16_at(4) != CONTROL_VERSION {
            return Err(BadNote("unsupported protocol version"));
        }
        let n = usize::from(u16_at(20));
        if n > MAX_REASON || u16_at(22) != 0 {
            return Err(BadNote("reason too long or reserved bytes set"));
        }
        if b.len() < NOTE_HEADER + n {
            return Ok(None);
        }
        let note = OpFailedNote {
            op_seq: u64::from_le_bytes(b[8..16].try_into().expect("8 bytes")),
            tensor_id: u32::from_le_bytes(b[16..20].try_into().expect("4 bytes")),
            reason: String::from_utf8_lossy(&b[NOTE_HEADER..NOTE_HEADER + n]).into_owned(),
        };
        Ok(Some((note, NOTE_HEADER + n)))
    }
}

/// Bytes on the control socket that are no note.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("malformed note from the daemon: {0}")]
pub struct BadNote(pub &'static str);

/// The daemon's side: notes the socket could not take yet, at most
/// [`OUTBOX_NOTES`]. Never blocks.
#[derive(Debug, Default)]
pub struct Outbox {
    /// Encoded notes not (wholly) written; the first may be partly written.
    queue: VecDeque<Vec<u8>>,
    /// Bytes of the first note already written.
    written: usize,
    /// Notes dropped because the outbox was full or the socket failed.
    dropped: u64,
}

impl Outbox {
    /// Queues `note` and writes what the socket takes now, without blocking.
    /// False if the note was dropped (the outbox is full: the trainer does not
    /// read its socket).
    pub fn send(&mut self, sock: BorrowedFd<'_>, note: &OpFailedNote) -> bool {
        if self.queue.len() >= OUTBOX_NOTES {
            self.flush(sock);
        }
        if self.queue.len() >= OUTBOX_NOTES {
            self.dropped += 1;
            return false;
        }
        self.queue.push_back(note.encode());
        self.flush(sock);
        true
    }

    /// Writes queued notes until the socket would block.
    pub fn flush(&mut self, sock: BorrowedFd<'_>) {
        while let Some(front) = self.queue.front() {
            match rustix::net::send(sock, &front[self.written..], SendFlags::DONTWAIT | SendFlags::NOSIGNAL) {
                Ok(n) => {
                    self.written += n;
                    if self.written == front.len() {
                        self.queue.pop_front();
                        self.written = 0;
                    }
                }
                Err(rustix::io::Errno::INTR) => {}
                Err(rustix::io::Errno::AGAIN) => return,
                Err(_) => {
                    // The trainer is gone or its socket broke: nobody will read these.
                    self.dropped += self.queue.len() as u64;
                    self.queue.clear();
                    self.written = 0;
                    return;
                }
            }
        }
    }

    /// Notes waiting for room on the socket.
    pub fn queued(&self) -> usize {
        self.queue.len()
    }

    /// Notes dropped so far.
    pub fn dropped(&self) -> u64 {
        self.dropped
    }
}

/// The trainer's side: the bytes read off the control socket and the reasons
/// they carried, the last [`INBOX_NOTES`].
#[derive(Debug, Default)]
pub struct Inbox {
    partial: Vec<u8>,
    reasons: VecDeque<OpFailedNote>,
    /// Bytes that were no note (discarded; the stream cannot be resynchronised).
    bad: u64,
}

impl Inbox {
    /// Reads what the socket holds now, without blocking, and keeps the notes
    /// in it. True if the daemon closed the socket (or it failed): it is gone.
    pub fn read(&mut self, sock: BorrowedFd<'_>) -> bool {
        let mut buf = [0u8; 4096];
        // Bounded: a daemon cannot keep the trainer here.
        for _ in 0..64 {
            match rustix::net::recv(sock, &mut buf, RecvFlags::DONTWAIT) {
                Ok((0, _)) => return true,
                Ok((n, _)) => self.take_bytes(&buf[..n]),
                Err(rustix::io::Errno::INTR) => {}
                Err(rustix::io::Errno::AGAIN) => return false,
                Err(_) => return true,
            }
        }
        false
    }

    fn take_bytes(&mut self, bytes: &[u8]) {
        self.partial.extend_from_slice(bytes);
        let mut at = 0;
        loop {
            match OpFailedNote::decode(&self.partial[at..]) {
                Ok(Some((note, len))) => {
                    at += len;
                    if self.reasons.len() >= INBOX_NOTES {
                        self.reasons.pop_front();
                    }
                    self.reasons.push_back(note);
                }
                Ok(None) => break,
                Err(_) => {
                    self.bad += (self.partial.len() - at) as u64;
                    at = self.partial.len();
                    break;
                }
            }
        }
        self.partial.drain(..at);
    }

    /// Takes the reason the daemon gave for op (`op_seq`, `tensor_id`), if any.
    pub fn take(&mut self, op_seq: u64, tensor_id: u32) -> Option<String> {
        let i = self.reasons.iter().position(|n| n.op_seq == op_seq && n.tensor_id == tensor_id)?;
        self.reasons.remove(i).map(|n| n.reason)
    }

    /// Bytes read that were no note.
    pub fn bad_bytes(&self) -> u64 {
        self.bad
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::AsFd;
    use std::os::unix::net::UnixStream;

    fn note(seq: u64, reason: &str) -> OpFailedNote {
        OpFailedNote { op_seq: seq, tensor_id: 7, reason: reason.to_owned() }
    }

    #[test]
    fn a_note_round_trips_and_a_long_reason_is_cut_at_a_char_boundary() {
        let n = note(3, "no progress; waiting on ranks [1]");
        let b = n.encode();
        assert_eq!(OpFailedNote::decode(&b), Ok(Some((n, b.len()))));
        assert_eq!(OpFailedNote::decode(&b[..b.len() - 1]), Ok(None), "incomplete");
        let long = "é".repeat(MAX_REASON);
        let (d, _) = OpFailedNote::decode(&note(1, &long).encode()).unwrap().unwrap();
        assert!(d.reason.len() <= MAX_REASON && d.reason.chars().all(|c| c == 'é'));
        let mut bad = note(1, "x").encode();
        bad[0] = b'X';
        assert!(OpFailedNote::decode(&bad).is_err());
    }

    #[test]
    fn notes_cross_a_socket_and_are_found_by_op() {
        let (d, t) = UnixStream::pair().unwrap();
        d.set_nonblocking(true).unwrap();
        let mut out = Outbox::default();
        let mut inbox = Inbox::default();
        assert!(out.send(d.as_fd(), &note(1, "first")));
        assert!(out.send(d.as_fd(), &note(2, "second")));
        assert!(!inbox.read(t.as_fd()));
        assert_eq!(inbox.take(2, 7).as_deref(), Some("second"));
        assert_eq!(inbox.take(2, 7), None, "taken once");
        assert_eq!(inbox.take(1, 8), None, "another tensor");
        assert_eq!(inbox.take(1, 7).as_deref(), Some("first"));
        drop(d);
        assert!(inbox.read(t.as_fd()), "EOF: the daemon is gone");
        assert_eq!(inbox.bad_bytes(), 0);
    }

    #[test]
    fn a_trainer_that_never_reads_costs_a_bounded_outbox_and_drops_are_counted() {
        let (d, _t) = UnixStream::pair().unwrap();
        d.set_nonblocking(true).unwrap();
        let mut out = Outbox::default();
        let reason = "r".repeat(MAX_REASON);
        let mut sent = 0u64;
        for i in 0..100_000u64 {
            if !out.send(d.as_fd(), &note(i, &reason)) {
                break;
            }
            sent += 1;
        }
        assert!(out.queued() <= OUTBOX_NOTES);
        assert_eq!(out.dropped(), 1, "the first note that found the outbox full");
        assert!(sent < 100_000, "the socket filled up");
        assert!(!out.send(d.as_fd(), &note(0, "x")));
        assert_eq!(out.dropped(), 2);
    }

    #[test]
    fn the_inbox_keeps_the_last_notes_only() {
        let mut inbox = Inbox::default();
        let mut bytes = Vec::new();
        for i in 0..(INBOX_NOTES as u64 + 10) {
            bytes.extend(note(i, "why").encode());
        }
        // In pieces, as a stream delivers them.
        for piece in bytes.chunks(5) {
            inbox.take_bytes(piece);
        }
        assert_eq!(inbox.take(0, 7), None, "the oldest were let go");
        assert_eq!(inbox.take(INBOX_NOTES as u64 + 9, 7).as_deref(), Some("why"));
        assert_eq!(inbox.reasons.len(), INBOX_NOTES - 1);
    }
}
