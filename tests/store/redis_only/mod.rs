//! Cases only the Redis store has: its formats, connections and what several replicas share.

use super::*;

mod audit;
mod connections;
mod deliveries;
mod events;
mod key_store;
