//! Credit spend and monthly budgets, with no store round trip per request.
//!
//! Each replica adds what its requests cost to local accumulators and, every flush interval,
//! sends them to the store in one batch ([`UsageStore::flush_usage`](super::store::UsageStore::flush_usage)) — which
//! adds them atomically, fires `billing.credits.low` once per crossing, and answers with the
//! month's totals of every workspace, key and project this replica watches (its own spend and
//! every other replica's). Budget checks compare a budget with those totals plus what this
//! replica has spent since; a total not read yet is unknown, and the request waits for the flush
//! that reads it ([`Verdict::Unknown`]).
//!
//! Across replicas, budgets hold by leases ([`lease`](super::lease)): requests reserve their
//! price against slices of each budget that the store grants atomically, so a budget is
//! overspent by at most what requests in flight cost beyond what they reserved.
//!
//! The parts: budget arithmetic ([`budget`](super::budget)), the ledger of unflushed spend
//! (`ledger.rs`), the flush to the store ([`flush`](super::flush)) and the spool kept over a
//! shutdown ([`checkpoint`](super::checkpoint)).

use std::collections::HashMap;
use std::sync::Mutex;

use super::flush::FlushState;
use super::lease::{FetchSlots, Leases};
use super::ledger::{FastMap, Ledger};
use crate::shared::month::{month_bounds_ms, month_of};

pub use super::budget::{Admit, BudgetScope, KeyBudget, Verdict, READ_BACK_WAIT};
pub use super::checkpoint::{SpendByMonth, SpendSpool};
pub use super::flush::{
    credits_low_event, RateFlush, RateTotals, UsageFlush, UsageSnapshot, WorkspaceFlush,
    WorkspaceTotals,
};
pub use super::lease::{LeaseAsk, LeaseFlush, LeaseGrant, LeaseRequest, Reservation};
pub use super::ledger::{PendingSpend, WATCH_IDLE_FLUSHES};

/// This replica's view of the month's spend, and its unflushed spend.
pub struct Usage {
    pub(super) ledger: Mutex<Ledger>,
    /// Budgets per workspace and project from the configuration; the store's win. Nested, so
    /// a lookup borrows the names instead of building a `(String, String)` key per request.
    pub(super) configured_project_budgets: FastMap<String, FastMap<String, i64>>,
    /// Signalled when a request checks totals this replica has not read ([`Verdict::Unknown`]).
    pub(super) flush_wanted: tokio::sync::Notify,
    /// Where flushes stand, for requests waiting on totals ([`Usage::read_back`]).
    pub(super) flushed: tokio::sync::watch::Sender<FlushState>,
    /// Requests waiting to ask the store for leases, per workspace.
    pub(super) fetches: FetchSlots,
}

impl Usage {
    /// An empty ledger with budgets from the configuration.
    pub fn new(configured_project_budgets: HashMap<(String, String), i64>) -> Self {
        let mut nested: FastMap<String, FastMap<String, i64>> = FastMap::default();
        for ((ws, project), budget) in configured_project_budgets {
            nested.entry(ws).or_default().insert(project, budget);
        }
        Self {
            ledger: Mutex::new({
                let now = crate::ids::unix_now();
                Ledger {
                    month: month_of(now),
                    month_ms: month_bounds_ms(now),
                    leases: Leases::new(),
                    ..Ledger::default()
                }
            }),
            configured_project_budgets: nested,
            flush_wanted: tokio::sync::Notify::new(),
            flushed: tokio::sync::watch::Sender::new(FlushState::default()),
            fetches: FetchSlots::default(),
        }
    }

    /// Completes when a request found totals not known yet.
    pub async fn flush_wanted(&self) {
        self.flush_wanted.notified().await
    }

    pub(super) fn ledger(&self) -> std::sync::MutexGuard<'_, Ledger> {
        self.ledger.lock().unwrap_or_else(|e| e.into_inner())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::keys::CachedKey;
    use crate::keys::{Environment, KeyStatus, Scopes};
    use crate::metering::MAX_FLUSH_ENTRIES;
    use crate::shared::month::bounds_of_month;
    use crate::shared::Credits;
    use std::collections::HashSet;
    use std::sync::Arc;
    use std::time::Duration;

    /// Now, in unix milliseconds.
    fn now_ms() -> u64 {
        crate::ids::unix_millis()
    }

