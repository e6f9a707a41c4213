//! Peer request signing: what a signature covers, which requests are refused, request
//! ids, and how the claimed protocol version (legacy included) decides the check.

use super::*;
use crate::core::testing::pod;

fn secret(byte: u8) -> ClusterSecret {
    ClusterSecret::new(vec![byte; 32]).unwrap()
}

const PATH: &str = "/internal/v1/push/pos-1?x=1";

/// A forwarded push's headers, signed by pod "a" for pod "b" at `at`.
fn signed_push(at: SystemTime, body: &[u8]) -> HeaderMap {
    let mut headers = HeaderMap::new();
    headers.insert("posgate-tenant", HeaderValue::from_static("acme"));
    headers.insert("posgate-deadline-ms", HeaderValue::from_static("900"));
    headers.insert("posgate-hop", HeaderValue::from_static("1"));
    headers.insert("idempotency-key", HeaderValue::from_static("order-1"));
    headers.insert("content-type", HeaderValue::from_static("application/json"));
    sign(
        &secret(1),
        &Method::POST,
        PATH,
        &mut headers,
        body,
        at,
        (&pod("a"), &pod("b")),
        Some(served()),
    );
    headers
}

/// The API request the pushes [`signed_push`] signs forward.
fn served() -> RequestId {
    RequestId::parse(b"00f067aa0ba902b7").unwrap()
}

fn check(
    headers: &HeaderMap,
    method: Method,
    path: &str,
    now: SystemTime,
) -> Result<SignedHead, AuthError> {
    verify_head(
        &[secret(9), secret(1)],
        &method,
        path,
        headers,
        now,
        &pod("b"),
    )
}

#[test]
fn a_signed_head_verifies_and_its_body_must_match_the_digest() {
    let now = SystemTime::now();
    let headers = signed_push(now, b"{\"amount\":1}");
    let head = check(&headers, Method::POST, PATH, now).unwrap();
    assert_eq!(head.from, "a");
    let mut body = BodyDigest::default();
    body.update(b"{\"amount\"");
    body.update(b":1}");
    assert_eq!(body.check(&head), Ok(()));
    let mut other = BodyDigest::default();
    other.update(b"{\"amount\":9}");
    assert_eq!(other.check(&head), Err(AuthError::DigestMismatch));
    // Unsigned headers may come and go (proxies add some); receivers ignore them.
    let mut extra = headers.clone();
    extra.insert("user-agent", HeaderValue::from_static("curl"));
    assert!(check(&extra, Method::POST, PATH, now).is_ok());
    // Skew within the window.
    assert!(check(&headers, Method::POST, PATH, now + Duration::from_secs(29)).is_ok());
}

#[test]
fn every_signed_part_is_covered() {
    let now = SystemTime::now();
    let headers = signed_push(now, b"{}");
    let bad = |case: &str, h: &HeaderMap, method: Method, path: &str| {
        assert_eq!(
            check(h, method, path, now),
            Err(AuthError::BadSignature),
            "{case}"
        );
    };
    bad("method", &headers, Method::PUT, PATH);
    bad(
        "path",
        &headers,
        Method::POST,
        "/internal/v1/push/pos-2?x=1",
    );
    bad(
        "query",
        &headers,
        Method::POST,
        "/internal/v1/push/pos-1?x=2",
    );
    for (name, value) in [
        ("posgate-tenant", "bank"),
        ("posgate-deadline-ms", "30000"),
        ("posgate-hop", "0"),
        ("idempotency-key", "order-2"),
        ("content-type", "text/plain"),
        ("posgate-from", "z"),
        ("posgate-request-id", "00000000000000000000000000000000"),
        (
            "content-digest",
            "sha-256=:AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA=:",
        ),
    ] {
        let mut changed = headers.clone();
        changed.insert(name, HeaderValue::from_str(value).unwrap());
        bad(&format!("{name} changed"), &changed, Method::POST, PATH);
    }
    for name in ["posgate-tenant", "idempotency-key", "content-type"] {
        let mut removed = headers.clone();
        removed.remove(name);
        bad(&format!("{name} removed"), &removed, Method::POST, PATH);
    }
    for (name, value) in [
        ("content-encoding", "gzip"),
        ("posgate-epoch", "7"),
        ("posgate-anything", "x"),
    ] {
        let mut added = headers.clone();
        added.insert(name, HeaderValue::from_static(value));
        bad(&format!("{name} added"), &added, Method::POST, PATH);
    }
    // A second value of a signed header is refused before anything else.
    let mut doubled = headers.clone();
    doubled.append("idempotency-key", HeaderValue::from_static("order-2"));
    assert_eq!(
        check(&doubled, Method::POST, PATH, now),
        Err(AuthError::BadSignature)
    );
    let mut doubled = headers.clone();
    doubled.append(TIMESTAMP_HEADER, HeaderValue::from_static("1"));
    assert_eq!(
        check(&doubled, Method::POST, PATH, now),
        Err(AuthError::Malformed(TIMESTAMP_HEADER))
    );
    // A different timestamp, even within the window, is another text.
    let mut moved = headers.clone();
    moved.insert(TIMESTAMP_HEADER, HeaderValue::from(unix_seconds(now) + 1));
    bad("timestamp", &moved, Method::POST, PATH);
}

