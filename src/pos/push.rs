//! One push over a terminal's live session, and what its outcome proves about delivery
//! (the request itself and the meaning of the terminal's answer are `wire`).
//!
//! The classification is the heart of "at most once per attempt": only an outcome that
//! proves the terminal never processed the push ([`PushFailure::NotSent`],
//! [`PushFailure::StaleEpoch`]) may be retried by the gateway; once the request may have
//! reached the terminal without an answer, the outcome is [`PushFailure::Unknown`].
//!
//! Not for: choosing the session, waiting for one, or retrying (the push service).

use std::time::Duration;

use http::StatusCode;

use super::session::{self, RequestSender, SendError};
use super::wire::{self, PosPush, Receipt, Verdict};
use crate::core::Epoch;

/// The terminal's own answer to a push (the fence is a [`PushFailure`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Answered {
    /// 2xx: the terminal has the push, taken now or, with [`Receipt::Duplicate`], from
    /// an earlier copy of the same key.
    Accepted {
        status: StatusCode,
        receipt: Receipt,
    },
    /// Any other status: the terminal's refusal of this push.
    Refused { status: StatusCode },
}

/// Why a push did not get a terminal's answer, by what it proves.
#[derive(Debug, thiserror::Error)]
pub enum PushFailure {
    /// The request never left: the connection was closed or not ready. Safe to retry.
    #[error("not sent: {0}")]
    NotSent(String),
    /// The terminal refused our epoch (`409` with `posgate-stale-epoch`): it did not
    /// process the push, and a newer owner exists.
    #[error("terminal refused the epoch as stale (it has seen {highest:?})")]
    StaleEpoch { highest: Option<Epoch> },
    /// The request may have reached the terminal and no answer came.
    #[error("no answer: {0}")]
    Unknown(String),
}

/// Sends `push` on `sender` and waits up to `timeout` for the status. `Ok` is the
/// terminal's own answer; only its status and headers are read, never its body.
pub async fn send(
    sender: &mut RequestSender,
    push: PosPush<'_>,
    timeout: Duration,
) -> Result<Answered, PushFailure> {
    let request = wire::push(&push).map_err(|e| PushFailure::NotSent(e.to_string()))?;
    // A push still queued for a stream (the terminal's concurrency limit) when the
    // time is up was not sent either, but the two are not told apart: both count as
    // unknown.
    let response = tokio::time::timeout(timeout, session::send(sender, request))
        .await
        .map_err(|_| PushFailure::Unknown(format!("no answer within {timeout:?}")))?
        .map_err(|e| match e {
            SendError::NotSent(e) => PushFailure::NotSent(e.to_string()),
            SendError::Unknown(e) => PushFailure::Unknown(e.to_string()),
        })?;
    let status = response.status();
    match wire::verdict(status, response.headers()) {
        Verdict::Stale { highest } => Err(PushFailure::StaleEpoch { highest }),
        Verdict::Accepted => Ok(Answered::Accepted {
            status,
            receipt: wire::receipt(response.headers()),
        }),
        Verdict::Refused { status } => Ok(Answered::Refused { status }),
    }
}