    /// The month of now.
    fn this_month() -> String {
        month_of(now_ms() / 1000)
    }

    /// The month after it.
    fn next_month() -> String {
        month_of(bounds_of_month(&this_month()).end / 1000)
    }

    fn key(budget: Option<i64>) -> CachedKey {
        CachedKey {
            id: "key_1".into(),
            workspace: "ws_1".into(),
            environment: Environment::Live,
            scopes: Arc::new(Scopes::default()),
            status: KeyStatus::Active,
            grace_until: None,
            monthly_budget: budget.map(Credits::from_micros),
            budget_peers: Box::default(),
            scoped: None,
            last4: *b"abcd",
            expires_at: None,
            rate_limit: None,
            workspace_limit: Arc::new(crate::keys::SharedLimit::of(None)),
            metadata: None,
        }
    }

    #[test]
    fn a_key_budget_counts_flushed_and_unflushed_spend() {
        let usage = Usage::new(HashMap::new());
        let k = key(Some(3_000_000));
        // Nothing read yet: unknown, and the next flush (the first) reads it.
        assert_eq!(
            usage.check(&k, KeyBudget::of(&k), None, now_ms()),
            Verdict::Unknown { flush: 1 }
        );
        usage.charge(&k, None, Credits::from_micros(1_000_000), now_ms());
        let (_, flush) = usage.begin_flush(&this_month());
        assert_eq!(flush[0].total, 1_000_000);
        assert_eq!(flush[0].watch_keys, vec!["key_1".to_string()]);
        // Another replica spent 1.5 meanwhile; the store reports 2.5 in all.
        let mut totals = WorkspaceTotals {
            total: 2_500_000,
            ..Default::default()
        };
        totals.keys.insert("key_1".into(), 2_500_000);
        let mut snapshot = UsageSnapshot::default();
        snapshot.workspaces.insert("ws_1".into(), totals);
        usage.finish_flush(&snapshot);
        assert_eq!(
            usage.check(&k, KeyBudget::of(&k), None, now_ms()),
            Verdict::Within
        );
        usage.charge(&k, None, Credits::from_micros(500_000), now_ms());
        assert_eq!(
            usage.check(&k, KeyBudget::of(&k), None, now_ms()),
            Verdict::Spent(BudgetScope::Key)
        );
    }

    /// What a flush reads back when `key_1` of `ws_1` has spent `micros` this month.
    fn key_1_spent(micros: i64) -> UsageSnapshot {
        let mut totals = WorkspaceTotals::default();
        totals.keys.insert("key_1".into(), micros);
        let mut snapshot = UsageSnapshot::default();
        snapshot.workspaces.insert("ws_1".into(), totals);
        snapshot
    }

    #[test]
    fn a_new_month_does_not_check_against_the_last_one() {
        let usage = Usage::new(HashMap::new());
        let k = key(Some(1_000_000));
        usage.check(&k, KeyBudget::of(&k), None, now_ms());
        usage.begin_flush(&this_month());
        usage.finish_flush(&key_1_spent(1_000_000));
        assert_eq!(
            usage.check(&k, KeyBudget::of(&k), None, now_ms()),
            Verdict::Spent(BudgetScope::Key)
        );
        // The first request of the next month (UTC), before any flush: last month's spend
        // says nothing of it; its totals are read first.
        let next_month_ms = bounds_of_month(&next_month()).start;
        assert!(matches!(
            usage.check(&k, KeyBudget::of(&k), None, next_month_ms),
            Verdict::Unknown { .. }
        ));
        let (_, flush) = usage.begin_flush(&next_month());
        assert_eq!(flush[0].watch_keys, vec!["key_1".to_string()]);
    }

    #[test]
    fn a_flush_of_the_month_that_ended_brings_no_totals_into_the_new_one() {
        let usage = Usage::new(HashMap::new());
        let k = key(Some(1_000_000));
        usage.check(&k, KeyBudget::of(&k), None, now_ms());
        // A flush of this month is on its way at midnight; the first request of the next
        // month turns the ledger; then the flush lands with this month's spent totals.
        usage.begin_flush(&this_month());
        let next_month_ms = bounds_of_month(&next_month()).start;
        usage.check(&k, KeyBudget::of(&k), None, next_month_ms);
        usage.finish_flush(&key_1_spent(1_000_000));
        assert!(
            matches!(
                usage.check(&k, KeyBudget::of(&k), None, next_month_ms),
                Verdict::Unknown { .. }
            ),
            "not refused on last month's spend"
        );
    }

