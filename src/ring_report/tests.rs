use super::*;

#[test]
fn placement_is_the_production_variant() {
    assert!(matches!(VARIANTS[PRODUCTION], Variant::Placement));
}

fn small() -> String {
    run(&RingReportArgs {
        shards: 64,
        min_pods: 4,
        max_pods: 6,
        sets: 5,
        seed: 1,
    })
}

#[test]
fn report_has_every_section_variant_and_pod_count() {
    let report = small();
    for heading in [
        "## Max shards per pod",
        "## Moved on join",
        "## Moved on leave",
        "## Summary",
        "Missed at N = ",
    ] {
        assert!(report.contains(heading), "missing {heading:?} in\n{report}");
    }
    let header = "| N | ceil | hash%N | plain ring | bounded ring | rendezvous | \
                  rdv+greedy cap | placement |";
    assert!(report.contains(header), "{report}");
    for n in 4..=6 {
        assert_eq!(
            report
                .lines()
                .filter(|l| l.starts_with(&format!("| {n} |")))
                .count(),
            3,
            "{report}"
        );
    }
}

#[test]
fn production_max_load_is_ceil_in_the_report() {
    let report = small();
    let max_table = report.split("## Moved on join").next().unwrap();
    for (n, ceil) in [(4, 16), (5, 13), (6, 11)] {
        let row = max_table
            .lines()
            .find(|l| l.starts_with(&format!("| {n} |")))
            .unwrap();
        let cells: Vec<&str> = row.split('|').map(str::trim).collect();
        // cells: "", N, ceil, hash%N, plain, bounded, rendezvous, rdv cap, placement
        assert_eq!(cells[2], ceil.to_string(), "{row}");
        assert_eq!(cells[5], format!("{ceil}.0 / {ceil}"), "{row}");
        assert_eq!(cells[8], format!("{ceil}.0 / {ceil}"), "{row}");
    }
    let missed = report
        .lines()
        .find(|l| l.starts_with("Missed at N = "))
        .unwrap();
    assert!(!missed.contains("max load"), "{missed}");
}

#[test]
fn same_arguments_same_report() {
    assert_eq!(small(), small());
}
