//! The spend the meter keeps on disk: the checkpoint written while the store does not take
//! flushes, the spool written at shutdown, and the spool files taken in at start.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::PoisonError;
use std::time::Duration;

use super::meter::Meter;
use super::spool;
use super::usage::{PendingSpend, SpendByMonth, SpendSpool, WorkspaceFlush};
use crate::shared::month::month_of;

/// This process's spend file: a spool file taken in (one at a time), or one written at the
/// first failed flush. While the store does not take flushes it is rewritten every
/// [`SPEND_CHECKPOINT_INTERVAL`], so a crash (or a SIGKILL) in an outage loses at most that
/// much of spend, not all of it. Held while the process lives; after a crash the next start,
/// or another process on the directory, takes it as any spool file.
///
/// It never holds spend that went out to the store under an id it does not show: a new batch
/// is written into it before it is sent ([`Meter::begin_batch`]), so replaying it after a
/// crash charges nothing twice. It is always rewritten in place, in one rename (at shutdown
/// too), so no crash leaves its spend in two files.
pub(super) struct Checkpoint {
    taken: spool::Taken,
    /// When it was last written.
    written: std::time::Instant,
    /// The id of the batch it holds, if it holds one.
    batch: Option<String>,
    /// Whether it holds spend besides that batch: if not, it holds nothing the store lacks
    /// once the batch lands, and goes.
    holds_pending: bool,
}

impl Checkpoint {
    /// The file's name in the spool directory.
    fn name(&self) -> Option<String> {
        let name = self.taken.path().file_name()?;
        Some(name.to_string_lossy().into_owned())
    }
}

/// While the store does not take flushes, how often the spend kept in memory is written to the
/// checkpoint ([`Checkpoint`]).
const SPEND_CHECKPOINT_INTERVAL: Duration = Duration::from_secs(5);

impl Meter {
    /// Writes what is unflushed to a spool file for the next start: in place of the checkpoint,
    /// if there is one (one rename: a crash never leaves both), else a new file.
    pub(super) fn spool_spend(&self) {
        let unflushed = self.usage.spool();
        if unflushed.is_empty() {
            self.drop_checkpoint();
            return;
        }
        let mut checkpoint = self.checkpoint();
        let name = checkpoint
            .as_ref()
            .and_then(Checkpoint::name)
            .unwrap_or_else(|| spool::new_name("spend", "json"));
        let written = spool::write(&self.config.spool_dir, &name, |out| {
            Ok(serde_json::to_writer(out, &unflushed)?)
        });
        match written {
            Ok(path) => {
                tracing::warn!(path = %path.display(), "unflushed spend spooled for the next start");
                // Its path names the new file now: let go, not removed.
                *checkpoint = None;
            }
            // The checkpoint, if any, stays: it holds what it held.
            Err(e) => tracing::error!(error = %e, "unflushed spend lost: cannot spool"),
        }
    }

    /// The next batch of spend ([`Usage::begin_flush`]), if it may go out. While there is a
    /// checkpoint, a batch it does not hold is written into it first: were it to hold that
    /// spend as pending, a crash after the batch landed would charge it again. `None` if the
    /// checkpoint can be neither rewritten nor removed: the batch waits.
    pub(super) fn begin_batch(&self, month: &str) -> Option<(String, Vec<WorkspaceFlush>)> {
        let (id, parts) = self.usage.begin_flush(month);
        let unpinned = self
            .checkpoint()
            .as_ref()
            .is_some_and(|c| c.batch.as_deref() != Some(id.as_str()));
        if unpinned && !parts.is_empty() && !self.write_checkpoint(true) {
            return None;
        }
        Some((id, parts))
    }

    /// After a failed flush: writes the checkpoint if there is none, or it is
    /// [`SPEND_CHECKPOINT_INTERVAL`] old.
    pub(super) fn checkpoint_if_due(&self) {
        let due = self
            .checkpoint()
            .as_ref()
            .is_none_or(|c| c.written.elapsed() >= SPEND_CHECKPOINT_INTERVAL);
        if due {
            self.write_checkpoint(false);
        }
    }

    /// Batch `id` landed: a checkpoint that held it and nothing else goes, and the next spool
    /// file, if there is one, is taken in.
    pub(super) fn checkpoint_landed(&self, id: &str) {
        let done = self
            .checkpoint()
            .take_if(|c| !c.holds_pending && c.batch.as_deref() == Some(id));
        if let Some(done) = done {
            tracing::info!(path = %done.taken.path().display(), "checkpointed or spooled spend written");
            self.remove_spool(done.taken);
            self.take_spooled_spend();
        }
    }

