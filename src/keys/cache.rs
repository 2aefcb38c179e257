//! The in-process key cache: the request path's view of the key registry.
//!
//! A warm request is answered from memory with no store round trip. The cache stays correct
//! by following the store's change log: every key write advances an epoch and names the key's
//! digest; a sync (woken by the store's change signal — Redis pub/sub — and by a periodic poll
//! that catches anything the signal missed) drops exactly the entries that changed.
//!
//! When the store is unreachable, cached answers are served for a bounded time since the last
//! successful sync (`max_staleness`); past that, and for keys not cached, lookups fail with
//! [`StoreError::Unavailable`] (503 on the request path, never a 401 for a key that may be
//! valid).

use dashmap::{DashMap, DashSet};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::directory::KeyDirectory;
use super::store::KeyStore;
use crate::keys::{workspace_digest, CachedKey, KeyHash, KeyRecord, Scopes, SharedLimit};
use crate::shared::store::StoreError;

/// How many times a fetch reads the store when syncs keep overlapping it.
const FETCH_ATTEMPTS: u32 = 3;

/// How often expired scoped tokens are swept out of the cache.
const EXPIRY_SWEEP: Duration = Duration::from_secs(30);

/// Tuning of a [`KeyCache`].
#[derive(Debug, Clone)]
pub struct CacheConfig {
    /// How long cached answers outlive the last successful sync when the store is down.
    pub max_staleness: Duration,
    /// How long an unknown digest is remembered as unknown.
    pub negative_ttl: Duration,
    /// Most unknown digests remembered; when full, those older than `negative_ttl` go (all of
    /// them if that frees less than half).
    pub negative_capacity: usize,
    /// How often to check the change log when no signal arrives.
    pub poll_interval: Duration,
    /// Memory the cached scoped tokens may take ([`token_weight`]). A token minted past it is
    /// not cached: it is read from the store on each use, until expired tokens make room.
    pub token_budget_bytes: usize,
}

/// What a cached scoped token counts for, besides its metadata.
const TOKEN_ENTRY_BYTES: usize = 512;

/// What a cached key counts against [`CacheConfig::token_budget_bytes`]: nothing for a key; for
/// a scoped token its entry, and its metadata at four times its JSON (parsed values, each
/// string and map allocated apart). Keys are bounded by what the store holds; tokens are
/// minted at up to a key's rate limit, each with up to 4 KiB of metadata.
fn token_weight(key: &CachedKey) -> usize {
    key.scoped.as_ref().map_or(0, |grant| {
        let json = serde_json::to_vec(&grant.metadata).map_or(0, |v| v.len());
        // The key's metadata it carries: parsed, and its JSON kept for the header.
        let inherited = key.metadata.as_ref().map_or(0, |(_, json)| 5 * json.len());
        TOKEN_ENTRY_BYTES + 4 * json + inherited
    })
}

impl Default for CacheConfig {
    fn default() -> Self {
        Self {
            max_staleness: Duration::from_secs(60),
            negative_ttl: Duration::from_secs(30),
            negative_capacity: 100_000,
            poll_interval: Duration::from_secs(1),
            token_budget_bytes: 64 << 20,
        }
    }
}

pub use crate::metrics::CacheOutcome;

/// Key records by digest, kept in step with the store.
pub struct KeyCache {
    store: Arc<dyn KeyStore>,
    // Keyed by SHA-256 digests, which are uniformly spread already: a fast seeded hash, not
    // SipHash, on every request's lookup.
    known: DashMap<KeyHash, Arc<CachedKey>, foldhash::fast::RandomState>,
    unknown: DashMap<KeyHash, Instant, foldhash::fast::RandomState>,
    /// Every key the store holds, by digest, cached or not.
    directory: KeyDirectory,
    /// One shared copy of each workspace id and each scope set: most keys share both.
    workspaces: DashSet<Arc<str>>,
    scope_sets: DashSet<Arc<Scopes>>,
    /// The rate limit of each workspace a cached key belongs to, one cell per workspace, by
    /// the digest its changes are logged under ([`workspace_digest`]): a change to the
    /// workspace updates the cell in place for all its keys.
    workspace_limits: DashMap<KeyHash, (Arc<str>, Arc<SharedLimit>), foldhash::fast::RandomState>,
    /// Where in the store's change log the cache has caught up to: the epoch and the mark
    /// of the change at it.
    position: Mutex<(u64, String)>,
    /// Held while a sync runs, one at a time, so that callers that arrive meanwhile share the
    /// next one ([`KeyCache::sync`]): the number of the last sync that finished, and how.
    syncing: tokio::sync::Mutex<(u64, Result<(), StoreError>)>,
    /// Syncs started, numbered from 1 as they start.
    syncs_started: AtomicU64,
    /// Bumped before entries are dropped, so a fetch that raced a change does not re-insert
    /// what it read before the change.
    generation: AtomicU64,
    /// Milliseconds after `origin` of the last successful sync; 0 = never.
    synced_at_ms: AtomicU64,
    /// What the cached scoped tokens weigh ([`token_weight`]).
    token_bytes: AtomicUsize,
    /// The earliest expiry (unix seconds) of a cached scoped token, as of the last sweep and
    /// the admissions since (`u64::MAX`: none). A full token budget sweeps the cache only once
    /// a token has expired: a sweep visits every entry.
    next_expiry: AtomicU64,
    /// Milliseconds after `origin` of the last sweep for the token budget; 0 = never.
    budget_swept_ms: AtomicU64,
    /// Sweeps made, for tests.
    #[cfg(test)]
    sweeps: AtomicUsize,
    /// Milliseconds after `origin` of the last warning that the token budget is full.
    token_budget_warned_ms: AtomicU64,
    origin: Instant,
    config: CacheConfig,
}

