//! Count and nearest-rank percentiles (p50, p99, max) of a set of values: the one
//! summary of times the simulator's dark-interval log and the harness's reports share.
//!
//! Not a histogram or a streaming estimator: the values are kept, sorted and ranked, which
//! is exact and cheap at the sizes measured here (at most a few hundred thousand).

use serde::{Deserialize, Serialize};

/// Count, p50, p99 and max of a set of values.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Dist {
    pub count: usize,
    pub p50: u64,
    pub p99: u64,
    pub max: u64,
}

/// Nearest-rank percentiles; all zero for no values.
pub fn dist(mut values: Vec<u64>) -> Dist {
    if values.is_empty() {
        return Dist::default();
    }
    values.sort_unstable();
    let at = |q: f64| {
        let rank = ((q * values.len() as f64).ceil() as usize).clamp(1, values.len());
        values[rank - 1]
    };
    Dist {
        count: values.len(),
        p50: at(0.50),
        p99: at(0.99),
        max: values[values.len() - 1],
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles() {
        let d = dist((1..=100).collect());
        assert_eq!((d.count, d.p50, d.p99, d.max), (100, 50, 99, 100));
        assert_eq!(
            dist(vec![7]),
            Dist {
                count: 1,
                p50: 7,
                p99: 7,
                max: 7
            }
        );
        assert_eq!(dist(Vec::new()), Dist::default());
    }
}
