//! Differential test: one scripted sequence of store operations runs against the
//! in-memory store and against a real Redis, and the two transcripts must be equal.
//!
//! Nondeterministic values are normalized before comparing:
//! - generation ids become `G0`, `G1`, ... in order of first appearance (so "the same
//!   generation as before" and "a new generation" are still compared);
//! - epochs become their rank among the distinct epochs seen for the same shard (so
//!   "strictly larger than before", "unchanged" and "equal to the holder's" are still
//!   compared, but not the clock values);
//! - generation ages are dropped.
//!
//! It fails when either store differs in a rule: the epoch rule (after a wipe a
//! `last + 1`-only epoch would rank lowest), owner checks, generation checks, expiry,
//! membership or release results.

use crate::support::leases::Deletes;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::time::{Duration, Instant};

use crate::support::leases;
use crate::support::pod::member;
use crate::support::RedisServer;
use posgate::core::lease::{
    AcquireOutcome, Checked, Claim, LeaseCall, Release, ReleaseNote, Released, RenewOutcome,
};
use posgate::core::membership::Snapshot;
use posgate::core::placement::Placement;
use posgate::core::{Epoch, PodId, ShardId};
use posgate::store::memory::MemoryStore;
use posgate::store::redis::{RedisOptions, RedisStore};
use posgate::store::{ClusterMeta, CoordStore, StoreError};

const SHARDS: u32 = 8;
const LONG: Duration = Duration::from_secs(30);
const SHORT: Duration = Duration::from_millis(300);
/// An epoch floor far above either store's clock (Unix ms of the year 2096), so both
/// grant the same epochs above it.
const FAR: Epoch = 4_000_000_000_000;
/// Comfortably past SHORT, so expiry is certain in both stores.
const PAST_SHORT: Duration = Duration::from_millis(700);

/// One token of a transcript line.
#[derive(Clone, Debug)]
enum Tok {
    Text(String),
    Gen(String),
    Epoch(ShardId, Epoch),
}

#[derive(Default)]
struct Transcript {
    lines: Vec<Vec<Tok>>,
    /// Raw epochs of `Acquired` outcomes, per shard, in order: must strictly increase.
    acquired: BTreeMap<ShardId, Vec<Epoch>>,
}

fn text(s: impl Into<String>) -> Tok {
    Tok::Text(s.into())
}

fn held_by(s: ShardId, owner: &PodId, epoch: Epoch) -> Vec<Tok> {
    vec![text(format!("HeldBy({owner})")), Tok::Epoch(s, epoch)]
}

impl Transcript {
    fn push(&mut self, op: &str, toks: Vec<Tok>) {
        let mut line = vec![text(format!("{op}:"))];
        line.extend(toks);
        self.lines.push(line);
    }

    fn error(e: &StoreError) -> Vec<Tok> {
        match e {
            StoreError::MetaMismatch { stored, ours } => {
                vec![text(format!(
                    "MetaMismatch(stored {} shards, ours {})",
                    stored.shards, ours.shards
                ))]
            }
            other => panic!("unexpected store error in the differential script: {other}"),
        }
    }

    fn checked<T>(c: &Checked<T>, ok: impl FnOnce(&T) -> Vec<Tok>) -> Vec<Tok> {
        match c {
            Checked::Ok(v) => ok(v),
            Checked::GenerationChanged(info) => {
                vec![text("GenerationChanged"), Tok::Gen(info.id.clone())]
            }
        }
    }

    /// One line for a batch answer: `[shard]` and the tokens `each` gives its outcome.
    fn outcomes<O>(
        &mut self,
        op: &str,
        shards: &[ShardId],
        r: Result<Checked<Vec<O>>, StoreError>,
        mut each: impl FnMut(&mut Self, ShardId, &O) -> Vec<Tok>,
    ) {
        let toks = match &r {
            Err(e) => Self::error(e),
            Ok(c) => Self::checked(c, |outs| {
                assert_eq!(outs.len(), shards.len());
                let mut toks = Vec::new();
                for (&s, o) in shards.iter().zip(outs) {
                    toks.push(text(format!("[{s}]")));
                    toks.extend(each(self, s, o));
                }
                toks
            }),
        };
        self.push(op, toks);
    }

