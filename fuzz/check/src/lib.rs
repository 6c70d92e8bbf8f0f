//! # dlcp-fuzz-check — what dlcp's fuzz targets check
//!
//! Every cargo-fuzz target in `fuzz/fuzz_targets/` is one call to a `check`
//! function of this crate, and `tests/corpus_replay.rs` replays every
//! committed corpus file (`fuzz/corpus/<target>/`) through the same function
//! in a plain `cargo test`: the target and its regression test cannot drift.
//!
//! A check never returns an error: it panics when dlcp breaks a property
//! (that is what the fuzzer reports as a crash). Inputs are structured — a
//! few leading bytes pick a mode or build a valid message that the rest then
//! edits ([`input`]) — so most inputs reach past the first length check.
//!
//! | module | target | what it drives |
//! |--------|--------|----------------|
//! | [`endpoint`] | `endpoint` | 2–4 `dlcp_proto` endpoints on a network the input controls, against `dlcp_proto::oracle` |
//! | [`frame`] | `frame` | the DPDK datapath's Ethernet/IPv4/UDP/ARP parser |
//! | [`gro`] | `gro` | the socket datapath's GSO plan and GRO split |
//! | [`control`] | `control` | the trainer control socket's register and reply messages |
//! | [`ring`] | `ring` | a hostile trainer's descriptors and ring indices against a real attachment |
//! | [`config`] | `config` | the configuration loader, from TOML text |
//! | [`requests`] | `admin`, `metrics` | the admin socket's and the metrics endpoint's request parsers |

pub mod config;
pub mod control;
pub mod endpoint;
pub mod frame;
pub mod gro;
pub mod input;
pub mod requests;
pub mod ring;

pub use input::{Input, mutate};

/// A target's check: runs one input, panics if dlcp breaks a property.
pub type Check = fn(&[u8]);

/// Every fuzz target, by name (the corpus folder `fuzz/corpus/<name>/`), with
/// its check.
pub const TARGETS: &[(&str, Check)] = &[
    ("endpoint", endpoint::check),
    ("frame", frame::check),
    ("gro", gro::check),
    ("control", control::check),
    ("ring", ring::check),
    ("config", config::check),
    ("admin", requests::check_admin),
    ("metrics", requests::check_metrics),
];
