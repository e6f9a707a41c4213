//! The peer protocol's requests and answers on the wire, all in one place: every
//! internal endpoint's path, how a forwarded push is encoded by the pod that received it
//! and decoded by the owner, and the answers' JSON shapes. Signing is `signing`; the
//! transport `client`; what the endpoints do, `crate::http` and `crate::push`.
//!
//! A forwarded push (`POST /internal/v1/push/{terminal}`) carries the body and content
//! type as received, [`TENANT_HEADER`] (the tenant the token named),
//! [`IDEMPOTENCY_KEY`], [`DEADLINE_HEADER`] (milliseconds left of the caller's deadline)
//! and [`HOP_HEADER`] `1`: the owner delivers or answers `421`, never forwards again, so
//! one attempt is one hop. A push with a TTL also carries [`TTL_HEADER`] and, with a
//! collapse key, [`COLLAPSE_HEADER`]; like every `posgate-*` header they are signed. Only
//! pods that advertise the queue (`Member::queue`) are sent one, and the owner answers
//! `202` with the push's status while it waits.
//!
//! A push relayed through a shard's previous owner (`POST /internal/v1/relay/{terminal}`,
//! [`RELAY_ROUTE`]) is encoded as a forwarded push: the new owner sends it while the
//! terminal's session is still the predecessor's, draining (`crate::push` `owner`). The
//! answer is the public one, or `421` when the predecessor sent nothing. Only members
//! that advertise it (`Member::handover` 3 or more) are sent one.
//!
//! A batch's pushes for one owner travel as one request (`POST
//! /internal/v1/push-batch`, [`ForwardedBatch`], JSON with base64 bodies: the signature
//! covers the body, so everything a header carries for one push is in it) and come back
//! as one result per push ([`BatchAnswer`]), each what the owner answers a forwarded
//! push. Only members that advertise it (`Member::batch`) are sent one; pods of the
//! release before it get the batch's pushes one by one.

use std::time::Duration;

use base64::engine::general_purpose::STANDARD as BASE64;
use base64::Engine as _;
use bytes::Bytes;
use http::{header, HeaderMap, HeaderName, HeaderValue};
use serde::{Deserialize, Serialize};

use crate::api::{
    valid_collapse_key, valid_key, valid_terminal_id, IDEMPOTENCY_KEY, TENANT_HEADER,
};
use crate::core::{PodId, ShardId};
use crate::metrics::timeline::Point;

/// `POST`: "do you reach the store?" -> [`PeerAnswer`].
pub const STORE_REACHABLE_ROUTE: &str = "/internal/v1/store-reachable";
/// `POST`: a forwarded push -> the owner's public answer, or `421`.
pub const PUSH_ROUTE: &str = "/internal/v1/push/{id}";
/// `POST`: the items of a batch whose terminals the pod asked serves ([`ForwardedBatch`])
/// -> [`BatchAnswer`]. Sent only to members that advertise `Member::batch`.
pub const PUSH_BATCH_ROUTE: &str = "/internal/v1/push-batch";
/// `GET`: the owner's view of one terminal -> `TerminalView` JSON, or `421`.
pub const TERMINAL_ROUTE: &str = "/internal/v1/terminals/{id}";
/// `GET`: connected and listed terminals per shard served, and the pod's timeline ->
/// [`ShardTerminals`].
pub const SHARD_TERMINALS_ROUTE: &str = "/internal/v1/shard-terminals";
/// `GET`: the final push answers a pod keeps for one shard's terminals (`{id}` is the
/// shard) -> [`HandedOver`]. Asked by the pod that acquired the shard from it.
pub const KEPT_ANSWERS_ROUTE: &str = "/internal/v1/kept-answers/{id}";
/// `POST`: the pod that took a shard over asks its previous owner to close the
/// draining sessions of the terminals a [`ReleaseTerminals`] names (`{id}` is the
/// shard), right before it dials them -> [`ReleaseAnswer`].
pub const RELEASE_TERMINALS_ROUTE: &str = "/internal/v1/release-terminals/{id}";
/// `POST`: a pod that drains shard `{id}` tells a member so (body [`Draining`]), before
/// it releases the lease: whoever acquires the shard next asks it first -> `204`.
pub const DRAINING_ROUTE: &str = "/internal/v1/draining/{id}";
/// `POST`: a push for a terminal whose session the pod asked still drains there (`{id}`
/// is the terminal), encoded as [`ForwardedPush`]: sent on that session -> the public
/// answer, or `421` when nothing was sent. Sent by the pod that took the shard over.
pub const RELAY_ROUTE: &str = "/internal/v1/relay/{id}";
/// Most terminals one [`ReleaseTerminals`] may name.
pub const MAX_RELEASE_TERMINALS: usize = 64;
/// Most bytes of a [`HandedOver`] answer: the pod answering stops adding keys (newest
/// first) before it and says `truncated`.
pub const MAX_HANDED_OVER_BYTES: usize = 4 * 1024 * 1024;
/// Most bytes of one kept answer's body (the pod's own JSON answers are far smaller).
const MAX_KEPT_BODY: usize = 16 * 1024;

