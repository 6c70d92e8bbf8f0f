//! Unit tests of flow control's credit, windows and pauses.

use super::*;

fn flow(window: u32, world: u32) -> Flow {
    Flow::new(FlowConfig::with_window(window), world)
}

#[test]
fn a_sender_stops_at_its_unscheduled_window() {
    let mut f = flow(16, 3); // 8 per sender
    let sent = (0..20)
        .take_while(|_| {
            f.may_send(1) && {
                f.take_dseq(1);
                true
            }
        })
        .count();
    // The unscheduled window is a quarter of the 8 (at least
    // `min_per_sender`, 2): the rest comes by need.
    assert_eq!(sent, 2);
    assert!(f.may_send(2), "credit is per receiver");
}

#[test]
fn grants_follow_the_highest_dseq_once_per_quarter_window() {
    let mut r = flow(16, 3);
    let due: Vec<bool> = (0..8).map(|d| r.on_data(0, d, true, u64::MAX)).collect();
    // 8 per sender: due when at most 6 of the credit is left: at once
    // (the unscheduled 2 are nearly used), then every second datagram.
    assert_eq!(due, [true, false, true, false, true, false, true, false]);
    assert_eq!(r.grant(0), 15);
}

#[test]
fn without_backlog_a_grant_only_tops_up_a_used_window() {
    let mut r = flow(16, 3);
    let due: Vec<bool> = (0..8).map(|d| r.on_data(0, d, false, u64::MAX)).collect();
    // Due when at most 2 of the 8 are left: at once (1 of the unscheduled
    // 2 left), then at dseq 6 (high 7, granted 9); then at 15.
    assert_eq!(due, [true, false, false, false, false, false, true, false]);
    assert_eq!(r.grant(0), 15);
    // A transfer this rank wants nothing more of costs no GRANT.
    let mut r = flow(16, 3);
    assert!((0..2).all(|d| !r.on_data(0, d, false, 0)));
}

#[test]
fn lost_datagrams_leak_no_credit_while_later_ones_arrive() {
    let mut r = flow(16, 3);
    for d in [0, 2, 4] {
        r.on_data(0, d, true, u64::MAX);
    }
    assert!(r.on_data(0, 6, true, u64::MAX), "dseq 6 arriving (1, 3, 5 lost) leaves 1 of 8: grant");
    assert_eq!((r.grant(0), r.cuts), (15, 0), "single losses: the window stays");
}

#[test]
fn a_lost_tail_is_written_off_by_the_senders_request() {
    let (mut s, mut r) = (flow(16, 3), flow(16, 3));
    for _ in 0..2 {
        s.take_dseq(1);
    }
    assert!(!s.may_send(1));
    let ms = Duration::from_millis;
    assert!(s.blocked(1, Instant::ZERO, ms(1), ms(20)));
    let at = s.next_timeout().unwrap();
    assert_eq!(s.requests_due(at), [1]);
    s.request_sent(1);
    // Both lost; the request says 2 were sent.
    r.on_request(0, s.sent(1), u64::MAX);
    assert!(s.on_grant(1, r.grant(0)));
    assert!(s.may_send(1) && s.next_timeout().is_none());
    assert_eq!(r.grant(0), 10);
}

#[test]
fn requests_back_off_until_credit_comes() {
    let mut s = flow(16, 3);
    (0..2).for_each(|_| {
        s.take_dseq(1);
    });
    let ms = Duration::from_millis;
    let mut now = Instant::ZERO;
    let mut gaps = vec![];
    for _ in 0..5 {
        assert!(s.blocked(1, now, ms(1), ms(4)));
        let at = s.next_timeout().unwrap();
        gaps.push((at - now).as_millis());
        s.request_sent(1);
        now = at;
    }
    assert_eq!(gaps, [1, 2, 4, 4, 4]);
    assert!(s.on_grant(1, 12) && s.next_timeout().is_none());
}

#[test]
fn grants_are_cumulative_and_bounded() {
    let mut s = flow(16, 3);
    assert!(!s.on_grant(1, 2), "an old limit is no news");
    (0..8).for_each(|_| {
        s.take_dseq(1);
    });
    assert!(s.on_grant(1, 1_000_000), "more credit");
    let n = (0..100)
        .take_while(|_| {
            s.may_send(1) && {
                s.take_dseq(1);
                true
            }
        })
        .count();
    assert_eq!(n, 8, "a limit beyond a window of what was sent is capped");
}