impl KeyCache {
    /// An empty cache in front of `store`. Call [`KeyCache::sync`] once, then run
    /// [`KeyCache::follow`] in the background.
    pub fn new(store: Arc<dyn KeyStore>, config: CacheConfig) -> Self {
        Self {
            directory: KeyDirectory::new(store.minted_tokens()),
            store,
            known: DashMap::default(),
            unknown: DashMap::default(),
            workspaces: DashSet::new(),
            scope_sets: DashSet::new(),
            workspace_limits: DashMap::default(),
            position: Mutex::new((0, String::new())),
            syncing: tokio::sync::Mutex::new((0, Ok(()))),
            syncs_started: AtomicU64::new(0),
            generation: AtomicU64::new(0),
            synced_at_ms: AtomicU64::new(0),
            token_bytes: AtomicUsize::new(0),
            next_expiry: AtomicU64::new(u64::MAX),
            budget_swept_ms: AtomicU64::new(0),
            #[cfg(test)]
            sweeps: AtomicUsize::new(0),
            token_budget_warned_ms: AtomicU64::new(0),
            origin: Instant::now(),
            config,
        }
    }

    /// The store behind the cache.
    pub fn store(&self) -> &Arc<dyn KeyStore> {
        &self.store
    }

    /// What the cache knows of `hash` without asking the store: the key, or that there is
    /// none; `None` if it must ask (not cached, or the cache is stale).
    #[inline]
    pub fn cached(&self, hash: &KeyHash) -> Option<(Option<Arc<CachedKey>>, CacheOutcome)> {
        if !self.is_fresh() {
            return None;
        }
        if let Some(record) = self.known.get(hash) {
            return Some((Some(record.clone()), CacheOutcome::Hit));
        }
        match self.unknown.get(hash) {
            Some(seen) if seen.elapsed() < self.config.negative_ttl => {
                Some((None, CacheOutcome::NegativeHit))
            }
            _ => None,
        }
    }

    /// Whether the store holds a key with digest `hash`, or a scoped token valid at unix second
    /// `now`, as far as this replica knows without asking it: a key written elsewhere since the
    /// last sync is not listed yet, nor, while the replica lists the store (after its start, or
    /// a gap in the change log), one the listing has not reached, nor a token minted elsewhere
    /// whose news has not arrived.
    pub fn listed(&self, hash: &KeyHash, now: u64) -> bool {
        self.directory.listed(hash, now)
    }

    /// The key whose value hashes to `hash`, or `None` if there is none.
    pub async fn get(
        &self,
        hash: &KeyHash,
    ) -> Result<(Option<Arc<CachedKey>>, CacheOutcome), StoreError> {
        match self.cached(hash) {
            Some(found) => Ok(found),
            None => self.fetch(hash).await,
        }
    }

    /// Asks the store for `hash`, and caches the answer.
    pub async fn fetch(
        &self,
        hash: &KeyHash,
    ) -> Result<(Option<Arc<CachedKey>>, CacheOutcome), StoreError> {
        self.fetch_with(hash, || self.store.key_by_hash(hash)).await
    }

