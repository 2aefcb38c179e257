//! Where audit records the store does not take wait: in memory ([`Backlog`]), bounded in
//! number and bytes, then in spool files on disk, replayed oldest first when it is back.

use std::collections::VecDeque;
use std::path::PathBuf;

use super::audit::AuditRecord;
use super::spool;

/// Records per spool file, and per write to the store: a file is one write, whatever the
/// size of the backlog spilled.
pub(super) const SPOOL_FILE_RECORDS: usize = 5_000;

/// How long a spool directory found empty is not listed again. Another process may spool
/// into it meanwhile: the one a graceful upgrade replaces, at its exit.
const SPOOL_LOOK_INTERVAL: std::time::Duration = std::time::Duration::from_secs(5);

/// Flushes in a row in which the store refused a spool file before the backlog is tried past
/// it; and flushes in which the store took the backlog and refused the file before the file
/// is set aside (renamed `….refused`, out of every listing, for an operator to look at).
const REFUSALS_BEFORE_SETTING_ASIDE: u32 = 3;

/// Audit spool files: JSON lines, at most [`SPOOL_FILE_RECORDS`] to a file, named by time so
/// the oldest goes first.
pub(super) struct Spool {
    dir: PathBuf,
    /// When to list the directory again, if it was found empty.
    next_look: Option<std::time::Instant>,
    /// The file being replayed, kept between flushes while the store refuses it.
    current: Option<SpoolFile>,
    /// Files written and not removable: held, so that no process replays them again while
    /// this one runs.
    stuck: Vec<spool::Taken>,
}

/// A spool file taken for replay, with its records.
pub(super) struct SpoolFile {
    taken: spool::Taken,
    records: Vec<AuditRecord>,
    /// Records already written (a file of an earlier version may hold more than one write).
    written: usize,
    /// Flushes in which the store refused this file.
    failures: u32,
    /// Of those, flushes in which the store took other records.
    refused_alone: u32,
}

impl SpoolFile {
    /// The records of the next write.
    pub(super) fn chunk(&self) -> &[AuditRecord] {
        let end = self.records.len().min(self.written + SPOOL_FILE_RECORDS);
        &self.records[self.written..end]
    }

    /// The id of the next write, the same whichever process replays the file: its name and
    /// where the write starts. The store appends a write of one id once, so a file replayed
    /// again after the process replaying it died (before it could remove it) adds nothing.
    pub(super) fn chunk_id(&self) -> String {
        let name = self.taken.path().file_name().unwrap_or_default();
        format!("{}:{}", name.to_string_lossy(), self.written)
    }
}

impl Spool {
    /// The spool in `dir`.
    pub(super) fn new(dir: PathBuf) -> Self {
        Self {
            dir,
            next_look: None,
            current: None,
            stuck: Vec::new(),
        }
    }

    /// Writes `records` to new files; on an error, the records not in a file come back.
    pub(super) fn write(
        &mut self,
        records: &[AuditRecord],
    ) -> Result<(), (std::io::Error, Vec<AuditRecord>)> {
        use std::io::Write;
        for (i, chunk) in records.chunks(SPOOL_FILE_RECORDS).enumerate() {
            let written = spool::write(&self.dir, &spool::new_name("audit", "jsonl"), |out| {
                for r in chunk {
                    serde_json::to_writer(&mut *out, r)?;
                    out.write_all(b"\n")?;
                }
                Ok(())
            });
            if let Err(e) = written {
                return Err((e, records[i * SPOOL_FILE_RECORDS..].to_vec()));
            }
            self.next_look = None;
        }
        Ok(())
    }

    /// The file to replay next: the one under way, or the oldest this process can take.
    pub(super) fn oldest(&mut self) -> Option<&SpoolFile> {
        if self.current.is_none() {
            self.current = self.take_oldest();
        }
        self.current.as_ref()
    }

    fn take_oldest(&mut self) -> Option<SpoolFile> {
        if self
            .next_look
            .is_some_and(|t| std::time::Instant::now() < t)
        {
            return None;
        }
        for path in spool::list(&self.dir, is_spool_file) {
            let Some(mut taken) = spool::take(&path) else {
                continue;
            };
            let text = match taken.read() {
                Ok(bytes) => String::from_utf8_lossy(&bytes).into_owned(),
                Err(e) => {
                    tracing::error!(error = %e, path = %path.display(), "cannot read an audit spool file");
                    continue;
                }
            };
            let records: Vec<AuditRecord> = text
                .lines()
                .filter_map(|l| serde_json::from_str(l).ok())
                .collect();
            if records.is_empty() {
                if let Err(taken) = remove(taken) {
                    self.stuck.push(taken);
                }
                continue;
            }
            return Some(SpoolFile {
                taken,
                records,
                written: 0,
                failures: 0,
                refused_alone: 0,
            });
        }
        self.next_look = Some(std::time::Instant::now() + SPOOL_LOOK_INTERVAL);
        None
    }