/// Milliseconds left of the caller's deadline when the push was forwarded.
pub const DEADLINE_HEADER: &str = "posgate-deadline-ms";
/// `1` on a forwarded push: it must not be forwarded again.
pub const HOP_HEADER: &str = "posgate-hop";
/// A push with a TTL: the TTL in milliseconds.
pub const TTL_HEADER: &str = "posgate-ttl-ms";
/// A push with a TTL and a collapse key: the key.
pub const COLLAPSE_HEADER: &str = "posgate-collapse-key";

/// The path of a route with its `{id}` filled in.
pub fn path_of(route: &str, id: &str) -> String {
    route.replace("{id}", id)
}

/// A push on its way from the pod that received it to the shard's owner.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ForwardedPush {
    pub tenant: String,
    pub terminal: String,
    pub key: String,
    /// What is left of the caller's deadline.
    pub deadline: Duration,
    pub content_type: Option<HeaderValue>,
    pub body: Bytes,
    /// A push with a TTL: the TTL, and its collapse key if any.
    pub ttl: Option<Duration>,
    pub collapse_key: Option<String>,
}

impl ForwardedPush {
    /// The request's path on `route` ([`PUSH_ROUTE`] or [`RELAY_ROUTE`]) and its
    /// headers (the body is [`ForwardedPush::body`]).
    pub fn encode(&self, route: &str) -> (String, HeaderMap) {
        // Names made at compile time: a name given as text is parsed, and one that is
        // not a standard header copied, on every insert.
        const TENANT: HeaderName = HeaderName::from_static(TENANT_HEADER);
        const KEY: HeaderName = HeaderName::from_static(IDEMPOTENCY_KEY);
        const DEADLINE: HeaderName = HeaderName::from_static(DEADLINE_HEADER);
        const HOP: HeaderName = HeaderName::from_static(HOP_HEADER);
        // Room for these 7, the trace's 2 and the signature's 7 (`peer::signing::sign`):
        // a map that grows rehashes every name in it.
        let mut headers = HeaderMap::with_capacity(16);
        // Tenant and key were validated as visible ASCII, so these always convert.
        let text = |v: &str| HeaderValue::from_str(v).expect("validated header text");
        headers.insert(TENANT, text(&self.tenant));
        // The key and the deadline differ on every push: HPACK literals never indexed
        // (why: `peer::signing::sign`).
        let mut key = text(&self.key);
        key.set_sensitive(true);
        headers.insert(KEY, key);
        let mut deadline = HeaderValue::from(self.deadline.as_millis() as u64);
        deadline.set_sensitive(true);
        headers.insert(DEADLINE, deadline);
        headers.insert(HOP, HeaderValue::from_static("1"));
        if let Some(ct) = &self.content_type {
            headers.insert(header::CONTENT_TYPE, ct.clone());
        }
        if let Some(ttl) = self.ttl {
            const TTL: HeaderName = HeaderName::from_static(TTL_HEADER);
            headers.insert(TTL, HeaderValue::from(ttl.as_millis() as u64));
        }
        if let Some(collapse) = &self.collapse_key {
            const COLLAPSE: HeaderName = HeaderName::from_static(COLLAPSE_HEADER);
            headers.insert(COLLAPSE, text(collapse));
        }
        (path_of(route, &self.terminal), headers)
    }

