//! The owner's idempotency cache: `(tenant, terminal, key)` -> the body's digest and the
//! answer, so a retry with the same key and body gets the stored answer instead of a
//! second delivery, and a reuse of the key with another body is refused.
//!
//! A key belongs to one terminal: the same key sent to another terminal is a different
//! push (delivered there), never the first terminal's cached answer. Senders commonly
//! derive keys from their own order ids, which repeat across terminals.
//!
//! Only final answers the terminal gave are stored (`200`, and `502` — the terminal
//! saw the push). A key whose push is in flight is reserved: a concurrent push with the
//! same key gets `409`. A reservation that ends without a stored answer (not delivered,
//! or delivery unknown) is removed, so the caller may retry with the same key; the
//! terminal dedupes such retries by key.
//!
//! Limits (documented in `docs/design.md`): entries live `ttl` (default 10 min) and at
//! most `capacity` (default 100,000) per pod, oldest evicted first; the cache is per
//! pod, so a new owner that could not take the old owner's answers over (below) does not
//! know its keys — the key and epoch still reach the terminal, which dedupes across
//! handovers.
//!
//! A shard's final answers move with it: the pod that takes a shard over asks the pod
//! that had it for them ([`IdempotencyCache::export`], [`IdempotencyCache::import`];
//! the transfer is `super::handover`), so a retry across a planned move is answered
//! from the cache rather than reaching the terminal again.
//!
//! Time is passed in (`now`), so the rules are tested without sleeping.

use std::collections::VecDeque;
use std::hash::{BuildHasher, RandomState};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use hashbrown::HashTable;

use super::answer::Answer;
use crate::credentials::Tenant;

/// What a key is unique within: the tenant that sent it and the terminal it is for.
/// `hash` is the three's hash with the cache's keyed hasher, computed once when the key
/// is made: a push looks its key up, stores it, expires an older one and completes it,
/// and hashing three caller-chosen strings each time was ~4k instructions per push.
#[derive(Debug)]
struct Key {
    tenant: Tenant,
    terminal: String,
    key: String,
    hash: u64,
}

impl Key {
    fn new(hasher: &RandomState, tenant: Tenant, terminal: String, key: String) -> Key {
        let hash = hasher.hash_one((&tenant, &terminal, &key));
        Key {
            tenant,
            terminal,
            key,
            hash,
        }
    }
}

impl PartialEq for Key {
    /// The hash first: it differs for almost every other key.
    fn eq(&self, other: &Key) -> bool {
        self.hash == other.hash
            && self.key == other.key
            && self.terminal == other.terminal
            && self.tenant == other.tenant
    }
}

#[derive(Debug)]
enum Outcome {
    InFlight,
    Done(Answer),
}

#[derive(Debug)]
struct Entry {
    digest: [u8; 32],
    slot: Outcome,
    expires: Instant,
    /// Matches the entry's place in the eviction order.
    serial: u64,
}

/// A key as the cache holds it: one copy of its strings, shared by the map, the
/// eviction order and the push's reservation.
type SharedKey = Arc<Key>;

#[derive(Debug, Default)]
struct Cache {
    /// By each key's own `hash` (see [`Key`]).
    entries: HashTable<(SharedKey, Entry)>,
    /// SipHash with keys drawn at random per process: callers choose the strings, so a
    /// hasher they could predict would let them aim keys at one bucket.
    hasher: RandomState,
    /// Insertion order, for expiry and eviction; may hold keys already removed.
    order: VecDeque<(SharedKey, u64)>,
    next_serial: u64,
}

/// What [`IdempotencyCache::reserve`] found.
#[derive(Debug)]
pub enum Reserve {
    /// New key: deliver, then [`Reservation::complete`].
    Reserved(Reservation),
    /// Same key and body answered before: return this.
    Replay(Answer),
    /// Same key in flight, or reused with another body; the reason says which.
    Conflict(&'static str),
}

/// A final answer as it moves to another pod: what it answers, for which key, and how
/// much longer it is kept.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Kept {
    pub tenant: Tenant,
    pub terminal: String,
    pub key: String,
    pub digest: [u8; 32],
    pub answer: Answer,
    pub ttl_left: Duration,
}

/// The cache, shared by the pod's pushes.
#[derive(Clone, Debug)]
pub struct IdempotencyCache {
    inner: Arc<Mutex<Cache>>,
    ttl: Duration,
    capacity: usize,
}

