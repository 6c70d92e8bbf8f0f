//! # dlcp-proto — the sans-IO protocol core of dlcp
//!
//! No sockets, no clocks, no `unsafe`: time comes in as an argument and work
//! comes out of `poll_*` calls, quinn-proto style. Everything that decides what
//! goes on the wire lives here and is tested in deterministic simulations.
//!
//! - [`endpoint`]: one rank's protocol state machine, the entry point.
//! - [`transfer`]: one bounded-loss transfer, send and receive side.
//! - [`wire`]: packet layout, zero-copy views, parsed headers, the MAC.
//! - [`class`]: the eight priority classes and sets of them.
//! - [`elem`]: element types (f32, f16, bf16): conversions and the one rounding.
//! - [`priority`]: the chunk classifier.
//! - [`bitmap`]: chunk bitmaps and their segmented wire form.
//! - [`pacer`]: token-bucket pacing on virtual time.
//! - [`paths`]: per-packet spraying over many paths, and path health.
//! - [`rate`]: loss-driven adaptation of the pacing rate (AIMD).
//! - [`estimator`]: Jacobson/Karels estimators for probe timers and deadlines.
//! - [`time`]: virtual [`time::Instant`].
//! - [`pool`]: reusable `f32` buffers for ops.
//! - [`sim`]: the deterministic network simulator the tests drive endpoints in.
//! - [`oracle`]: the reference result of an allreduce.
//! - [`stats`]: the endpoint's counters, each defined once, and their visitor.
//! - [`rng`]: a small seeded random generator (SplitMix64).
#![forbid(unsafe_code)]

pub mod bitmap;
pub mod class;
pub mod elem;
pub mod endpoint;
pub mod estimator;
pub mod flow;
pub mod oracle;
pub mod pacer;
pub mod paths;
pub mod pool;
pub mod priority;
pub mod rate;
pub mod rng;
pub mod run;
pub mod sim;
pub mod stats;
pub mod time;
pub mod transfer;
pub mod wire;