    /// Writes all unflushed spend to the checkpoint, in place, or to a new one if there is none.
    /// If it cannot be written and a batch is `sending`, the checkpoint there was is removed
    /// (or emptied): it may hold as pending spend that the batch sends, which a crash after the
    /// batch landed would charge again. Otherwise it stays, holding what it held. Returns
    /// whether a batch may go out: false only if the old checkpoint could not be removed or
    /// emptied either.
    fn write_checkpoint(&self, sending: bool) -> bool {
        let state = self.usage.spool();
        if state.is_empty() {
            self.drop_checkpoint();
            return true;
        }
        let mut checkpoint = self.checkpoint();
        let name = checkpoint
            .as_ref()
            .and_then(Checkpoint::name)
            .unwrap_or_else(|| spool::new_name("spend", "json"));
        let written = spool::write_taken(&self.config.spool_dir, &name, |out| {
            Ok(serde_json::to_writer(out, &state)?)
        });
        let e = match written {
            Ok(taken) => {
                if checkpoint.is_none() {
                    tracing::warn!(path = %taken.path().display(), "store unreachable: unflushed spend checkpointed to disk");
                }
                // Replaces the old file's handle, if any: its path names the new file now.
                *checkpoint = Some(Checkpoint {
                    taken,
                    written: std::time::Instant::now(),
                    batch: state.batch.map(|(id, _)| id),
                    holds_pending: !state.pending.is_empty(),
                });
                return true;
            }
            Err(e) => e,
        };
        if !sending {
            tracing::error!(error = %e, "cannot update the spend checkpoint; it holds what it held");
            if let Some(old) = checkpoint.as_mut() {
                old.written = std::time::Instant::now(); // tried again in an interval
            }
            return true;
        }
        let Some(old) = checkpoint.take() else {
            tracing::error!(error = %e, "cannot checkpoint unflushed spend; it is kept in memory");
            return true;
        };
        let Checkpoint {
            taken,
            written,
            batch,
            holds_pending,
        } = old;
        match taken.remove() {
            Ok(()) => {
                tracing::error!(error = %e, "cannot checkpoint unflushed spend; it is kept in memory");
                true
            }
            Err((removal, taken)) => {
                tracing::error!(error = %e, removal = %removal, path = %taken.path().display(), "cannot rewrite or remove the spend checkpoint; spend waits");
                *checkpoint = Some(Checkpoint {
                    taken,
                    written,
                    batch,
                    holds_pending,
                });
                false
            }
        }
    }

    /// Removes the checkpoint: what it held is written, or in a spool file written since.
    fn drop_checkpoint(&self) {
        let old = self.checkpoint().take();
        if let Some(old) = old {
            self.remove_spool(old.taken);
        }
    }

    fn checkpoint(&self) -> std::sync::MutexGuard<'_, Option<Checkpoint>> {
        self.checkpoint
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// Writes `pinned` over the spool file `taken` before any of it is sent: a batch whose id is
    /// on disk goes out under that id however often the file is read again (after a crash,
    /// say, with Redis having taken it and its answer lost). The new file is held from the
    /// moment it replaces the old one. If it cannot be written, the file is kept as it was,
    /// and its spend sent as new spend (once the checkpoint it becomes is rewritten, or gone).
    fn pin(&self, taken: spool::Taken, pinned: &SpendSpool) -> (spool::Taken, bool) {
        let name = match taken.path().file_name() {
            Some(name) => name.to_string_lossy().into_owned(),
            None => return (taken, false),
        };
        let written = spool::write_taken(&self.config.spool_dir, &name, |out| {
            Ok(serde_json::to_writer(out, pinned)?)
        });
        match written {
            Ok(new) => (new, true),
            Err(e) => {
                tracing::warn!(error = %e, path = %taken.path().display(), "cannot write a spend spool's batch id down; sent as new spend");
                (taken, false)
            }
        }
    }

    /// Removes a spool file whose spend is written; one that cannot be removed is kept held.
    fn remove_spool(&self, taken: spool::Taken) {
        if let Err((e, taken)) = taken.remove() {
            tracing::error!(error = %e, path = %taken.path().display(), "cannot remove a written spend spool");
            self.kept().push(taken);
        }
    }

