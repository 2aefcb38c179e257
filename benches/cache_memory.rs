//! Resident memory of the key cache holding many keys: `cargo bench --bench cache_memory`
//! (1,000,000 keys; under `cargo test` a quick 10,000-key smoke run).
//!
//! The cache sits in front of a store that makes up a plausible record for any digest, so
//! what is measured is the cache alone, not a second copy in the store.

use async_trait::async_trait;
use std::sync::Arc;
use tokio::sync::Notify;

use svcgate::events::Event;
use svcgate::keys::{self, Environment, KeyHash, KeyParams, KeyRecord, Scopes, Workspace};
use svcgate::store::{CacheConfig, KeyCache, KeyChange, KeyChanges, Rotation, Store, StoreError};

/// A store that invents a key record for every digest it is asked about.
struct SyntheticStore {
    signal: Arc<Notify>,
}

#[async_trait]
impl Store for SyntheticStore {
    async fn ping(&self) -> Result<(), StoreError> {
        Ok(())
    }
    async fn create_workspace(&self, _: &Workspace) -> Result<(), StoreError> {
        Ok(())
    }
    async fn workspace(&self, _: &str) -> Result<Option<Workspace>, StoreError> {
        Ok(None)
    }
    async fn insert_key(&self, _: &KeyRecord) -> Result<(), StoreError> {
        Ok(())
    }
    async fn key_by_hash(&self, hash: &KeyHash) -> Result<Option<Arc<KeyRecord>>, StoreError> {
        let n = u32::from_le_bytes([hash.0[0], hash.0[1], hash.0[2], hash.0[3]]);
        let (_, mut record) = keys::issue(
            KeyParams {
                workspace: format!("ws_{:020}", n % 1000),
                environment: Environment::Live,
                scopes: Scopes::new(["chat.completions:create", "models:read"]),
                name: String::new(),
                monthly_budget: None,
            },
            1_700_000_000,
        );
        record.hash = *hash;
        Ok(Some(Arc::new(record)))
    }
    async fn key_by_id(&self, _: &str) -> Result<Option<Arc<KeyRecord>>, StoreError> {
        Ok(None)
    }
    async fn keys_in_workspace(&self, _: &str) -> Result<Vec<Arc<KeyRecord>>, StoreError> {
        Ok(Vec::new())
    }
    async fn update_key(
        &self,
        _: &str,
        _: KeyChange<'_>,
    ) -> Result<Option<Arc<KeyRecord>>, StoreError> {
        Ok(None)
    }
    async fn update_key_emitting(
        &self,
        _: &str,
        _: KeyChange<'_>,
        _: &Event,
    ) -> Result<Option<Arc<KeyRecord>>, StoreError> {
        Ok(None)
    }
    async fn key_changes_since(&self, epoch: u64) -> Result<KeyChanges, StoreError> {
        Ok(KeyChanges {
            epoch,
            changed: Some(Vec::new()),
        })
    }
    fn key_change_signal(&self) -> Arc<Notify> {
        self.signal.clone()
    }
    async fn rotate_key(&self, _: &str, _: &KeyRecord, _: u64) -> Result<Rotation, StoreError> {
        Ok(Rotation::NotFound)
    }
    async fn insert_token(&self, _: &KeyRecord, _: u64) -> Result<(), StoreError> {
        Ok(())
    }
    async fn secret(&self, _: &str) -> Result<[u8; 32], StoreError> {
        Ok([0; 32])
    }
}

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
    let count: u32 = if full { 1_000_000 } else { 10_000 };
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let store = Arc::new(SyntheticStore {
        signal: Arc::new(Notify::new()),
    });
    let cache = KeyCache::new(store, CacheConfig::default());
    rt.block_on(cache.sync()).unwrap();
    let before = resident_bytes();
    rt.block_on(async {
        for i in 0..count {
            let hash = KeyHash::of(&format!("svc_live_{i}"));
            cache.get(&hash).await.unwrap();
        }
    });
    let after = resident_bytes();
    assert_eq!(cache.len(), count as usize);
    let mb = (after.saturating_sub(before)) as f64 / 1e6;
    println!(
        "cache_memory: {count} keys cached, resident memory +{mb:.1} MB ({:.0} bytes per key)",
        (after.saturating_sub(before)) as f64 / count as f64
    );
}
