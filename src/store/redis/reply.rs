//! Strict parsing of the Lua scripts' replies into the `CoordStore` types.
//!
//! Every reply shape is checked exactly (tags, item counts, integer signs, UTF-8, pod id
//! syntax) and anything unexpected becomes [`StoreError::Protocol`], never a panic or a
//! silently defaulted value: a script and a binary of different versions must fail
//! loudly rather than be misread as "lease held" or "epoch 0".
//!
//! What it does not do: talk to Redis, or map connection errors (that is `super`).

use std::fmt;
use std::time::Duration;

use redis::Value;

use crate::core::lease::{AcquireOutcome, Checked, Released, RenewOutcome};
use crate::core::membership::{GenerationInfo, Lease, Member, Snapshot};
use crate::core::placement::Placement;
use crate::core::PodId;
use crate::store::directory::{Refusal, Restored};
use crate::store::{parse_placement, ClusterMeta, StoreError};

/// A reply (or request) we cannot make sense of.
pub(super) fn bad(what: impl fmt::Display) -> StoreError {
    StoreError::Protocol(what.to_string())
}

fn text(v: &Value) -> Result<&str, StoreError> {
    match v {
        Value::BulkString(b) => {
            std::str::from_utf8(b).map_err(|_| bad("non-UTF-8 string in reply"))
        }
        Value::SimpleString(s) => Ok(s),
        other => Err(bad(format!("expected a string, got {other:?}"))),
    }
}

/// A reply item as bytes (bulk or simple string).
pub(super) fn bytes(v: Value) -> Result<Vec<u8>, StoreError> {
    match v {
        Value::BulkString(b) => Ok(b),
        Value::SimpleString(s) => Ok(s.into_bytes()),
        other => Err(bad(format!("expected a string, got {other:?}"))),
    }
}

pub(super) fn string(v: Value) -> Result<String, StoreError> {
    String::from_utf8(bytes(v)?).map_err(|_| bad("non-UTF-8 string in a script reply"))
}

/// A script argument.
pub(super) fn arg(v: impl ToString) -> Vec<u8> {
    v.to_string().into_bytes()
}

pub(super) fn uint(v: &Value) -> Result<u64, StoreError> {
    match v {
        Value::Int(n) => {
            u64::try_from(*n).map_err(|_| bad(format!("negative integer {n} in reply")))
        }
        other => Err(bad(format!("expected an integer, got {other:?}"))),
    }
}

pub(super) fn items(v: Value) -> Result<Vec<Value>, StoreError> {
    match v {
        Value::Array(items) => Ok(items),
        other => Err(bad(format!("expected an array, got {other:?}"))),
    }
}

fn pod(v: &Value) -> Result<PodId, StoreError> {
    PodId::new(text(v)?).map_err(bad)
}

/// `{tag, rest...}` -> (tag, rest).
pub(super) fn tagged(v: Value) -> Result<(String, Vec<Value>), StoreError> {
    let mut all = items(v)?;
    if all.is_empty() {
        return Err(bad("empty reply"));
    }
    let rest = all.split_off(1);
    Ok((text(&all[0])?.to_string(), rest))
}

fn generation(id: &Value, age: &Value) -> Result<GenerationInfo, StoreError> {
    let id = text(id)?;
    if id.is_empty() {
        return Err(bad("empty generation id"));
    }
    Ok(GenerationInfo {
        id: id.to_string(),
        age: Duration::from_millis(uint(age)?),
    })
}

/// `{'ok', rest...}`, `{'gen', id, age}`, or (when `ours` is given) `{'meta', stored}`.
/// `expect` is the number of items `ok` must carry.
pub(super) fn checked(
    reply: Value,
    ours: Option<&ClusterMeta>,
    expect: usize,
) -> Result<Checked<Vec<Value>>, StoreError> {
    let (tag, rest) = tagged(reply)?;
    match (tag.as_str(), rest.as_slice(), ours) {
        ("ok", _, _) if rest.len() == expect => Ok(Checked::Ok(rest)),
        ("gen", [id, age], _) => Ok(Checked::GenerationChanged(generation(id, age)?)),
        ("meta", [stored], Some(ours)) => {
            let stored = text(stored)?;
            match serde_json::from_str::<ClusterMeta>(stored) {
                Ok(stored) => Err(StoreError::MetaMismatch {
                    stored,
                    ours: ours.clone(),
                }),
                Err(e) => Err(bad(format!(
                    "stored cluster metadata is not valid ({e}): {stored:?}"
                ))),
            }
        }
        (tag, rest, _) => Err(bad(format!(
            "unexpected reply {tag:?} with {} items (expected {expect})",
            rest.len()
        ))),
    }
}

