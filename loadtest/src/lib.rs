//! Load and fault harness for posgate: the POS terminal simulator ([`pos_sim`]) and the
//! scenario runner with its push load generator ([`load`], binary `posgate-load`), and the
//! percentile summary both use ([`dist`]).
#![forbid(unsafe_code)]
// As in posgate: the API docs are the developers' (`--document-private-items`).
#![allow(rustdoc::private_intra_doc_links)]

pub mod dist;
pub mod load;
pub mod pos_sim;