    /// [`KeyCache::fetch`], reading the store with `read`.
    ///
    /// A sync that runs while the store is read bumps the generation; what was read may then
    /// predate a change the sync dropped, so it is not kept. The read is tried again (a key's
    /// first use often meets the sync of the key's own creation, and a key left uncached is
    /// refused while the store is away), up to [`FETCH_ATTEMPTS`] times; the answer is the
    /// last read either way.
    async fn fetch_with<F, Fut>(
        &self,
        hash: &KeyHash,
        mut read: F,
    ) -> Result<(Option<Arc<CachedKey>>, CacheOutcome), StoreError>
    where
        F: FnMut() -> Fut,
        Fut: std::future::Future<Output = Result<Option<Arc<KeyRecord>>, StoreError>>,
    {
        let mut attempt = 1;
        loop {
            let generation = self.generation.load(Ordering::Acquire);
            let record = read().await?.map(|r| Arc::new(self.compact(&r)));
            if let Some(key) = record.as_ref().filter(|k| !k.workspace_limit.is_loaded()) {
                // The first key of its workspace here: its limit is read once, and kept up to
                // date by the change log from then on.
                let workspace = self.store.workspace(&key.workspace).await?;
                key.workspace_limit
                    .load_once(workspace.and_then(|w| w.rate_limit));
            }
            if self.remember(hash, &record, generation) || attempt == FETCH_ATTEMPTS {
                return Ok((record, CacheOutcome::Miss));
            }
            attempt += 1;
        }
    }

    /// Caches what the store said of `hash`, read at `generation`; false (nothing kept) if a
    /// sync has run since.
    fn remember(&self, hash: &KeyHash, record: &Option<Arc<CachedKey>>, generation: u64) -> bool {
        if self.generation.load(Ordering::Acquire) != generation {
            return false;
        }
        match record {
            Some(r) => {
                self.unknown.remove(hash);
                if self.admit(r) {
                    if let Some(old) = self.known.insert(*hash, r.clone()) {
                        self.release(&old);
                    }
                }
            }
            None => {
                if self.unknown.len() >= self.config.negative_capacity {
                    // Aged out first; cleared if that frees less than half, so the pass runs
                    // at most once per half a set of inserts.
                    let ttl = self.config.negative_ttl;
                    self.unknown.retain(|_, seen| seen.elapsed() < ttl);
                    if self.unknown.len() >= self.config.negative_capacity / 2 {
                        self.unknown.clear();
                    }
                }
                self.unknown.insert(*hash, Instant::now());
            }
        }
        // A sync that began after the check above bumps the generation and then removes what
        // changed, so it may have removed the hash before the insert: look again and take back
        // what may be stale (a revoked key would otherwise stay cached here).
        if self.generation.load(Ordering::Acquire) != generation {
            self.forget(hash);
            self.unknown.remove(hash);
            return false;
        }
        true
    }

    /// Whether `key` may be cached: always for a key; for a scoped token, while the tokens
    /// cached fit [`CacheConfig::token_budget_bytes`] (expired ones go first). Counts it in.
    fn admit(&self, key: &CachedKey) -> bool {
        let weight = token_weight(key);
        if weight == 0 {
            return true;
        }
        let budget = self.config.token_budget_bytes;
        let fits = |cache: &Self| cache.token_bytes.load(Ordering::Acquire) + weight <= budget;
        let now = crate::ids::unix_now();
        if !fits(self) && self.next_expiry.load(Ordering::Acquire) <= now && self.sweep_due() {
            self.evict_expired(now);
        }
        if !fits(self) {
            let now = self.now_ms().max(1);
            let warned = self.token_budget_warned_ms.load(Ordering::Acquire);
            if (warned == 0 || now.saturating_sub(warned) >= 60_000)
                && self
                    .token_budget_warned_ms
                    .compare_exchange(warned, now, Ordering::AcqRel, Ordering::Acquire)
                    .is_ok()
            {
                tracing::warn!(
                    budget_bytes = budget,
                    "cached scoped tokens fill their memory budget; new tokens are read from the store on each use"
                );
            }
            return false;
        }
        self.token_bytes.fetch_add(weight, Ordering::AcqRel);
        // A token that has expired already (the store keeps one an hour, to say so) is cached,
        // and goes with the periodic sweep: it is no reason for a sweep of its own.
        if let Some(grant) = key.scoped.as_ref().filter(|g| g.expires_at > now) {
            self.next_expiry
                .fetch_min(grant.expires_at, Ordering::AcqRel);
        }
        true
    }

    /// Whether a sweep for the token budget may run now: one a second at most, whatever asks.
    fn sweep_due(&self) -> bool {
        let now = self.now_ms().max(1);
        let last = self.budget_swept_ms.load(Ordering::Acquire);
        (last == 0 || now.saturating_sub(last) >= 1_000)
            && self
                .budget_swept_ms
                .compare_exchange(last, now, Ordering::AcqRel, Ordering::Acquire)
                .is_ok()
    }