pub(super) fn acquire_outcome(v: Value) -> Result<AcquireOutcome, StoreError> {
    let (tag, rest) = tagged(v)?;
    match (tag.as_str(), rest.as_slice()) {
        ("acquired", [e, note]) => Ok(AcquireOutcome::Acquired {
            epoch: uint(e)?,
            released_by: match text(note)? {
                "" => None,
                json => Some(
                    serde_json::from_str::<Member>(json)
                        .map_err(|e| bad(format!("bad release note: {e}")))?,
                ),
            },
        }),
        ("mine", [e]) => Ok(AcquireOutcome::AlreadyMine { epoch: uint(e)? }),
        ("held", [o, e]) => Ok(AcquireOutcome::HeldBy {
            owner: pod(o)?,
            epoch: uint(e)?,
        }),
        (tag, _) => Err(bad(format!("unexpected acquire outcome {tag:?}"))),
    }
}

pub(super) fn renew_outcome(v: Value) -> Result<RenewOutcome, StoreError> {
    let (tag, rest) = tagged(v)?;
    match (tag.as_str(), rest.as_slice()) {
        ("renewed", []) => Ok(RenewOutcome::Renewed),
        ("missing", [e]) => Ok(RenewOutcome::Missing { epoch: uint(e)? }),
        ("held", [o, e]) => Ok(RenewOutcome::HeldBy {
            owner: pod(o)?,
            epoch: uint(e)?,
        }),
        (tag, _) => Err(bad(format!("unexpected renew outcome {tag:?}"))),
    }
}

/// One outcome of `directory_restore.lua`: `{'written', version}`, `{'same_generation'}`,
/// `{'not_holder', owner|nil, epoch|nil}` (the epoch as the decimal string the epochs
/// hash holds) or `{'present'}`.
pub(super) fn restore_outcome(v: Value) -> Result<Restored, StoreError> {
    let (tag, rest) = tagged(v)?;
    let refused = |r| Ok(Restored::Refused(r));
    match (tag.as_str(), rest.as_slice()) {
        ("written", [version]) => Ok(Restored::Written {
            version: uint(version)?,
        }),
        ("same_generation", []) => refused(Refusal::SameGeneration),
        ("not_holder", [owner, epoch]) => refused(Refusal::NotHolder {
            owner: match owner {
                Value::Nil => None,
                o => Some(pod(o)?),
            },
            epoch: match epoch {
                Value::Nil => None,
                e => Some(
                    text(e)?
                        .parse()
                        .map_err(|_| bad(format!("bad stored epoch {e:?}")))?,
                ),
            },
        }),
        ("present", []) => refused(Refusal::Present),
        (tag, _) => Err(bad(format!("unexpected directory_restore outcome {tag:?}"))),
    }
}

/// One `0`/`1` per shard, exactly `shards` of them.
pub(super) fn released(reply: Value, shards: usize) -> Result<Vec<Released>, StoreError> {
    let answers = items(reply)?;
    if answers.len() != shards {
        return Err(bad(format!(
            "release answered {} items for {shards}",
            answers.len()
        )));
    }
    answers
        .into_iter()
        .map(|v| match v {
            Value::Array(_) => match items(v)?.as_slice() {
                [tag, epoch] if text(tag)? == "handed" => Ok(Released::HandedOver {
                    epoch: uint(epoch)?,
                }),
                other => Err(bad(format!("release answered {other:?}"))),
            },
            v => match uint(&v)? {
                0 => Ok(Released::NotHeld),
                1 => Ok(Released::Deleted),
                n => Err(bad(format!("release answered {n}"))),
            },
        })
        .collect()
}

