//! Budget arithmetic: whether a request's key, project and workspace have credits left.

use std::sync::Arc;
use std::time::Duration;

use super::lease::{
    Applies, LeaseGrant, LeaseRequest, Reservation, Reserve, LEASE_SHARE, LEASE_TTL_MS,
};
use super::ledger::{touch, Ledger, PendingSpend};
use super::usage::Usage;
use crate::keys::CachedKey;
use crate::shared::month::{month_bounds_ms, month_of};
use crate::shared::Credits;

/// Which budget refused a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BudgetScope {
    /// The key's monthly budget.
    Key,
    /// The `Service-Project`'s monthly budget.
    Project,
    /// The workspace's monthly credits.
    Workspace,
}

impl BudgetScope {
    /// The word used in messages.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Key => "key",
            Self::Project => "project",
            Self::Workspace => "workspace",
        }
    }
}

/// What a budget check found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// Every budget that applies has room.
    Within,
    /// This budget is spent.
    Spent(BudgetScope),
    /// A total the check needs has not been read from the store yet: the workspace, key or
    /// project is new to this replica, or went unused long enough to be forgotten, or the month
    /// just began. Flush number `flush` is the first to read it, and has been asked for
    /// ([`Usage::read_back`] waits for it). Nothing known so far spends a budget.
    Unknown {
        /// The flush that reads the missing totals.
        flush: u64,
    },
}

/// What [`Usage::admit_budget`] found.
#[derive(Debug)]
pub enum Admit {
    /// Within every budget; the request's reservation, settled when it finishes.
    Reserved(Reservation),
    /// This budget is spent.
    Spent(BudgetScope),
    /// Totals not read yet: as [`Verdict::Unknown`].
    Unknown {
        /// The flush that reads them.
        flush: u64,
    },
    /// A lease is missing or short: ask the store, then check again.
    Fetch(LeaseRequest),
}

/// How long a request whose totals are unknown waits for the flush that reads them. Past it
/// (a slow or unreachable store), the request is admitted, as every request is while the store
/// is down: spend is still counted, and charged when the store is back.
pub const READ_BACK_WAIT: Duration = Duration::from_secs(2);

/// A key's monthly budget as the check needs it: the cap, and the other keys whose spend it
/// counts (those it replaced in rotations and, during its grace period, its successor).
#[derive(Debug, Clone, Copy)]
pub struct KeyBudget<'a> {
    /// The monthly cap.
    pub limit: Credits,
    /// The other keys of the rotation lineage.
    pub peers: &'a [Arc<str>],
}

impl<'a> KeyBudget<'a> {
    /// `key`'s own budget, if it has one.
    pub fn of(key: &'a CachedKey) -> Option<Self> {
        key.monthly_budget.map(|limit| KeyBudget {
            limit,
            peers: &key.budget_peers,
        })
    }
}

impl Usage {
    /// Whether the request's key, project and workspace have budget left, by the month totals
    /// of the last flush and what this replica has spent since.
    ///
    /// A total not read yet counts as unknown, not as zero: a key idle long enough to be
    /// forgotten, or first seen after a restart, would otherwise be admitted whatever it has
    /// spent, once per idle spell. The check then asks for a flush that reads it.
    ///
    /// `now_ms` is the request's arrival (unix milliseconds): in a month (UTC) that began since
    /// the last flush, last month's totals say nothing, and are dropped.
    pub fn check(
        &self,
        key: &CachedKey,
        budget: Option<KeyBudget<'_>>,
        project: Option<&str>,
        now_ms: u64,
    ) -> Verdict {
        let mut ledger = self.ledger();
        let (verdict, _) = self.check_locked(&mut ledger, key, budget, project, now_ms);
        drop(ledger);
        if let Verdict::Unknown { .. } = verdict {
            self.flush_wanted.notify_one();
        }
        verdict
    }

