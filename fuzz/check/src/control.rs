//! The trainer control socket's messages (`dlcp_shm::control`): the 32-byte
//! register request the daemon decodes from any local process, and the
//! 128-byte reply the trainer decodes.
//!
//! Input: a mode byte; raw message bytes (modes 0, 2) or the fields of a valid
//! message (modes 1, 3: a registration; an accepted reply with its geometry
//! or a rejection with its code and details), then a few in-place edits.
//! Checked:
//! - decoding never panics, and every error has a message;
//! - a decoded registration is valid (`local_rank < local_world ≤ 1024`) and
//!   re-encodes to exactly the input (the form is canonical);
//! - a decoded reply re-encodes to bytes that decode to the same reply, and
//!   an accepted one describes a geometry `Geometry::new` agrees with;
//! - an unedited message built from valid fields decodes to those fields.

use dlcp_shm::control::{MAX_LOCAL_WORLD, REGISTER_LEN, REPLY_LEN, Reply};
use dlcp_shm::{Geometry, Registration, RejectReason};

use crate::input::Input;

/// Overwrite or flip up to 4 bytes of `b` in place.
fn edit(input: &mut Input<'_>, b: &mut [u8]) {
    for _ in 0..input.below(5) {
        let at = input.below(b.len());
        if input.bool() {
            b[at] = input.u8();
        } else {
            b[at] ^= 1 << (input.u8() % 8);
        }
    }
}

fn fill(input: &mut Input<'_>, b: &mut [u8]) {
    let raw = input.bytes(b.len());
    b[..raw.len()].copy_from_slice(raw);
}

/// Run one input.
pub fn check(data: &[u8]) {
    let mut input = Input::new(data);
    match input.u8() % 4 {
        0 | 1 => register(&mut input),
        _ => reply(&mut input),
    }
}

fn register(input: &mut Input<'_>) {
    let mut b = [0u8; REGISTER_LEN];
    let mut built = None;
    if input.bool() {
        let world = 1 + input.below(MAX_LOCAL_WORLD as usize) as u32;
        let r = Registration { job_id: input.u64(), local_rank: input.u32() % world, local_world: world };
        b = r.encode();
        built = Some(r);
    } else {
        fill(input, &mut b);
    }
    let orig = b;
    edit(input, &mut b);
    match Registration::decode(&b) {
        Ok(r) => {
            assert!(r.local_world >= 1 && r.local_world <= MAX_LOCAL_WORLD && r.local_rank < r.local_world);
            assert_eq!(r.encode(), b, "register form is not canonical");
            if b == orig
                && let Some(want) = built
            {
                assert_eq!(r, want);
            }
        }
        Err(e) => {
            assert!(built.is_none() || b != orig, "valid registration refused: {e}");
            assert!(!e.to_string().is_empty());
        }
    }
}

fn reply(input: &mut Input<'_>) {
    let mut b = [0u8; REPLY_LEN];
    let mut built = None;
    match input.u8() % 3 {
        0 => fill(input, &mut b),
        1 => {
            let g = Geometry::new(
                1 << input.below(18),
                1 << input.below(18),
                4096 * (1 + u64::from(input.u16())),
            );
            if let Ok(geometry) = g {
                // A valid place: a rank below the number of daemons (0 daemons: not told).
                let nodes = input.u32();
                let node_rank = if nodes == 0 { 0 } else { input.u32() % nodes };
                let place = dlcp_shm::control::JobPlace { node_rank, nodes };
                let r = Reply::Accepted { attachment_id: input.u64(), geometry, place };
                b = r.encode();
                built = Some(r);
            }
        }
        _ => {
            let code = input.u32() % 10;
            let r = Reply::Rejected(RejectReason::from_wire(code, [input.u64(), input.u64()]));
            b = r.encode();
            built = Some(r);
        }
    }
    let orig = b;
    edit(input, &mut b);
    match Reply::decode(&b) {
        Ok(r) => {
            let again = Reply::decode(&r.encode()).expect("a re-encoded reply decodes");
            assert_eq!(again, r, "reply does not survive re-encoding");
            match r {
                Reply::Accepted { geometry: g, .. } => {
                    assert_eq!(Geometry::new(g.sq_capacity, g.cq_capacity, g.arena_size), Ok(g));
                }
                Reply::Rejected(why) => assert!(!why.to_string().is_empty()),
            }
            if b == orig
                && let Some(want) = built
            {
                assert_eq!(r, want);
            }
        }
        Err(e) => {
            assert!(built.is_none() || b != orig, "valid reply refused: {e}");
            assert!(!e.to_string().is_empty());
        }
    }
}
