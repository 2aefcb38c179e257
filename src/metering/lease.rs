//! Budget leases: slices of a budget's remainder that this replica may spend without asking
//! the store, so that budgets hold across replicas with no store round trip per request.
//!
//! A lease is granted by the store atomically against everything every replica has spent and
//! holds ([`UsageStore::lease_budget`](super::store::UsageStore::lease_budget)): a share of
//! what is left while much is left, no more than what is asked near the end. A request reserves
//! its route's price (or `reserve`) against the leases of the budgets it is under — key,
//! project, workspace — and settles with its actual cost when it finishes. Each flush tells the
//! store how much of each lease has been spent (the spend flushed with it), renews leases in
//! use and returns idle ones; at shutdown every lease is returned.
//!
//! The store keeps, per lease, the credits granted (`g`) and the spend flushed against it
//! (`s`), both counted from the lease's start, so every update is an absolute value: a batch
//! sent twice changes nothing twice. What a lease still holds is `g - s`.

use serde::{Deserialize, Serialize};
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::Arc;

use super::budget::BudgetScope;
use super::ledger::FastMap;

/// How long the store keeps a lease that is not renewed (a replica that died): its unspent
/// part is free again after this. A replica renews its leases at its flushes.
pub const LEASE_TTL_MS: u64 = 30_000;

/// A lease not used for this long is returned at the next flush.
pub const LEASE_IDLE_MS: u64 = 5_000;

/// After the store had nothing left to grant, requests are refused from what this replica
/// holds for this long before the store is asked again (other replicas return leases, or the
/// budget is raised).
pub const DRY_RETRY_MS: u64 = 1_000;

/// A grant is at least `1 / LEASE_SHARE` of what is left, so a replica asks the store once per
/// many requests while the remainder is large, and for single requests near the end.
pub const LEASE_SHARE: i64 = 8;

/// A budget the store no longer has (removed since the replica saw it) grants as if it were
/// this large: 2^52 micro-credits, exact in the store's Lua numbers.
pub const NO_LIMIT: i64 = 1 << 52;

/// What a lease grants when `free` micro-credits are left beyond every lease and spend, and
/// `ask` are asked for by requests reserving `unit` each: a [`LEASE_SHARE`]th of what is left
/// rounded up to whole units (so that what is left stays whole units too), or what is asked
/// if more; never more than what is left. (The Redis script computes the same.)
pub fn lease_grant(free: i64, ask: i64, share: i64, unit: i64) -> i64 {
    if free <= 0 {
        return 0;
    }
    let (share, unit) = (share.max(1), unit.max(1));
    // Both positive: the rounding up of signed division is plain arithmetic.
    let up = |n: i64, d: i64| n / d + i64::from(n % d != 0);
    let slice = up(up(free, share), unit).saturating_mul(unit);
    free.min(ask.max(slice))
}

/// What a request reserved against the leases of its budgets, settled when it finishes.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Reservation {
    /// Micro-credits reserved against each lease below.
    pub(super) amount: i64,
    /// The generation of the key's, the project's and the workspace's lease; 0: none.
    pub(super) key: u64,
    pub(super) project: u64,
    pub(super) workspace: u64,
}

/// One budget a replica wants a lease on, or more of one.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LeaseAsk {
    /// `key:<id>`, `project:<name>` or `workspace`.
    pub scope: String,
    /// The lease's id: the replica's and the lease's generation.
    pub id: String,
    /// The budget as the replica knows it (micro-credits): a key's own, or a project's from
    /// the configuration (the store's budget of the project wins). The workspace's credits
    /// are read by the store.
    pub limit: Option<i64>,
    /// A key's other keys of its rotation lineage, whose spend and leases its budget counts.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub peers: Vec<String>,
    /// Micro-credits wanted now: what the requests waiting for it reserve.
    pub ask: i64,
}

