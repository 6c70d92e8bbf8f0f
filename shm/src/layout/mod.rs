//! The segment layout shared by both sides, in three parts:
//!
//! - `segment`: where the regions sit ([`Geometry`]), the header at
//!   offset 0 ([`SegmentHeader`]) and the ring control block;
//! - `desc`: the descriptor formats ([`SubmitDesc`], [`CompletionDesc`]) and their
//!   raw values ([`ElemType`], [`Opcode`], `FLAG_*`, [`Status`]);
//! - `validate`: the rules a submission must satisfy ([`SubmitDesc::validate`],
//!   [`DescError`], [`Limits`]) and what passes them ([`Submission`]).
//!
//! Everything here is shared with the trainer side, so every struct is
//! `#[repr(C)]` with explicit padding and a size pinned by a compile-time
//! assertion. Descriptors travel through the rings as eight 64-bit words
//! (see [`SubmitDesc::to_words`]); the byte layout of those words is the
//! `repr(C)` layout of the struct in native byte order (the two sides always run
//! on the same host).
//!
//! Pure data: no `unsafe`, no I/O. Everything is re-exported here, so users name
//! `layout::X` whatever file `X` lives in.

mod desc;
mod segment;
mod validate;

pub use desc::*;
pub use segment::*;
pub use validate::*;
