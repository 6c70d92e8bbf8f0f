//! Deterministic simulations of the allreduce endpoint: N ranks on virtual time
//! with seeded loss, reordering, duplication, corruption and a priority-aware
//! bottleneck. Every test here fails if the property it names breaks.

mod common;

use common::*;
use dlcp_proto::endpoint::OpId;
use dlcp_proto::sim::NetConfig;
use dlcp_proto::time::Duration;

const SECOND: Duration = Duration::from_secs(1);

#[test]
fn lossless_is_bit_exact_for_2_4_8_33_ranks() {
    for (world, len) in [(2u32, 1001usize), (4, 4099), (8, 777), (33, 3331)] {
        for budget in [0, 10_000] {
            let mut c = Cluster::new(world, NetConfig::default().with_seed(u64::from(world)));
            let x = inputs(u64::from(world), world, len);
            let res = all_ok(c.allreduce(OpId { seq: 1, tensor: 3 }, &x, opts(budget), SECOND));
            let want = bits(&reference_sum(&x));
            for (r, (v, rep)) in res.iter().enumerate() {
                assert!(bits(v) == want, "world {world} budget {budget}: rank {r} not bit-exact");
                assert!(rep.own_mask.count_ones() == 0);
                assert!(!rep.deadline_fired, "world {world}: deadline fired on a clean network");
            }
        }
    }
}
