//! The idempotency cache's unit tests: replays and conflicts, keys scoped to their terminal,
//! answers moved to another cache, expiry and eviction.

use http::StatusCode;

use super::*;

fn tenant(t: &str) -> Tenant {
    Tenant(t.into())
}

fn ok_answer() -> Answer {
    Answer {
        status: StatusCode::OK,
        body: bytes::Bytes::from_static(b"{}"),
    }
}

#[test]
fn replays_conflicts_and_releases() {
    let cache = IdempotencyCache::new(Duration::from_secs(600), 100);
    let t0 = Instant::now();
    let (a, b) = ([1u8; 32], [2u8; 32]);
    let Reserve::Reserved(r) = cache.reserve(&tenant("x"), "t1", "k1", a, t0) else {
        panic!("new key is reserved");
    };
    // In flight: same key conflicts, whatever the body.
    assert!(matches!(
        cache.reserve(&tenant("x"), "t1", "k1", a, t0),
        Reserve::Conflict(_)
    ));
    // Another tenant's identical key is independent.
    assert!(matches!(
        cache.reserve(&tenant("y"), "t1", "k1", a, t0),
        Reserve::Reserved(_)
    ));
    r.complete(&ok_answer());
    match cache.reserve(&tenant("x"), "t1", "k1", a, t0) {
        Reserve::Replay(answer) => assert_eq!(answer, ok_answer()),
        other => panic!("expected a replay, got {other:?}"),
    }
    assert!(matches!(
        cache.reserve(&tenant("x"), "t1", "k1", b, t0),
        Reserve::Conflict(_)
    ));
    // A reservation dropped without an answer frees the key.
    let Reserve::Reserved(r2) = cache.reserve(&tenant("x"), "t1", "k2", a, t0) else {
        panic!("new key is reserved");
    };
    drop(r2);
    assert!(matches!(
        cache.reserve(&tenant("x"), "t1", "k2", a, t0),
        Reserve::Reserved(_)
    ));
}

#[test]
fn a_key_belongs_to_its_terminal() {
    let cache = IdempotencyCache::new(Duration::from_secs(600), 100);
    let t0 = Instant::now();
    let Reserve::Reserved(r) = cache.reserve(&tenant("x"), "t1", "order-1", [1; 32], t0) else {
        panic!("new key is reserved");
    };
    r.complete(&ok_answer());
    // The same tenant, key and body for another terminal is another push: it is
    // delivered there, never answered with t1's stored result.
    assert!(matches!(
        cache.reserve(&tenant("x"), "t2", "order-1", [1; 32], t0),
        Reserve::Reserved(_)
    ));
    assert!(matches!(
        cache.reserve(&tenant("x"), "t1", "order-1", [1; 32], t0),
        Reserve::Replay(_)
    ));
}

#[test]
fn final_answers_move_to_another_cache_and_are_replayed_there() {
    let (old, new) = (
        IdempotencyCache::new(Duration::from_secs(600), 100),
        IdempotencyCache::new(Duration::from_secs(60), 100),
    );
    let t0 = Instant::now();
    for (terminal, key) in [("t1", "a"), ("t2", "b"), ("t1", "c")] {
        let Reserve::Reserved(r) = old.reserve(&tenant("x"), terminal, key, [1; 32], t0) else {
            panic!("reserved");
        };
        r.complete(&ok_answer());
    }
    // In flight: its outcome is unknown, so it does not move.
    let Reserve::Reserved(_flying) = old.reserve(&tenant("x"), "t1", "d", [1; 32], t0) else {
        panic!("reserved");
    };
    let later = t0 + Duration::from_secs(100);
    let kept = old.export(|t| t == "t1", 10, later);
    let keys: Vec<&str> = kept.iter().map(|k| k.key.as_str()).collect();
    assert_eq!(keys, ["c", "a"], "t1's final answers, newest first");
    assert_eq!(kept[0].ttl_left, Duration::from_secs(500));
    assert_eq!(
        old.export(|t| t == "t1", 1, later).len(),
        1,
        "bounded by max"
    );
    // A key the new cache holds already keeps its own state.
    let Reserve::Reserved(own) = new.reserve(&tenant("x"), "t1", "a", [7; 32], later) else {
        panic!("reserved");
    };
    assert_eq!(new.import(kept, later), 1);
    match new.reserve(&tenant("x"), "t1", "c", [1; 32], later) {
        Reserve::Replay(answer) => assert_eq!(answer, ok_answer()),
        other => panic!("expected the moved answer, got {other:?}"),
    }
    assert!(matches!(
        new.reserve(&tenant("x"), "t1", "a", [7; 32], later),
        Reserve::Conflict(_)
    ));
    drop(own);
    // Kept for at most the importing cache's own TTL (60 s, not the 500 s left).
    let after_ttl = later + Duration::from_secs(61);
    assert!(matches!(
        new.reserve(&tenant("x"), "t1", "c", [1; 32], after_ttl),
        Reserve::Reserved(_)
    ));
}

#[test]
fn entries_expire_and_capacity_evicts_the_oldest() {
    let cache = IdempotencyCache::new(Duration::from_secs(10), 2);
    let t0 = Instant::now();
    for (i, key) in ["a", "b", "c"].iter().enumerate() {
        let at = t0 + Duration::from_secs(i as u64);
        let Reserve::Reserved(r) = cache.reserve(&tenant("x"), "t1", key, [0; 32], at) else {
            panic!("reserved");
        };
        r.complete(&ok_answer());
    }
    assert_eq!(cache.len(), 2, "capacity bounds the cache");
    // "a" was evicted: it is new again.
    assert!(matches!(
        cache.reserve(
            &tenant("x"),
            "t1",
            "a",
            [9; 32],
            t0 + Duration::from_secs(3)
        ),
        Reserve::Reserved(_)
    ));
    // After the TTL "c" (inserted at t0+2) is gone too.
    let later = t0 + Duration::from_secs(13);
    assert!(matches!(
        cache.reserve(&tenant("x"), "t1", "c", [9; 32], later),
        Reserve::Reserved(_)
    ));
}