    #[test]
    fn a_failed_flush_is_retried_as_the_same_batch() {
        let usage = Usage::new(HashMap::new());
        let k = key(None);
        usage.charge(&k, Some("p"), Credits::from_micros(7), now_ms());
        let (id, first) = usage.begin_flush(&this_month());
        assert_eq!(first[0].total, 7);
        usage.charge(&k, Some("p"), Credits::from_micros(3), now_ms());
        // No answer from the store: the same batch goes again, the new spend waits.
        let (retry_id, retry) = usage.begin_flush(&this_month());
        assert_eq!((retry_id.as_str(), retry[0].total), (id.as_str(), 7));
        assert_eq!(retry[0].event_id, first[0].event_id);
        assert_eq!(usage.unflushed()[&this_month()]["ws_1"].total, 10);
        usage.finish_flush(&UsageSnapshot::default());
        let (next_id, next) = usage.begin_flush(&this_month());
        assert_ne!(next_id, id);
        assert_eq!(next[0].total, 3);
        assert_eq!(next[0].projects["p"], 3);
    }

    #[test]
    fn project_and_workspace_budgets_apply() {
        let mut configured = HashMap::new();
        configured.insert(("ws_1".to_string(), "p".to_string()), 5);
        let usage = Usage::new(configured);
        let k = key(None);
        usage.charge(&k, Some("p"), Credits::from_micros(5), now_ms());
        // What this replica spent is enough to refuse, before any total is read.
        assert_eq!(
            usage.check(&k, KeyBudget::of(&k), Some("p"), now_ms()),
            Verdict::Spent(BudgetScope::Project)
        );
        assert!(matches!(
            usage.check(&k, KeyBudget::of(&k), Some("q"), now_ms()),
            Verdict::Unknown { .. }
        ));
        let (_, batch) = usage.begin_flush(&this_month());
        assert_eq!(batch[0].watch_projects.len(), 2);
        let mut totals = WorkspaceTotals {
            total: 99,
            monthly_credits: Some(100),
            ..Default::default()
        };
        totals.projects.insert("p".into(), 5);
        totals.projects.insert("q".into(), 0);
        let mut snapshot = UsageSnapshot::default();
        snapshot.workspaces.insert("ws_1".into(), totals);
        usage.finish_flush(&snapshot);
        assert_eq!(
            usage.check(&k, KeyBudget::of(&k), Some("q"), now_ms()),
            Verdict::Within
        );
        // Once the workspace's budgets are read, a project without one needs no reading: made
        // up names are neither watched nor a reason to flush.
        assert_eq!(
            usage.check(&k, KeyBudget::of(&k), Some("r"), now_ms()),
            Verdict::Within
        );
        assert!(!usage.ledger().watched["ws_1"].projects.contains_key("r"));
        usage.charge(&k, Some("q"), Credits::from_micros(1), now_ms());
        assert_eq!(
            usage.check(&k, KeyBudget::of(&k), Some("q"), now_ms()),
            Verdict::Spent(BudgetScope::Workspace)
        );
        // A spent workspace refuses whatever is unknown about the project.
        assert_eq!(
            usage.check(&k, KeyBudget::of(&k), Some("s"), now_ms()),
            Verdict::Spent(BudgetScope::Workspace)
        );
        // A new month: last month's totals no longer apply, and this month's are read first.
        usage.begin_flush(&next_month());
        assert!(matches!(
            usage.check(&k, KeyBudget::of(&k), Some("q"), now_ms()),
            Verdict::Unknown { .. }
        ));
    }