    /// The push a request to [`PUSH_ROUTE`] (or [`RELAY_ROUTE`]) for `terminal`
    /// carries, or what is wrong with it.
    pub fn decode(
        terminal: String,
        headers: &HeaderMap,
        body: Bytes,
    ) -> Result<Self, &'static str> {
        let text = |name: &str| headers.get(name).and_then(|v| v.to_str().ok());
        if text(HOP_HEADER) != Some("1") {
            return Err("a forwarded push must carry posgate-hop: 1");
        }
        let tenant = text(TENANT_HEADER)
            .filter(|t| !t.is_empty())
            .ok_or("missing posgate-tenant")?;
        let key = text(IDEMPOTENCY_KEY)
            .filter(|k| valid_key(k))
            .ok_or("missing or invalid idempotency-key")?;
        let deadline_ms = text(DEADLINE_HEADER)
            .and_then(|v| v.parse::<u64>().ok())
            .ok_or("missing or invalid posgate-deadline-ms")?;
        if !valid_terminal_id(&terminal) {
            return Err("invalid terminal id");
        }
        let ttl = match text(TTL_HEADER) {
            None => None,
            Some(ms) => Some(Duration::from_millis(
                ms.parse::<u64>()
                    .ok()
                    .filter(|&ms| ms > 0)
                    .ok_or("invalid posgate-ttl-ms")?,
            )),
        };
        let collapse_key = match text(COLLAPSE_HEADER) {
            None => None,
            Some(_) if ttl.is_none() => return Err("a collapse key needs a TTL"),
            Some(c) if valid_collapse_key(c) => Some(c.to_string()),
            Some(_) => return Err("invalid posgate-collapse-key"),
        };
        Ok(ForwardedPush {
            ttl,
            collapse_key,
            tenant: tenant.to_string(),
            key: key.to_string(),
            deadline: Duration::from_millis(deadline_ms),
            content_type: headers.get(header::CONTENT_TYPE).cloned(),
            terminal,
            body,
        })
    }
}

/// The body of a request on [`PUSH_BATCH_ROUTE`]: pushes for terminals whose shards the
/// pod asked serves, each as [`ForwardedPush`] carries one, under one deadline. The
/// bodies are base64: a push body is bytes, not text.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ForwardedBatch {
    /// What is left of the caller's deadline, ms.
    pub deadline_ms: u64,
    pub pushes: Vec<BatchedPush>,
}

/// One push of a [`ForwardedBatch`].
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BatchedPush {
    pub tenant: String,
    pub terminal: String,
    pub key: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub content_type: Option<String>,
    /// The body, base64 (standard alphabet, padded).
    pub body: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ttl_ms: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub collapse_key: Option<String>,
}

