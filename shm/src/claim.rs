//! What an attachment holds while it lives: its local rank in its job, one of
//! its user's attachments, one of the server's; given back when it is dropped.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use super::control::{Registration, RejectReason};

/// Which local ranks of which job are attached, the job's local world size,
/// and how many attachments each uid holds.
#[derive(Debug, Default)]
pub(crate) struct RankTable {
    jobs: HashMap<u64, (u32, HashSet<u32>)>,
    users: HashMap<u32, usize>,
}

impl RankTable {
    /// Take `r`'s rank for `uid`, unless the uid holds `per_user` already
    /// (0: no limit), the rank is taken or the world size disagrees.
    pub(crate) fn claim(&mut self, r: &Registration, uid: u32, per_user: usize) -> Result<(), RejectReason> {
        let held = self.users.get(&uid).copied().unwrap_or(0);
        if per_user > 0 && held >= per_user {
            let limit = u32::try_from(per_user).unwrap_or(u32::MAX);
            return Err(RejectReason::TooManyAttachments { limit, per_user: true });
        }
        let (world, ranks) = self.jobs.entry(r.job_id).or_insert_with(|| (r.local_world, HashSet::new()));
        if *world != r.local_world {
            return Err(RejectReason::WorldMismatch { job_world: *world, trainer_world: r.local_world });
        }
        if !ranks.insert(r.local_rank) {
            return Err(RejectReason::RankInUse { local_rank: r.local_rank });
        }
        *self.users.entry(uid).or_default() += 1;
        Ok(())
    }

    fn release(&mut self, r: &Registration, uid: u32) {
        if let Some((_, ranks)) = self.jobs.get_mut(&r.job_id) {
            ranks.remove(&r.local_rank);
            if ranks.is_empty() {
                self.jobs.remove(&r.job_id);
            }
        }
        if let Some(n) = self.users.get_mut(&uid) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                self.users.remove(&uid);
            }
        }
    }
}

/// Held by an attachment: its (job, rank) slot, its uid's count and the
/// server's live count, released on drop.
#[derive(Debug)]
pub(crate) struct Claim {
    live: Arc<AtomicUsize>,
    ranks: Arc<Mutex<RankTable>>,
    registration: Registration,
    uid: u32,
}

impl Claim {
    /// Counted in `live` already; `registration`'s rank and `uid`'s count are
    /// taken in `ranks` ([`RankTable::claim`]).
    pub(crate) fn new(
        live: Arc<AtomicUsize>,
        ranks: Arc<Mutex<RankTable>>,
        registration: Registration,
        uid: u32,
    ) -> Claim {
        Claim { live, ranks, registration, uid }
    }
}

impl Drop for Claim {
    fn drop(&mut self) {
        self.live.fetch_sub(1, Ordering::Relaxed);
        self.ranks.lock().unwrap_or_else(|p| p.into_inner()).release(&self.registration, self.uid);
    }
}
