//! Resident memory of the key cache holding many keys: `cargo bench --bench cache_memory`
//! (1,000,000 keys; under `cargo test` a quick 10,000-key smoke run).
//!
//! The keys are stored first (in the in-memory store); what is measured is the growth of the
//! process while the cache takes them all in, i.e. the cache alone.

use std::sync::Arc;

use svcgate::keys::cache::{CacheConfig, KeyCache};
use svcgate::keys::{self, Environment, KeyParams, Scopes};
use svcgate::store::{KeyStore, MemoryStore};

fn resident_bytes() -> u64 {
    let statm = std::fs::read_to_string("/proc/self/statm").unwrap_or_default();
    let pages: u64 = statm
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    pages * 4096
}

fn main() {
    let full = std::env::args().any(|a| a == "--bench");
    let count: usize = if full { 1_000_000 } else { 10_000 };
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let store = Arc::new(MemoryStore::new());
    let hashes = rt.block_on(async {
        let mut hashes = Vec::with_capacity(count);
        for i in 0..count {
            let (_, record) = keys::issue(
                KeyParams {
                    // A thousand workspaces, two scope sets: a plausible spread.
                    workspace: format!("ws_{:020}", i % 1000),
                    environment: Environment::Live,
                    scopes: if i % 2 == 0 {
                        Scopes::new(["chat.completions:create", "models:read"])
                    } else {
                        Scopes::new(["images:create"])
                    },
                    name: String::new(),
                    monthly_budget: None,
                    expires_at: None,
                    rate_limit: None,
                    metadata: None,
                },
                1_700_000_000,
            );
            hashes.push(record.hash);
            store.insert_key(&record).await.unwrap();
        }
        hashes
    });
    let cache = KeyCache::new(store, CacheConfig::default());
    rt.block_on(cache.sync()).unwrap();
    let before = resident_bytes();
    rt.block_on(async {
        for hash in &hashes {
            cache.get(hash).await.unwrap();
        }
    });
    let after = resident_bytes();
    assert_eq!(cache.len(), count);
    let grown = after.saturating_sub(before);
    println!(
        "cache_memory: {count} keys cached, resident memory +{:.1} MB ({:.0} bytes per key)",
        grown as f64 / 1e6,
        grown as f64 / count as f64
    );
}
