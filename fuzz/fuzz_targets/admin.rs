//! Fuzz target `admin`: see `dlcp_fuzz_check::requests` for what it drives and checks
//! (the corpus replay test in `fuzz/check/tests/` runs the same function).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| dlcp_fuzz_check::requests::check_admin(data));
