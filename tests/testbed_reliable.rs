//! Reliable mode on the emulated cluster of `scripts/testbed.sh`: 4 hosts,
//! 1% random loss on every link (nftables), budget 0. 50 allreduce ops all
//! complete and are bit-exact (the sum over hosts in rank order), with every
//! chunk delivered and no op failed or ended by the hard timeout.
//!
//! Needs root and network namespaces; where they are unavailable it fails under `DLCP_REQUIRE_NETNS=1` / `DLCP_CI=1`
//! and is reported as skipped otherwise (see `tests/prereq`).

mod prereq;
mod testbed_common;

use testbed_common::*;

const PREFIX: &str = "dlcptbe";
const HOSTS: usize = 4;
const OPS: usize = 50;

/// 256 KiB .. 1 MiB of f32, odd sizes included.
fn size(i: usize) -> usize {
    [65_536, 100_003, 180_001, 262_144, 131_072][i % 5]
}

#[test]
fn one_pct_loss_on_every_link_budget_zero_is_bit_exact() {
    let Some(bed) = Bed::start(PREFIX, HOSTS, &["--loss", "1"], 10_000) else { return };
    let sizes: Vec<usize> = (0..OPS).map(size).collect();
    let results = run_ops(&bed, &sizes, 0);
    for (i, &n) in sizes.iter().enumerate() {
        let mut want = data(seed(0, i), n);
        for h in 1..HOSTS {
            want.iter_mut().zip(data(seed(h, i), n)).for_each(|(a, b)| *a += b);
        }
        let want: Vec<u32> = want.iter().map(|x| x.to_bits()).collect();
        for (h, r) in results.iter().enumerate() {
            let got: Vec<u32> = r[i].0.iter().map(|x| x.to_bits()).collect();
            assert!(got == want, "host {h} op {i} ({n} elems): budget 0 result is not bit-exact");
            assert_eq!(r[i].1.delivered_ppm, 1_000_000, "host {h} op {i}: budget 0 must deliver everything");
        }
        for h in 0..HOSTS {
            let r = bed.report(h, i as u64 + 1, i as u32);
            for t in r["scatter"].as_array().unwrap().iter().chain(r["gather"].as_array().unwrap()) {
                assert_eq!(
                    t["delivered_fraction"].as_f64(),
                    Some(1.0),
                    "host {h} op {i}: incomplete transfer {t}"
                );
            }
        }
    }
    let (seen, dropped) = bed.loss_counters();
    let mut repairs = 0;
    for h in 0..HOSTS {
        let s = bed.stats(h);
        assert_eq!(s["protocol"]["hard_timeouts"], 0, "host {h}: an op hit the hard timeout: {s}");
        assert_eq!(s["service"]["ops_failed"], 0, "host {h}: an op failed: {s}");
        assert_eq!(s["service"]["ops_completed"], OPS as u64, "host {h}: {s}");
        repairs += s["protocol"]["repairs_received"].as_u64().unwrap_or(0);
    }
    let (p50, max) =
        p50_max(&results.iter().flat_map(|r| r.iter().map(|(_, c)| c.duration)).collect::<Vec<_>>());
    eprintln!(
        "reliable mode (1% loss per link, budget 0): {dropped} of {seen} packets dropped, {repairs} repairs received; \
         completion p50 {p50:?} max {max:?}"
    );
    assert!(dropped > 0, "the testbed's 1% loss dropped nothing: the test proves nothing");
    assert!(repairs > 0, "no repairs under 1% loss: the test proves nothing");
}
