//! What arrives at the peer endpoints from the pod network: the signed head (protocol 2
//! and the previous release's protocol 1), a forwarded push's headers and body, and
//! the bodies of the other peer requests and answers. Never a panic; and a request
//! signed with the cluster secret verifies, while any other body fails its digest.
#![no_main]

use std::time::{Duration, SystemTime};

use bytes::Bytes;
use http::{HeaderValue, Method};
use libfuzzer_sys::arbitrary::{self, Arbitrary};
use libfuzzer_sys::fuzz_target;
use posgate::core::shard::shard_of;
use posgate::core::PodId;
use posgate::credentials::ClusterSecret;
use posgate::peer::signing::{self, legacy, BodyDigest};
use posgate::peer::wire::{Draining, ForwardedPush, HandedOver, ReleaseTerminals};

/// Header names the peer endpoints read, and one they do not.
const NAMES: [&str; 12] = [
    signing::VERSION_HEADER,
    signing::TIMESTAMP_HEADER,
    signing::SIGNATURE_HEADER,
    signing::REQUEST_ID_HEADER,
    signing::FROM_HEADER,
    signing::TO_HEADER,
    signing::DIGEST_HEADER,
    "posgate-hop",
    "posgate-tenant",
    "idempotency-key",
    "content-type",
    "x-other",
];

#[derive(Arbitrary, Debug)]
struct Input {
    post: bool,
    path: String,
    headers: Vec<(u8, Vec<u8>)>,
    body: Vec<u8>,
    other_body: Vec<u8>,
    terminal: String,
    shard: u32,
    skew_secs: i16,
}

fuzz_target!(|input: Input| {
    let secret = ClusterSecret::new(vec![7u8; 32]).unwrap();
    let me = PodId::new("pod-b").unwrap();
    let from = PodId::new("pod-a").unwrap();
    let now = SystemTime::UNIX_EPOCH + Duration::from_secs(1_800_000_000);
    let method = if input.post {
        Method::POST
    } else {
        Method::GET
    };
    let mut headers = posgate_fuzz::headers(&NAMES, &input.headers);
    let path = &input.path;
    let secrets = [secret.clone()];
    let _ = signing::verify_head(&secrets, &method, path, &headers, now, &me);
    let _ = legacy::verify(&secrets, &method, path, &headers, &input.body, now);
    let _ = signing::claimed(&headers);
    let body = Bytes::from(input.body.clone());
    let _ = ForwardedPush::decode(input.terminal.clone(), &headers, body);
    let _ = HandedOver::decode(&input.body, input.shard % 64, |id| shard_of(id, 64));
    let _ = ReleaseTerminals::decode(&input.body);
    let _ = Draining::decode(&input.body);

    // Signed here: verifies within the clock window, and only its own body matches.
    if !path.starts_with('/') || HeaderValue::from_str(path).is_err() {
        return;
    }
    let at = now
        .checked_add(Duration::from_secs(input.skew_secs.unsigned_abs().into()))
        .unwrap();
    signing::sign(
        &secret,
        &method,
        path,
        &mut headers,
        &input.body,
        at,
        (&from, &me),
        None,
    );
    let verified = signing::verify_head(&secrets, &method, path, &headers, now, &me);
    let within = u64::from(input.skew_secs.unsigned_abs()) <= signing::MAX_CLOCK_SKEW.as_secs();
    assert_eq!(verified.is_ok(), within, "{verified:?}");
    if let Ok(head) = verified {
        let mut digest = BodyDigest::default();
        digest.update(&input.body);
        assert!(digest.check(&head).is_ok());
        let mut other = BodyDigest::default();
        other.update(&input.other_body);
        assert_eq!(other.check(&head).is_ok(), input.other_body == input.body);
    }
});