    #[test]
    fn spend_is_charged_to_the_month_the_request_arrived_in() {
        let usage = Usage::new(HashMap::new());
        let k = key(Some(100));
        let (month, next) = (this_month(), next_month());
        let start = bounds_of_month(&month).start;
        let last = month_of((start - 1) / 1000);
        // A request from the last second of last month, finished now: last month's spend,
        // which this month's budget does not count.
        usage.charge(&k, Some("p"), Credits::from_micros(100), start - 1);
        usage.charge(&k, Some("p"), Credits::from_micros(7), start);
        let (_, batch) = usage.begin_flush(&month);
        let part = |batch: &[WorkspaceFlush], m: &str| {
            batch
                .iter()
                .find(|w| w.month.as_deref() == Some(m))
                .cloned()
                .unwrap_or_else(|| panic!("no part for {m}: {batch:?}"))
        };
        let earlier = part(&batch, &last);
        assert_eq!(
            (earlier.total, earlier.keys["key_1"], earlier.projects["p"]),
            (100, 100, 100)
        );
        assert!(earlier.watch_keys.is_empty() && earlier.watch_projects.is_empty());
        assert_eq!(part(&batch, &month).total, 7);
        let mut totals = WorkspaceTotals::default();
        totals.keys.insert("key_1".into(), 7);
        totals.projects.insert("p".into(), 7);
        let mut snapshot = UsageSnapshot::default();
        snapshot.workspaces.insert("ws_1".into(), totals);
        usage.finish_flush(&snapshot);
        assert_eq!(
            usage.check(&k, KeyBudget::of(&k), Some("p"), now_ms()),
            Verdict::Within
        );

        // The month turns between a request and its flush: the spend stays this month's, and
        // goes out so even in a batch retried after the turn.
        usage.charge(&k, None, Credits::from_micros(5), now_ms());
        let (id, before) = usage.begin_flush(&next);
        assert_eq!(part(&before, &month).total, 5);
        let (retry_id, retried) = usage.begin_flush(&next);
        assert_eq!((retry_id, retried), (id, before));
        // Spooled at shutdown and restored, spend keeps its month.
        let spooled = usage.unflushed();
        assert_eq!(spooled[&month]["ws_1"].total, 5);
        let restored = Usage::new(HashMap::new());
        restored.restore(spooled);
        let (_, batch) = restored.begin_flush(&next);
        assert_eq!(part(&batch, &month).total, 5);
    }

    #[test]
    fn a_batch_whose_answer_was_lost_is_spooled_with_its_id_and_goes_out_once() {
        let usage = Usage::new(HashMap::new());
        let k = key(None);
        let month = this_month();
        usage.charge(&k, Some("p"), Credits::from_micros(7), now_ms());
        // The store may have taken this batch; its answer never came. Then more spend, and a
        // shutdown while the store is down.
        let (id, sent) = usage.begin_flush(&month);
        usage.charge(&k, None, Credits::from_micros(3), now_ms());
        let spooled = serde_json::to_vec(&usage.spool()).unwrap();

        let restored = Usage::new(HashMap::new());
        assert!(restored.restore_spool(serde_json::from_slice(&spooled).unwrap()));
        // The batch goes first, as it was (the store adds a batch id it knows nothing), with
        // its month written down; the rest follows in a batch of its own.
        let (retry_id, retried) = restored.begin_flush(&month);
        assert_eq!(retry_id, id);
        assert_eq!(retried.len(), 1);
        assert_eq!(retried[0].total, 7);
        assert_eq!(retried[0].projects["p"], 7);
        assert_eq!(retried[0].event_id, sent[0].event_id);
        assert_eq!(retried[0].month.as_deref(), Some(month.as_str()));
        restored.finish_flush(&UsageSnapshot::default());
        let (next_id, next) = restored.begin_flush(&month);
        assert_ne!(next_id, id);
        assert_eq!(next.iter().map(|w| w.total).sum::<i64>(), 3);
        // Nothing left over: every micro-credit went out exactly once.
        restored.finish_flush(&UsageSnapshot::default());
        assert!(restored.spool().is_empty());
    }

    #[test]
    fn a_spooled_batch_waits_while_another_is_in_flight() {
        let month = this_month();
        let spooled = |amount| {
            let usage = Usage::new(HashMap::new());
            usage.charge(&key(None), None, Credits::from_micros(amount), now_ms());
            usage.begin_flush(&month);
            usage.spool()
        };
        let usage = Usage::new(HashMap::new());
        assert!(usage.restore_spool(spooled(5)));
        // Its id would be lost behind the batch in flight: not taken now.
        assert!(!usage.restore_spool(spooled(9)));
        usage.begin_flush(&month);
        usage.finish_flush(&UsageSnapshot::default());
        assert!(usage.restore_spool(spooled(9)));
        let (_, batch) = usage.begin_flush(&month);
        assert_eq!(batch.iter().map(|w| w.total).sum::<i64>(), 9);
    }