pub(super) fn parse_snapshot(
    reply: Value,
    shards: u32,
    held: Option<&View>,
) -> Result<(Snapshot, Option<View>), StoreError> {
    let [id, age, heartbeats, digest, view]: [Value; 5] = items(reply)?
        .try_into()
        .map_err(|v: Vec<Value>| bad(format!("snapshot has {} parts, expected 5", v.len())))?;
    let digest = text(&digest)?.to_string();
    let parts: Result<[Value; 3], Vec<Value>> = items(view)?.try_into();
    let (view, read) = match parts {
        Ok([members, leases, placement]) => {
            let view = View {
                digest,
                members: parse_members(members)?,
                leases: parse_leases(leases, shards)?,
                placement: parse_stored_placement(placement, shards)?,
            };
            (view.clone(), Some(view))
        }
        Err(v) if v.is_empty() => match held {
            Some(held) if held.digest == digest => (held.clone(), None),
            _ => {
                return Err(bad(
                    "snapshot called a view unchanged that this pod does not hold",
                ))
            }
        },
        Err(v) => {
            return Err(bad(format!(
                "snapshot view has {} parts, expected 3",
                v.len()
            )))
        }
    };
    let snapshot = Snapshot {
        generation: generation(&id, &age)?,
        members: view.members,
        leases: view.leases,
        placement: view.placement,
        heartbeats: uint(&heartbeats)?,
    };
    Ok((snapshot, read))
}

/// The members, leases and placement a snapshot read in full, with the digest
/// `snapshot.lua` computed over them: while Redis answers the same digest, the view is
/// unchanged and rebuilt from this. The digest covers one line per lease, so a view of
/// another shard count never matches.
#[derive(Clone, Debug)]
pub(super) struct View {
    pub(super) digest: String,
    members: Vec<Member>,
    leases: Vec<Option<Lease>>,
    placement: Option<Placement>,
}

impl View {
    /// How the leases of a pod reading this view are kept (`lib.lua`, "Pod leases"):
    /// `"pod"` when every member it shows reads pod leases, else `"lease"`; and the
    /// shard count, for the scripts that convert a pod's leases from one to the other.
    pub(super) fn upkeep(&self) -> (&'static str, usize) {
        let pod = !self.members.is_empty()
            && self
                .members
                .iter()
                .all(|m| m.pod_lease >= crate::core::membership::POD_LEASE);
        (if pod { "pod" } else { "lease" }, self.leases.len())
    }
}

fn parse_members(members: Value) -> Result<Vec<Member>, StoreError> {
    let mut members = items(members)?
        .iter()
        .map(|m| {
            serde_json::from_str::<Member>(text(m)?)
                .map_err(|e| bad(format!("bad member record: {e}")))
        })
        .collect::<Result<Vec<_>, _>>()?;
    members.sort_by(|a, b| a.pod.cmp(&b.pod));
    Ok(members)
}

fn parse_leases(leases: Value, shards: u32) -> Result<Vec<Option<Lease>>, StoreError> {
    let leases = items(leases)?
        .into_iter()
        .map(|l| match items(l)?.as_slice() {
            [] => Ok(None),
            [owner, epoch] => Ok(Some(Lease {
                owner: pod(owner)?,
                epoch: uint(epoch)?,
            })),
            other => Err(bad(format!("lease entry with {} items", other.len()))),
        })
        .collect::<Result<Vec<_>, _>>()?;
    if leases.len() != shards as usize {
        return Err(bad(format!(
            "snapshot lists {} leases for {shards} shards",
            leases.len()
        )));
    }
    Ok(leases)
}

fn parse_stored_placement(placement: Value, shards: u32) -> Result<Option<Placement>, StoreError> {
    match items(placement)?.as_slice() {
        [] => Ok(None),
        [version, table] => {
            let version = text(version)?
                .parse()
                .map_err(|e| bad(format!("bad placement version: {e}")))?;
            Ok(Some(parse_placement(version, text(table)?, shards)?))
        }
        other => Err(bad(format!("placement entry with {} items", other.len()))),
    }
}