#[test]
fn dseq_wraps_at_32_bits() {
    let mut r = flow(16, 3);
    r.rx[0].high = u64::from(u32::MAX) - 1;
    r.rx[0].granted = r.rx[0].high + 8;
    r.on_data(0, u32::MAX, true, u64::MAX);
    r.on_data(0, 0, true, u64::MAX);
    assert_eq!(r.rx[0].high, u64::from(u32::MAX) + 2);
}

#[test]
fn a_restart_starts_both_directions_over() {
    let mut f = flow(16, 3);
    for d in 0..8 {
        f.take_dseq(1);
        f.on_data(1, d, true, u64::MAX);
    }
    f.reset(1);
    assert_eq!((f.sent(1), f.grant(1)), (0, 2));
    assert!(f.may_send(1));
}

#[test]
fn off_never_blocks() {
    let mut f = Flow::new(FlowConfig::OFF, 4);
    assert!((0..10_000).all(|_| f.may_send(1) && {
        f.take_dseq(1);
        true
    }));
    assert!(!f.on_data(1, 5, true, u64::MAX));
    assert_eq!((f.high(1), f.sent(1)), (6, 10_000), "counts are kept for PROBEs");
}

#[test]
fn a_run_of_losses_halves_the_senders_window_once_per_window_and_it_grows_back() {
    let mut r = flow(32, 3); // 16 per sender
    let feed = |r: &mut Flow, ds: std::ops::Range<u32>| {
        for d in ds {
            r.on_data(0, d, true, u64::MAX);
        }
    };
    feed(&mut r, 0..2);
    // dseq 2 and 3 lost: random loss may do that, no cut.
    feed(&mut r, 4..5);
    assert_eq!((r.cuts, r.rx[0].win), (0, 16));
    // 5, 6 and 7 missing: judged once the highest is SUSPECT_WAIT further
    // (they might still come, by a longer path or from a lower priority
    // queue); still missing then, a run: the window halves.
    feed(&mut r, 8..9);
    assert_eq!(r.cuts, 0, "not at once");
    feed(&mut r, 9..(9 + SUSPECT_WAIT as u32));
    assert_eq!((r.cuts, r.rx[0].win), (1, 8));
    // Another run that began within the window after the cut: no second
    // cut; meanwhile the window grows back, one datagram per window.
    let h = r.high(0) as u32;
    feed(&mut r, (h + 3)..(h + 4 + SUSPECT_WAIT as u32));
    assert_eq!(r.cuts, 1);
    assert!(r.rx[0].win > 8 && r.rx[0].win <= 16, "grows back: {}", r.rx[0].win);
}

/// Datagrams that come late — reordered within their class by paths of
/// different delays, or held back by a priority queue — are no loss run;
/// datagrams still missing once the highest has moved on are.
#[test]
fn gaps_as_deep_as_seen_reordering_are_not_loss_runs() {
    let c = |k| Class::new(k).unwrap();
    let mut r = flow(64, 3); // 32 per sender
    let note = |r: &mut Flow, d: u32, k: u8| {
        r.on_data(0, d, true, u64::MAX);
        r.new_chunk(0, d, c(k));
    };
    for d in 0..4 {
        note(&mut r, d, 3);
    }
    // Class 5 overtakes class 3 in a priority queue: not reordering.
    note(&mut r, 5, 5);
    note(&mut r, 4, 3);
    assert!(!r.reordering(0) && r.seen(0) == r.high(0));
    // dseq 6..=9 of class 3 go on a slow path: 10 arrives first...
    note(&mut r, 10, 3);
    // ...and they land, late, within their class.
    for d in 6..9 {
        note(&mut r, d, 3);
    }
    assert!(r.reordering(0));
    // 9 is still on its way: the highest says 11, the count 10.
    assert_eq!((r.seen(0), r.high(0)), (10, 11), "while reordering, a PROBE is compared with the count");
    note(&mut r, 9, 3);
    assert!(r.rx[0].late_depth >= 4, "{}", r.rx[0].late_depth);
    for d in 11..(11 + SUSPECT_WAIT as u32) {
        note(&mut r, d, 3);
    }
    assert_eq!(r.cuts, 0, "what came late was no loss");
    // A gap whose datagrams never come: a loss run.
    let h = r.high(0) as u32;
    for d in (h + 4)..(h + 5 + SUSPECT_WAIT as u32) {
        note(&mut r, d, 3);
    }
    assert_eq!(r.cuts, 1);
}