    #[test]
    fn absurd_costs_saturate_instead_of_overflowing() {
        let usage = Usage::new(HashMap::new());
        let k = key(Some(10));
        for _ in 0..3 {
            usage.charge(&k, Some("p"), Credits::from_micros(i64::MAX / 2), now_ms());
        }
        assert_eq!(
            usage.check(&k, KeyBudget::of(&k), Some("p"), now_ms()),
            Verdict::Spent(BudgetScope::Key)
        );
        assert_eq!(usage.unflushed()[&this_month()]["ws_1"].total, i64::MAX);
    }

    #[test]
    fn nothing_is_charged_for_free_requests() {
        let usage = Usage::new(HashMap::new());
        usage.charge(&key(None), None, Credits::ZERO, now_ms());
        assert!(usage.unflushed().is_empty());
    }

    #[test]
    fn only_budgeted_keys_are_read_back_and_idle_ones_are_forgotten() {
        let usage = Usage::new(HashMap::new());
        let capped = key(Some(10));
        let mut free = key(None);
        free.id = "key_2".into();
        let unknown = |v| matches!(v, Verdict::Unknown { .. });
        assert!(unknown(usage.check(
            &free,
            KeyBudget::of(&free),
            Some("p"),
            now_ms()
        )));
        assert!(unknown(usage.check(
            &capped,
            KeyBudget::of(&capped),
            None,
            now_ms()
        )));
        let (_, batch) = usage.begin_flush(&this_month());
        assert_eq!(batch.len(), 1);
        assert_eq!(batch[0].watch_keys, vec!["key_1".to_string()]);
        assert_eq!(batch[0].watch_projects, vec!["p".to_string()]);
        let mut totals = WorkspaceTotals::default();
        totals.keys.insert("key_1".into(), 10);
        totals.projects.insert("p".into(), 0);
        let mut snapshot = UsageSnapshot::default();
        snapshot.workspaces.insert("ws_1".into(), totals);
        usage.finish_flush(&snapshot);
        let spent = Verdict::Spent(BudgetScope::Key);
        assert_eq!(
            usage.check(&capped, KeyBudget::of(&capped), None, now_ms()),
            spent
        );
        // The budgeted key stays in use; the project is not named again.
        for _ in 0..WATCH_IDLE_FLUSHES {
            assert_eq!(
                usage.check(&capped, KeyBudget::of(&capped), None, now_ms()),
                spent
            );
            let (_, batch) = usage.begin_flush(&this_month());
            usage.finish_flush(&snapshot);
            assert_eq!(batch[0].watch_keys, vec!["key_1".to_string()]);
        }
        let (_, batch) = usage.begin_flush(&this_month());
        usage.finish_flush(&UsageSnapshot::default());
        assert!(batch[0].watch_projects.is_empty(), "idle project dropped");
        // Nothing used the workspace for as long: it and its totals go too. Forgotten is not
        // zero: the next request waits for its spent total to be read again, and is refused.
        for _ in 0..=WATCH_IDLE_FLUSHES {
            let (_, batch) = usage.begin_flush(&this_month());
            if batch.is_empty() {
                let Verdict::Unknown { flush } =
                    usage.check(&capped, KeyBudget::of(&capped), None, now_ms())
                else {
                    panic!("a forgotten total taken as known");
                };
                let (_, batch) = usage.begin_flush(&this_month());
                assert_eq!(usage.ledger().flushes, flush, "the flush asked for");
                assert_eq!(batch[0].watch_keys, vec!["key_1".to_string()]);
                usage.finish_flush(&snapshot);
                assert_eq!(
                    usage.check(&capped, KeyBudget::of(&capped), None, now_ms()),
                    spent
                );
                return;
            }
            usage.finish_flush(&snapshot);
        }
        panic!("an idle workspace is never forgotten");
    }