impl ForwardedBatch {
    /// The batch of `pushes` with `deadline` left.
    pub fn new<'a>(pushes: impl Iterator<Item = &'a ForwardedPush>, deadline: Duration) -> Self {
        let pushes = pushes
            .map(|p| BatchedPush {
                tenant: p.tenant.clone(),
                terminal: p.terminal.clone(),
                key: p.key.clone(),
                // Batch items are checked as text at the edge (`crate::http::batch`).
                content_type: p
                    .content_type
                    .as_ref()
                    .and_then(|c| c.to_str().ok())
                    .map(str::to_owned),
                body: BASE64.encode(&p.body),
                ttl_ms: p.ttl.map(|t| t.as_millis() as u64),
                collapse_key: p.collapse_key.clone(),
            })
            .collect();
        ForwardedBatch {
            deadline_ms: deadline.as_millis() as u64,
            pushes,
        }
    }

    pub fn encode(&self) -> Bytes {
        Bytes::from(serde_json::to_vec(self).expect("a batch serialises"))
    }

    /// The pushes `body` carries, checked as [`ForwardedPush::decode`] checks one, or
    /// what is wrong with the first bad one (the whole batch is refused: a peer that
    /// sends a bad item is not one this release knows).
    pub fn decode(body: &[u8]) -> Result<(Duration, Vec<ForwardedPush>), &'static str> {
        let batch: ForwardedBatch = serde_json::from_slice(body).map_err(|_| "not a push batch")?;
        if batch.pushes.is_empty() || batch.pushes.len() > MAX_BATCH_PUSHES {
            return Err("a batch carries 1 to 1,000 pushes");
        }
        let deadline = Duration::from_millis(batch.deadline_ms);
        let mut pushes = Vec::with_capacity(batch.pushes.len());
        for p in batch.pushes {
            if p.tenant.is_empty() || !p.tenant.bytes().all(|b| b.is_ascii_graphic()) {
                return Err("invalid tenant");
            }
            if !valid_key(&p.key) {
                return Err("invalid idempotency key");
            }
            if !valid_terminal_id(&p.terminal) {
                return Err("invalid terminal id");
            }
            let ttl = match p.ttl_ms {
                None => None,
                Some(0) => return Err("invalid ttl_ms"),
                Some(ms) => Some(Duration::from_millis(ms)),
            };
            let collapse_key = match p.collapse_key {
                None => None,
                Some(_) if ttl.is_none() => return Err("a collapse key needs a TTL"),
                Some(c) if valid_collapse_key(&c) => Some(c),
                Some(_) => return Err("invalid collapse key"),
            };
            let content_type = match p.content_type {
                None => None,
                // Visible ASCII, as the entry pod checked it (`to_str` refuses the rest).
                Some(c) => Some(
                    HeaderValue::try_from(c)
                        .ok()
                        .filter(|v| v.to_str().is_ok())
                        .ok_or("invalid content type")?,
                ),
            };
            let body = BASE64
                .decode(p.body.as_bytes())
                .map_err(|_| "a body that is not base64")?;
            pushes.push(ForwardedPush {
                tenant: p.tenant,
                terminal: p.terminal,
                key: p.key,
                deadline,
                content_type,
                body: Bytes::from(body),
                ttl,
                collapse_key,
            });
        }
        Ok((deadline, pushes))
    }
}

/// Most pushes one batch carries, from a sender or between pods.
pub const MAX_BATCH_PUSHES: usize = 1_000;
/// Most bytes of a [`BatchAnswer`]: an owner's answer to one push is a few hundred.
pub const MAX_BATCH_ANSWER_BYTES: usize = MAX_BATCH_PUSHES * 2 * 1024;

/// A peer's answer on [`PUSH_BATCH_ROUTE`]: one result per push, in the request's order.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct BatchAnswer {
    pub results: Vec<BatchResult>,
}

/// What the owner answered for one push of a batch, as it answers a forwarded push:
/// the status and its JSON body (`421` with its body when it does not serve the
/// terminal's shard).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct BatchResult {
    pub status: u16,
    pub body: String,
}

/// A peer's answer on [`STORE_REACHABLE_ROUTE`].
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PeerAnswer {
    pub pod: PodId,
    pub store_reachable: bool,
}

