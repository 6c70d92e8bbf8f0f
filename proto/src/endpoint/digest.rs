//! The digest of the settings every host of a job must share, announced in
//! HELLO: peers whose digest differs are refused and reported with both
//! values ([`Mismatch::SettingsDigest`](crate::endpoint::Mismatch)).

use crate::endpoint::api::EndpointConfig;
use crate::transfer::MAX_BUDGET_PPM;
use crate::wire;

/// SHA-256, truncated to 64 bits, of a canonical encoding of: the wire
/// version, the packet authentication mode, the chunk size, the flow window,
/// the classifier's bands, levels and droppable classes, the budget cap, and
/// the number of paths (a receiver takes a peer's datagrams only from the
/// source ports of that many paths: hosts that disagree would drop part of
/// each other's traffic as from an unknown source, so HELLO refuses them).
/// Equal on every host with the same settings, whatever its build.
pub fn settings_digest(cfg: &EndpointConfig) -> u64 {
    let c = &cfg.classifier;
    let mut b = Vec::with_capacity(48);
    b.extend_from_slice(b"dlcp settings v6");
    b.push(wire::VERSION);
    b.push(cfg.key.auth() as u8);
    b.extend_from_slice(&(cfg.chunk_bytes as u32).to_be_bytes());
    b.extend_from_slice(&cfg.flow.wire_window().to_be_bytes());
    b.extend_from_slice(&[c.scatter_band.0, c.scatter_band.1, c.gather_band.0, c.gather_band.1]);
    b.extend_from_slice(&[c.layer_levels, c.magnitude_levels, c.droppable.0]);
    b.extend_from_slice(&MAX_BUDGET_PPM.to_be_bytes());
    b.extend_from_slice(&cfg.paths.to_be_bytes());
    let d = aws_lc_rs::digest::digest(&aws_lc_rs::digest::SHA256, &b);
    let mut out = [0u8; 8];
    out.copy_from_slice(&d.as_ref()[..8]);
    u64::from_be_bytes(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::JobKey;

    fn cfg(rank: u32) -> EndpointConfig {
        EndpointConfig::new(rank, 4, 1, 1, 7, JobKey::new(b"digest test"))
    }

    #[test]
    fn hosts_with_other_paths_have_other_digests() {
        let (a, b) = (cfg(0), EndpointConfig { paths: 16, ..cfg(1) });
        assert_ne!(settings_digest(&a), settings_digest(&b));
        assert_eq!(settings_digest(&a), settings_digest(&cfg(2)), "identity is not a setting");
    }
}