/// A request for leases on one workspace's budgets, in one store call.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LeaseRequest {
    /// `ws_…`
    pub workspace: String,
    /// `YYYY-MM` (UTC).
    pub month: String,
    /// How long the store keeps the lease unless it is renewed.
    pub ttl_ms: u64,
    /// [`LEASE_SHARE`].
    pub share: i64,
    /// What one request of those asking reserves: grants are whole multiples of it.
    pub unit: i64,
    /// Budgets, key first, then project, then workspace.
    pub asks: Vec<LeaseAsk>,
}

/// What the store granted on one [`LeaseAsk`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct LeaseGrant {
    /// Everything the lease has been granted since it began (micro-credits).
    pub granted: i64,
    /// What is left of the budget after the grant, beyond every lease (micro-credits).
    pub free: i64,
}

/// A lease's part of a flush: the spend flushed against it so far, and whether it is
/// returned (what it still holds goes back to the budget).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LeaseFlush {
    /// `key:<id>`, `project:<name>` or `workspace`.
    pub scope: String,
    /// The lease's id.
    pub id: String,
    /// Spend against it since it began, all of it in this flush or earlier ones.
    pub spent: i64,
    /// Returned: the store drops the lease once `spent` is recorded.
    #[serde(default)]
    pub release: bool,
}

/// One lease as this replica holds it (micro-credits).
#[derive(Debug)]
pub(super) struct Lease {
    gen: u64,
    id: Box<str>,
    /// Granted since the lease began, as the store last answered.
    granted: i64,
    /// Spent against it (finished requests).
    charged: i64,
    /// Reserved by requests in flight.
    reserved: i64,
    /// `charged` as last recorded by the store.
    sent: i64,
    /// Unix ms until which the store keeps it (counted from before the call that granted or
    /// renewed it); 0: nothing granted yet.
    valid_until_ms: u64,
    /// Unix ms until which the store is not asked again: it had nothing left to grant.
    dry_until_ms: u64,
    /// When a request last reserved against it.
    used_ms: u64,
}

impl Lease {
    fn available(&self) -> i64 {
        self.granted
            .saturating_sub(self.charged)
            .saturating_sub(self.reserved)
    }
}

/// The leases of one workspace's budgets.
#[derive(Debug, Default)]
pub(super) struct WorkspaceLeases {
    workspace: Option<Lease>,
    keys: FastMap<Box<str>, Lease>,
    projects: FastMap<Box<str>, Lease>,
}

impl WorkspaceLeases {
    fn get(&mut self, scope: &str) -> Option<&mut Lease> {
        if scope == "workspace" {
            return self.workspace.as_mut();
        }
        if let Some(id) = scope.strip_prefix("key:") {
            return self.keys.get_mut(id);
        }
        self.projects.get_mut(scope.strip_prefix("project:")?)
    }

    fn is_empty(&self) -> bool {
        self.workspace.is_none() && self.keys.is_empty() && self.projects.is_empty()
    }
}

/// Every lease of this replica, for the month of the ledger.
#[derive(Debug, Default)]
pub(super) struct Leases {
    /// Unique per process: leases of a replica that went away are not mistaken for this one's.
    replica: Box<str>,
    next_gen: u64,
    pub(super) by_workspace: FastMap<String, WorkspaceLeases>,
    /// Every lease is returned at the next flush (shutdown).
    pub(super) closing: bool,
}

/// The budgets a request is under, as the budget check found them.
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct Applies<'a> {
    /// The key's budget (micro-credits) and lineage, under the billed key's id.
    pub(super) key: Option<(&'a str, i64, &'a [Arc<str>])>,
    /// The project and its budget as configured here, if any (the store's wins).
    pub(super) project: Option<(&'a str, Option<i64>)>,
    /// Whether the workspace's credits are capped.
    pub(super) workspace: bool,
}

/// What reserving against the leases found.
#[derive(Debug)]
pub(super) enum Reserve {
    /// Reserved (all of the request's price, or what was left of a budget the store has no
    /// more of).
    Reserved(Reservation),
    /// A budget has nothing left.
    Spent(BudgetScope),
    /// A lease is missing, expired or short: ask the store.
    Fetch(Vec<LeaseAsk>),
}