    /// The budget check and, for a request within every budget, a reservation of `need`
    /// micro-credits against this replica's leases of them ([`lease`](super::lease)); or what
    /// to ask the store for first.
    pub fn admit_budget(
        &self,
        key: &CachedKey,
        budget: Option<KeyBudget<'_>>,
        project: Option<&str>,
        need: i64,
        now_ms: u64,
    ) -> Admit {
        self.admit_after(None, key, budget, project, need, now_ms)
    }

    /// Takes the store's answer to a [`LeaseRequest`] sent at `start_ms`, and checks the
    /// request that asked again at once, under the same lock: what was granted for it is not
    /// taken by requests arriving meanwhile.
    #[allow(clippy::too_many_arguments)]
    pub fn admit_granted(
        &self,
        request: &LeaseRequest,
        grants: &[LeaseGrant],
        start_ms: u64,
        key: &CachedKey,
        budget: Option<KeyBudget<'_>>,
        project: Option<&str>,
        need: i64,
        now_ms: u64,
    ) -> Admit {
        let granted = Some((request, grants, start_ms));
        self.admit_after(granted, key, budget, project, need, now_ms)
    }

    /// [`Usage::admit_budget`], after taking a grant first if there is one.
    fn admit_after(
        &self,
        granted: Option<(&LeaseRequest, &[LeaseGrant], u64)>,
        key: &CachedKey,
        budget: Option<KeyBudget<'_>>,
        project: Option<&str>,
        need: i64,
        now_ms: u64,
    ) -> Admit {
        let mut guard = self.ledger();
        let ledger = &mut *guard;
        if let Some((request, grants, start_ms)) = granted {
            if ledger.month == request.month {
                let now = crate::ids::unix_millis();
                ledger.leases.granted(request, grants, start_ms, now);
            }
        }
        let admit = self.admit_locked(ledger, key, budget, project, need, now_ms);
        drop(guard);
        if let Admit::Unknown { .. } = admit {
            self.flush_wanted.notify_one();
        }
        admit
    }

    /// [`Usage::admit_budget`] under the ledger's lock.
    fn admit_locked(
        &self,
        ledger: &mut Ledger,
        key: &CachedKey,
        budget: Option<KeyBudget<'_>>,
        project: Option<&str>,
        need: i64,
        now_ms: u64,
    ) -> Admit {
        let (verdict, applies) = self.check_locked(ledger, key, budget, project, now_ms);
        match verdict {
            Verdict::Within => {}
            Verdict::Spent(scope) => return Admit::Spent(scope),
            Verdict::Unknown { flush } => return Admit::Unknown { flush },
        }
        if applies.key.is_none() && applies.project.is_none() && !applies.workspace {
            return Admit::Reserved(Reservation::default());
        }
        match ledger
            .leases
            .reserve(&key.workspace, applies, need.max(1), now_ms)
        {
            Reserve::Reserved(r) => Admit::Reserved(r),
            Reserve::Spent(scope) => Admit::Spent(scope),
            Reserve::Fetch(asks) => Admit::Fetch(LeaseRequest {
                workspace: key.workspace.to_string(),
                month: ledger.month.clone(),
                ttl_ms: LEASE_TTL_MS,
                share: LEASE_SHARE,
                unit: need.max(1),
                asks,
            }),
        }
    }

