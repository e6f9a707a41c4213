//! Fault knobs: what the simulated terminals do wrong on purpose, set through
//! [`super::PosFarm::set_faults`] or `POST /faults` on the admin endpoint.
//!
//! A [`FaultConfig`] is a whole state: setting one replaces the previous one, and every
//! field left out of the JSON is "off". Dropping live connections is an action, not a
//! state, so it is a separate call ([`super::PosFarm::drop_connections`]). This module only
//! describes and selects; the connection code applies the faults.

use std::time::Duration;

use serde::{Deserialize, Serialize};

/// Persistent fault settings of a farm.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct FaultConfig {
    /// Close every new TCP connection right after accepting it (before TLS).
    pub refuse_connections: bool,
    /// Wait this long after accepting a TCP connection before starting the TLS handshake.
    pub handshake_delay_ms: u64,
    /// Wait this long before answering each hello and push.
    pub response_latency_ms: u64,
    /// Wait this long after taking a push before answering it: the push is taken even
    /// when the pod stops waiting first (its answer is lost on the way back).
    pub answer_delay_ms: u64,
    /// The terminals `answer_delay_ms` applies to; every terminal when empty.
    pub slow_terminals: Vec<String>,
    /// Fraction (0..=1) of the farm's terminals that are offline: their SNI is refused and
    /// their live connections are dropped when the setting is applied. Which terminals is
    /// a fixed function of the terminal number, so the same fraction picks the same ones.
    pub offline_fraction: f64,
    /// Terminal ids that are offline in addition to `offline_fraction`.
    pub offline_terminals: Vec<String>,
    /// Answer every push with this HTTP status instead of accepting it (0: off). The
    /// push is not recorded as accepted.
    pub push_status: u16,
    /// Protocol breakage (what `posgate conformance` must catch): answer a hello or push
    /// with a stale epoch `200` instead of `409` (nothing recorded).
    pub accept_stale_epochs: bool,
    /// Protocol breakage: answer a repeated key `200` without the duplicate marker.
    pub forget_keys: bool,
    /// Protocol breakage: answer a push without an accepted hello on its connection `200`
    /// instead of `428` (nothing recorded).
    pub accept_without_hello: bool,
    /// Protocol breakage: refuse a push without `content-type` with `400`, as a terminal
    /// that takes the header for mandatory would (the pod sends none when its sender
    /// gave none).
    pub require_content_type: bool,
}

impl FaultConfig {
    /// Rejects fractions outside 0..=1 (NaN included).
    pub fn validate(&self) -> Result<(), String> {
        if !(0.0..=1.0).contains(&self.offline_fraction) {
            return Err(format!(
                "offline_fraction must be within 0..=1, got {}",
                self.offline_fraction
            ));
        }
        if self.push_status != 0 && http::StatusCode::from_u16(self.push_status).is_err() {
            return Err(format!(
                "push_status {} is not an HTTP status",
                self.push_status
            ));
        }
        Ok(())
    }

    pub(crate) fn handshake_delay(&self) -> Duration {
        Duration::from_millis(self.handshake_delay_ms)
    }

    pub(crate) fn response_latency(&self) -> Duration {
        Duration::from_millis(self.response_latency_ms)
    }

    /// How long terminal `id` waits before answering a push it took.
    pub(crate) fn answer_delay(&self, id: &str) -> Duration {
        let slow = self.slow_terminals.is_empty() || self.slow_terminals.iter().any(|t| t == id);
        Duration::from_millis(if slow { self.answer_delay_ms } else { 0 })
    }

    /// Whether terminal number `n` (id `id`) is offline under this configuration.
    pub fn is_offline(&self, n: u64, id: &str) -> bool {
        selected(n, 0, self.offline_fraction) || self.offline_terminals.iter().any(|t| t == id)
    }
}

/// Body of `POST /drop`: drop this fraction of live connections now.
#[derive(Debug, Clone, Copy, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DropRequest {
    /// Fraction (0..=1) of live terminal connections to drop.
    pub fraction: f64,
}

/// Whether item `n` falls in `fraction` for selection round `round`: a fixed mix
/// (SplitMix64) of the two mapped to 0..1, so selections are reproducible and spread evenly
/// over consecutive numbers.
pub(crate) fn selected(n: u64, round: u64, fraction: f64) -> bool {
    if fraction <= 0.0 {
        return false;
    }
    if fraction >= 1.0 {
        return true;
    }
    let mut z = n ^ round.wrapping_mul(0xD6E8_FEB8_6659_FD93);
    z = z.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^= z >> 31;
    ((z >> 11) as f64 / (1u64 << 53) as f64) < fraction
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn selection_matches_fraction_roughly() {
        let picked = (0..10_000).filter(|&n| selected(n, 0, 0.25)).count();
        assert!((2_300..2_700).contains(&picked), "picked {picked}");
        assert_eq!((0..100).filter(|&n| selected(n, 3, 0.0)).count(), 0);
        assert_eq!((0..100).filter(|&n| selected(n, 3, 1.0)).count(), 100);
    }

    #[test]
    fn json_defaults_to_off_and_rejects_bad_fraction() {
        let f: FaultConfig = serde_json::from_str(r#"{"handshake_delay_ms":5}"#).unwrap();
        assert_eq!(f.handshake_delay_ms, 5);
        assert!(!f.refuse_connections);
        assert!(f.validate().is_ok());
        let bad = FaultConfig {
            offline_fraction: 1.5,
            ..FaultConfig::default()
        };
        assert!(bad.validate().is_err());
        assert!(serde_json::from_str::<FaultConfig>(r#"{"nope":1}"#).is_err());
    }
}