impl Leases {
    pub(super) fn new() -> Self {
        let mut tag = [0u8; 6];
        rand::Rng::fill(&mut rand::rng(), &mut tag[..]);
        let replica: String = tag.iter().map(|b| format!("{b:02x}")).collect();
        Self {
            replica: replica.into(),
            ..Self::default()
        }
    }

    /// Reserves `need` micro-credits against the leases of every budget in `applies`, all or
    /// none; or says which leases to ask the store for.
    pub(super) fn reserve(
        &mut self,
        workspace: &str,
        applies: Applies<'_>,
        need: i64,
        now_ms: u64,
    ) -> Reserve {
        let Leases {
            replica,
            next_gen,
            by_workspace,
            ..
        } = self;
        let leases = match by_workspace.get_mut(workspace) {
            Some(l) => l,
            None => by_workspace.entry(workspace.to_string()).or_default(),
        };
        let WorkspaceLeases {
            workspace: ws_lease,
            keys,
            projects,
        } = leases;
        let mut fresh = || {
            *next_gen += 1;
            new_lease(replica, *next_gen)
        };
        let key = applies.key.map(|(id, ..)| get_or_add(keys, id, &mut fresh));
        let project = applies
            .project
            .map(|(p, _)| get_or_add(projects, p, &mut fresh));
        let ws_lease = match applies.workspace {
            true => Some(ws_lease.get_or_insert_with(&mut fresh)),
            false => None,
        };
        let mut asks = Vec::new();
        let mut amount = need;
        let mut spent = None;
        let budgets = [
            (key, BudgetScope::Key),
            (project, BudgetScope::Project),
            (ws_lease, BudgetScope::Workspace),
        ];
        let mut held: [Option<&mut Lease>; 3] = [None, None, None];
        for (slot, (lease, scope)) in held.iter_mut().zip(budgets) {
            let Some(lease) = lease else { continue };
            if lease.valid_until_ms != 0 && lease.valid_until_ms <= now_ms {
                // Expired here before the store drops it: a new lease, never the old one
                // again (the store may hold another one under its id by now).
                *lease = fresh();
            }
            // In use: not returned while a request waits for it.
            lease.used_ms = now_ms;
            let available = lease.available();
            let granted = lease.valid_until_ms != 0;
            if granted && available < need {
                if lease.dry_until_ms <= now_ms {
                    asks.push(ask_for(lease, scope, &applies, need));
                } else if available > 0 {
                    // The store has no more: what is left of the lease, for this request.
                    amount = amount.min(available);
                } else {
                    spent = spent.or(Some(scope));
                }
            } else if !granted {
                asks.push(ask_for(lease, scope, &applies, need));
            }
            *slot = Some(lease);
        }
        if let Some(scope) = spent {
            return Reserve::Spent(scope);
        }
        if !asks.is_empty() {
            return Reserve::Fetch(asks);
        }
        let mut reservation = Reservation {
            amount,
            ..Reservation::default()
        };
        let [key, project, ws_lease] = held;
        for (lease, gen) in [
            (key, &mut reservation.key),
            (project, &mut reservation.project),
            (ws_lease, &mut reservation.workspace),
        ] {
            if let Some(lease) = lease {
                lease.reserved = lease.reserved.saturating_add(amount);
                *gen = lease.gen;
            }
        }
        Reserve::Reserved(reservation)
    }

    /// Takes what the store granted on `request`'s asks, made at `start_ms`.
    pub(super) fn granted(
        &mut self,
        request: &LeaseRequest,
        grants: &[LeaseGrant],
        start_ms: u64,
        now_ms: u64,
    ) {
        let Some(leases) = self.by_workspace.get_mut(&request.workspace) else {
            return;
        };
        for (ask, grant) in request.asks.iter().zip(grants) {
            let Some(lease) = leases.get(&ask.scope) else {
                continue;
            };
            if *lease.id != *ask.id {
                continue;
            }
            lease.granted = grant.granted;
            lease.valid_until_ms = start_ms + LEASE_TTL_MS;
            if grant.free <= 0 {
                lease.dry_until_ms = now_ms + DRY_RETRY_MS;
            }
        }
    }

