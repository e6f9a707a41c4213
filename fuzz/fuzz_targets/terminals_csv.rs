//! `posgate terminals import`'s CSV: never a panic; an accepted file holds valid, unique
//! terminal ids, and `export`'s writing of them reads back as the same terminals; every
//! error names a line of the file and shows a bounded piece of it.
#![no_main]

use std::collections::HashSet;

use libfuzzer_sys::fuzz_target;
use posgate::api::valid_terminal_id;
use posgate::store::directory::csv;

fuzz_target!(|data: &[u8]| {
    let text = String::from_utf8_lossy(data);
    match csv::parse(&text) {
        Ok(terminals) => {
            let mut seen = HashSet::new();
            for t in &terminals {
                assert!(valid_terminal_id(&t.id), "{:?}", t.id);
                assert!(seen.insert(t.id.clone()), "duplicate {:?}", t.id);
            }
            let written = csv::write(&terminals);
            assert_eq!(csv::parse(&written).as_ref(), Ok(&terminals), "{written}");
        }
        Err(errors) => {
            let lines = text.lines().count().max(1);
            assert!(!errors.is_empty());
            assert!(errors.windows(2).all(|w| w[0].line <= w[1].line));
            for e in &errors {
                assert!((1..=lines).contains(&e.line), "line {} of {lines}", e.line);
                assert!(
                    e.reason.len() <= 600,
                    "{} bytes: {}",
                    e.reason.len(),
                    e.reason
                );
            }
        }
    }
});