/// A peer's answer on [`SHARD_TERMINALS_ROUTE`]. Pods of earlier releases send only
/// `pod` and `shards`, or no `queue` (the rest defaults), and ignore what they do not
/// know.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ShardTerminals {
    pub pod: Option<PodId>,
    /// Connected terminals per served shard.
    pub shards: Vec<(ShardId, usize)>,
    /// Terminals of each served shard's directory listing (not those still loading).
    #[serde(default)]
    pub listed: Vec<(ShardId, usize)>,
    /// The pod's timeline (`crate::metrics::timeline`), oldest first.
    #[serde(default)]
    pub timeline: Option<Vec<Point>>,
    /// Pushes with a TTL waiting for the terminals of the shards served. `None` is
    /// unknown, not none waiting: a pod that keeps no pushes for later, or of a release
    /// that does not send it.
    #[serde(default)]
    pub queue: Option<QueueDepth>,
}

/// Pushes with a TTL not final yet for the terminals of the shards a pod serves, as its
/// drains last read them (what `posgate_queue_pushes` and
/// `posgate_queue_oldest_seconds` say).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct QueueDepth {
    pub pushes: u64,
    /// How long ago the oldest of them was accepted, by the answering pod's clock;
    /// `None` when none waits.
    pub oldest_ms_ago: Option<u64>,
}

/// The body of a request on [`RELEASE_TERMINALS_ROUTE`].
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReleaseTerminals {
    pub terminals: Vec<String>,
}

impl ReleaseTerminals {
    pub fn encode(&self) -> Bytes {
        Bytes::from(serde_json::to_vec(self).expect("strings serialise"))
    }

    /// The request `body` carries, or what is wrong with it: 1 to
    /// [`MAX_RELEASE_TERMINALS`] valid terminal ids.
    pub fn decode(body: &[u8]) -> Result<Self, &'static str> {
        let request: ReleaseTerminals =
            serde_json::from_slice(body).map_err(|_| "not a release-terminals request")?;
        if request.terminals.is_empty() || request.terminals.len() > MAX_RELEASE_TERMINALS {
            return Err("a release names 1 to 64 terminals");
        }
        if !request.terminals.iter().all(|t| valid_terminal_id(t)) {
            return Err("invalid terminal id");
        }
        Ok(request)
    }
}

/// The body of a request on [`DRAINING_ROUTE`]: the pod that drains the shard (a
/// member; the signature vouches for the body).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Draining {
    pub from: PodId,
}

impl Draining {
    pub fn encode(&self) -> Bytes {
        Bytes::from(serde_json::to_vec(self).expect("a pod id serialises"))
    }

    /// The announcement `body` carries, or what is wrong with it.
    pub fn decode(body: &[u8]) -> Result<Self, &'static str> {
        serde_json::from_slice(body).map_err(|_| "not a draining announcement")
    }
}

/// A peer's answer on [`RELEASE_TERMINALS_ROUTE`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReleaseAnswer {
    /// Whether the shard drains there; if not, nothing was closed and the asking pod
    /// dials the rest of the shard without asking.
    pub draining: bool,
    /// How many of the named terminals had a session, now closed.
    pub closed: usize,
}

/// A peer's answer on [`KEPT_ANSWERS_ROUTE`]: its final answers for the shard's keys.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct HandedOver {
    pub shard: ShardId,
    pub keys: Vec<KeptAnswer>,
    /// Keys were left out to stay within [`MAX_HANDED_OVER_BYTES`] (the oldest).
    pub truncated: bool,
}

/// One key's final answer as it moves between pods.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct KeptAnswer {
    pub tenant: String,
    pub terminal: String,
    pub key: String,
    /// SHA-256 of the push body, lowercase hex.
    pub digest: String,
    pub status: u16,
    /// The answer's JSON body, as the pod answered it.
    pub body: String,
    /// How much longer the key is kept, ms.
    pub ttl_left_ms: u64,
}

