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
#[path = "lease_tests.rs"]
mod tests;