    /// Settles a finished request: its reservation is released, and `cost` is spent against
    /// the leases of its budgets that this replica holds.
    pub(super) fn settle(
        &mut self,
        workspace: &str,
        key: &str,
        project: Option<&str>,
        cost: i64,
        reservation: Option<Reservation>,
    ) {
        let Some(leases) = self.by_workspace.get_mut(workspace) else {
            return;
        };
        let reservation = reservation.unwrap_or_default();
        let apply = |lease: Option<&mut Lease>, gen: u64| {
            if let Some(lease) = lease {
                if gen != 0 && lease.gen == gen {
                    lease.reserved = lease.reserved.saturating_sub(reservation.amount).max(0);
                }
                lease.charged = lease.charged.saturating_add(cost.max(0));
            }
        };
        apply(leases.keys.get_mut(key), reservation.key);
        if let Some(p) = project {
            apply(leases.projects.get_mut(p), reservation.project);
        }
        apply(leases.workspace.as_mut(), reservation.workspace);
    }

    /// The leases of `workspace` to send with a flush begun at `now_ms`: those with spend not
    /// recorded yet, those to renew, and those returned (idle, or every one when closing),
    /// which are dropped here. `settled` says whether all of a scope's spend is in this
    /// flush (a flush too large leaves some for the next).
    pub(super) fn for_flush(
        &mut self,
        workspace: &str,
        now_ms: u64,
        settled: impl Fn(&str) -> bool,
    ) -> Vec<LeaseFlush> {
        let closing = self.closing;
        let Some(leases) = self.by_workspace.get_mut(workspace) else {
            return Vec::new();
        };
        let mut out = Vec::new();
        let mut visit = |scope: String, lease: &mut Lease| -> bool {
            if lease.valid_until_ms == 0 {
                // Not granted yet (a fetch is on its way) or never: nothing to say.
                return lease.reserved > 0 || lease.used_ms + LEASE_IDLE_MS > now_ms;
            }
            if lease.valid_until_ms <= now_ms {
                // Expired: the store drops it too.
                return lease.reserved > 0;
            }
            let whole = settled(&scope);
            let spent = match whole {
                true => lease.charged,
                false => lease.sent,
            };
            let idle = lease.reserved == 0 && (closing || lease.used_ms + LEASE_IDLE_MS <= now_ms);
            let release = idle && whole;
            let renew = lease.valid_until_ms < now_ms + LEASE_TTL_MS / 2;
            if release || renew || spent != lease.sent {
                out.push(LeaseFlush {
                    scope,
                    id: lease.id.to_string(),
                    spent,
                    release,
                });
            }
            !release
        };
        if let Some(lease) = &mut leases.workspace {
            if !visit("workspace".into(), lease) {
                leases.workspace = None;
            }
        }
        leases
            .keys
            .retain(|id, lease| visit(format!("key:{id}"), lease));
        leases
            .projects
            .retain(|p, lease| visit(format!("project:{p}"), lease));
        if leases.is_empty() {
            self.by_workspace.remove(workspace);
        }
        out
    }

    /// The store took a flush begun at `start_ms` carrying `flushed`.
    pub(super) fn flushed(&mut self, workspace: &str, flushed: &[LeaseFlush], start_ms: u64) {
        let Some(leases) = self.by_workspace.get_mut(workspace) else {
            return;
        };
        for f in flushed.iter().filter(|f| !f.release) {
            if let Some(lease) = leases.get(&f.scope) {
                if *lease.id == *f.id {
                    lease.sent = lease.sent.max(f.spent);
                    lease.valid_until_ms = lease.valid_until_ms.max(start_ms + LEASE_TTL_MS);
                }
            }
        }
    }