    #[tokio::test]
    async fn a_request_waits_for_the_flush_that_reads_its_totals_and_no_longer() {
        let usage = Arc::new(Usage::new(HashMap::new()));
        let k = key(Some(10));
        let Verdict::Unknown { flush } = usage.check(&k, KeyBudget::of(&k), None, now_ms()) else {
            panic!("nothing read yet");
        };
        let waiting = tokio::spawn({
            let usage = usage.clone();
            async move { usage.read_back(flush).await }
        });
        // A retried batch begun before the check does not read the key; it does not end the
        // wait.
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert!(!waiting.is_finished());
        let (_, batch) = usage.begin_flush(&this_month());
        assert_eq!(batch[0].watch_keys, vec!["key_1".to_string()]);
        let mut totals = WorkspaceTotals::default();
        totals.keys.insert("key_1".into(), 10);
        let mut snapshot = UsageSnapshot::default();
        snapshot.workspaces.insert("ws_1".into(), totals);
        usage.finish_flush(&snapshot);
        tokio::time::timeout(Duration::from_secs(1), waiting)
            .await
            .expect("the wait ends when the flush lands")
            .unwrap();
        assert_eq!(
            usage.check(&k, KeyBudget::of(&k), None, now_ms()),
            Verdict::Spent(BudgetScope::Key)
        );

        // With the store down, nobody waits for a flush that will not come.
        let mut other = key(Some(10));
        other.workspace = "ws_2".into();
        let Verdict::Unknown { flush } = usage.check(&other, KeyBudget::of(&other), None, now_ms())
        else {
            panic!("ws_2 not read yet");
        };
        usage.flush_failed();
        tokio::time::timeout(Duration::from_millis(500), usage.read_back(flush))
            .await
            .expect("a failed flush ends the wait");
    }

    #[test]
    fn a_flush_carries_a_bounded_share_of_the_spend_and_the_rest_follows() {
        let usage = Usage::new(HashMap::new());
        let keys = 2 * MAX_FLUSH_ENTRIES + 10;
        for i in 0..keys {
            let mut k = key(None);
            k.id = format!("key_{i}").into();
            usage.charge(&k, Some("p"), Credits::from_micros(i as i64 + 1), now_ms());
        }
        let month = this_month();
        let mut spent: HashMap<String, i64> = HashMap::new();
        let (mut total, mut project, mut batches) = (0, 0, 0);
        loop {
            let flushed_before: HashSet<String> = spent.keys().cloned().collect();
            let (_, batch) = usage.begin_flush(&month);
            let entries: usize = batch.iter().map(|w| w.keys.len() + w.projects.len()).sum();
            assert!(
                entries <= MAX_FLUSH_ENTRIES,
                "{entries} entries in one flush"
            );
            for part in batch {
                total += part.total;
                project += part.projects.get("p").copied().unwrap_or(0);
                for (k, v) in part.keys {
                    assert!(spent.insert(k, v).is_none(), "a key's spend goes once");
                }
            }
            batches += 1;
            // Nothing is counted twice or lost while the spend is split: what the ledger
            // counts for a key is its spend, whichever batch holds it.
            {
                let ledger = usage.ledger();
                let counted = |pick: &dyn Fn(&PendingSpend) -> i64| -> i64 {
                    [&ledger.pending, &ledger.in_flight]
                        .iter()
                        .filter_map(|m| m.get("ws_1"))
                        .map(pick)
                        .sum()
                };
                for i in [0, MAX_FLUSH_ENTRIES, keys - 1] {
                    let id = format!("key_{i}");
                    let key_spend = counted(&|p| p.keys.get(&id).copied().unwrap_or(0));
                    // Landed earlier: in the totals the store returns (none here).
                    let expected = match flushed_before.contains(&id) {
                        true => 0,
                        false => i as i64 + 1,
                    };
                    assert_eq!(key_spend, expected, "{id}");
                }
            }
            usage.finish_flush(&UsageSnapshot::default());
            if !usage.deferred() {
                break;
            }
            assert!(batches < 10, "the rest follows");
        }
        assert_eq!(batches, 3);
        assert_eq!(spent.len(), keys);
        assert!(spent.iter().all(|(k, v)| *k == format!("key_{}", v - 1)));
        let expected: i64 = (1..=keys as i64).sum();
        assert_eq!(
            total, expected,
            "the workspace's total goes whole, with the first part"
        );
        assert_eq!(project, expected);
        let (_, empty) = usage.begin_flush(&month);
        assert!(empty.is_empty() && !usage.deferred());
    }
}
