//! Fuzz target `control`: see `dlcp_fuzz_check::control` for what it drives and checks
//! (the corpus replay test in `fuzz/check/tests/` runs the same function).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| dlcp_fuzz_check::control::check(data));