    fn acquire(&mut self, shards: &[ShardId], r: Result<Checked<Vec<AcquireOutcome>>, StoreError>) {
        self.outcomes("acquire", shards, r, |t, s, o| match o {
            AcquireOutcome::Acquired { epoch, released_by } => {
                t.acquired.entry(s).or_default().push(*epoch);
                let mut toks = vec![text("Acquired"), Tok::Epoch(s, *epoch)];
                if let Some(m) = released_by {
                    toks.push(text(format!("released by {}", m.pod)));
                }
                toks
            }
            AcquireOutcome::AlreadyMine { epoch } => {
                vec![text("AlreadyMine"), Tok::Epoch(s, *epoch)]
            }
            AcquireOutcome::HeldBy { owner, epoch } => held_by(s, owner, *epoch),
        });
    }

    fn renew(&mut self, shards: &[ShardId], r: Result<Checked<Vec<RenewOutcome>>, StoreError>) {
        self.outcomes("renew", shards, r, |_, s, o| match o {
            RenewOutcome::Renewed => vec![text("Renewed")],
            RenewOutcome::Missing { epoch } => vec![text("Missing"), Tok::Epoch(s, *epoch)],
            RenewOutcome::HeldBy { owner, epoch } => held_by(s, owner, *epoch),
        });
    }

    fn unit<T: std::fmt::Debug>(&mut self, op: &str, r: Result<Checked<T>, StoreError>) {
        let toks = match &r {
            Err(e) => Self::error(e),
            Ok(c) => Self::checked(c, |v| vec![text(format!("Ok {v:?}"))]),
        };
        self.push(op, toks);
    }

    fn snapshot(&mut self, snap: &Snapshot) {
        let mut toks = vec![Tok::Gen(snap.generation.id.clone()), text("members")];
        toks.extend(snap.members.iter().map(|m| text(format!("{m:?}"))));
        toks.push(text("leases"));
        for (s, lease) in snap.leases.iter().enumerate() {
            match lease {
                None => toks.push(text("-")),
                Some(l) => {
                    toks.extend([text(l.owner.to_string()), Tok::Epoch(s as ShardId, l.epoch)])
                }
            }
        }
        toks.push(text("placement"));
        toks.push(text(format!("{:?}", snap.placement)));
        toks.push(text(format!("heartbeats {}", snap.heartbeats)));
        self.push("snapshot", toks);
    }

    fn place(&mut self, expected: Option<u64>, p: &Placement, r: Result<bool, StoreError>) {
        let toks = match &r {
            Err(e) => Self::error(e),
            Ok(stored) => vec![text(stored.to_string())],
        };
        self.push(&format!("place v{} over {expected:?}", p.version), toks);
    }

    /// Renders with normalized generation ids and per-shard epoch ranks.
    fn render(&self) -> Vec<String> {
        let mut gens: HashMap<String, usize> = HashMap::new();
        let mut epochs: BTreeMap<ShardId, BTreeSet<Epoch>> = BTreeMap::new();
        for tok in self.lines.iter().flatten() {
            match tok {
                Tok::Gen(id) => {
                    let n = gens.len();
                    gens.entry(id.clone()).or_insert(n);
                }
                Tok::Epoch(s, e) => {
                    epochs.entry(*s).or_default().insert(*e);
                }
                Tok::Text(_) => {}
            }
        }
        let rank =
            |s: &ShardId, e: &Epoch| epochs[s].iter().position(|x| x == e).expect("seen epoch");
        self.lines
            .iter()
            .map(|line| {
                line.iter()
                    .map(|tok| match tok {
                        Tok::Text(t) => t.clone(),
                        Tok::Gen(id) => format!("G{}", gens[id]),
                        Tok::Epoch(s, e) => format!("e{}", rank(s, e)),
                    })
                    .collect::<Vec<_>>()
                    .join(" ")
            })
            .collect()
    }

    fn check_epochs_increase(&self, who: &str) {
        for (shard, seq) in &self.acquired {
            assert!(
                seq.windows(2).all(|w| w[0] < w[1]),
                "{who}: shard {shard} epochs not increasing: {seq:?}"
            );
        }
    }
}

/// How a test wipes the store: a soft wipe (FLUSHALL) keeps connections, a hard one
/// (restart empty) drops them.
trait Wiper {
    fn flush(&mut self);
    fn restart(&mut self);
}

struct MemoryWiper(MemoryStore);

