//! Like `decode`, but first overwrites the last 16 bytes with the correct tag
//! for the rest of the input (at least a header), as a peer holding the job key could. Random
//! mutations almost never pass the MAC, so this is the target that reaches the
//! field checks in `Header::parse` / `Header::check`.
#![no_main]

use dlcp_proto::wire::{self, JobKey, OVERHEAD, TAG_LEN};
use libfuzzer_sys::fuzz_target;
use std::sync::OnceLock;

/// Secret shared with `proto/tests/wire_fuzz_corpus.rs`.
const SECRET: &[u8] = b"dlcp fuzz corpus key";

fn key() -> &'static JobKey {
    static KEY: OnceLock<JobKey> = OnceLock::new();
    KEY.get_or_init(|| JobKey::new(SECRET))
}

fuzz_target!(|data: &[u8]| {
    let k = key();
    let mut b = data.to_vec();
    if b.len() >= OVERHEAD {
        let n = b.len() - TAG_LEN;
        let t = k.tag(&b[..n]);
        b[n..].copy_from_slice(&t);
    }
    if let Ok((h, payload)) = wire::decode(k, &b) {
        assert_eq!(h.check(), Ok(()));
        let mut out = vec![0u8; h.packet_len()];
        let n = wire::encode(k, &h, payload, &mut out).expect("re-encode of a decoded packet");
        assert_eq!(&out[..n], &b[..], "decode/encode is not the identity");
    }
});