    /// Counts out a cached key that left the cache.
    fn release(&self, key: &CachedKey) {
        let weight = token_weight(key);
        if weight > 0 {
            let _ = self
                .token_bytes
                .fetch_update(Ordering::AcqRel, Ordering::Acquire, |b| {
                    Some(b.saturating_sub(weight))
                });
        }
    }

    /// Drops `hash` from the cached keys.
    fn forget(&self, hash: &KeyHash) {
        if let Some((_, old)) = self.known.remove(hash) {
            self.release(&old);
        }
    }

    fn compact(&self, record: &KeyRecord) -> CachedKey {
        let workspace = intern(&self.workspaces, record.workspace.as_str(), |w| w.into());
        let scopes = intern(&self.scope_sets, &record.scopes, |s| Arc::new(s.clone()));
        let limit = self
            .workspace_limits
            .entry(workspace_digest(&record.workspace))
            .or_insert_with(|| (workspace.clone(), Arc::new(SharedLimit::unloaded())))
            .1
            .clone();
        CachedKey::new_in(record, workspace, scopes, limit)
    }

    /// Whether the last successful sync is recent enough to trust cached answers.
    pub fn is_fresh(&self) -> bool {
        let synced = self.synced_at_ms.load(Ordering::Acquire);
        synced != 0
            && self.now_ms().saturating_sub(synced) <= self.config.max_staleness.as_millis() as u64
    }

    /// Number of cached keys.
    pub fn len(&self) -> usize {
        self.known.len()
    }

    /// Whether no key is cached.
    pub fn is_empty(&self) -> bool {
        self.known.is_empty()
    }

    /// Catches up with the store's change log: when it returns `Ok`, the cache has read every
    /// change the store held when it was called. Callers that arrive together (every listen
    /// stream of a workspace, woken by one event) share one read: a sync that started after a
    /// call answers it, failed or not (a store that does not answer costs them one timeout
    /// together, not one each in turn).
    pub async fn sync(&self) -> Result<(), StoreError> {
        let started_before = self.syncs_started.load(Ordering::Acquire);
        let mut last = self.syncing.lock().await;
        if last.0 > started_before {
            return last.1.clone();
        }
        let number = self.syncs_started.fetch_add(1, Ordering::AcqRel) + 1;
        let synced = self.read_changes().await;
        *last = (number, synced.clone());
        synced
    }

    /// One read of the store's changes since the cache's position, applied.
    async fn read_changes(&self) -> Result<(), StoreError> {
        let (since, mark) = self.position().clone();
        let changes = self.store.key_changes_since(since, &mark).await?;
        if let Some(hashes) = &changes.changed {
            // Read before the position moves: if the store fails here, the next sync reads
            // the same changes again.
            self.reload_workspace_limits(hashes).await?;
        }
        match changes.changed {
            None => {
                self.generation.fetch_add(1, Ordering::AcqRel);
                // New cells, read afresh with the keys: a workspace changed in the gap is
                // named nowhere.
                self.workspace_limits.clear();
                self.known.retain(|_, key| {
                    self.release(key);
                    false
                });
                self.unknown.clear();
                self.directory.restart();
            }
            Some(hashes) if !hashes.is_empty() => {
                self.generation.fetch_add(1, Ordering::AcqRel);
                for hash in &hashes {
                    self.forget(hash);
                    self.unknown.remove(hash);
                }
                self.directory.add(&hashes);
            }
            Some(_) => {}
        }
        *self.position() = (changes.epoch, changes.mark);
        let first = self
            .synced_at_ms
            .swap(self.now_ms().max(1), Ordering::AcqRel)
            == 0;
        if first {
            // Every key written from here on is in the change log: the store's listing, which
            // starts after this, finds the rest.
            self.directory.restart();
        }
        Ok(())
    }

    /// Reads again the rate limit of each workspace among `changed` that a cached key uses.
    async fn reload_workspace_limits(&self, changed: &[KeyHash]) -> Result<(), StoreError> {
        for hash in changed {
            let Some((id, cell)) = self.workspace_limits.get(hash).map(|e| e.value().clone())
            else {
                continue;
            };
            let workspace = self.store.workspace(&id).await?;
            cell.set(workspace.and_then(|w| w.rate_limit));
        }
        Ok(())
    }

    fn position(&self) -> std::sync::MutexGuard<'_, (u64, String)> {
        self.position
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Drops scoped tokens that expired before unix second `now`, and the key directory's.
    pub fn evict_expired(&self, now: u64) {
        self.directory.sweep_tokens(now);
        #[cfg(test)]
        self.sweeps.fetch_add(1, Ordering::AcqRel);
        let mut next = u64::MAX;
        self.known.retain(|_, key| {
            let expired = key.expired(now);
            if expired {
                self.release(key);
            } else if let Some(grant) = &key.scoped {
                next = next.min(grant.expires_at);
            }
            !expired
        });
        // A token admitted meanwhile may be missed here: the periodic sweep still finds it.
        self.next_expiry.store(next, Ordering::Release);
    }

