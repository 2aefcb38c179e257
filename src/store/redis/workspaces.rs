//! Workspaces in Redis, and the index that lists them.

use redis::aio::ConnectionManager;
use redis::{AsyncCommands, Script};
use std::sync::LazyLock;
use std::time::Duration;

use super::*;
use crate::keys::Workspace;
use crate::store::{KeyStore, StoreError};

/// Creates a workspace and indexes it. KEYS: record, index. ARGV: json, created_at, id.
/// Returns 1, or 0 if the id exists.
pub(super) static CREATE_WORKSPACE: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("scripts/create_workspace.lua")));

/// Takes the lease on filling the workspace index, unless it is filled. KEYS: the index's
/// filled mark, the lease. ARGV: token, lease (ms). Returns `filled`, `taken` (now the
/// caller's) or `busy` (another replica's).
pub(super) static TAKE_FILL_LEASE: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("scripts/take_fill_lease.lua")));

/// Renews a lease for ARGV[2] ms if KEYS[1] still holds ARGV[1] (the holder's token).
pub(super) static RENEW_LEASE: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("scripts/renew_lease.lua")));

/// Lets go of a lease: deletes KEYS[1] if it still holds ARGV[1] (the holder's token), not a
/// lease another replica took after this one's ran out.
pub(super) static RELEASE_LEASE: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("scripts/release_lease.lua")));

/// How long a workspace listing waits for another replica's fill.
pub(super) const INDEX_FILL_LISTING_WAIT: Duration = Duration::from_secs(5);

/// The pace of the workspace index fill ([`RedisStore::fill_workspace_index`]) and of its lease.
/// The defaults serve; a test sets a lease short enough for a scan to outlast it (a scan of
/// 30 s takes millions of keys).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IndexFillTiming {
    /// The lease of the replica filling the index, renewed as it scans: another replica takes
    /// over this long after one that died mid-scan (30 s).
    pub lease: Duration,
    /// How often the replica filling the index renews its lease (5 s).
    pub renewal: Duration,
    /// How often a replica waiting for another's fill looks whether it is done or its lease
    /// over (250 ms).
    pub poll: Duration,
    /// The keys each `SCAN` call looks at (1,000; at least 1).
    pub scan_count: usize,
}

impl Default for IndexFillTiming {
    fn default() -> Self {
        Self {
            lease: Duration::from_secs(30),
            renewal: Duration::from_secs(5),
            poll: Duration::from_millis(250),
            scan_count: 1_000,
        }
    }
}

impl IndexFillTiming {
    /// The lease in milliseconds, as Redis takes it (at least 1).
    pub(super) fn lease_ms(&self) -> u64 {
        u64::try_from(self.lease.as_millis())
            .unwrap_or(u64::MAX)
            .max(1)
    }
}

/// The lease on the workspace index fill, let go when dropped: when the fill ends, well or
/// not, or when the start-up fill running it is dropped part way; the next try, here or on
/// another replica, need not wait for it to run out. (A release that fails leaves it to run
/// out.)
pub(super) struct FillLease {
    pub(super) conn: ConnectionManager,
    pub(super) key: String,
    /// This replica's, in the lease while it holds it.
    pub(super) token: String,
    /// Whether the lease may be this replica's.
    pub(super) held: bool,
}

impl Drop for FillLease {
    fn drop(&mut self) {
        if !self.held {
            return;
        }
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let (mut conn, key, token) = (
            self.conn.clone(),
            std::mem::take(&mut self.key),
            std::mem::take(&mut self.token),
        );
        runtime.spawn(async move {
            let _: Result<i64, _> = RELEASE_LEASE
                .key(&key)
                .arg(&token)
                .invoke_async(&mut conn)
                .await;
        });
    }
}

/// The scan of [`RedisStore::fill_workspace_index`], under its lease: every workspace record
/// found goes into the index, then the index is marked filled. The lease is renewed as the scan
/// goes, while it is this replica's (one that ran out and was taken over is not renewed for
/// the replica that took it: the scan goes on, and is only done twice); it is let go when the
/// scan ends, or is dropped part way.
pub(super) async fn scan_into_workspace_index(
    layout: Layout,
    lease: FillLease,
    timing: IndexFillTiming,
) -> Result<(), StoreError> {
    // One connection throughout: a `SCAN` cursor belongs to the server that gave it.
    let mut conn = lease.conn.clone();
    let pattern = format!("{}*", glob_escape(&layout.workspace("")));
    let mut cursor: u64 = 0;
    let mut renewed = tokio::time::Instant::now();
    loop {
        let (next, found): (u64, Vec<String>) = redis::cmd("SCAN")
            .arg(cursor)
            .arg("MATCH")
            .arg(&pattern)
            .arg("COUNT")
            .arg(timing.scan_count.max(1))
            .query_async(&mut conn)
            .await
            .map_err(unavailable)?;
        if renewed.elapsed() >= timing.renewal {
            let _: i64 = RENEW_LEASE
                .key(&lease.key)
                .arg(&lease.token)
                .arg(timing.lease_ms())
                .invoke_async(&mut conn)
                .await
                .map_err(unavailable)?;
            renewed = tokio::time::Instant::now();
        }
        let mut batch = redis::pipe();
        if !found.is_empty() {
            let raw: Vec<Option<String>> = conn.mget(&found).await.map_err(unavailable)?;
            for (key, raw) in found.iter().zip(raw) {
                let Some(w) = raw.and_then(|r| decode::<Workspace>(key, &r).ok()) else {
                    continue;
                };
                batch
                    .zadd(layout.workspace_index(), &w.id, w.created_at)
                    .ignore();
            }
        }
        if !batch.is_empty() {
            batch
                .query_async::<()>(&mut conn)
                .await
                .map_err(unavailable)?;
        }
        if next == 0 {
            break;
        }
        cursor = next;
    }
    conn.set::<_, _, ()>(layout.workspace_index_filled(), 1)
        .await
        .map_err(unavailable)
}

