//! Signing pod-to-pod requests and checking them: protocol 2, and protocol 1 (the
//! previous release's) for the length of a rolling upgrade.
//!
//! # Protocol 2
//! The sender sets [`VERSION_HEADER`] `2`, [`TIMESTAMP_HEADER`] (Unix seconds),
//! [`REQUEST_ID_HEADER`] (128 bits, hex: see [`sign`]), [`FROM_HEADER`] and [`TO_HEADER`] (the
//! sending and the addressed pod ids) and [`DIGEST_HEADER`] (`sha-256=:<base64>:` of
//! the body, RFC 9530), then [`SIGNATURE_HEADER`], the lowercase hex of
//! `HMAC-SHA256(secret, canonical)` where `canonical` is
//!
//! ```text
//! posgate-peer-v2 "\n" METHOD "\n" PATH_AND_QUERY "\n"
//! then, sorted by name, one "name:value\n" line per value of every signed header
//! ```
//!
//! and the signed headers are every `posgate-*` header except the signature itself,
//! plus `idempotency-key`, `content-type`, `content-encoding` and `content-digest`:
//! everything a receiver acts on. A header added, removed or changed on the way changes
//! the canonical text, so the MAC fails; a receiver must act on no other header.
//!
//! The receiver checks the MAC over the head before it reads the body
//! ([`verify_head`]), then the body against the signed digest as it arrives. What the
//! MAC cannot stop is an exact replay: the receiver remembers request ids for as long as
//! their timestamp is acceptable (`super::replay`). A request addressed to another pod,
//! or to an earlier incarnation of this one (a restarted pod has a new id), is refused,
//! so a capture cannot be replayed elsewhere or after a restart either.
//!
//! # Protocol 1 (the previous release)
//! `HMAC(secret, METHOD "\n" PATH_AND_QUERY "\n" TIMESTAMP "\n" hex(sha256(body)))` in
//! the same [`SIGNATURE_HEADER`], no version header. It signs neither the headers nor a
//! request id, so a capture could be re-sent with another key or tenant. A pod speaks it
//! only to members that do not advertise protocol 2, and accepts it only while such a
//! member exists (`crate::http`), with exact replays refused by signature. A protocol-2
//! capture cannot be downgraded: its MAC is over another text.
//!
//! Not for: transport (`super::PeerClient`) or what the endpoints do (`crate::http`).

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use base64::Engine as _;
use hmac::{Hmac, Mac};
use http::{HeaderMap, HeaderValue, Method};
use rand::Rng;
use sha2::{Digest, Sha256};

use crate::core::PodId;
use crate::credentials::ClusterSecret;
use crate::trace_context::RequestId;

/// The peer protocol this build speaks (and the newest one it accepts).
pub const PEER_PROTOCOL: u32 = 2;
/// Request (and answer) header naming the peer protocol; absent means protocol 1.
pub const VERSION_HEADER: &str = "posgate-peer-version";
/// Request header with the signing time, Unix seconds.
pub const TIMESTAMP_HEADER: &str = "posgate-timestamp";
/// Request header with the hex HMAC-SHA256 signature.
pub const SIGNATURE_HEADER: &str = "posgate-signature";
/// Request header with the request's unique id (32 lowercase hex digits): the API
/// request it serves, then 64 random bits ([`sign`]).
pub const REQUEST_ID_HEADER: &str = "posgate-request-id";
/// Request header naming the sending pod.
pub const FROM_HEADER: &str = "posgate-from";
/// Request header naming the pod the request is for.
pub const TO_HEADER: &str = "posgate-to";
/// The body's digest (RFC 9530), signed in place of the body.
pub const DIGEST_HEADER: &str = "content-digest";
/// How far a signature's timestamp may be from the verifier's clock, either way.
pub const MAX_CLOCK_SKEW: Duration = Duration::from_secs(30);

/// Headers outside `posgate-*` that receivers act on: signed like the `posgate-*` ones.
const SIGNED_OTHERS: [&str; 4] = [
    "idempotency-key",
    "content-type",
    "content-encoding",
    DIGEST_HEADER,
];
const CANONICAL_PREFIX: &str = "posgate-peer-v2\n";

type HmacSha256 = Hmac<Sha256>;

fn mac_of(secret: &ClusterSecret) -> HmacSha256 {
    // HMAC is defined for keys of any length (long keys are hashed), so this cannot fail.
    <HmacSha256 as Mac>::new_from_slice(secret.as_bytes()).expect("HMAC accepts keys of any length")
}