/// A pause the sender came back from within a transfer is remembered
/// for one to two epochs; the first DATA of a transfer (after the idle
/// time between ops) is no sample.
#[test]
fn pauses_a_sender_came_back_from_are_remembered_for_an_epoch_or_two() {
    let mut r = flow(16, 3);
    let ms = |n: u64| Instant::from_nanos(n * 1_000_000);
    r.note_data(0, 0, ms(100));
    r.note_pause(0, ms(100));
    assert_eq!(r.pause(0, ms(100)), Duration::ZERO, "nothing came before");
    r.note_data(0, 1, ms(105));
    r.note_pause(0, ms(105));
    r.note_data(0, 2, ms(106));
    r.note_pause(0, ms(106));
    assert_eq!(r.pause(0, ms(106)), Duration::from_millis(5), "the longest, not the latest");
    assert_eq!(r.pause(1, ms(106)), Duration::ZERO, "per sender");
    // A long idle time, then a new transfer's first DATA: not sampled.
    r.note_data(0, 3, ms(1_400));
    assert_eq!(r.pause(0, ms(1_400)), Duration::from_millis(5), "the epoch before still counts");
    // A new epoch's sample rotates the old one out after two epochs.
    r.note_data(0, 4, ms(1_401));
    r.note_pause(0, ms(1_401));
    assert_eq!(r.pause(0, ms(1_401)), Duration::from_millis(5));
    assert_eq!(r.pause(0, ms(3_500)), Duration::ZERO, "forgotten after two epochs");
    // A restart forgets everything.
    r.note_data(0, 5, ms(3_510));
    r.note_pause(0, ms(3_510));
    assert_eq!(r.pause(0, ms(3_510)), Duration::from_millis(2_109));
    r.reset(0);
    assert_eq!(r.pause(0, ms(3_510)), Duration::ZERO);
}

#[test]
fn the_default_window_is_2_mib_of_datagrams() {
    assert_eq!(FlowConfig::default().window, 1424);
    assert_eq!(FlowConfig::for_window_bytes(2 << 20, 8872).window, 233);
    assert_eq!(FlowConfig::for_window_bytes(1, 8872).window, 1);
    assert_eq!(FlowConfig::for_window_bytes(1 << 40, 256).window, 65535);
}

#[test]
fn the_window_is_shared_with_a_floor() {
    assert_eq!(FlowConfig::with_window(256).per_sender(4), 85);
    assert_eq!(FlowConfig::with_window(256).per_sender(1024), 2);
    assert_eq!(FlowConfig { window: 63, min_per_sender: 1 }.per_sender(64), 1);
    assert_eq!(FlowConfig::with_window(256).per_sender(1), 256);
}

/// With flowlets on many paths, two datagrams of one path may have another
/// path's flowlet between them, and a priority queue holds a lower class
/// back: neither gap is a loss once what it missed came. A gap whose
/// datagrams never come is, however far the paths reorder.
#[test]
fn a_gap_within_one_path_is_a_loss_run_whatever_other_paths_reorder() {
    let c = |k| Class::new(k).unwrap();
    let mut r = flow(256, 3); // 128 per sender
    let note = |r: &mut Flow, d: u32, _path: u16| {
        // (The path is for the reader: flow control is not told it.)
        r.note_data(0, d, Instant::ZERO);
        r.new_chunk(0, d, c(3));
    };
    // Flowlet on path 1 (0..20), the next on path 2 (20..40) overtakes
    // the tail of the first (10..20), which lands late: deep reordering,
    // no loss.
    for d in (0..10).chain(20..40) {
        note(&mut r, d, 1 + u16::from(d >= 20));
    }
    for d in 10..20 {
        note(&mut r, d, 1);
    }
    assert!(r.rx[0].late_depth >= 20, "{}", r.rx[0].late_depth);
    // Path 2, then a flowlet on path 4 (50..70) that lands after path 2's
    // next one (70..110): the gap on path 2 filled in, no loss.
    for d in (40..50).chain(70..110) {
        note(&mut r, d, 2);
    }
    for d in 50..70 {
        note(&mut r, d, 4);
    }
    // A priority queue lets later datagrams of a higher class overtake
    // (110..114 come after 114..120 on the same path): no loss either.
    for d in (114..120).chain(110..114).chain(120..300) {
        note(&mut r, d, 2);
    }
    assert_eq!(r.cuts, 0, "reordering is no loss");
    // A gap of 5 on path 2 (300..305 dropped by its queue): a loss run
    // once the highest has moved on, though reordering was this deep.
    for d in 305..(306 + SUSPECT_WAIT as u32) {
        note(&mut r, d, 2);
    }
    assert_eq!(r.cuts, 1, "a gap whose datagrams never came is a loss run");
}
