//! # dlcp-ffi — DPDK bindings for dlcp
