//! The receiver's packet keys: a few per peer, derived on demand.
//!
//! Every datagram names its sender (job, rank, generation, session) in its
//! header, and its tag is checked with that sender's key ([`JobKey::sender_key`]).
//! Deriving a key costs about a microsecond, so a receiver keeps the keys that
//! recently authenticated a datagram, [`KEYS_PER_PEER`] per peer rank (a
//! peer's current incarnation, and its previous one while both still speak):
//! a bounded cache, no allocation per datagram.
//!
//! A key enters the cache only after it authenticated a datagram, so
//! datagrams with forged sessions (or generations, or jobs) never evict a key
//! that is in use: each costs one derivation, counted in
//! [`KeyCache::derivations`], and is rejected. A sender rank outside the
//! world gets no slot: its key is derived for the one datagram.

use crate::wire::auth::PacketAuth;
use crate::wire::codec::decode_with;
use crate::wire::error::WireError;
use crate::wire::header::Header;
use crate::wire::mac::{JobKey, MacKey, SenderId};
use crate::wire::packet::Packet;

/// Keys kept per peer rank.
pub const KEYS_PER_PEER: usize = 2;

/// A key that authenticated a datagram, and when it last did (a use count).
#[derive(Debug)]
struct Cached {
    key: MacKey,
    used: u64,
}

/// The packet keys of a world's senders (see the module docs).
#[derive(Debug)]
pub struct KeyCache {
    job: JobKey,
    peers: Vec<[Option<Cached>; KEYS_PER_PEER]>,
    uses: u64,
    derivations: u64,
}

impl KeyCache {
    /// An empty cache for the ranks `0..world` of the job keyed by `job`.
    pub fn new(job: JobKey, world: u32) -> KeyCache {
        KeyCache { job, peers: (0..world).map(|_| Default::default()).collect(), uses: 0, derivations: 0 }
    }

    /// The packet authentication mode.
    pub fn auth(&self) -> PacketAuth {
        self.job.auth()
    }

    /// Keys derived so far (cache misses).
    pub fn derivations(&self) -> u64 {
        self.derivations
    }

    /// Bytes held (for footprints).
    pub fn bytes(&self) -> usize {
        self.peers.capacity() * size_of::<[Option<Cached>; KEYS_PER_PEER]>()
    }

    /// Check the tag of a structurally checked datagram with the key of the
    /// sender its header names, deriving that key if it is not cached; a
    /// derived key that authenticates is cached. Under `packet_auth = "none"`
    /// there is nothing to check.
    pub fn verify<T: AsRef<[u8]>>(&mut self, p: &Packet<T>) -> Result<(), WireError> {
        if self.job.auth() == PacketAuth::None {
            return Ok(());
        }
        let id = SenderId::of_header(p.header());
        self.uses += 1;
        let Some(slots) = self.peers.get_mut(id.rank as usize) else {
            self.derivations += 1;
            return p.verify(&self.job.sender_key(id));
        };
        if let Some(c) = slots.iter_mut().flatten().find(|c| c.key.id() == id) {
            c.used = self.uses;
            return p.verify(&c.key);
        }
        self.derivations += 1;
        let key = self.job.sender_key(id);
        p.verify(&key)?;
        // Authenticated: it takes an empty slot, or the least recently used one.
        let lru = slots.iter_mut().min_by_key(|s| s.as_ref().map_or(0, |c| c.used));
        if let Some(slot) = lru {
            *slot = Some(Cached { key, used: self.uses });
        }
        Ok(())
    }

    /// [`decode`](crate::wire::decode) with the keys of this cache.
    pub fn decode<'a>(&mut self, datagram: &'a [u8]) -> Result<(Header, &'a [u8]), WireError> {
        let auth = self.auth();
        decode_with(auth, datagram, |p| self.verify(p))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::class::Class;
    use crate::wire::{PacketType, Phase, seal};

    fn datagram(job: &JobKey, rank: u32, session: u64, packet: u64) -> Vec<u8> {
        let mut h = Header::new(PacketType::Probe, Class::CONTROL, Phase::Scatter);
        (h.job, h.src, h.dst, h.run, h.session, h.packet) = (1, rank, 0, 5, session, packet);
        h.chunk_count = 1;
        h.payload_len = crate::wire::GRANT_LEN as u16;
        let key = job.sender_key(h.sender());
        let mut out = vec![0u8; h.packet_len()];
        seal(&key, &h, &mut out, |_| {}).unwrap();
        out
    }

    #[test]
    fn keys_are_derived_once_per_sender_and_forged_sessions_evict_nothing() {
        let job = JobKey::new(b"cache secret");
        let mut c = KeyCache::new(job.clone(), 4);
        for p in 0..10 {
            c.decode(&datagram(&job, 1, 100, p)).unwrap();
            c.decode(&datagram(&job, 2, 200, p)).unwrap();
        }
        assert_eq!(c.derivations(), 2);
        // A new incarnation of rank 1, then the old one again: both fit.
        c.decode(&datagram(&job, 1, 101, 0)).unwrap();
        c.decode(&datagram(&job, 1, 100, 10)).unwrap();
        assert_eq!(c.derivations(), 3);
        // Forged sessions (another secret): each costs a derivation, is
        // rejected, and evicts neither cached key of rank 1.
        let forger = JobKey::new(b"not the secret");
        for s in 0..20 {
            assert_eq!(c.decode(&datagram(&forger, 1, 1000 + s, 0)), Err(WireError::BadTag));
        }
        assert_eq!(c.derivations(), 23);
        c.decode(&datagram(&job, 1, 100, 11)).unwrap();
        c.decode(&datagram(&job, 1, 101, 1)).unwrap();
        assert_eq!(c.derivations(), 23, "the authenticated keys stayed cached");
        // A third incarnation replaces the least recently used one (session 100).
        c.decode(&datagram(&job, 1, 102, 0)).unwrap();
        c.decode(&datagram(&job, 1, 101, 2)).unwrap();
        assert_eq!(c.derivations(), 24);
        c.decode(&datagram(&job, 1, 100, 12)).unwrap();
        assert_eq!(c.derivations(), 25);
        // A rank outside the world: derived every time, never cached.
        c.decode(&datagram(&job, 9, 1, 0)).unwrap();
        c.decode(&datagram(&job, 9, 1, 1)).unwrap();
        assert_eq!(c.derivations(), 27);
    }
}
