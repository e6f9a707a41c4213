//! The two text formats `/metrics` speaks, chosen by the scraper's `Accept` header:
//! OpenMetrics 1.0 when it asks for it (Prometheus does, and prefers it), the classic
//! Prometheus text format 0.0.4 otherwise (curl, `promtool check metrics`, older
//! scrapers and client libraries). Both carry the same samples; they differ in how a
//! counter family is named (`posgate_x` in OpenMetrics, `posgate_x_total` in the classic
//! format, like its samples) and in the closing `# EOF` line, which the classic format
//! has not.
//!
//! Not for: which metrics exist (`super`) or serving them (`crate::http`).

/// A text format of the metrics.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Exposition {
    OpenMetrics,
    Classic,
}

impl Exposition {
    /// The format an `Accept` header asks for: OpenMetrics when one of its media ranges
    /// is `application/openmetrics-text` with a non-zero quality, else the classic one
    /// (also without the header).
    pub fn negotiate(accept: Option<&str>) -> Exposition {
        let wants_openmetrics = accept.is_some_and(|accept| {
            accept.split(',').any(|range| {
                let mut parts = range.split(';').map(str::trim);
                let media = parts.next().unwrap_or_default();
                let refused = parts.any(|p| {
                    p.strip_prefix("q=")
                        .and_then(|q| q.parse::<f32>().ok())
                        .is_some_and(|q| q <= 0.0)
                });
                media.eq_ignore_ascii_case("application/openmetrics-text") && !refused
            })
        });
        if wants_openmetrics {
            Exposition::OpenMetrics
        } else {
            Exposition::Classic
        }
    }

    /// The `Content-Type` of a scrape in this format.
    pub fn content_type(self) -> &'static str {
        match self {
            Exposition::OpenMetrics => "application/openmetrics-text; version=1.0.0; charset=utf-8",
            Exposition::Classic => "text/plain; version=0.0.4; charset=utf-8",
        }
    }
}

/// `openmetrics` (as `prometheus-client` encodes it) in the classic text format: counter
/// families' `# HELP` and `# TYPE` lines named like their samples (`_total`), no
/// `# UNIT` and no `# EOF`; every sample line as it was.
pub(super) fn classic(openmetrics: &str) -> String {
    let counters: Vec<&str> = openmetrics
        .lines()
        .filter_map(|l| l.strip_prefix("# TYPE "))
        .filter_map(|l| l.strip_suffix(" counter"))
        .collect();
    let mut out = String::with_capacity(openmetrics.len() + 8 * counters.len());
    for line in openmetrics.lines() {
        if line == "# EOF" || line.starts_with("# UNIT ") {
            continue;
        }
        let renamed = ["# HELP ", "# TYPE "].into_iter().find_map(|prefix| {
            let rest = line.strip_prefix(prefix)?;
            let (name, tail) = rest.split_once(' ').unwrap_or((rest, ""));
            counters
                .contains(&name)
                .then(|| format!("{prefix}{name}_total {tail}"))
        });
        out.push_str(renamed.as_deref().unwrap_or(line));
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prometheus_gets_openmetrics_and_everyone_else_the_classic_format() {
        // What Prometheus 2.x sends.
        let prometheus = "application/openmetrics-text;version=1.0.0,application/openmetrics-text;\
                          version=0.0.1;q=0.75,text/plain;version=0.0.4;q=0.5,*/*;q=0.1";
        assert_eq!(
            Exposition::negotiate(Some(prometheus)),
            Exposition::OpenMetrics
        );
        for classic in [
            None,
            Some("*/*"),
            Some("text/plain"),
            Some("text/plain;version=0.0.4"),
            Some("application/openmetrics-text;q=0, text/plain"),
            Some("application/json"),
        ] {
            assert_eq!(
                Exposition::negotiate(classic),
                Exposition::Classic,
                "{classic:?}"
            );
        }
    }

    #[test]
    fn counters_are_named_like_their_samples_and_eof_goes() {
        let openmetrics = "# HELP posgate_dials Dials.\n# TYPE posgate_dials counter\n\
                           posgate_dials_total{result=\"ok\"} 3\n\
                           # HELP posgate_members Members.\n# TYPE posgate_members gauge\n\
                           posgate_members 2\n# UNIT posgate_x seconds\n# EOF\n";
        assert_eq!(
            classic(openmetrics),
            "# HELP posgate_dials_total Dials.\n# TYPE posgate_dials_total counter\n\
             posgate_dials_total{result=\"ok\"} 3\n\
             # HELP posgate_members Members.\n# TYPE posgate_members gauge\n\
             posgate_members 2\n"
        );
    }
}
