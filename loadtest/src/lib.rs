//! Load and fault harness for posgate: the POS terminal simulator ([`pos_sim`]), and later
//! the push load generator and the scenario runner (load-harness issue).
#![forbid(unsafe_code)]

pub mod pos_sim;