impl RedisStore {
    /// A page of the ids in the sorted set `index` (ordered by creation time, then id, so an
    /// id's rank is a stable cursor): at most `limit` (at least 1), those after `after` or
    /// from the first.
    pub(super) async fn page(
        &self,
        index: &str,
        after: Option<&str>,
        limit: usize,
    ) -> Result<Vec<String>, StoreError> {
        let start = match after {
            Some(id) => {
                let rank: Option<isize> =
                    self.conn().zrank(index, id).await.map_err(unavailable)?;
                rank.map_or(0, |r| r + 1)
            }
            None => 0,
        };
        self.range(index, start, limit).await
    }

    /// `limit` (at least 1) ids of the sorted set `index` from rank `start`.
    pub(super) async fn range(
        &self,
        index: &str,
        start: isize,
        limit: usize,
    ) -> Result<Vec<String>, StoreError> {
        let limit = isize::try_from(limit).unwrap_or(isize::MAX);
        self.conn()
            .zrange(index, start, start.saturating_add(limit - 1))
            .await
            .map_err(unavailable)
    }

    /// Indexes the workspaces created before the index existed (by an earlier version), once
    /// per namespace: a scan of the namespace's workspace records (a scan cut short starts
    /// again: a `SCAN` cursor means nothing to another Redis process, after a failover or a
    /// restart). `serve` runs it at start ([`StoreHealth::prepare`]); a listing before it is done
    /// waits for it (or, if it failed, starts it), for a while. Workspaces created since are
    /// indexed as they are created, and any read of a workspace indexes it if it is not.
    ///
    /// One replica scans at a time: it holds a lease in Redis (`{ns}:workspaces:filling`),
    /// renewed as it scans, and the others wait until the index is marked filled, or
    /// until the lease runs out (its holder died) and one of them takes it over; or, given a
    /// `wait`, for that long, and then give up (503).
    pub(super) async fn fill_workspace_index(
        &self,
        wait: Option<Duration>,
    ) -> Result<(), StoreError> {
        let deadline = wait.map(|w| tokio::time::Instant::now() + w);
        let indexing = || {
            StoreError::Unavailable(
                "the workspaces an earlier version wrote are being indexed; try again shortly"
                    .into(),
            )
        };
        let _filling = match deadline {
            Some(deadline) => tokio::time::timeout_at(deadline, self.filling.lock())
                .await
                .map_err(|_| indexing())?,
            None => self.filling.lock().await,
        };
        let mut lease = FillLease {
            conn: self.conn(),
            key: self.layout.workspace_index_filling(),
            token: crate::ids::new_id("fill"),
            held: false,
        };
        loop {
            // Held from the moment it is asked for: an answer that times out or is never
            // read (what runs this was dropped) may still have given it.
            lease.conn = self.conn();
            lease.held = true;
            let state: String = TAKE_FILL_LEASE
                .key(self.layout.workspace_index_filled())
                .key(&lease.key)
                .arg(&lease.token)
                .arg(self.index_fill.lease_ms())
                .invoke_async(&mut lease.conn)
                .await
                .map_err(unavailable)?;
            if state == "taken" {
                break;
            }
            lease.held = false;
            if state == "filled" {
                return Ok(());
            }
            let poll = self.index_fill.poll;
            if deadline.is_some_and(|d| tokio::time::Instant::now() + poll > d) {
                return Err(indexing());
            }
            tokio::time::sleep(poll).await;
        }
        let scan = scan_into_workspace_index(self.layout.clone(), lease, self.index_fill);
        let Some(deadline) = deadline else {
            return scan.await;
        };
        // A listing that found no fill under way (the start-up fill failed and waits to try
        // again) starts it, but waits no longer for it than for another's: the scan goes on
        // without it, under its lease, and the listings after it wait for that.
        let scan = self.runtime.spawn(async move {
            let scanned = scan.await;
            if let Err(e) = &scanned {
                tracing::warn!(error = %e, "indexing the workspaces an earlier version wrote failed; the next listing or start-up retry tries again");
            }
            scanned
        });
        match tokio::time::timeout_at(deadline, scan).await {
            Ok(Ok(scanned)) => scanned,
            Ok(Err(_)) => Err(StoreError::Unavailable(
                "the index fill stopped part way".into(),
            )),
            Err(_) => Err(indexing()),
        }
    }

    /// Where a page of the workspace index after workspace `id` starts: past its rank, or, for
    /// a workspace not in the index (created by an earlier version during a rolling upgrade,
    /// say), past where it would be, and it is indexed for the next listing.
    pub(super) async fn workspace_rank_after(&self, id: &str) -> Result<isize, StoreError> {
        let mut conn = self.conn();
        let index = self.layout.workspace_index();
        let rank: Option<isize> = conn.zrank(&index, id).await.map_err(unavailable)?;
        if let Some(rank) = rank {
            return Ok(rank + 1);
        }
        let Some(workspace) = self.workspace(id).await? else {
            return Ok(0);
        };
        let created = workspace.created_at;
        let (older, same): (isize, Vec<String>) = redis::pipe()
            .zcount(&index, "-inf", format!("({created}"))
            .zrangebyscore(&index, created, created)
            .query_async(&mut conn)
            .await
            .map_err(unavailable)?;
        let before = same.iter().filter(|other| other.as_str() <= id).count();
        Ok(older + isize::try_from(before).unwrap_or(isize::MAX))
    }
}