    /// Fills the key directory whenever a listing is due ([`KeyDirectory::restart`]): lists
    /// the store page by page. When the store does not answer, the listing starts over after
    /// `poll_interval` (a cursor may mean nothing to the master after a failover), and the
    /// first of a run of failures is logged, as is the listing that ends it (a Redis user not
    /// allowed `SCAN` would leave the directory incomplete). A listing overtaken by a restart
    /// of the change log starts over.
    async fn fill_directory(self: Arc<Self>) {
        // Since the last listing that ended: a listing overtaken by another is not the end of
        // its failures.
        let mut failed = false;
        loop {
            let ticket = self.directory.listing_due().await;
            let mut cursor = 0;
            let listed = loop {
                if self.directory.ticket() != ticket {
                    break false;
                }
                match self.store.key_digests(cursor).await {
                    Ok((digests, next)) => {
                        self.directory.add(&digests);
                        if next == 0 {
                            break true;
                        }
                        cursor = next;
                    }
                    Err(e) => {
                        if !failed {
                            failed = true;
                            tracing::warn!(error = %e, "cannot list the keys for the key directory; trying again");
                        }
                        tokio::time::sleep(self.config.poll_interval).await;
                        cursor = 0;
                    }
                }
            };
            if listed {
                self.directory.listed_all(ticket);
                let keys = self.directory.len();
                if std::mem::take(&mut failed) {
                    tracing::info!(keys, "key directory listed");
                } else {
                    tracing::debug!(keys, "key directory listed");
                }
            }
        }
    }

    /// Follows the store's changes for the life of the process: syncs on every change signal
    /// and at least every `poll_interval`, sweeps out expired scoped tokens, and keeps the key
    /// directory filled.
    pub async fn follow(self: Arc<Self>) {
        tokio::spawn(self.clone().fill_directory());
        let signal = self.store.key_change_signal();
        let mut failing = false;
        let mut last_sweep = Instant::now();
        loop {
            if last_sweep.elapsed() >= EXPIRY_SWEEP {
                self.evict_expired(crate::ids::unix_now());
                last_sweep = Instant::now();
            }
            tokio::select! {
                _ = signal.notified() => {}
                _ = tokio::time::sleep(self.config.poll_interval) => {}
            }
            let sync = self.sync().await;
            crate::metrics::record_key_cache(self.len(), self.sync_age(), self.directory.size());
            match sync {
                Ok(()) if failing => {
                    failing = false;
                    tracing::info!("key store reachable again; cache in sync");
                }
                Ok(()) => {}
                Err(e) if !failing => {
                    failing = true;
                    tracing::warn!(error = %e, "key store unreachable; serving cached keys");
                }
                Err(_) => {}
            }
        }
    }

    /// Time since the last successful sync (since start, if there was none).
    pub fn sync_age(&self) -> Duration {
        let synced = self.synced_at_ms.load(Ordering::Acquire);
        Duration::from_millis(self.now_ms().saturating_sub(synced))
    }

    fn now_ms(&self) -> u64 {
        self.origin.elapsed().as_millis() as u64
    }
}

