//! Load and fault harness for posgate: the POS terminal simulator ([`pos_sim`]) and the
//! scenario runner with its push load generator ([`load`], binary `posgate-load`), and the
//! percentile summary both use ([`dist`]).
#![forbid(unsafe_code)]

pub mod dist;
pub mod load;
pub mod pos_sim;