    /// Workspaces with leases.
    pub(super) fn workspaces(&self) -> impl Iterator<Item = &String> {
        self.by_workspace.keys()
    }
}

/// `map[name]`, added by `fresh` if missing; allocating the name only then.
fn get_or_add<'m>(
    map: &'m mut FastMap<Box<str>, Lease>,
    name: &str,
    fresh: &mut impl FnMut() -> Lease,
) -> &'m mut Lease {
    if !map.contains_key(name) {
        map.insert(name.into(), fresh());
    }
    map.get_mut(name).expect("just added")
}

/// What to ask the store for on `lease`, of budget `scope`.
fn ask_for(lease: &Lease, scope: BudgetScope, applies: &Applies<'_>, need: i64) -> LeaseAsk {
    let (scope, limit, peers) = match (scope, applies.key, applies.project) {
        (BudgetScope::Key, Some((id, limit, peers)), _) => (
            format!("key:{id}"),
            Some(limit),
            peers.iter().map(|p| p.to_string()).collect(),
        ),
        (BudgetScope::Project, _, Some((p, limit))) => (format!("project:{p}"), limit, Vec::new()),
        _ => ("workspace".to_string(), None, Vec::new()),
    };
    LeaseAsk {
        scope,
        id: lease.id.to_string(),
        limit,
        peers,
        ask: need,
    }
}

fn new_lease(replica: &str, gen: u64) -> Lease {
    Lease {
        gen,
        id: format!("{replica}.{gen}").into(),
        granted: 0,
        charged: 0,
        reserved: 0,
        sent: 0,
        valid_until_ms: 0,
        dry_until_ms: 0,
        used_ms: 0,
    }
}

/// Requests of one workspace waiting to ask the store for leases: one asks at a time, for
/// what all of them reserve, and the others mostly find enough once it lands.
#[derive(Debug, Default)]
pub struct FetchSlot {
    /// Held while a request asks the store.
    pub lock: tokio::sync::Mutex<()>,
    /// What the requests waiting reserve, together (micro-credits).
    pub waiting: AtomicI64,
}

/// The [`FetchSlot`]s of the workspaces with requests waiting for leases.
#[derive(Debug, Default)]
pub(super) struct FetchSlots(std::sync::Mutex<FastMap<String, Arc<FetchSlot>>>);

impl FetchSlots {
    /// `workspace`'s slot, with `need` added to what waits on it.
    pub(super) fn join(&self, workspace: &str, need: i64) -> Arc<FetchSlot> {
        let mut slots = self.0.lock().unwrap_or_else(|e| e.into_inner());
        let slot = slots.entry(workspace.to_string()).or_default().clone();
        slot.waiting.fetch_add(need, Ordering::Relaxed);
        slot
    }

    /// Leaves `slot`, taking `need` off; the last one out removes it.
    pub(super) fn leave(&self, workspace: &str, slot: Arc<FetchSlot>, need: i64) {
        slot.waiting.fetch_sub(need, Ordering::Relaxed);
        let mut slots = self.0.lock().unwrap_or_else(|e| e.into_inner());
        drop(slot);
        if slots
            .get(workspace)
            .is_some_and(|s| Arc::strong_count(s) == 1)
        {
            slots.remove(workspace);
        }
    }
}

#[cfg(test)]
mod tests {
    //! Budget leases on the memory store: several meters sharing one store stand for replicas.

    use super::*;
    use crate::keys::{CachedKey, Environment, KeyStatus, Scopes};
    use crate::metering::config::StoreDown;
    use crate::metering::meter::{Meter, MeterConfig};
    use crate::metering::ratelimit::Limit;
    use crate::metering::usage::{Admit, KeyBudget};
    use crate::shared::Credits;
    use crate::store::MemoryStore;
    use std::collections::HashMap;
    use std::time::Duration;

    const CREDIT: i64 = 1_000_000;

