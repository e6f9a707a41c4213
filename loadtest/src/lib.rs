//! Load and fault harness for posgate: the POS terminal simulator ([`pos_sim`]) and the
//! scenario runner with its push load generator ([`load`], binary `posgate-load`).
#![forbid(unsafe_code)]

pub mod load;
pub mod pos_sim;