    fn kept(&self) -> std::sync::MutexGuard<'_, Vec<spool::Taken>> {
        self.kept_spools
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// Takes in a spend spool file no process holds, if this process has no spend file of its
    /// own ([`Checkpoint`]): at start, after a file's spend is written, and from time to time
    /// (a process that hands over in a graceful upgrade spools at its exit). The file taken in
    /// becomes the checkpoint; one at a time, so that the spend of two files never goes into
    /// one, which a crash could leave beside one of them.
    pub(super) fn take_spooled_spend(&self) {
        if self.checkpoint().is_some() {
            return;
        }
        let kept: Vec<PathBuf> = self.kept().iter().map(|t| t.path().into()).collect();
        let files = spool::list(&self.config.spool_dir, |name| {
            name == "spend.json" || (name.starts_with("spend-") && name.ends_with(".json"))
        });
        for path in files.into_iter().filter(|p| !kept.contains(p)) {
            let Some(mut taken) = spool::take(&path) else {
                continue;
            };
            let spooled = taken.read().map_err(|e| e.to_string()).and_then(|bytes| {
                // Emptied once written, by a process that could not remove it.
                match bytes.iter().all(u8::is_ascii_whitespace) {
                    true => Ok(SpendSpool::default()),
                    false => read_spend_spool(&path, &bytes).map_err(|e| e.to_string()),
                }
            });
            let spooled = match spooled {
                Ok(spooled) if spooled.is_empty() => {
                    self.remove_spool(taken);
                    continue;
                }
                Ok(spooled) => spooled,
                Err(e) => {
                    tracing::error!(error = %e, path = %path.display(), "spooled spend unreadable; left in place");
                    self.kept().push(taken);
                    continue;
                }
            };
            let (taken, spooled) = match spooled.pinned() {
                Some(pinned) => match self.pin(taken, &pinned) {
                    (taken, true) => (taken, pinned),
                    (taken, false) => (taken, spooled),
                },
                None => (taken, spooled),
            };
            let checkpoint = Checkpoint {
                taken,
                written: std::time::Instant::now(),
                batch: spooled.batch.as_ref().map(|(id, _)| id.clone()),
                holds_pending: !spooled.pending.is_empty(),
            };
            // Taken again once the batch in flight has landed, if it holds a batch of its own.
            if self.usage.restore_spool(spooled) {
                tracing::info!(path = %path.display(), "spooled spend restored");
                *self.checkpoint() = Some(checkpoint);
                return;
            }
        }
    }
}