#[test]
fn stale_misaddressed_unknown_secret_and_missing_parts_are_refused() {
    let now = SystemTime::now();
    let headers = signed_push(now, b"{}");
    assert!(matches!(
        check(&headers, Method::POST, PATH, now + Duration::from_secs(31)),
        Err(AuthError::Stale { .. })
    ));
    assert!(matches!(
        check(&headers, Method::POST, PATH, now - Duration::from_secs(31)),
        Err(AuthError::Stale { .. })
    ));
    assert_eq!(
        verify_head(&[secret(1)], &Method::POST, PATH, &headers, now, &pod("c")),
        Err(AuthError::WrongRecipient { to: "b".into() })
    );
    assert_eq!(
        verify_head(&[secret(2)], &Method::POST, PATH, &headers, now, &pod("b")),
        Err(AuthError::BadSignature)
    );
    for name in [
        SIGNATURE_HEADER,
        TIMESTAMP_HEADER,
        REQUEST_ID_HEADER,
        FROM_HEADER,
        TO_HEADER,
        DIGEST_HEADER,
    ] {
        let mut missing = headers.clone();
        missing.remove(name);
        assert_eq!(
            check(&missing, Method::POST, PATH, now),
            Err(AuthError::Missing(name)),
            "{name}"
        );
    }
    let mut upper = headers.clone();
    let id = upper[REQUEST_ID_HEADER].to_str().unwrap().to_uppercase();
    upper.insert(REQUEST_ID_HEADER, HeaderValue::from_str(&id).unwrap());
    assert_eq!(
        check(&upper, Method::POST, PATH, now),
        Err(AuthError::Malformed(REQUEST_ID_HEADER))
    );
}

#[test]
fn request_ids_are_unique_per_signature() {
    let now = SystemTime::now();
    let a = signed_push(now, b"{}");
    let b = signed_push(now, b"{}");
    assert_ne!(a[REQUEST_ID_HEADER], b[REQUEST_ID_HEADER]);
    assert_ne!(a[SIGNATURE_HEADER], b[SIGNATURE_HEADER]);
    // Both forward pushes of one API request: its id leads theirs, for the owner's log.
    assert_eq!((serves(&a), serves(&b)), (Some(served()), Some(served())));
    let mut unserved = HeaderMap::new();
    let (me, you) = (pod("a"), pod("b"));
    sign(
        &secret(1),
        &Method::GET,
        PATH,
        &mut unserved,
        b"",
        now,
        (&me, &you),
        None,
    );
    assert_ne!(serves(&unserved), Some(served()));
    assert!(check(&unserved, Method::GET, PATH, now).is_ok());
    // New on every request, so sent as HPACK literals never indexed (`sign`).
    for name in [REQUEST_ID_HEADER, DIGEST_HEADER, SIGNATURE_HEADER] {
        assert!(a[name].is_sensitive(), "{name}");
    }
    assert!(!a[FROM_HEADER].is_sensitive());
}

#[test]
fn the_claimed_version_decides_the_check() {
    let mut headers = HeaderMap::new();
    assert_eq!(claimed(&headers), Ok(Claimed::Legacy));
    headers.insert(VERSION_HEADER, HeaderValue::from_static("2"));
    assert_eq!(claimed(&headers), Ok(Claimed::Current));
    headers.insert(VERSION_HEADER, HeaderValue::from_static("3"));
    assert_eq!(
        claimed(&headers),
        Err(AuthError::UnsupportedVersion("3".into()))
    );
    headers.append(VERSION_HEADER, HeaderValue::from_static("2"));
    assert_eq!(claimed(&headers), Err(AuthError::Malformed(VERSION_HEADER)));
}

#[test]
fn legacy_signatures_round_trip_and_a_current_one_cannot_be_downgraded() {
    let now = SystemTime::now();
    let mut headers = HeaderMap::new();
    legacy::sign(&secret(1), &Method::POST, "/p?q=1", now, b"body").apply(&mut headers);
    let (ts, sig) = legacy::verify(
        &[secret(1)],
        &Method::POST,
        "/p?q=1",
        &headers,
        b"body",
        now,
    )
    .unwrap();
    assert_eq!(ts, unix_seconds(now));
    assert_eq!(
        hex::encode(sig),
        headers[SIGNATURE_HEADER].to_str().unwrap()
    );
    assert_eq!(
        legacy::verify(
            &[secret(1)],
            &Method::POST,
            "/p?q=1",
            &headers,
            b"bodx",
            now
        ),
        Err(AuthError::BadSignature)
    );
    // A protocol-2 request stripped of its version header is checked as protocol 1:
    // its MAC is over another text, so it fails.
    let mut current = signed_push(now, b"{}");
    current.remove(VERSION_HEADER);
    assert_eq!(claimed(&current), Ok(Claimed::Legacy));
    assert_eq!(
        legacy::verify(&[secret(1)], &Method::POST, PATH, &current, b"{}", now),
        Err(AuthError::BadSignature)
    );
}
