//! Leaf types every area may use; nothing here imports another module of the crate.

pub mod store;