    /// The store took the current chunk.
    pub(super) fn chunk_written(&mut self) {
        let Some(file) = &mut self.current else {
            return;
        };
        file.written += file.chunk().len();
        file.failures = 0;
        file.refused_alone = 0;
        if file.written < file.records.len() {
            return;
        }
        if let Some(file) = self.current.take() {
            if let Err(taken) = remove(file.taken) {
                self.stuck.push(taken);
            }
        }
    }

    /// Counts a refusal of the current file; whether there were a few in a row.
    pub(super) fn refused_often(&mut self) -> bool {
        self.current.as_mut().is_some_and(|file| {
            file.failures += 1;
            file.failures >= REFUSALS_BEFORE_SETTING_ASIDE
        })
    }

    /// The store took other records and refused the current file: after a few such flushes,
    /// the file is set aside.
    pub(super) fn refused_alone(&mut self) {
        let Some(file) = &mut self.current else {
            return;
        };
        file.refused_alone += 1;
        if file.refused_alone < REFUSALS_BEFORE_SETTING_ASIDE {
            return;
        }
        let Some(file) = self.current.take() else {
            return;
        };
        let from = file.taken.path().display().to_string();
        let name = format!(
            "{}.refused",
            file.taken
                .path()
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_default()
        );
        match file.taken.set_aside(&name) {
            Ok(to) => tracing::error!(
                from,
                to = %to.display(),
                records = file.records.len() - file.written,
                "the store refuses an audit spool file it takes other records with; set aside"
            ),
            Err(e) => {
                tracing::error!(error = %e, path = from, "cannot set aside a refused audit spool file")
            }
        }
    }
}

/// Removes a replayed spool file; gives it back if it cannot.
fn remove(taken: spool::Taken) -> Result<(), spool::Taken> {
    taken.remove().map_err(|(e, taken)| {
        tracing::error!(error = %e, path = %taken.path().display(), "cannot remove a replayed spool file");
        taken
    })
}

fn is_spool_file(name: &str) -> bool {
    name.starts_with("audit-") && name.ends_with(".jsonl")
}

/// Audit records taken from the request path's queues and not yet written, oldest first, with
/// the memory they hold ([`AuditRecord::memory_size`]).
#[derive(Default)]
pub(super) struct Backlog {
    records: VecDeque<AuditRecord>,
    bytes: usize,
}

impl Backlog {
    /// Records held.
    pub(super) fn len(&self) -> usize {
        self.records.len()
    }

    pub(super) fn is_empty(&self) -> bool {
        self.records.is_empty()
    }

    /// About how many bytes the records hold.
    pub(super) fn bytes(&self) -> usize {
        self.bytes
    }

    /// Adds newer records.
    pub(super) fn extend(&mut self, records: impl IntoIterator<Item = AuditRecord>) {
        for record in records {
            self.bytes += record.memory_size();
            self.records.push_back(record);
        }
    }

    /// Takes the `n` oldest records (all, if fewer).
    pub(super) fn take_oldest(&mut self, n: usize) -> Vec<AuditRecord> {
        let n = n.min(self.records.len());
        let taken: Vec<AuditRecord> = self.records.drain(..n).collect();
        self.bytes -= taken.iter().map(AuditRecord::memory_size).sum::<usize>();
        taken
    }

    /// Puts back records taken with [`take_oldest`](Self::take_oldest), in their place.
    pub(super) fn put_back(&mut self, records: Vec<AuditRecord>) {
        for record in records.into_iter().rev() {
            self.bytes += record.memory_size();
            self.records.push_front(record);
        }
    }

    /// Drops the oldest records until the rest hold at most `max_bytes`; how many it dropped.
    pub(super) fn drop_oldest_over(&mut self, max_bytes: usize) -> usize {
        let mut dropped = 0;
        while self.bytes > max_bytes {
            let Some(record) = self.records.pop_front() else {
                break;
            };
            self.bytes -= record.memory_size();
            dropped += 1;
        }
        dropped
    }
}
