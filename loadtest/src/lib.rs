//! Load and fault harness for posgate: the scenario runner with its push load generator
//! ([`load`], binary `posgate-load`) and the benchmarks (`conn-bench`, `wire-dial`). The
//! terminals they run against are `pos-sim` processes (crate `posgate-pos-sim`).
#![forbid(unsafe_code)]
// As in posgate: the API docs are the developers' (`--document-private-items`).
#![allow(rustdoc::private_intra_doc_links)]

pub mod load;