/// Applies `f` to an `Ok` answer; a generation change passes through untouched.
pub(super) fn map_ok<T, U>(
    checked: Checked<T>,
    f: impl FnOnce(T) -> Result<U, StoreError>,
) -> Result<Checked<U>, StoreError> {
    Ok(match checked {
        Checked::Ok(v) => Checked::Ok(f(v)?),
        Checked::GenerationChanged(g) => Checked::GenerationChanged(g),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(x: &str) -> Value {
        Value::BulkString(x.as_bytes().to_vec())
    }

    #[test]
    fn replies_are_parsed_strictly() {
        let ok = Value::Array(vec![
            s("ok"),
            Value::Array(vec![s("acquired"), Value::Int(5), s("")]),
        ]);
        assert!(matches!(checked(ok.clone(), None, 1), Ok(Checked::Ok(_))));
        assert!(matches!(checked(ok, None, 2), Err(StoreError::Protocol(_))));
        let gen = Value::Array(vec![s("gen"), s("1.000001-ab"), Value::Int(7)]);
        match checked(gen, None, 0).unwrap() {
            Checked::GenerationChanged(g) => assert_eq!(g.age, Duration::from_millis(7)),
            other => panic!("{other:?}"),
        }
        assert!(
            acquire_outcome(Value::Array(vec![s("held"), s("bad pod"), Value::Int(1)])).is_err()
        );
        assert!(acquire_outcome(Value::Array(vec![s("acquired"), Value::Int(-1)])).is_err());
        assert!(renew_outcome(Value::Array(vec![s("renewed"), Value::Int(1)])).is_err());
        assert!(parse_snapshot(Value::Array(vec![]), 0, None).is_err());
    }

    #[test]
    fn an_acquired_outcome_carries_its_release_note_or_none() {
        let acquired = |note: &str| Value::Array(vec![s("acquired"), Value::Int(5), s(note)]);
        assert_eq!(
            acquire_outcome(acquired("")).unwrap(),
            AcquireOutcome::Acquired {
                epoch: 5,
                released_by: None
            }
        );
        let b = crate::core::testing::member("pod-b");
        let note = serde_json::to_string(&b).unwrap();
        assert_eq!(
            acquire_outcome(acquired(&note)).unwrap(),
            AcquireOutcome::Acquired {
                epoch: 5,
                released_by: Some(b)
            }
        );
        // A lying store: a note that is no member record is an error, not a guess.
        assert!(acquire_outcome(acquired("{")).is_err());
        // The previous script's two-part reply is not this script's.
        let old = Value::Array(vec![s("acquired"), Value::Int(5)]);
        assert!(acquire_outcome(old).is_err());
    }

    #[test]
    fn release_answers_must_match_the_request() {
        let reply = |v: Vec<i64>| Value::Array(v.into_iter().map(Value::Int).collect());
        assert_eq!(
            released(reply(vec![1, 0]), 2).unwrap(),
            [Released::Deleted, Released::NotHeld]
        );
        let handed = Value::Array(vec![Value::Array(vec![s("handed"), Value::Int(9)])]);
        assert_eq!(
            released(handed, 1).unwrap(),
            [Released::HandedOver { epoch: 9 }]
        );
        assert!(released(reply(vec![1]), 2).is_err());
        assert!(released(reply(vec![2]), 1).is_err());
        let other = Value::Array(vec![Value::Array(vec![s("taken"), Value::Int(9)])]);
        assert!(released(other, 1).is_err());
    }

    #[test]
    fn a_stored_meta_of_another_binary_is_a_mismatch() {
        let ours = ClusterMeta::current(64);
        let stored = serde_json::to_string(&ClusterMeta::current(32)).unwrap();
        let reply = Value::Array(vec![s("meta"), s(&stored)]);
        match checked(reply, Some(&ours), 0) {
            Err(StoreError::MetaMismatch { stored, .. }) => assert_eq!(stored.shards, 32),
            other => panic!("{other:?}"),
        }
        let garbage = Value::Array(vec![s("meta"), s("{")]);
        assert!(matches!(
            checked(garbage, Some(&ours), 0),
            Err(StoreError::Protocol(_))
        ));
    }
}
