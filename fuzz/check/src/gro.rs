//! The socket datapath's GSO send plan and GRO receive split
//! (`dlcp::datapath::socket::fuzzing`).
//!
//! Input: a queue of datagrams (destination, length), where the plan starts,
//! the batch size and the GSO limits; then a raw `(len, segment)` pair.
//! Checked:
//! - the plan's messages are consecutive runs of the queue from `start`, at
//!   most `batch` of them, stopping early only at the queue's end;
//! - a GSO message holds datagrams to one destination, all of the segment
//!   size but a shorter last one, within `max_segments` and `max_payload`;
//! - splitting each message the way the receiver's GRO split does gives back
//!   exactly its datagrams (the round trip a GSO sender and a GRO receiver make);
//! - any split covers `0..len` with consecutive ranges of `segment` bytes,
//!   the last one shorter, and yields at least one range.

use dlcp::datapath::socket::fuzzing::{gro_segments, gso_plan};

use crate::input::Input;

/// Run one input.
pub fn check(data: &[u8]) {
    let mut input = Input::new(data);
    let n = input.below(48);
    let sizes = [0usize, 1, 4, 100, 1392, 1400, 1472, 8952];
    let datagrams: Vec<(u16, usize)> = (0..n)
        .map(|_| {
            let port = u16::from(input.u8() % 3);
            let b = input.u8();
            let len = if b < 0xC0 { sizes[usize::from(b) % sizes.len()] } else { usize::from(input.u16()) };
            (port, len)
        })
        .collect();
    let start = input.below(n + 1);
    let batch = 1 + input.below(64);
    let gso = input.bool().then(|| (1 + input.below(64), usize::from(input.u16()).max(1)));
    let plan = gso_plan(&datagrams, start, batch, gso);
    check_plan(&datagrams, start, batch, gso, &plan);
    let (len, segment) = (usize::from(input.u16()), usize::from(input.u16()));
    check_split(len, segment);
}

fn check_plan(
    datagrams: &[(u16, usize)],
    start: usize,
    batch: usize,
    gso: Option<(usize, usize)>,
    plan: &[(usize, usize, usize, usize)],
) {
    assert!(plan.len() <= batch);
    let mut next = start;
    for &(first, count, segment, bytes) in plan {
        assert_eq!(first, next, "messages are consecutive: {plan:?}");
        assert!(count >= 1 && first + count <= datagrams.len());
        let group = &datagrams[first..first + count];
        assert_eq!(bytes, group.iter().map(|d| d.1).sum::<usize>());
        next = first + count;
        if count == 1 {
            assert_eq!(segment, 0);
            assert_eq!(gro_segments(bytes, 0), vec![0..bytes]);
            continue;
        }
        let (max_segments, max_payload) = gso.expect("no GSO message without GSO");
        assert!(count <= max_segments && bytes <= max_payload, "{plan:?} over {gso:?}");
        assert!(group.iter().all(|d| d.0 == group[0].0), "one destination per message");
        assert_eq!(segment, group[0].1);
        let (last, full) = group.split_last().expect("count > 1");
        assert!(full.iter().all(|d| d.1 == segment) && last.1 > 0 && last.1 <= segment, "{group:?}");
        let split = gro_segments(bytes, segment);
        let lens: Vec<usize> = split.iter().map(|r| r.len()).collect();
        assert_eq!(lens, group.iter().map(|d| d.1).collect::<Vec<_>>(), "GRO does not undo GSO");
    }
    assert!(plan.len() == batch || next == datagrams.len().max(start), "plan stopped early: {plan:?}");
}

fn check_split(len: usize, segment: usize) {
    let split = gro_segments(len, segment);
    assert!(!split.is_empty());
    assert_eq!(split[0].start, 0);
    assert_eq!(split.last().map(|r| r.end), Some(len));
    let step = if segment == 0 || segment >= len { len } else { segment };
    for (i, w) in split.windows(2).enumerate() {
        assert_eq!(w[0].end, w[1].start, "split of {len} at {segment}: {split:?}");
        assert_eq!(w[0].len(), step, "range {i}");
    }
    assert!(split.iter().all(|r| r.len() <= step.max(1) && (!r.is_empty() || len == 0)));
    assert_eq!(split.len(), if len == 0 { 1 } else { len.div_ceil(step) });
}