/// Why a request's signature was refused. [`AuthError::reason`] is the metric label.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum AuthError {
    #[error("missing {0} header")]
    Missing(&'static str),
    #[error("malformed or repeated {0} header")]
    Malformed(&'static str),
    #[error(
        "timestamp is {skew_secs} s away from this pod's clock (at most {} s allowed)",
        MAX_CLOCK_SKEW.as_secs()
    )]
    Stale { skew_secs: u64 },
    #[error("signature does not match any cluster secret")]
    BadSignature,
    #[error("request is addressed to pod {to:?}, not to this one")]
    WrongRecipient { to: String },
    #[error("request id already used: a replay")]
    Replayed,
    #[error("body does not match its signed content-digest")]
    DigestMismatch,
    #[error("peer protocol {0:?} is not supported; this pod speaks 1 and {PEER_PROTOCOL}")]
    UnsupportedVersion(String),
    #[error("peer protocol 1 is refused: every member speaks protocol {PEER_PROTOCOL}")]
    LegacyRefused,
    #[error("too many recent peer requests to remember; try again")]
    WindowFull,
}

impl AuthError {
    /// A fixed label per kind (`posgate_peer_requests_refused_total{reason}`).
    pub fn reason(&self) -> &'static str {
        match self {
            AuthError::Missing(_) => "unsigned",
            AuthError::Malformed(_) => "malformed",
            AuthError::Stale { .. } => "stale",
            AuthError::BadSignature => "bad_signature",
            AuthError::WrongRecipient { .. } => "wrong_recipient",
            AuthError::Replayed => "replay",
            AuthError::DigestMismatch => "digest_mismatch",
            AuthError::UnsupportedVersion(_) => "unsupported_version",
            AuthError::LegacyRefused => "legacy_refused",
            AuthError::WindowFull => "window_full",
        }
    }
}

/// Unix seconds of `at` (0 before 1970, which makes every signature stale).
pub fn unix_seconds(at: SystemTime) -> u64 {
    at.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs())
}

/// The `content-digest` value of `body`.
pub fn content_digest(body: &[u8]) -> String {
    digest_value(&Sha256::digest(body).into())
}

fn digest_value(hash: &[u8; 32]) -> String {
    format!(
        "sha-256=:{}:",
        base64::engine::general_purpose::STANDARD.encode(hash)
    )
}

/// Signs a protocol-2 request from `from` to `to` at `at`: sets every header the
/// protocol needs on `headers` (which already hold the request's own, e.g. the key).
///
/// The request id's first 64 bits are the API request the call `serves` (the entry
/// pod's id of a forwarded push, which the owner logs the push under: [`serves`]), or
/// random when it serves none; the other 64 are random, and keep ids unique on their
/// own: one API request may make many calls. One header does both: a push forwarded
/// pays for every header's name and value on the wire and in the signature.
#[allow(clippy::too_many_arguments)]
pub fn sign(
    secret: &ClusterSecret,
    method: &Method,
    path_and_query: &str,
    headers: &mut HeaderMap,
    body: &[u8],
    at: SystemTime,
    (from, to): (&PodId, &PodId),
    serves: Option<RequestId>,
) {
    let mut id: [u8; 16] = rand::rng().random();
    if let Some(serves) = serves {
        id[..8].copy_from_slice(&serves.to_bytes());
    }
    let text = |v: &str| HeaderValue::from_str(v).expect("pod ids and hex are header-safe");
    // Values new on every request are sent as HPACK literals never indexed: indexing
    // them only evicts the entries that repeat and makes the encoder compare them
    // against a growing chain of same-named entries (see `pos::wire::push`). The
    // signature is also what RFC 7541 section 7.1.3 has in mind: a value that
    // compression must not expose.
    let unique = |v: &str| {
        let mut value = text(v);
        value.set_sensitive(true);
        value
    };
    headers.insert(VERSION_HEADER, HeaderValue::from(PEER_PROTOCOL));
    headers.insert(TIMESTAMP_HEADER, HeaderValue::from(unix_seconds(at)));
    headers.insert(REQUEST_ID_HEADER, unique(&hex::encode(id)));
    headers.insert(FROM_HEADER, text(from.as_str()));
    headers.insert(TO_HEADER, text(to.as_str()));
    headers.insert(DIGEST_HEADER, unique(&content_digest(body)));
    headers.remove(SIGNATURE_HEADER);
    let mac = canonical_mac(secret, method, path_and_query, headers);
    let signature = hex::encode(mac.finalize().into_bytes());
    headers.insert(SIGNATURE_HEADER, unique(&signature));
}