impl Wiper for MemoryWiper {
    // A real wipe takes far longer than a millisecond; the epoch rule after data loss
    // (`now_ms` beats every earlier epoch) relies on that, so an instant wipe waits a
    // little, like a Redis restart would.
    fn flush(&mut self) {
        self.0.wipe();
        std::thread::sleep(Duration::from_millis(5));
    }
    fn restart(&mut self) {
        self.0.wipe();
        std::thread::sleep(Duration::from_millis(5));
    }
}

struct RedisWiper(RedisServer);

impl Wiper for RedisWiper {
    fn flush(&mut self) {
        assert_eq!(self.0.command(&["FLUSHALL"]), "+OK");
    }
    fn restart(&mut self) {
        self.0.restart_empty();
    }
}

fn pod(id: &str) -> PodId {
    PodId::new(id).unwrap()
}

/// The snapshot after a hard wipe, retried while the client reconnects.
async fn settle<S: CoordStore>(store: &S) -> Snapshot {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        match store.snapshot(SHARDS).await {
            Ok(snap) => return snap,
            Err(e) if Instant::now() < deadline => eprintln!("waiting for the store: {e}"),
            Err(e) => panic!("store did not come back: {e}"),
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Waits until the change counter has been quiet for 300 ms and returns it.
async fn quiet_changes<S: CoordStore>(store: &S) -> u64 {
    let rx = store.changes();
    let mut last = *rx.borrow();
    loop {
        tokio::time::sleep(Duration::from_millis(300)).await;
        let now = *rx.borrow();
        if now == last {
            return now;
        }
        last = now;
    }
}

async fn run<S: CoordStore>(store: &S, wiper: &mut dyn Wiper) -> Transcript {
    let mut t = Transcript::default();
    let (a, b, c) = (pod("a"), pod("b"), pod("c"));
    let meta = ClusterMeta::current(SHARDS);
    let other_meta = ClusterMeta {
        shards: 16,
        ..meta.clone()
    };

    // Generation: created by the first snapshot; "" never matches.
    let snap = store.snapshot(SHARDS).await.unwrap();
    t.snapshot(&snap);
    let g0 = snap.generation.id.clone();
    t.unit(
        "heartbeat a ''",
        store.heartbeat("", &member("a"), &meta, LONG).await,
    );
    t.unit(
        "heartbeat a",
        store.heartbeat(&g0, &member("a"), &meta, LONG).await,
    );
    t.unit(
        "heartbeat b",
        store.heartbeat(&g0, &member("b"), &meta, LONG).await,
    );
    t.unit(
        "heartbeat b again",
        store.heartbeat(&g0, &member("b"), &meta, LONG).await,
    );
    t.unit(
        "heartbeat c other meta",
        store.heartbeat(&g0, &member("c"), &other_meta, LONG).await,
    );
    t.unit("pin_meta", store.pin_meta(&meta).await.map(Checked::Ok));
    t.unit(
        "pin_meta other",
        store.pin_meta(&other_meta).await.map(Checked::Ok),
    );

    // Leases and owner checks.
    t.acquire(
        &[0, 1, 2, 3],
        leases::acquire(store, &g0, &a, &[0, 1, 2, 3], LONG).await,
    );
    t.acquire(
        &[2, 3, 4, 5],
        leases::acquire(store, &g0, &b, &[2, 3, 4, 5], LONG).await,
    );
    t.acquire(&[0], leases::acquire(store, &g0, &a, &[0], LONG).await);
    t.acquire(
        &[7, 7],
        leases::acquire(store, &g0, &c, &[7, 7], LONG).await,
    );
    t.renew(
        &[0, 4, 6],
        leases::renew(store, &g0, &b, &[0, 4, 6], LONG).await,
    );
    t.renew(&[0], leases::renew(store, "stale", &a, &[0], LONG).await);
    t.acquire(&[1], leases::acquire(store, "stale", &a, &[1], LONG).await);
    t.push(
        "release b",
        vec![text(format!(
            "{:?}",
            store.delete(&b, &[0, 4], None).await.unwrap()
        ))],
    );
    t.push(
        "release c",
        vec![text(format!(
            "{:?}",
            store.delete(&c, &[7, 7], None).await.unwrap()
        ))],
    );
    t.snapshot(&store.snapshot(SHARDS).await.unwrap());
    t.acquire(&[4], leases::acquire(store, &g0, &a, &[4], LONG).await);

    // Lease expiry by the store clock.
    t.acquire(&[6], leases::acquire(store, &g0, &b, &[6], SHORT).await);
    t.renew(&[6], leases::renew(store, &g0, &b, &[6], SHORT).await);
    tokio::time::sleep(PAST_SHORT).await;
    t.renew(&[6], leases::renew(store, &g0, &b, &[6], LONG).await);
    t.push(
        "release b expired",
        vec![text(format!(
            "{:?}",
            store.delete(&b, &[6], None).await.unwrap()
        ))],
    );
    t.acquire(&[6], leases::acquire(store, &g0, &a, &[6], LONG).await);

    // Release notes: left only by a release that deleted the releaser's lease, returned
    // by the next acquire (a fresh one, not `AlreadyMine`) until they expire.
    let note = |pod: &str, ttl| ReleaseNote {
        member: member(pod),
        ttl,
    };
    t.push(
        "release a noted",
        vec![text(format!(
            "{:?}",
            store
                .delete(&a, &[6, 5], Some(&note("a", LONG)))
                .await
                .unwrap()
        ))],
    );
    t.acquire(
        &[6, 5],
        leases::acquire(store, &g0, &c, &[6, 5], LONG).await,
    );
    t.acquire(&[6], leases::acquire(store, &g0, &c, &[6], LONG).await);
    t.push(
        "release c noted briefly",
        vec![text(format!(
            "{:?}",
            store
                .delete(&c, &[6], Some(&note("c", SHORT)))
                .await
                .unwrap()
        ))],
    );
    tokio::time::sleep(PAST_SHORT).await;
    t.acquire(&[6], leases::acquire(store, &g0, &a, &[6], LONG).await);

    // Handovers: a's lease of 6 to b (a live member) with a new epoch, which b's next
    // acquire finds as its own; a's lease of 4 to a pod that is no member (deleted); a
    // handover by a pod the lease does not name (nothing changes).
    let hand = |shard, to: &str| Release {
        shard,
        to: Some(pod(to)),
        floor: FAR,
    };
    let r = store
        .release(&a, &[hand(6, "b"), hand(4, "nobody")], None, LONG)
        .await
        .unwrap();
    let mut toks = Vec::new();
    for (s, r) in [6, 4].into_iter().zip(&r) {
        toks.push(text(format!("[{s}]")));
        match r {
            Released::HandedOver { epoch } => {
                t.acquired.entry(s).or_default().push(*epoch);
                toks.extend([text("HandedOver"), Tok::Epoch(s, *epoch)]);
            }
            other => toks.push(text(format!("{other:?}"))),
        }
    }
    t.push("release a to b", toks);
    t.push(
        "release c to a",
        vec![text(format!(
            "{:?}",
            store
                .release(&c, &[hand(6, "a")], None, LONG)
                .await
                .unwrap()
        ))],
    );
    t.snapshot(&store.snapshot(SHARDS).await.unwrap());
    t.acquire(&[6], leases::acquire(store, &g0, &b, &[6], LONG).await);
    t.renew(&[6], leases::renew(store, &g0, &a, &[6], LONG).await);

    // Member expiry, rejoin and deregistration.
    t.unit(
        "heartbeat c short",
        store.heartbeat(&g0, &member("c"), &meta, SHORT).await,
    );
    t.unit(
        "heartbeat d short",
        store.heartbeat(&g0, &member("d"), &meta, SHORT).await,
    );
    t.snapshot(&store.snapshot(SHARDS).await.unwrap());
    tokio::time::sleep(PAST_SHORT).await;
    // d comes back before any snapshot pruned it: still a (counted) join.
    t.unit(
        "heartbeat d rejoin",
        store.heartbeat(&g0, &member("d"), &meta, LONG).await,
    );
    t.snapshot(&store.snapshot(SHARDS).await.unwrap());
    t.unit(
        "heartbeat c rejoin",
        store.heartbeat(&g0, &member("c"), &meta, LONG).await,
    );
    store.deregister(&b).await.unwrap();
    store.deregister(&b).await.unwrap();
    t.snapshot(&store.snapshot(SHARDS).await.unwrap());

    // Placement compare-and-set: only over the stored version (`None`: none stored).
    let p1 = Placement::initial(&[a.clone(), c.clone()], SHARDS);
    let p2 = p1.next(&[a.clone(), c.clone(), pod("d")], SHARDS);
    t.place(Some(1), &p1, store.place(Some(1), &p1).await);
    t.place(None, &p1, store.place(None, &p1).await);
    t.place(None, &p2, store.place(None, &p2).await);
    t.place(Some(2), &p2, store.place(Some(2), &p2).await);
    t.place(Some(1), &p2, store.place(Some(1), &p2).await);
    t.snapshot(&store.snapshot(SHARDS).await.unwrap());
    // Joins a, b, c, d, d again, c again; releases 4 (b), 7 (c), 6 (a) and 6 (c); leave b;
    // 2 placements.
    t.push(
        "notifications",
        vec![text(quiet_changes(store).await.to_string())],
    );

    // Floors (epochs never go back): a claim above the store's clock is granted above its
    // floor; a holder's lease is bumped above a floor higher than the stored epoch, and
    // only the holder's (owner-checked); renewals name the shard's epoch.
    let floored = |shard, floor| [Claim { shard, floor }];
    let call = |pod| LeaseCall {
        generation: &g0,
        pod,
        ttl: LONG,
    };
    t.acquire(&[7], store.acquire(&call(&c), &floored(7, FAR)).await);
    t.acquire(&[7], store.acquire(&call(&c), &floored(7, FAR + 1)).await);
    t.acquire(&[7], store.acquire(&call(&a), &floored(7, 3 * FAR)).await);
    t.acquire(&[7], store.acquire(&call(&c), &floored(7, 2 * FAR)).await);
    t.renew(&[7], store.renew(&call(&a), &[7]).await);
    store.delete(&c, &[7], None).await.unwrap();
    t.renew(&[7], store.renew(&call(&c), &[7]).await);

    // Soft wipe: same connection, everything lost.
    wiper.flush();
    t.acquire(&[1], leases::acquire(store, &g0, &a, &[1], LONG).await);
    let g1 = store.snapshot(SHARDS).await.unwrap().generation.id;
    t.unit(
        "heartbeat a g1",
        store.heartbeat(&g1, &member("a"), &meta, LONG).await,
    );
    t.unit(
        "pin_meta after wipe",
        store.pin_meta(&other_meta).await.map(Checked::Ok),
    );
    t.acquire(
        &[1, 2],
        leases::acquire(store, &g1, &a, &[1, 2], LONG).await,
    );
    t.snapshot(&store.snapshot(SHARDS).await.unwrap());
    // The placement was lost with everything else; a pod puts back the one it remembers.
    let p3 = Placement {
        version: 3,
        assignment: p2.assignment.clone(),
    };
    t.place(Some(2), &p3, store.place(Some(2), &p3).await);
    t.place(None, &p3, store.place(None, &p3).await);
    t.snapshot(&store.snapshot(SHARDS).await.unwrap());

    // Hard wipe: the server restarts empty.
    wiper.restart();
    let snap = settle(store).await;
    t.snapshot(&snap);
    let g2 = snap.generation.id;
    t.acquire(&[1], leases::acquire(store, &g1, &a, &[1], LONG).await);
    t.acquire(
        &[1, 2, 3],
        leases::acquire(store, &g2, &b, &[1, 2, 3], LONG).await,
    );
    t.renew(&[1, 2], leases::renew(store, &g2, &a, &[1, 2], LONG).await);
    t.push(
        "release b",
        vec![text(format!(
            "{:?}",
            store.delete(&b, &[1, 2, 3, 4], None).await.unwrap()
        ))],
    );
    t.unit(
        "heartbeat c other meta g2",
        store.heartbeat(&g2, &member("c"), &other_meta, LONG).await,
    );
    t.snapshot(&store.snapshot(SHARDS).await.unwrap());
    t
}

#[tokio::test]
async fn memory_and_redis_agree() {
    let memory = MemoryStore::new();
    let mem = run(&memory, &mut MemoryWiper(memory.clone())).await;

    let server = RedisServer::start();
    let opts = RedisOptions {
        response_timeout: Duration::from_secs(2),
        connect_timeout: Duration::from_secs(1),
        ..Default::default()
    };
    let redis = RedisStore::connect(&server.url(), "diff", opts)
        .await
        .unwrap();
    let red = run(&redis, &mut RedisWiper(server)).await;

    mem.check_epochs_increase("memory");
    red.check_epochs_increase("redis");
    let (mem, red) = (mem.render(), red.render());
    eprintln!("normalized transcript (memory):\n{}", mem.join("\n"));
    for (i, (m, r)) in mem.iter().zip(&red).enumerate() {
        assert_eq!(
            m,
            r,
            "step {i} differs\nmemory: {m}\nredis:  {r}\nfull memory transcript:\n{}",
            mem.join("\n")
        );
    }
    assert_eq!(mem.len(), red.len());
}
