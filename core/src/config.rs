//! Timings and sizes the ownership core runs with, validated once.
//!
//! The relations checked in [`CoreConfig::validate`] are what the safety and liveness
//! arguments in `docs/design.md` rely on; a config that breaks one is refused at start
//! with a message naming the flag.

use std::time::Duration;

/// Settings of the sans-IO core. Field names match the CLI flags of `posgate serve`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CoreConfig {
    /// Number of shards (`--shards`, 64).
    pub shards: u32,
    /// Lease time-to-live in the store (`--lease-ttl`, 15 s).
    pub lease_ttl: Duration,
    /// How often held leases are renewed (`--renew-interval`, 5 s).
    pub renew_interval: Duration,
    /// Safety margin subtracted from the TTL for the local deadline (`--lease-margin`, 1 s).
    pub lease_margin: Duration,
    /// Membership registration time-to-live (`--member-ttl`, 15 s).
    pub member_ttl: Duration,
    /// How often the registration is refreshed (`--heartbeat-interval`, member TTL / 3).
    pub heartbeat_interval: Duration,
    /// How often the store is polled for members and lease holders when no change
    /// notification arrives (`--poll-interval`, 1 s).
    pub poll_interval: Duration,
    /// A membership change is applied once the view was stable this long
    /// (`--rebalance-debounce`, 1 s).
    pub debounce: Duration,
    /// Time a shard's connections get to close after it stops being served
    /// (`--close-budget`). When a lease is about to run out, serving stops this long
    /// before the local deadline, so the connections are gone by then.
    pub close_budget: Duration,
    /// Upper bound for a graceful shutdown: stop serving, release, deregister
    /// (`--shutdown-budget`, 10 s).
    pub shutdown_budget: Duration,
    /// At most this many shards in motion across the cluster: assigned to a live pod
    /// that does not hold them yet (`--max-moving-shards`, an eighth of the shards).
    /// Shards of crashed or drained pods never wait for it (see `placement::step`).
    pub max_moving_shards: u32,
}

/// A configuration the safety argument cannot work with.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum InvalidTimings {
    #[error("--shards must be between 1 and 4096, got {0}")]
    Shards(u32),
    #[error("--{flag} must be greater than zero")]
    Zero { flag: &'static str },
    #[error(
        "--lease-ttl ({ttl:?}) must exceed --lease-margin + --close-budget + --renew-interval \
         ({need:?}) so that a lease survives at least one failed renewal"
    )]
    TtlTooShort { ttl: Duration, need: Duration },
    #[error("--heartbeat-interval ({hb:?}) must be at most half of --member-ttl ({ttl:?})")]
    Heartbeat { hb: Duration, ttl: Duration },
    #[error(
        "--member-ttl ({member:?}) must be at least --lease-ttl - --lease-margin - --close-budget \
         ({need:?}): after Redis restarts empty, pods hold off new claims for one member TTL, \
         which must outlast every lease deadline from before the restart"
    )]
    MemberTtlTooShort { member: Duration, need: Duration },
}

impl Default for CoreConfig {
    fn default() -> Self {
        CoreConfig {
            shards: 64,
            lease_ttl: Duration::from_secs(15),
            renew_interval: Duration::from_secs(5),
            lease_margin: Duration::from_secs(1),
            member_ttl: Duration::from_secs(15),
            heartbeat_interval: Duration::from_secs(5),
            poll_interval: Duration::from_secs(1),
            debounce: Duration::from_secs(1),
            close_budget: Duration::from_secs(2),
            shutdown_budget: Duration::from_secs(10),
            max_moving_shards: 8,
        }
    }
}

impl CoreConfig {
    /// Short timings for tests and the demo: TTL 3 s, renew 1 s, member TTL 3 s.
    pub fn fast() -> Self {
        CoreConfig {
            lease_ttl: Duration::from_secs(3),
            renew_interval: Duration::from_secs(1),
            lease_margin: Duration::from_millis(500),
            member_ttl: Duration::from_secs(3),
            heartbeat_interval: Duration::from_secs(1),
            poll_interval: Duration::from_millis(500),
            debounce: Duration::from_millis(300),
            close_budget: Duration::from_millis(300),
            shutdown_budget: Duration::from_secs(5),
            ..CoreConfig::default()
        }
    }

    pub fn validate(&self) -> Result<(), InvalidTimings> {
        if self.shards == 0 || self.shards > 4096 {
            return Err(InvalidTimings::Shards(self.shards));
        }
        if self.max_moving_shards == 0 {
            return Err(InvalidTimings::Zero {
                flag: "max-moving-shards",
            });
        }
        for (flag, d) in [
            ("lease-ttl", self.lease_ttl),
            ("renew-interval", self.renew_interval),
            ("member-ttl", self.member_ttl),
            ("heartbeat-interval", self.heartbeat_interval),
            ("poll-interval", self.poll_interval),
            ("shutdown-budget", self.shutdown_budget),
        ] {
            if d.is_zero() {
                return Err(InvalidTimings::Zero { flag });
            }
        }
        let need = self.lease_margin + self.close_budget + self.renew_interval;
        if self.lease_ttl <= need {
            return Err(InvalidTimings::TtlTooShort {
                ttl: self.lease_ttl,
                need,
            });
        }
        let need = self.lease_ttl - self.lease_margin - self.close_budget;
        if self.member_ttl < need {
            return Err(InvalidTimings::MemberTtlTooShort {
                member: self.member_ttl,
                need,
            });
        }
        if self.heartbeat_interval * 2 > self.member_ttl {
            return Err(InvalidTimings::Heartbeat {
                hb: self.heartbeat_interval,
                ttl: self.member_ttl,
            });
        }
        Ok(())
    }

    /// How long after sending a successful acquire or renew this pod may serve the shard:
    /// the lease TTL minus the safety margin minus the close budget, so that the shard's
    /// connections are closed before the lease can expire in the store.
    pub fn serve_window(&self) -> Duration {
        self.lease_ttl
            .saturating_sub(self.lease_margin + self.close_budget)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_and_fast_are_valid() {
        assert_eq!(CoreConfig::default().validate(), Ok(()));
        assert_eq!(CoreConfig::fast().validate(), Ok(()));
    }

    #[test]
    fn rejects_ttl_without_room_for_a_failed_renewal() {
        let c = CoreConfig {
            lease_ttl: Duration::from_secs(8),
            ..CoreConfig::default()
        };
        assert!(matches!(
            c.validate(),
            Err(InvalidTimings::TtlTooShort { .. })
        ));
        let c = CoreConfig {
            heartbeat_interval: Duration::from_secs(8),
            ..CoreConfig::default()
        };
        assert!(matches!(
            c.validate(),
            Err(InvalidTimings::Heartbeat { .. })
        ));
        let c = CoreConfig {
            member_ttl: Duration::from_secs(10),
            ..CoreConfig::default()
        };
        assert!(matches!(
            c.validate(),
            Err(InvalidTimings::MemberTtlTooShort { .. })
        ));
        let c = CoreConfig {
            shards: 0,
            ..CoreConfig::default()
        };
        assert_eq!(c.validate(), Err(InvalidTimings::Shards(0)));
    }
}