/// The API request a protocol-2 request serves, as [`sign`] put it in the request id; a
/// random id for a call that serves none (or a pod of the previous release's forward).
/// Read after the signature was verified: only then is the id the sender's.
pub fn serves(headers: &HeaderMap) -> Option<RequestId> {
    let id = headers.get(REQUEST_ID_HEADER)?.as_bytes();
    RequestId::parse(id.get(..16)?)
}

fn is_signed(name: &str) -> bool {
    (name.starts_with("posgate-") && name != SIGNATURE_HEADER) || SIGNED_OTHERS.contains(&name)
}

fn canonical_mac(
    secret: &ClusterSecret,
    method: &Method,
    path_and_query: &str,
    headers: &HeaderMap,
) -> HmacSha256 {
    let mut mac = mac_of(secret);
    mac.update(CANONICAL_PREFIX.as_bytes());
    mac.update(method.as_str().as_bytes());
    mac.update(b"\n");
    mac.update(path_and_query.as_bytes());
    mac.update(b"\n");
    let mut names: Vec<&str> = headers
        .keys()
        .map(|n| n.as_str())
        .filter(|n| is_signed(n))
        .collect();
    names.sort_unstable();
    for name in names {
        // Header values hold no CR or LF, so a line cannot be forged from another.
        for value in headers.get_all(name) {
            mac.update(name.as_bytes());
            mac.update(b":");
            mac.update(value.as_bytes());
            mac.update(b"\n");
        }
    }
    mac
}

/// Which protocol a request claims to speak.
#[derive(Debug, PartialEq, Eq)]
pub enum Claimed {
    /// No version header: the previous release.
    Legacy,
    Current,
}

/// The protocol `headers` claim, or why it cannot be spoken.
pub fn claimed(headers: &HeaderMap) -> Result<Claimed, AuthError> {
    let mut values = headers.get_all(VERSION_HEADER).iter();
    match (values.next(), values.next()) {
        (None, _) => Ok(Claimed::Legacy),
        (Some(v), None) if v.as_bytes() == PEER_PROTOCOL.to_string().as_bytes() => {
            Ok(Claimed::Current)
        }
        (Some(_), Some(_)) => Err(AuthError::Malformed(VERSION_HEADER)),
        (Some(v), None) => Err(AuthError::UnsupportedVersion(
            String::from_utf8_lossy(v.as_bytes())
                .chars()
                .take(16)
                .collect(),
        )),
    }
}

/// What a verified protocol-2 head promises about the rest of the request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SignedHead {
    pub request_id: [u8; 16],
    /// Unix seconds the sender signed at.
    pub timestamp: u64,
    /// SHA-256 the body must have.
    pub digest: [u8; 32],
    /// The sending pod, as it signed it.
    pub from: String,
}

/// The one value of `name`, as text.
fn single<'a>(headers: &'a HeaderMap, name: &'static str) -> Result<&'a str, AuthError> {
    let mut values = headers.get_all(name).iter();
    let value = values.next().ok_or(AuthError::Missing(name))?;
    if values.next().is_some() {
        return Err(AuthError::Malformed(name));
    }
    value.to_str().map_err(|_| AuthError::Malformed(name))
}

fn parse_digest(value: &str) -> Option<[u8; 32]> {
    let b64 = value.strip_prefix("sha-256=:")?.strip_suffix(':')?;
    let bytes = base64::engine::general_purpose::STANDARD.decode(b64).ok()?;
    bytes.try_into().ok()
}

/// Checks a protocol-2 head: the required headers, the timestamp against `now`, the MAC
/// against each of `secrets` (constant time), and that it is addressed to `me`. The
/// body is checked afterwards against [`SignedHead::digest`]; replays by the caller.
pub fn verify_head(
    secrets: &[ClusterSecret],
    method: &Method,
    path_and_query: &str,
    headers: &HeaderMap,
    now: SystemTime,
    me: &PodId,
) -> Result<SignedHead, AuthError> {
    let signature = hex::decode(single(headers, SIGNATURE_HEADER)?)
        .map_err(|_| AuthError::Malformed(SIGNATURE_HEADER))?;
    let timestamp: u64 = single(headers, TIMESTAMP_HEADER)?
        .parse()
        .map_err(|_| AuthError::Malformed(TIMESTAMP_HEADER))?;
    let id = single(headers, REQUEST_ID_HEADER)?;
    let request_id: [u8; 16] = hex::decode(id)
        .ok()
        .filter(|_| {
            id.bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
        })
        .and_then(|b| b.try_into().ok())
        .ok_or(AuthError::Malformed(REQUEST_ID_HEADER))?;
    let from = single(headers, FROM_HEADER)?.to_string();
    let to = single(headers, TO_HEADER)?;
    let digest =
        parse_digest(single(headers, DIGEST_HEADER)?).ok_or(AuthError::Malformed(DIGEST_HEADER))?;
    let skew_secs = unix_seconds(now).abs_diff(timestamp);
    if skew_secs > MAX_CLOCK_SKEW.as_secs() {
        return Err(AuthError::Stale { skew_secs });
    }
    let matches = secrets.iter().any(|secret| {
        canonical_mac(secret, method, path_and_query, headers)
            .verify_slice(&signature)
            .is_ok()
    });
    if !matches {
        return Err(AuthError::BadSignature);
    }
    // Only now is `to` known to be the sender's: check it after the MAC, so unsigned
    // requests learn nothing about this pod's id.
    if to != me.as_str() {
        return Err(AuthError::WrongRecipient { to: to.to_string() });
    }
    Ok(SignedHead {
        request_id,
        timestamp,
        digest,
        from,
    })
}