/// The shared copy of `value` in `set`, added on first sight.
fn intern<T, Q>(set: &DashSet<Arc<T>>, value: &Q, make: impl FnOnce(&Q) -> Arc<T>) -> Arc<T>
where
    T: ?Sized + Eq + std::hash::Hash + std::borrow::Borrow<Q>,
    Q: ?Sized + Eq + std::hash::Hash,
    Arc<T>: std::borrow::Borrow<Q>,
{
    if let Some(shared) = set.get(value) {
        return shared.clone();
    }
    let shared = make(value);
    set.insert(shared.clone());
    shared
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::keys::{self, Environment, KeyParams, KeyStatus, Scopes};
    use crate::store::MemoryStore;

    fn new_key() -> KeyRecord {
        let (_, record) = keys::issue(
            KeyParams {
                workspace: "ws_1".into(),
                environment: Environment::Live,
                scopes: Scopes::new(["a:b"]),
                name: String::new(),
                monthly_budget: None,
                expires_at: None,
                rate_limit: None,
                metadata: None,
            },
            0,
        );
        record
    }

    #[tokio::test]
    async fn hits_after_the_first_lookup_and_drops_changed_keys() {
        let store = Arc::new(MemoryStore::new());
        let cache = KeyCache::new(store.clone(), CacheConfig::default());
        cache.sync().await.unwrap();
        let k = new_key();
        store.insert_key(&k).await.unwrap();
        cache.sync().await.unwrap();

        let (r, outcome) = cache.get(&k.hash).await.unwrap();
        assert_eq!(outcome, CacheOutcome::Miss);
        assert_eq!(r.unwrap().status, KeyStatus::Active);
        let (_, outcome) = cache.get(&k.hash).await.unwrap();
        assert_eq!(outcome, CacheOutcome::Hit);

        store
            .update_key(&k.id, &|r: &mut KeyRecord| r.status = KeyStatus::Revoked)
            .await
            .unwrap();
        cache.sync().await.unwrap();
        let (r, outcome) = cache.get(&k.hash).await.unwrap();
        assert_eq!(outcome, CacheOutcome::Miss);
        assert_eq!(r.unwrap().status, KeyStatus::Revoked);
    }

    /// Waits (at most 5 s) until the cache's key directory is complete.
    async fn directory_listed(cache: &KeyCache) {
        for _ in 0..500 {
            if cache.directory.is_complete() {
                return;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        panic!("the key directory was not listed");
    }

    #[tokio::test]
    async fn the_directory_lists_keys_written_before_and_after_and_across_a_gap_in_the_log() {
        let store = Arc::new(MemoryStore::new());
        let before = new_key();
        store.insert_key(&before).await.unwrap();
        let cache = Arc::new(KeyCache::new(store.clone(), CacheConfig::default()));
        tokio::spawn(cache.clone().fill_directory());
        let made_up = KeyHash::of("svc_live_made_up");
        assert!(!cache.listed(&before.hash, 0));

        // The first sync starts the listing of the store.
        cache.sync().await.unwrap();
        directory_listed(&cache).await;
        assert!(cache.listed(&before.hash, 0));
        assert!(!cache.listed(&made_up, 0));

        // A key written since is in the change log, read by the next sync.
        let since = new_key();
        store.insert_key(&since).await.unwrap();
        assert!(!cache.listed(&since.hash, 0), "not before the next sync");
        cache.sync().await.unwrap();
        assert!(cache.listed(&since.hash, 0));

        // More changes than the log keeps: the keys in the gap are found by listing again, and
        // until then a digest not listed may be a key's.
        let mut gap = Vec::new();
        for _ in 0..=crate::store::memory::CHANGE_LOG_LEN {
            let key = new_key();
            store.insert_key(&key).await.unwrap();
            gap.push(key.hash);
        }
        let ticket = cache.directory.ticket();
        cache.sync().await.unwrap();
        assert_eq!(cache.directory.ticket(), ticket + 1, "listed again");
        directory_listed(&cache).await;
        assert!(gap.iter().all(|hash| cache.listed(hash, 0)));
        assert!(!cache.listed(&made_up, 0));
        assert_eq!(cache.directory.len(), gap.len() + 2);
    }

    #[tokio::test]
    async fn a_fetch_that_meets_a_sync_reads_again_and_caches_the_key() {
        // A key's first use meets the sync of the key's own creation: the first read may
        // predate a change the sync drops, so it is not kept, and the key is read again.
        let store = Arc::new(MemoryStore::new());
        let cache = KeyCache::new(store.clone(), CacheConfig::default());
        cache.sync().await.unwrap();
        let k = new_key();
        store.insert_key(&k).await.unwrap();
        let reads = std::sync::atomic::AtomicU32::new(0);
        let (r, outcome) = cache
            .fetch_with(&k.hash, || async {
                if reads.fetch_add(1, Ordering::AcqRel) == 0 {
                    cache.sync().await?;
                }
                store.key_by_hash(&k.hash).await
            })
            .await
            .unwrap();
        assert_eq!((r.is_some(), outcome), (true, CacheOutcome::Miss));
        assert_eq!(
            reads.load(Ordering::Acquire),
            2,
            "read again after the sync"
        );
        assert_eq!(cache.get(&k.hash).await.unwrap().1, CacheOutcome::Hit);

        // Syncs that keep overlapping: the reads stop at FETCH_ATTEMPTS, nothing cached.
        let other = new_key();
        reads.store(0, Ordering::Release);
        let (r, _) = cache
            .fetch_with(&other.hash, || async {
                reads.fetch_add(1, Ordering::AcqRel);
                cache.generation.fetch_add(1, Ordering::AcqRel);
                store.key_by_hash(&other.hash).await
            })
            .await
            .unwrap();
        assert!(r.is_none());
        assert_eq!(reads.load(Ordering::Acquire), FETCH_ATTEMPTS);
        assert!(cache.cached(&other.hash).is_none(), "nothing kept");
    }

    #[tokio::test]
    async fn a_workspace_limit_reaches_its_cached_keys_in_place() {
        let store = Arc::new(MemoryStore::with_demo_workspace());
        let cache = KeyCache::new(store.clone(), CacheConfig::default());
        cache.sync().await.unwrap();
        let mut k = new_key();
        k.workspace = crate::store::memory::DEMO_WORKSPACE.into();
        store.insert_key(&k).await.unwrap();
        cache.sync().await.unwrap();
        let (key, _) = cache.get(&k.hash).await.unwrap();
        let key = key.unwrap();
        assert!(key.workspace_limit.is_loaded());
        assert_eq!(key.rate_limit_override(), None);
        let limit = crate::keys::RateLimit {
            requests_per_minute: 7,
            burst: None,
        };
        store
            .update_workspace(&k.workspace, &|w: &mut crate::keys::Workspace| {
                w.rate_limit = Some(limit)
            })
            .await
            .unwrap();
        cache.sync().await.unwrap();
        // The key is still cached, and sees the workspace's limit.
        let (again, outcome) = cache.get(&k.hash).await.unwrap();
        assert_eq!(outcome, CacheOutcome::Hit);
        assert!(Arc::ptr_eq(&again.unwrap(), &key));
        let seen = key
            .rate_limit_override()
            .map(|l| (l.requests_per_minute, l.burst()));
        assert_eq!(seen, Some((7, 7)));
    }

    #[tokio::test]
    async fn unknown_digests_are_remembered_until_the_key_appears() {
        let store = Arc::new(MemoryStore::new());
        let cache = KeyCache::new(store.clone(), CacheConfig::default());
        cache.sync().await.unwrap();
        let k = new_key();
        assert_eq!(cache.get(&k.hash).await.unwrap().1, CacheOutcome::Miss);
        assert_eq!(
            cache.get(&k.hash).await.unwrap().1,
            CacheOutcome::NegativeHit
        );
        store.insert_key(&k).await.unwrap();
        cache.sync().await.unwrap();
        let (r, _) = cache.get(&k.hash).await.unwrap();
        assert!(r.is_some());
    }

    #[tokio::test]
    async fn cached_tokens_stay_within_their_budget_and_expired_ones_make_room() {
        let store = Arc::new(MemoryStore::new());
        let parent = new_key();
        store.insert_key(&parent).await.unwrap();
        let metadata: serde_json::Map<String, serde_json::Value> =
            serde_json::from_value(serde_json::json!({"blob": "x".repeat(1000)})).unwrap();
        let now = crate::ids::unix_now();
        let parent_cached = CachedKey::new(&parent, "ws_1".into(), Arc::new(parent.scopes.clone()));
        let mint = |minted_at: u64| {
            let (_, token) = keys::mint(
                &parent_cached,
                parent.hash,
                Scopes::new(["a:b"]),
                60,
                metadata.clone(),
                minted_at,
            );
            token
        };
        // Room for three tokens.
        let one = token_weight(&CachedKey::new(&mint(now), "ws_1".into(), Arc::default()));
        let config = CacheConfig {
            token_budget_bytes: 3 * one,
            ..CacheConfig::default()
        };
        let cache = KeyCache::new(store.clone(), config);
        cache.sync().await.unwrap();
        // The first expires in a second (tokens here live 60 s).
        let expiring = mint(now - 59);
        let tokens = [expiring, mint(now), mint(now), mint(now), mint(now)];
        for t in &tokens {
            store.insert_key(t).await.unwrap();
        }
        cache.sync().await.unwrap();
        let outcome = |i: usize| {
            let cache = &cache;
            let hash = tokens[i].hash;
            async move {
                let (found, outcome) = cache.get(&hash).await.unwrap();
                assert!(found.is_some(), "a token past the budget is still answered");
                outcome
            }
        };
        for i in 0..3 {
            assert_eq!(outcome(i).await, CacheOutcome::Miss);
            assert_eq!(outcome(i).await, CacheOutcome::Hit);
        }
        tokio::time::sleep(Duration::from_millis(2_100)).await;
        // Full: the token that expired meanwhile makes room for the fourth.
        assert_eq!(outcome(3).await, CacheOutcome::Miss);
        assert_eq!(outcome(3).await, CacheOutcome::Hit);
        // Read again, expired: it is no reason to sweep (nor, with the cache full, cached).
        assert_eq!(outcome(0).await, CacheOutcome::Miss, "the expired one went");
        assert_eq!(outcome(0).await, CacheOutcome::Miss);
        // Full, and nothing expired: the fifth is read from the store on each use, and the
        // cache is not swept for it each time.
        let sweeps = cache.sweeps.load(Ordering::Acquire);
        assert_eq!(outcome(4).await, CacheOutcome::Miss);
        assert_eq!(outcome(4).await, CacheOutcome::Miss);
        assert_eq!(cache.sweeps.load(Ordering::Acquire), sweeps, "no sweep");
        assert!(cache.token_bytes.load(Ordering::Acquire) <= 3 * one);
        // Keys are not held to it.
        assert_eq!(cache.get(&parent.hash).await.unwrap().1, CacheOutcome::Miss);
        assert_eq!(cache.get(&parent.hash).await.unwrap().1, CacheOutcome::Hit);
        // Revoked (a change in the log): counted out as it leaves.
        store
            .update_key(&tokens[1].id, &|r: &mut KeyRecord| {
                r.status = KeyStatus::Revoked
            })
            .await
            .unwrap();
        cache.sync().await.unwrap();
        assert_eq!(cache.token_bytes.load(Ordering::Acquire), 2 * one);
    }

    #[tokio::test]
    async fn expired_tokens_read_again_do_not_sweep_a_full_cache() {
        // The store keeps a token an hour past its expiry; reading such tokens one after the
        // other must not set off a sweep of the whole cache for each.
        let store = Arc::new(MemoryStore::new());
        let parent = new_key();
        let parent_cached = CachedKey::new(&parent, "ws_1".into(), Arc::new(parent.scopes.clone()));
        let now = crate::ids::unix_now();
        let mint = |minted_at: u64| {
            keys::mint(
                &parent_cached,
                parent.hash,
                Scopes::new(["a:b"]),
                60,
                serde_json::Map::new(),
                minted_at,
            )
            .1
        };
        let (expired, live, other_expired) = (mint(now - 600), mint(now), mint(now - 600));
        let one = token_weight(&CachedKey::new(&live, "ws_1".into(), Arc::default()));
        let config = CacheConfig {
            token_budget_bytes: 2 * one,
            ..CacheConfig::default()
        };
        let cache = KeyCache::new(store.clone(), config);
        cache.sync().await.unwrap();
        for t in [&expired, &live, &other_expired] {
            store.insert_key(t).await.unwrap();
        }
        cache.sync().await.unwrap();
        for t in [&expired, &live] {
            assert_eq!(cache.get(&t.hash).await.unwrap().1, CacheOutcome::Miss);
        }
        assert_eq!(
            cache.get(&other_expired.hash).await.unwrap().1,
            CacheOutcome::Miss
        );
        assert_eq!(cache.sweeps.load(Ordering::Acquire), 0, "no sweep");
        assert_eq!(cache.get(&expired.hash).await.unwrap().1, CacheOutcome::Hit);
    }

    #[tokio::test]
    async fn the_negative_set_stays_bounded() {
        let store = Arc::new(MemoryStore::new());
        let config = CacheConfig {
            negative_capacity: 10,
            ..CacheConfig::default()
        };
        let cache = KeyCache::new(store, config);
        cache.sync().await.unwrap();
        for i in 0..100 {
            cache.get(&KeyHash::of(&format!("k{i}"))).await.unwrap();
        }
        assert!(cache.unknown.len() <= 10);
    }

    #[tokio::test]
    async fn a_full_negative_set_drops_its_old_entries_first() {
        let store = Arc::new(MemoryStore::new());
        let config = CacheConfig {
            negative_capacity: 10,
            negative_ttl: Duration::from_secs(2),
            ..CacheConfig::default()
        };
        let cache = KeyCache::new(store, config);
        cache.sync().await.unwrap();
        let hash = |i: usize| KeyHash::of(&format!("k{i}"));
        for i in 0..6 {
            cache.get(&hash(i)).await.unwrap();
        }
        tokio::time::sleep(Duration::from_millis(2_100)).await;
        cache.sync().await.unwrap();
        for i in 6..11 {
            cache.get(&hash(i)).await.unwrap();
        }
        // Full at the eleventh: the six aged ones went, the recent ones are still known.
        for i in 6..11 {
            assert_eq!(
                cache.cached(&hash(i)).map(|c| c.1),
                Some(CacheOutcome::NegativeHit)
            );
        }
        assert_eq!(cache.unknown.len(), 5);
    }

    #[tokio::test]
    async fn nothing_is_trusted_before_the_first_sync() {
        let store = Arc::new(MemoryStore::new());
        let cache = KeyCache::new(store, CacheConfig::default());
        assert!(!cache.is_fresh());
        let h = KeyHash::of("x");
        assert_eq!(cache.get(&h).await.unwrap().1, CacheOutcome::Miss);
        assert_eq!(cache.get(&h).await.unwrap().1, CacheOutcome::Miss);
    }
}
