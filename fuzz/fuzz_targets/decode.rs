//! Fuzz `wire::decode` with a fixed key. On success the decoded header and
//! payload must re-encode to exactly the input bytes (the wire form is
//! canonical: every header bit is either a field or checked to be zero).
#![no_main]

use dlcp_proto::wire::{self, JobKey};
use libfuzzer_sys::fuzz_target;
use std::sync::OnceLock;

/// Secret shared with `proto/tests/wire_fuzz_corpus.rs` (which also writes the
/// valid seed packets).
const SECRET: &[u8] = b"dlcp fuzz corpus key";

fn key() -> &'static JobKey {
    static KEY: OnceLock<JobKey> = OnceLock::new();
    KEY.get_or_init(|| JobKey::new(SECRET))
}

fuzz_target!(|data: &[u8]| {
    let k = key();
    if let Ok((h, payload)) = wire::decode(k, data) {
        assert_eq!(h.check(), Ok(()));
        assert_eq!(usize::from(h.payload_len), payload.len());
        let mut out = vec![0u8; h.packet_len()];
        let n = wire::encode(k, &h, payload, &mut out).expect("re-encode of a decoded packet");
        assert_eq!(&out[..n], data, "decode/encode is not the identity");
    }
});