    fn key(budget_credits: i64) -> CachedKey {
        CachedKey {
            id: "key_1".into(),
            workspace: "ws_1".into(),
            environment: Environment::Live,
            scopes: Arc::new(Scopes::default()),
            status: KeyStatus::Active,
            grace_until: None,
            monthly_budget: Some(Credits::from_micros(budget_credits * CREDIT)),
            budget_peers: Box::default(),
            scoped: None,
            last4: *b"abcd",
            expires_at: None,
            rate_limit: None,
            workspace_limit: Arc::new(crate::keys::SharedLimit::of(None)),
            metadata: None,
        }
    }

    /// A replica: a meter on `store`, flushing every 10 ms, and its stop switch.
    fn replica(
        store: &Arc<MemoryStore>,
        dir: &std::path::Path,
    ) -> (
        Arc<Meter>,
        tokio::sync::watch::Sender<bool>,
        tokio::task::JoinHandle<()>,
    ) {
        let limit = Limit {
            requests_per_minute: 1_000_000,
            burst: 1_000_000,
        };
        let config = MeterConfig {
            flush_interval: Duration::from_millis(10),
            live_limit: limit,
            test_limit: limit,
            spool_dir: dir.to_path_buf(),
            token_mints: limit,
            token_metadata_bytes: 4096,
            audit_backlog: 10_000,
            audit_backlog_bytes: usize::MAX,
            refused_audit_per_second: 5,
            project_budgets: HashMap::new(),
            max_credits_per_request: crate::metering::config::DEFAULT_MAX_CREDITS_PER_REQUEST,
            budget_when_store_down: StoreDown::Admit,
        };
        let (meter, writer) = Meter::new(store.clone(), store.clone(), config);
        let (stop, stopped) = tokio::sync::watch::channel(false);
        let run = tokio::spawn(meter.clone().run(writer, stopped));
        (meter, stop, run)
    }

    fn now_ms() -> u64 {
        crate::ids::unix_millis()
    }

    /// One one-credit request of `k` admitted by `meter`: its reservation, or the refusal.
    async fn admit_one(
        meter: &Meter,
        k: &CachedKey,
    ) -> Result<Option<Reservation>, crate::error::ApiError> {
        let one = Credits::from_micros(CREDIT);
        let (_, verdict) = meter
            .admit(k, None, KeyBudget::of(k), None, true, one, now_ms())
            .await;
        verdict
    }

    /// `n` one-credit requests at once, spread over `meters`; each finishes (charged one
    /// credit) only once every one has been admitted or refused. Answers how many were admitted.
    async fn concurrent(meters: &[Arc<Meter>], k: &Arc<CachedKey>, n: usize) -> usize {
        let admitted = futures_util::future::join_all((0..n).map(|i| {
            let meter = meters[i % meters.len()].clone();
            let k = k.clone();
            async move {
                let verdict = admit_one(&meter, &k).await;
                (meter, verdict.ok())
            }
        }))
        .await;
        let mut count = 0;
        for (meter, reservation) in admitted {
            if let Some(reservation) = reservation {
                count += 1;
                meter
                    .usage
                    .settle(k, None, Credits::from_micros(CREDIT), now_ms(), reservation);
            }
        }
        count
    }

    #[tokio::test]
    async fn concurrent_requests_over_two_replicas_never_exceed_the_budget() {
        let dir = tempfile::tempdir().unwrap();
        let store = Arc::new(MemoryStore::new());
        let (a, stop_a, run_a) = replica(&store, dir.path());
        let (b, stop_b, run_b) = replica(&store, dir.path());
        let k = Arc::new(key(10));
        let admitted = concurrent(&[a.clone(), b.clone()], &k, 60).await;
        assert_eq!(admitted, 10, "the budget, and not one request more");
        // Later requests too: the budget is spent everywhere.
        assert_eq!(concurrent(&[a.clone(), b.clone()], &k, 20).await, 0);
        stop_a.send(true).unwrap();
        stop_b.send(true).unwrap();
        run_a.await.unwrap();
        run_b.await.unwrap();
        let report = crate::metering::store::UsageStore::usage_report(
            &*store,
            "ws_1",
            &crate::shared::month::month_of(now_ms() / 1000),
        )
        .await
        .unwrap();
        assert_eq!(
            report.keys["key_1"],
            10 * CREDIT,
            "charged what was admitted"
        );
    }