    /// The budget check under the ledger's lock, and the budgets that apply.
    fn check_locked<'a>(
        &self,
        ledger: &mut Ledger,
        key: &'a CachedKey,
        budget: Option<KeyBudget<'a>>,
        project: Option<&'a str>,
        now_ms: u64,
    ) -> (Verdict, Applies<'a>) {
        if now_ms >= ledger.month_ms.end {
            let unix = now_ms / 1000;
            ledger.turn_to(&month_of(unix), month_bounds_ms(unix));
        }
        let mut applies = Applies::default();
        let ws = &*key.workspace;
        let billed = key.billed_key_id();
        let now = ledger.flushes;
        // A project's spend is read back only if it has a budget. Every flush reads all of a
        // workspace's project budgets, so once it has been read a project with none needs
        // nothing: a client making up project names costs no reads and no extra flushes.
        let budgeted = project.filter(|p| {
            ledger
                .totals
                .get(ws)
                .is_none_or(|t| t.project_budgets.contains_key(*p))
                || self
                    .configured_project_budgets
                    .get(ws)
                    .is_some_and(|projects| projects.contains_key(*p))
        });
        let watched = match ledger.watched.get_mut(ws) {
            Some(w) => w,
            None => ledger.watched.entry(ws.to_string()).or_default(),
        };
        watched.seen = now;
        // Only a key with a budget needs its total read back; the others are charged, not read.
        if let Some(budget) = &budget {
            touch(&mut watched.keys, billed, now);
            for peer in budget.peers {
                touch(&mut watched.keys, peer, now);
            }
        }
        if let Some(p) = budgeted {
            touch(&mut watched.projects, p, now);
        }
        let totals = ledger.totals.get(ws);
        let mut known = totals.is_some();
        let pending = ledger.pending.get(ws);
        let in_flight = ledger.in_flight.get(ws);
        let spent = |pick: &dyn Fn(&PendingSpend) -> i64, base: i64| {
            base.saturating_add(pending.map_or(0, pick))
                .saturating_add(in_flight.map_or(0, pick))
        };
        let mut verdict = Verdict::Within;
        if let Some(budget) = budget {
            applies.key = Some((billed, budget.limit.micros(), budget.peers));
            let mut spent_by = |id: &str| {
                let base = totals.and_then(|t| t.keys.get(id).copied());
                known &= base.is_some();
                spent(&|p| p.keys.get(id).copied().unwrap_or(0), base.unwrap_or(0))
            };
            let used = budget
                .peers
                .iter()
                .fold(spent_by(billed), |sum, p| sum.saturating_add(spent_by(p)));
            if used >= budget.limit.micros() {
                verdict = Verdict::Spent(BudgetScope::Key);
            }
        }
        if let (Some(p), Verdict::Within) = (budgeted, verdict) {
            // A project's budget is read with the workspace's (a configured one applies until
            // then), its total once it is watched.
            let base = totals.and_then(|t| t.projects.get(p).copied());
            known &= base.is_some();
            let budget = totals
                .and_then(|t| t.project_budgets.get(p))
                .copied()
                .or_else(|| {
                    self.configured_project_budgets
                        .get(ws)
                        .and_then(|projects| projects.get(p))
                        .copied()
                });
            if let Some(budget) = budget {
                let configured = self
                    .configured_project_budgets
                    .get(ws)
                    .and_then(|projects| projects.get(p))
                    .copied();
                applies.project = Some((p, configured));
                let used = spent(
                    &|s| s.projects.get(p).copied().unwrap_or(0),
                    base.unwrap_or(0),
                );
                if used >= budget {
                    verdict = Verdict::Spent(BudgetScope::Project);
                }
            }
        }
        if let (Some(credits), Verdict::Within) = (totals.and_then(|t| t.monthly_credits), verdict)
        {
            applies.workspace = true;
            let base = totals.map_or(0, |t| t.total);
            if spent(&|p| p.total, base) >= credits {
                verdict = Verdict::Spent(BudgetScope::Workspace);
            }
        }
        if verdict == Verdict::Within && !known {
            // The next batch begun reads what this check added to the watch lists; a batch
            // under way or being retried does not.
            let flush = ledger.flushes + 1;
            return (Verdict::Unknown { flush }, applies);
        }
        (verdict, applies)
    }

    /// Waits (at most [`READ_BACK_WAIT`]) until flush number `flush` has landed, or a flush
    /// has failed: a [`Verdict::Unknown`] is then checked again.
    pub async fn read_back(&self, flush: u64) {
        let mut state = self.flushed.subscribe();
        let landed = state.wait_for(|s| s.done >= flush || s.failing);
        let _ = tokio::time::timeout(READ_BACK_WAIT, landed).await;
    }

    /// The store did not take a flush: requests stop waiting for totals until one lands.
    pub fn flush_failed(&self) {
        self.flushed.send_modify(|s| s.failing = true);
    }
}