impl IdempotencyCache {
    pub fn new(ttl: Duration, capacity: usize) -> Self {
        IdempotencyCache {
            inner: Arc::new(Mutex::new(Cache::default())),
            ttl,
            capacity: capacity.max(1),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Cache> {
        // Every critical section leaves the maps consistent before it can panic.
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Looks `key` up for `tenant`'s pushes to `terminal` and reserves it when new.
    pub fn reserve(
        &self,
        tenant: &Tenant,
        terminal: &str,
        key: &str,
        digest: [u8; 32],
        now: Instant,
    ) -> Reserve {
        let mut cache = self.lock();
        cache.expire(now);
        let k = Key::new(
            &cache.hasher,
            tenant.clone(),
            terminal.to_string(),
            key.to_string(),
        );
        if let Some(entry) = cache.get(&k) {
            if entry.digest != digest {
                return Reserve::Conflict("idempotency key reused with a different body");
            }
            return match &entry.slot {
                Outcome::InFlight => {
                    Reserve::Conflict("a push with this idempotency key is in flight")
                }
                Outcome::Done(answer) => Reserve::Replay(answer.clone()),
            };
        }
        let k = Arc::new(k);
        let serial = cache.insert(
            k.clone(),
            digest,
            Outcome::InFlight,
            now + self.ttl,
            self.capacity,
        );
        Reserve::Reserved(Reservation {
            cache: self.clone(),
            key: Some((k, serial)),
        })
    }

    /// The final answers kept for terminals `wanted` selects, newest first, at most
    /// `max` of them; keys in flight are not included (their outcome is not known).
    pub fn export(&self, wanted: impl Fn(&str) -> bool, max: usize, now: Instant) -> Vec<Kept> {
        let mut cache = self.lock();
        cache.expire(now);
        let mut out = Vec::new();
        for (k, serial) in cache.order.iter().rev() {
            if out.len() == max {
                break;
            }
            let Some(e) = cache.get(k).filter(|e| e.serial == *serial) else {
                continue;
            };
            if let (Outcome::Done(answer), true) = (&e.slot, wanted(&k.terminal)) {
                out.push(Kept {
                    tenant: k.tenant.clone(),
                    terminal: k.terminal.clone(),
                    key: k.key.clone(),
                    digest: e.digest,
                    answer: answer.clone(),
                    ttl_left: e.expires.saturating_duration_since(now),
                });
            }
        }
        out
    }

    /// Takes answers another pod kept: each key this cache does not hold yet is stored
    /// as answered, for what was left of its time there (at most this cache's TTL). A
    /// key held here is left alone: this pod's own state is newer. Capacity bounds the
    /// import as it bounds reservations (oldest evicted first). Returns how many were
    /// taken.
    pub fn import(&self, kept: Vec<Kept>, now: Instant) -> usize {
        let mut cache = self.lock();
        cache.expire(now);
        let mut taken = 0;
        for entry in kept {
            let k = Key::new(&cache.hasher, entry.tenant, entry.terminal, entry.key);
            if entry.ttl_left.is_zero() || cache.get(&k).is_some() {
                continue;
            }
            let expires = now + entry.ttl_left.min(self.ttl);
            let answered = Outcome::Done(entry.answer);
            cache.insert(Arc::new(k), entry.digest, answered, expires, self.capacity);
            taken += 1;
        }
        taken
    }

    /// Entries held now (expired ones included until the next call).
    pub fn len(&self) -> usize {
        self.lock().entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl Cache {
    /// Stores a new entry for `k` (which must be absent), after evicting the oldest
    /// while the cache holds `capacity`; returns its serial.
    fn insert(
        &mut self,
        k: SharedKey,
        digest: [u8; 32],
        slot: Outcome,
        expires: Instant,
        capacity: usize,
    ) -> u64 {
        while self.entries.len() >= capacity {
            if !self.evict_oldest() {
                break;
            }
        }
        let serial = self.next_serial;
        self.next_serial += 1;
        self.order.push_back((k.clone(), serial));
        let entry = Entry {
            digest,
            slot,
            expires,
            serial,
        };
        self.entries
            .insert_unique(k.hash, (k, entry), |(k, _)| k.hash);
        serial
    }

    fn get(&self, k: &Key) -> Option<&Entry> {
        self.entries
            .find(k.hash, |(held, _)| **held == *k)
            .map(|(_, e)| e)
    }

    fn get_mut(&mut self, k: &Key) -> Option<&mut Entry> {
        self.entries
            .find_mut(k.hash, |(held, _)| **held == *k)
            .map(|(_, e)| e)
    }

    fn remove(&mut self, k: &Key) {
        if let Ok(held) = self.entries.find_entry(k.hash, |(held, _)| **held == *k) {
            held.remove();
        }
    }

    fn expire(&mut self, now: Instant) {
        while let Some((key, serial)) = self.order.front() {
            match self.get(key) {
                Some(e) if e.serial == *serial && e.expires > now => return,
                Some(e) if e.serial == *serial => {
                    let key = key.clone();
                    self.remove(&key);
                }
                _ => {}
            }
            self.order.pop_front();
        }
    }

    /// Removes the oldest live entry; false when there is none.
    fn evict_oldest(&mut self) -> bool {
        while let Some((key, serial)) = self.order.pop_front() {
            if self.get(&key).is_some_and(|e| e.serial == serial) {
                self.remove(&key);
                return true;
            }
        }
        false
    }
}

/// A reserved key. [`Reservation::complete`] stores the answer; dropping it otherwise
/// removes the key, so a retry with it is delivered again.
#[derive(Debug)]
pub struct Reservation {
    cache: IdempotencyCache,
    key: Option<(SharedKey, u64)>,
}

impl Reservation {
    /// Stores `answer` as the key's result.
    pub fn complete(mut self, answer: &Answer) {
        let Some((key, serial)) = self.key.take() else {
            return;
        };
        let mut cache = self.cache.lock();
        if let Some(entry) = cache.get_mut(&key).filter(|e| e.serial == serial) {
            entry.slot = Outcome::Done(answer.clone());
        }
    }
}

impl Drop for Reservation {
    fn drop(&mut self) {
        if let Some((key, serial)) = self.key.take() {
            let mut cache = self.cache.lock();
            if cache.get(&key).is_some_and(|e| e.serial == serial) {
                cache.remove(&key);
            }
        }
    }
}

#[cfg(test)]
mod tests;