    #[tokio::test]
    async fn a_lease_returned_at_shutdown_is_spent_by_another_replica() {
        let dir = tempfile::tempdir().unwrap();
        let store = Arc::new(MemoryStore::new());
        let (a, stop_a, run_a) = replica(&store, dir.path());
        let k = Arc::new(key(100));
        // A big remainder: replica A takes a slice larger than one request.
        assert_eq!(concurrent(std::slice::from_ref(&a), &k, 1).await, 1);
        {
            let ledger = a.usage.ledger();
            let lease = &ledger.leases.by_workspace["ws_1"].keys["key_1"];
            assert!(
                lease.granted > CREDIT,
                "a slice, not one request: {}",
                lease.granted
            );
        }
        // Replica B, while A holds its lease, cannot spend the whole remainder...
        let (b, stop_b, run_b) = replica(&store, dir.path());
        let held = concurrent(std::slice::from_ref(&b), &k, 99).await;
        assert!(held < 99, "A's lease is A's: {held}");
        assert_eq!(concurrent(std::slice::from_ref(&b), &k, 99).await, 0);
        // ...until A stops and returns it.
        stop_a.send(true).unwrap();
        run_a.await.unwrap();
        tokio::time::sleep(Duration::from_millis(DRY_RETRY_MS + 50)).await;
        assert_eq!(
            concurrent(std::slice::from_ref(&b), &k, 99).await,
            99 - held
        );
        stop_b.send(true).unwrap();
        run_b.await.unwrap();
    }

    #[tokio::test]
    async fn far_from_the_end_most_requests_need_no_store_call() {
        let dir = tempfile::tempdir().unwrap();
        let store = Arc::new(MemoryStore::new());
        let (a, stop, run) = replica(&store, dir.path());
        let k = Arc::new(key(1_000_000));
        let (mut fetches, requests) = (0, 2_000);
        for _ in 0..requests {
            let found = a
                .usage
                .admit_budget(&k, KeyBudget::of(&k), None, CREDIT, now_ms());
            let reservation = match found {
                Admit::Reserved(r) => r,
                _ => {
                    fetches += 1;
                    admit_one(&a, &k).await.unwrap().unwrap()
                }
            };
            a.usage.settle(
                &k,
                None,
                Credits::from_micros(CREDIT),
                now_ms(),
                Some(reservation),
            );
        }
        assert!(
            fetches * 20 <= requests,
            "{fetches} store calls for {requests} requests"
        );
        stop.send(true).unwrap();
        run.await.unwrap();
    }

    #[test]
    fn grants_are_a_share_of_the_remainder_and_never_more() {
        assert_eq!(lease_grant(0, 5, 8, 1), 0);
        assert_eq!(lease_grant(-3, 5, 8, 1), 0);
        assert_eq!(lease_grant(800, 1, 8, 1), 100);
        assert_eq!(lease_grant(801, 1, 8, 1), 101);
        assert_eq!(lease_grant(800, 300, 8, 1), 300);
        assert_eq!(lease_grant(10, 1, 8, 1), 2);
        assert_eq!(lease_grant(1, 1, 8, 1), 1);
        assert_eq!(lease_grant(3, 50, 8, 1), 3, "never more than what is left");
        // In whole units of a request: 10 credits left, one-credit requests: 2, not 1.25.
        assert_eq!(lease_grant(10 * CREDIT, CREDIT, 8, CREDIT), 2 * CREDIT);
        assert_eq!(lease_grant(CREDIT / 2, CREDIT, 8, CREDIT), CREDIT / 2);
    }