impl HandedOver {
    /// The answer for `shard` with `keys` (newest first), each serialised once and added
    /// while the whole stays within [`MAX_HANDED_OVER_BYTES`]; `truncated` when a key was
    /// left out, or when the sender already `capped` what it offers.
    pub fn encode(shard: ShardId, keys: impl Iterator<Item = KeptAnswer>, capped: bool) -> Vec<u8> {
        // Room for the envelope around the keys.
        let room = MAX_HANDED_OVER_BYTES - 128;
        let mut list = Vec::from(&b"["[..]);
        let mut truncated = capped;
        for key in keys {
            let json = serde_json::to_vec(&key).expect("a kept answer serialises");
            if list.len() + json.len() + 1 > room {
                truncated = true;
                break;
            }
            if list.len() > 1 {
                list.push(b',');
            }
            list.extend_from_slice(&json);
        }
        list.push(b']');
        let head = format!("{{\"shard\":{shard},\"truncated\":{truncated},\"keys\":");
        let mut out = head.into_bytes();
        out.extend_from_slice(&list);
        out.push(b'}');
        out
    }

    /// The answer `body` from a peer asked for `shard`, every key checked: it must be
    /// for a terminal of that shard (`shard_of`), with a valid id, key, digest, status
    /// and a bounded body. One bad key refuses the whole answer: a peer that lies about
    /// one may lie about the others.
    pub fn decode(
        body: &[u8],
        shard: ShardId,
        shard_of: impl Fn(&str) -> ShardId,
    ) -> Result<Self, String> {
        let handed: HandedOver =
            serde_json::from_slice(body).map_err(|e| format!("not a kept-answers answer: {e}"))?;
        if handed.shard != shard {
            return Err(format!("asked for shard {shard}, got {}", handed.shard));
        }
        for k in &handed.keys {
            let why = if k.tenant.is_empty() {
                "empty tenant"
            } else if !valid_terminal_id(&k.terminal) || shard_of(&k.terminal) != shard {
                "terminal not of the shard"
            } else if !valid_key(&k.key) {
                "invalid idempotency key"
            } else if k.digest.len() != 64 || hex::decode(&k.digest).is_err() {
                "digest is not 64 hex digits"
            } else if !(200..=599).contains(&k.status) {
                "status out of range"
            } else if k.body.len() > MAX_KEPT_BODY {
                "answer body too large"
            } else {
                continue;
            };
            return Err(format!(
                "key {:?} of terminal {:?}: {why}",
                k.key, k.terminal
            ));
        }
        Ok(handed)
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_batch_travels_whole_and_a_bad_one_is_refused_whole() {
        use super::*;
        let push = ForwardedPush {
            tenant: "acme".into(),
            terminal: "pos-1".into(),
            key: "k-1".into(),
            deadline: Duration::from_millis(900),
            content_type: Some(HeaderValue::from_static("application/octet-stream")),
            body: Bytes::from_static(&[0, 255, 7]),
            ttl: Some(Duration::from_secs(60)),
            collapse_key: Some("menu".into()),
        };
        let batch = ForwardedBatch::new([&push].into_iter(), Duration::from_millis(900));
        let (deadline, pushes) = ForwardedBatch::decode(&batch.encode()).unwrap();
        assert_eq!((deadline, pushes), (Duration::from_millis(900), vec![push]));
        let one = |f: &str, v: serde_json::Value| {
            let mut p =
                serde_json::json!({"tenant": "acme", "terminal": "pos-1", "key": "k", "body": ""});
            p[f] = v;
            serde_json::to_vec(&serde_json::json!({"deadline_ms": 5, "pushes": [p]})).unwrap()
        };
        for bad in [
            one("terminal", "bad id!".into()),
            one("key", "".into()),
            one("tenant", "".into()),
            one("body", "not base64!".into()),
            one("ttl_ms", 0.into()),
            one("collapse_key", "menu".into()),
            one("content_type", "caf\u{e9}".into()),
            one("unknown", 1.into()),
            br#"{"deadline_ms": 5, "pushes": []}"#.to_vec(),
            b"[]".to_vec(),
        ] {
            let text = String::from_utf8_lossy(&bad).into_owned();
            assert!(ForwardedBatch::decode(&bad).is_err(), "{text}");
        }
    }

    #[test]
    fn a_shard_terminals_answer_without_a_queue_says_unknown_not_none() {
        // What a pod of the previous release answers.
        let old = br#"{"pod":"pod-a","shards":[[3,10]],"listed":[[3,12]],"timeline":[]}"#;
        let answer: super::ShardTerminals = serde_json::from_slice(old).unwrap();
        assert_eq!(answer.queue, None);
        let depth = super::QueueDepth {
            pushes: 2,
            oldest_ms_ago: Some(1500),
        };
        let new = super::ShardTerminals {
            queue: Some(depth),
            ..answer
        };
        let again: super::ShardTerminals =
            serde_json::from_slice(&serde_json::to_vec(&new).unwrap()).unwrap();
        assert_eq!(again, new);
    }

    #[test]
    fn a_release_request_names_1_to_64_valid_terminals() {
        let ok = ReleaseTerminals {
            terminals: vec!["t-1".into(), "t-2".into()],
        };
        assert_eq!(ReleaseTerminals::decode(&ok.encode()), Ok(ok));
        let of = |n: usize, id: &str| ReleaseTerminals {
            terminals: vec![id.to_string(); n],
        };
        assert!(ReleaseTerminals::decode(&of(0, "t").encode()).is_err());
        assert!(ReleaseTerminals::decode(&of(MAX_RELEASE_TERMINALS, "t").encode()).is_ok());
        assert!(ReleaseTerminals::decode(&of(MAX_RELEASE_TERMINALS + 1, "t").encode()).is_err());
        assert!(ReleaseTerminals::decode(&of(1, "bad id!").encode()).is_err());
        assert!(ReleaseTerminals::decode(b"{\"terminals\": 3}").is_err());
        assert!(ReleaseTerminals::decode(b"").is_err());
    }

    #[test]
    fn a_draining_announcement_names_its_pod() {
        let ok = Draining {
            from: PodId::new("pod-a").unwrap(),
        };
        assert_eq!(Draining::decode(&ok.encode()), Ok(ok));
        assert!(Draining::decode(b"{}").is_err());
        assert!(Draining::decode(b"pod-a").is_err());
    }

    use super::*;

    fn kept(terminal: &str) -> KeptAnswer {
        KeptAnswer {
            tenant: "acme".into(),
            terminal: terminal.into(),
            key: "order-1".into(),
            digest: "ab".repeat(32),
            status: 200,
            body: "{}".into(),
            ttl_left_ms: 1_000,
        }
    }

    #[test]
    fn kept_answers_decode_only_when_every_key_is_for_the_shard_and_well_formed() {
        let shard_of = |t: &str| u32::from(t == "pos-2");
        let good = HandedOver {
            shard: 0,
            keys: vec![kept("pos-1")],
            truncated: false,
        };
        let bytes = serde_json::to_vec(&good).unwrap();
        assert_eq!(HandedOver::decode(&bytes, 0, shard_of), Ok(good.clone()));
        assert!(
            HandedOver::decode(&bytes, 1, shard_of).is_err(),
            "other shard"
        );
        let spoil: [fn(&mut KeptAnswer); 6] = [
            |k| k.terminal = "pos-2".into(),
            |k| k.key = "has space".into(),
            |k| k.digest = "zz".repeat(32),
            |k| k.status = 99,
            |k| k.body = "x".repeat(MAX_KEPT_BODY + 1),
            |k| k.tenant.clear(),
        ];
        for (i, spoil) in spoil.iter().enumerate() {
            let mut bad = good.clone();
            bad.keys.push(kept("pos-1"));
            spoil(&mut bad.keys[1]);
            let bytes = serde_json::to_vec(&bad).unwrap();
            assert!(HandedOver::decode(&bytes, 0, shard_of).is_err(), "case {i}");
        }
        assert!(HandedOver::decode(b"{", 0, shard_of).is_err());
    }

    #[test]
    fn kept_answers_encode_within_the_bound_newest_first() {
        let shard_of = |_: &str| 0;
        let keys = || (0..3).map(|i| kept(&format!("pos-{i}")));
        let all = HandedOver::encode(0, keys(), false);
        let got = HandedOver::decode(&all, 0, shard_of).unwrap();
        let terminals: Vec<&str> = got.keys.iter().map(|k| k.terminal.as_str()).collect();
        assert_eq!(
            (terminals, got.truncated),
            (vec!["pos-0", "pos-1", "pos-2"], false)
        );
        let capped = HandedOver::decode(&HandedOver::encode(0, keys(), true), 0, shard_of);
        assert!(capped.unwrap().truncated);
        assert_eq!(
            HandedOver::decode(
                &HandedOver::encode(0, std::iter::empty(), false),
                0,
                shard_of
            ),
            Ok(HandedOver {
                shard: 0,
                keys: vec![],
                truncated: false
            })
        );
        // Keys of 1 MiB bodies: only what fits in the bound goes, and it says so.
        let big = |i| KeptAnswer {
            body: "x".repeat(1024 * 1024),
            ..kept(&format!("pos-{i}"))
        };
        let bytes = HandedOver::encode(0, (0..8).map(big), false);
        assert!(bytes.len() <= MAX_HANDED_OVER_BYTES);
        let handed: HandedOver = serde_json::from_slice(&bytes).unwrap();
        assert_eq!((handed.keys.len(), handed.truncated), (3, true));
    }

    fn push() -> ForwardedPush {
        ForwardedPush {
            tenant: "acme".into(),
            terminal: "pos-1".into(),
            key: "order-1".into(),
            deadline: Duration::from_millis(900),
            content_type: Some(HeaderValue::from_static("application/json")),
            body: Bytes::from_static(b"{}"),
            ttl: None,
            collapse_key: None,
        }
    }

    #[test]
    fn a_forwarded_push_decodes_to_what_was_encoded() {
        let sent = push();
        let (path, headers) = sent.encode(PUSH_ROUTE);
        assert_eq!(path, "/internal/v1/push/pos-1");
        // Values new on every push stay out of the HPACK table (`encode`).
        assert!(headers[IDEMPOTENCY_KEY].is_sensitive() && headers[DEADLINE_HEADER].is_sensitive());
        assert!(!headers[TENANT_HEADER].is_sensitive());
        let got = ForwardedPush::decode("pos-1".into(), &headers, sent.body.clone()).unwrap();
        assert_eq!(got, sent);
        assert!(!headers.contains_key(TTL_HEADER) && !headers.contains_key(COLLAPSE_HEADER));
        // A push with a TTL and a collapse key carries both.
        let later = ForwardedPush {
            ttl: Some(Duration::from_secs(3_600)),
            collapse_key: Some("price-list".into()),
            ..push()
        };
        let (_, headers) = later.encode(PUSH_ROUTE);
        assert_eq!(headers[TTL_HEADER], "3600000");
        let got = ForwardedPush::decode("pos-1".into(), &headers, later.body.clone()).unwrap();
        assert_eq!(got, later);
    }

    #[test]
    fn a_forwarded_push_without_its_fields_is_refused() {
        let (_, headers) = push().encode(PUSH_ROUTE);
        for (name, bad) in [
            (HOP_HEADER, Some("0")),
            (TENANT_HEADER, None),
            (IDEMPOTENCY_KEY, Some("has space")),
            (DEADLINE_HEADER, Some("soon")),
            (TTL_HEADER, Some("0")),
            (TTL_HEADER, Some("an hour")),
            (COLLAPSE_HEADER, Some("no ttl")),
        ] {
            let mut h = headers.clone();
            match bad {
                Some(v) => {
                    h.insert(name, HeaderValue::from_static(v));
                }
                None => {
                    h.remove(name);
                }
            }
            assert!(
                ForwardedPush::decode("pos-1".into(), &h, Bytes::new()).is_err(),
                "{name}"
            );
        }
        assert!(ForwardedPush::decode("bad id!".into(), &headers, Bytes::new()).is_err());
    }
}