/// A spend spool file in any of its formats: by month with the batch in flight apart (the
/// current one), by month alone, or by workspace alone, charged to the month the file was
/// written in.
fn read_spend_spool(path: &Path, bytes: &[u8]) -> serde_json::Result<SpendSpool> {
    serde_json::from_slice::<SpendSpool>(bytes)
        .or_else(|_| {
            serde_json::from_slice::<SpendByMonth>(bytes).map(|pending| SpendSpool {
                batch: None,
                pending,
            })
        })
        .or_else(|e| {
            serde_json::from_slice::<HashMap<String, PendingSpend>>(bytes)
                .map(|spend| {
                    let written = std::fs::metadata(path)
                        .and_then(|m| m.modified())
                        .ok()
                        .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
                        .map_or_else(crate::ids::unix_now, |d| d.as_secs());
                    SpendSpool {
                        batch: None,
                        pending: SpendByMonth::from([(month_of(written), spend)]),
                    }
                })
                .map_err(|_| e)
        })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::keys::CachedKey;
    use crate::metering::meter::MeterConfig;
    use crate::metering::ratelimit::Limit;
    use crate::store::MemoryStore;
    use std::sync::Arc;

    fn meter(spool_dir: &std::path::Path) -> Arc<Meter> {
        let limit = Limit {
            requests_per_minute: 60,
            burst: 10,
        };
        let config = MeterConfig {
            flush_interval: Duration::from_millis(200),
            live_limit: limit,
            test_limit: limit,
            token_mints: Limit {
                requests_per_minute: 60,
                burst: 60,
            },
            token_metadata_bytes: 4096,
            spool_dir: spool_dir.to_path_buf(),
            audit_backlog: 10,
            audit_backlog_bytes: usize::MAX,
            refused_audit_per_second: 5,
            project_budgets: HashMap::new(),
            max_credits_per_request: crate::metering::config::DEFAULT_MAX_CREDITS_PER_REQUEST,
            budget_when_store_down: crate::metering::config::StoreDown::Admit,
        };
        let store = Arc::new(MemoryStore::new());
        Meter::new(store.clone(), store, config).0
    }

    #[test]
    fn spend_spooled_by_an_earlier_version_is_restored_to_the_month_it_was_written_in() {
        let dir = tempfile::tempdir().unwrap();
        let spool = dir.path().join("spend.json");
        // One month's spend by workspace, as spooled before months were kept.
        std::fs::write(
            &spool,
            r#"{"ws_1": {"total": 5, "keys": {"key_1": 5}, "projects": {}}}"#,
        )
        .unwrap();
        let meter = meter(dir.path());
        let month = month_of(crate::ids::unix_now());
        let spend: PendingSpend =
            serde_json::from_str(r#"{"total": 5, "keys": {"key_1": 5}, "projects": {}}"#).unwrap();
        assert_eq!(meter.usage.unflushed()[&month]["ws_1"], spend);
        // Kept until it is written: a crash before then leaves it for the next start.
        assert!(spool.exists(), "a restored spool stays until written");
        // What this version spools comes back by month, written over it.
        meter.spool_spend();
        let files = spool::list(dir.path(), |n| n.starts_with("spend"));
        assert_eq!(
            files,
            std::slice::from_ref(&spool),
            "the new spool replaces it"
        );
        assert!(std::fs::read_to_string(&spool).unwrap().contains(&month));
        drop(meter);
        let again = self::meter(dir.path());
        assert_eq!(again.usage.unflushed()[&month]["ws_1"], spend);
    }

    #[test]
    fn spooled_spend_gets_a_batch_id_on_disk_before_it_is_sent() {
        let dir = tempfile::tempdir().unwrap();
        let spool = dir.path().join("spend.json");
        let month = month_of(crate::ids::unix_now());
        std::fs::write(
            &spool,
            format!(r#"{{"pending": {{"{month}": {{"ws_1": {{"total": 5, "keys": {{"key_1": 5}}, "projects": {{}}}}}}}}}}"#),
        )
        .unwrap();
        let first = meter(dir.path());
        let (id, parts) = first.usage.begin_flush(&month);
        assert_eq!(parts.iter().map(|p| p.total).sum::<i64>(), 5);
        let on_disk: SpendSpool = serde_json::from_slice(&std::fs::read(&spool).unwrap()).unwrap();
        assert_eq!(on_disk.batch.as_ref().map(|(id, _)| id), Some(&id));
        assert!(on_disk.pending.is_empty());
        // Killed before its flush landed (Redis may have taken it): the next start sends the
        // same batch, which Redis adds once.
        drop(first);
        let again = meter(dir.path());
        let (retried, parts) = again.usage.begin_flush(&month);
        assert_eq!(retried, id);
        assert_eq!(parts.iter().map(|p| p.total).sum::<i64>(), 5);
    }

    #[test]
    fn an_emptied_spend_spool_holds_nothing_and_goes() {
        // What a process leaves when it wrote a spool's spend and could not remove the file.
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("spend-00000000000000000001-s_x.json");
        std::fs::write(&path, b"").unwrap();
        let meter = meter(dir.path());
        assert!(meter.usage.unflushed().is_empty());
        assert!(!path.exists());
        assert!(meter.kept().is_empty());
    }

    #[tokio::test]
    async fn a_spend_spool_is_taken_by_one_meter_and_removed_once_written() {
        let dir = tempfile::tempdir().unwrap();
        let spooling = meter(dir.path());
        let key = CachedKey::new(
            &crate::keys::tests::record(crate::keys::KeyStatus::Active, None),
            "ws_1".into(),
            Arc::new(crate::keys::Scopes::default()),
        );
        let now_ms = crate::ids::unix_now() * 1000;
        spooling
            .usage
            .charge(&key, None, crate::metering::Credits::from_micros(7), now_ms);
        spooling.spool_spend();
        let files = spool::list(dir.path(), |n| n.starts_with("spend-"));
        assert_eq!(files.len(), 1);

        // Two processes on one spool directory (a graceful upgrade): one takes it.
        let (first, second) = (meter(dir.path()), meter(dir.path()));
        let month = month_of(crate::ids::unix_now());
        let holds = |m: &Meter| {
            m.usage
                .unflushed()
                .get(&month)
                .is_some_and(|ws| ws.contains_key("ws_1"))
        };
        assert!(holds(&first) != holds(&second), "exactly one takes it");
        let (taker, other) = match holds(&first) {
            true => (first, second),
            false => (second, first),
        };
        other.take_spooled_spend();
        assert!(!holds(&other), "a held spool is not taken twice");
        assert!(files[0].exists());
        assert!(taker.flush_usage().await);
        assert!(!files[0].exists(), "written, then removed");
        assert!(!holds(&taker));
    }

    /// A key of `ws_1`, and a function that charges it `micros`.
    fn charger() -> impl Fn(&Meter, i64) {
        let key = CachedKey::new(
            &crate::keys::tests::record(crate::keys::KeyStatus::Active, None),
            "ws_1".into(),
            Arc::new(crate::keys::Scopes::default()),
        );
        move |meter: &Meter, micros| {
            let now_ms = crate::ids::unix_now() * 1000;
            meter.usage.charge(
                &key,
                None,
                crate::metering::Credits::from_micros(micros),
                now_ms,
            );
        }
    }

    /// The one spend spool file in `dir`.
    fn spend_file(dir: &Path) -> SpendSpool {
        let files = spool::list(dir, |n| n.starts_with("spend-"));
        assert_eq!(files.len(), 1, "{files:?}");
        serde_json::from_slice(&std::fs::read(&files[0]).unwrap()).unwrap()
    }

    fn batch_total(spool: &SpendSpool) -> i64 {
        spool
            .batch
            .iter()
            .flat_map(|(_, parts)| parts)
            .map(|p| p.total)
            .sum()
    }

    fn pending_total(spool: &SpendSpool) -> i64 {
        spool
            .pending
            .values()
            .flat_map(|ws| ws.values())
            .map(PendingSpend::total)
            .sum()
    }

    /// The spool of a meter that `spend` is made on, moved into `dir`: a process of its own, not
    /// one that takes the files already there.
    fn spooled_elsewhere(dir: &Path, spend: impl FnOnce(&Meter)) {
        let own = tempfile::tempdir().unwrap();
        let spooling = meter(own.path());
        spend(&spooling);
        spooling.spool_spend();
        for file in spool::list(own.path(), |_| true) {
            std::fs::rename(&file, dir.join(file.file_name().unwrap())).unwrap();
        }
    }

    /// Spend of 5 in a batch the store did not take, 3 more since, checkpointed.
    fn checkpointed(dir: &Path) -> (Arc<Meter>, String) {
        let meter = meter(dir);
        let charge = charger();
        let month = month_of(crate::ids::unix_now());
        charge(&meter, 5);
        // What `flush_usage` does when the store does not answer.
        let (a, _) = meter.begin_batch(&month).unwrap();
        meter.usage.flush_failed();
        meter.checkpoint_if_due();
        let on_disk = spend_file(dir);
        assert_eq!(on_disk.batch.as_ref().map(|(id, _)| id), Some(&a));
        assert_eq!((batch_total(&on_disk), pending_total(&on_disk)), (5, 0));
        charge(&meter, 3);
        meter.checkpoint_if_due();
        assert_eq!(pending_total(&spend_file(dir)), 0, "not due again yet");
        meter.write_checkpoint(false);
        let on_disk = spend_file(dir);
        assert_eq!((batch_total(&on_disk), pending_total(&on_disk)), (5, 3));
        (meter, a)
    }

    #[test]
    fn spend_checkpointed_in_an_outage_survives_a_crash_and_goes_out_under_its_batch_id() {
        let dir = tempfile::tempdir().unwrap();
        let (meter, a) = checkpointed(dir.path());
        // The checkpoint is this process's while it lives.
        assert!(self::meter(dir.path()).usage.unflushed().is_empty());
        drop(meter); // a crash
        let again = self::meter(dir.path());
        let month = month_of(crate::ids::unix_now());
        assert_eq!(again.usage.unflushed()[&month]["ws_1"].total(), 8);
        let (retried, parts) = again.usage.begin_flush(&month);
        assert_eq!(
            retried, a,
            "the batch the store may have taken goes under its id"
        );
        assert_eq!(parts.iter().map(|p| p.total).sum::<i64>(), 5);
    }

    #[tokio::test]
    async fn a_checkpoint_holds_each_batch_before_it_goes_out_and_goes_once_all_is_written() {
        let dir = tempfile::tempdir().unwrap();
        let (meter, a) = checkpointed(dir.path());
        let month = month_of(crate::ids::unix_now());
        // The store is back: the batch in flight lands; the 3 since are still only on disk.
        assert!(meter.flush_usage().await);
        let on_disk = spend_file(dir.path());
        assert_eq!(on_disk.batch.as_ref().map(|(id, _)| id), Some(&a));
        assert_eq!(pending_total(&on_disk), 3);
        // The next batch is written down under its id before it goes: sent, landed and then
        // replayed from a checkpoint that held it as pending, it would be charged twice.
        let (b, parts) = meter.begin_batch(&month).unwrap();
        assert_ne!(b, a);
        assert_eq!(parts.iter().map(|p| p.total).sum::<i64>(), 3);
        let on_disk = spend_file(dir.path());
        assert_eq!(on_disk.batch.as_ref().map(|(id, _)| id), Some(&b));
        assert_eq!((batch_total(&on_disk), pending_total(&on_disk)), (3, 0));
        // Say it failed, and then went through: the checkpoint goes.
        meter.usage.flush_failed();
        assert!(meter.flush_usage().await);
        assert!(spool::list(dir.path(), |_| true).is_empty());
        let report = meter.store.usage_report("ws_1", &month).await.unwrap();
        assert_eq!(report.total, 8);
    }

    #[test]
    fn a_spool_file_taken_in_is_the_checkpoint_rewritten_in_place_and_files_go_one_at_a_time() {
        let dir = tempfile::tempdir().unwrap();
        let month = month_of(crate::ids::unix_now());
        // Two processes' shutdown spools, each with a batch in flight and spend behind it.
        for amount in [7, 11] {
            spooled_elsewhere(dir.path(), |spooling| {
                charger()(spooling, amount);
                spooling.usage.begin_flush(&month);
                charger()(spooling, 1);
            });
        }
        let names = || spool::list(dir.path(), |_| true);
        let before = names();
        assert_eq!(before.len(), 2);
        let meter = meter(dir.path());
        let held = |m: &Meter| m.usage.unflushed()[&month]["ws_1"].total();
        assert_eq!(held(&meter), 8, "one file taken in, the oldest");
        // An outage: the file taken in is rewritten where it is, never copied into another.
        meter.usage.flush_failed();
        charger()(&meter, 2);
        meter.write_checkpoint(false);
        assert_eq!(names(), before);
        let on_disk: SpendSpool =
            serde_json::from_slice(&std::fs::read(&before[0]).unwrap()).unwrap();
        assert_eq!((batch_total(&on_disk), pending_total(&on_disk)), (7, 3));
        meter.take_spooled_spend();
        assert_eq!(held(&meter), 10, "the other file waits its turn");
        // A crash now: the files hold it all, once.
        drop(meter);
        let again = self::meter(dir.path());
        assert_eq!(held(&again), 10);
    }

    #[tokio::test]
    async fn spooled_files_are_written_one_after_the_other() {
        let dir = tempfile::tempdir().unwrap();
        for amount in [7, 11] {
            spooled_elsewhere(dir.path(), |spooling| charger()(spooling, amount));
        }
        let meter = meter(dir.path());
        for _ in 0..4 {
            assert!(meter.flush_usage().await);
        }
        assert!(spool::list(dir.path(), |_| true).is_empty());
        let month = month_of(crate::ids::unix_now());
        let report = meter.store.usage_report("ws_1", &month).await.unwrap();
        assert_eq!(report.total, 18);
    }

    #[tokio::test]
    async fn a_checkpoint_that_cannot_be_rewritten_goes_before_a_batch_of_its_spend_is_sent() {
        let dir = tempfile::tempdir().unwrap();
        let (meter, _) = checkpointed(dir.path());
        assert!(meter.flush_usage().await, "the batch it holds lands");
        let files = spool::list(dir.path(), |_| true);
        assert_eq!(files.len(), 1);
        // Its 3 pending go out next; the file cannot be rewritten (its temporary name is taken).
        let name = files[0].file_name().unwrap().to_string_lossy().into_owned();
        std::fs::create_dir(dir.path().join(format!("{name}.tmp"))).unwrap();
        let month = month_of(crate::ids::unix_now());
        let (_, parts) = meter
            .begin_batch(&month)
            .expect("the file is removed instead");
        assert_eq!(parts.iter().map(|p| p.total).sum::<i64>(), 3);
        assert!(
            !files[0].exists(),
            "no file holds as pending what the batch sends"
        );
    }
}