    #[test]
    fn a_request_costing_more_than_it_reserved_overspends_by_the_excess_only() {
        let mut leases = Leases::new();
        let k = key(10);
        let applies = Applies {
            key: Some(("key_1", 10 * CREDIT, &[])),
            ..Applies::default()
        };
        let Reserve::Fetch(asks) = leases.reserve("ws_1", applies, CREDIT, 1_000) else {
            panic!("no lease yet");
        };
        let request = LeaseRequest {
            workspace: k.workspace.to_string(),
            month: "2026-01".into(),
            ttl_ms: LEASE_TTL_MS,
            share: LEASE_SHARE,
            unit: CREDIT,
            asks,
        };
        // The store grants 2 credits and has 8 left beyond them.
        let grant = LeaseGrant {
            granted: 2 * CREDIT,
            free: 8 * CREDIT,
        };
        leases.granted(&request, &[grant], 1_000, 1_000);
        let Reserve::Reserved(first) = leases.reserve("ws_1", applies, CREDIT, 1_001) else {
            panic!("within the lease");
        };
        let Reserve::Reserved(second) = leases.reserve("ws_1", applies, CREDIT, 1_002) else {
            panic!("within the lease");
        };
        assert!(matches!(
            leases.reserve("ws_1", applies, CREDIT, 1_003),
            Reserve::Fetch(_)
        ));
        // The first costs 3 credits: the lease is overdrawn by 1, the second still settles.
        leases.settle("ws_1", "key_1", None, 3 * CREDIT, Some(first));
        leases.settle("ws_1", "key_1", None, CREDIT, Some(second));
        let lease = &leases.by_workspace["ws_1"].keys["key_1"];
        assert_eq!((lease.charged, lease.reserved), (4 * CREDIT, 0));
        assert_eq!(lease.available(), -2 * CREDIT);
        // The flush records the spend and keeps the lease (used just now).
        let flushed = leases.for_flush("ws_1", 1_100, |_| true);
        assert_eq!(flushed.len(), 1);
        assert_eq!((flushed[0].spent, flushed[0].release), (4 * CREDIT, false));
        leases.flushed("ws_1", &flushed, 1_100);
        // Idle for long enough, it is returned, and dropped here.
        let flushed = leases.for_flush("ws_1", 1_100 + LEASE_IDLE_MS + 1, |_| true);
        assert_eq!(flushed.len(), 1);
        assert!(flushed[0].release);
        assert!(leases.by_workspace.is_empty());
    }

    #[test]
    fn a_dry_budget_lends_what_is_left_then_refuses() {
        let mut leases = Leases::new();
        let applies = Applies {
            workspace: true,
            ..Applies::default()
        };
        let Reserve::Fetch(asks) = leases.reserve("ws_1", applies, CREDIT, 1_000) else {
            panic!("no lease yet");
        };
        let request = LeaseRequest {
            workspace: "ws_1".into(),
            month: "2026-01".into(),
            ttl_ms: LEASE_TTL_MS,
            share: LEASE_SHARE,
            unit: CREDIT,
            asks,
        };
        // Half a credit was left, and it is all this replica's now.
        let grant = LeaseGrant {
            granted: CREDIT / 2,
            free: 0,
        };
        leases.granted(&request, &[grant], 1_000, 1_000);
        let Reserve::Reserved(r) = leases.reserve("ws_1", applies, CREDIT, 1_001) else {
            panic!("what is left is lent");
        };
        assert_eq!(r.amount, CREDIT / 2);
        assert!(matches!(
            leases.reserve("ws_1", applies, CREDIT, 1_002),
            Reserve::Spent(BudgetScope::Workspace)
        ));
        // Once the retry interval is over, the store is asked again.
        assert!(matches!(
            leases.reserve("ws_1", applies, CREDIT, 1_000 + DRY_RETRY_MS + 1),
            Reserve::Fetch(_)
        ));
    }
}