/// A SHA-256 fed with the body as it arrives, checked against the signed digest.
#[derive(Debug, Default)]
pub struct BodyDigest(Sha256);

impl BodyDigest {
    pub fn update(&mut self, chunk: &[u8]) {
        self.0.update(chunk);
    }

    pub fn check(self, head: &SignedHead) -> Result<(), AuthError> {
        use subtle::ConstantTimeEq;
        let got: [u8; 32] = self.0.finalize().into();
        if bool::from(got.ct_eq(&head.digest)) {
            Ok(())
        } else {
            Err(AuthError::DigestMismatch)
        }
    }
}

/// Protocol 1, the previous release's signature, kept for rolling upgrades.
pub mod legacy {
    use super::*;

    /// The two signature headers of one protocol-1 request.
    #[derive(Clone, Debug, PartialEq, Eq)]
    pub struct Signature {
        /// Unix seconds, the value of [`TIMESTAMP_HEADER`].
        pub timestamp: u64,
        /// Lowercase hex HMAC, the value of [`SIGNATURE_HEADER`].
        pub signature: String,
    }

    impl Signature {
        /// Sets both signature headers on `headers`.
        pub fn apply(&self, headers: &mut HeaderMap) {
            headers.insert(TIMESTAMP_HEADER, HeaderValue::from(self.timestamp));
            let value =
                HeaderValue::from_str(&self.signature).expect("hex is a valid header value");
            headers.insert(SIGNATURE_HEADER, value);
        }
    }

    fn mac(
        secret: &ClusterSecret,
        method: &Method,
        path_and_query: &str,
        timestamp: u64,
        body: &[u8],
    ) -> HmacSha256 {
        let mut mac = mac_of(secret);
        let body_hash = hex::encode(Sha256::digest(body));
        mac.update(format!("{method}\n{path_and_query}\n{timestamp}\n{body_hash}").as_bytes());
        mac
    }

    /// Signs a protocol-1 request made at `at`.
    pub fn sign(
        secret: &ClusterSecret,
        method: &Method,
        path_and_query: &str,
        at: SystemTime,
        body: &[u8],
    ) -> Signature {
        let timestamp = unix_seconds(at);
        Signature {
            timestamp,
            signature: hex::encode(
                mac(secret, method, path_and_query, timestamp, body)
                    .finalize()
                    .into_bytes(),
            ),
        }
    }

    /// Checks a protocol-1 request; on success returns its timestamp and the signature
    /// bytes, which identify it for replay detection.
    pub fn verify(
        secrets: &[ClusterSecret],
        method: &Method,
        path_and_query: &str,
        headers: &HeaderMap,
        body: &[u8],
        now: SystemTime,
    ) -> Result<(u64, [u8; 32]), AuthError> {
        let timestamp: u64 = single(headers, TIMESTAMP_HEADER)?
            .parse()
            .map_err(|_| AuthError::Malformed(TIMESTAMP_HEADER))?;
        let signature: [u8; 32] = hex::decode(single(headers, SIGNATURE_HEADER)?)
            .ok()
            .and_then(|b| b.try_into().ok())
            .ok_or(AuthError::Malformed(SIGNATURE_HEADER))?;
        let skew_secs = unix_seconds(now).abs_diff(timestamp);
        if skew_secs > MAX_CLOCK_SKEW.as_secs() {
            return Err(AuthError::Stale { skew_secs });
        }
        let matches = secrets.iter().any(|secret| {
            mac(secret, method, path_and_query, timestamp, body)
                .verify_slice(&signature)
                .is_ok()
        });
        if matches {
            Ok((timestamp, signature))
        } else {
            Err(AuthError::BadSignature)
        }
    }
}

#[cfg(test)]
#[path = "signing_tests.rs"]
mod tests;
