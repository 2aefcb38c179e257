//! Spool files: what the store could not take (spend, audit records), kept on disk until it
//! does. A file is written whole or not at all (a temporary file, synced, then renamed), and
//! is used by one process at a time: the process that takes it holds an exclusive lock on it
//! until it has removed it, and the lock goes with the process if it dies. So the two
//! processes of a graceful upgrade, sharing one spool directory, never both replay a file,
//! and one of them takes over what the other spooled.

use std::fs::File;
use std::io::{self, Read, Write};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

/// A spool file this process holds.
#[derive(Debug)]
pub struct Taken {
    path: PathBuf,
    /// Open, and locked for as long as it is.
    file: File,
}

impl Taken {
    /// The file's path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The whole file.
    pub fn read(&mut self) -> io::Result<Vec<u8>> {
        let mut bytes = Vec::new();
        self.file.read_to_end(&mut bytes)?;
        Ok(bytes)
    }

    /// Removes the file: what it held is written. Its lock goes with it. If it cannot be
    /// removed, it is emptied (an empty spool file holds nothing to replay) and let go. A file
    /// that another process has put at the path meanwhile is left alone. Comes back, still
    /// held, only if the file may still hold what it held: then it must not be let go, nor
    /// what it holds sent as anything new.
    pub fn remove(self) -> Result<(), (io::Error, Self)> {
        match self.still_listed() {
            Ok(false) => return Ok(()),
            Ok(true) => {}
            // Whether the path still names this file is unknown: emptying it is safe either way.
            Err(e) => return self.empty(e),
        }
        match std::fs::remove_file(&self.path) {
            Ok(()) => {
                sync_dir(&self.path);
                Ok(())
            }
            Err(e) => self.empty(e),
        }
    }

    /// Empties the file, which `cause` kept from being removed.
    fn empty(self, cause: io::Error) -> Result<(), (io::Error, Self)> {
        match self.file.set_len(0).and_then(|()| self.file.sync_all()) {
            Ok(()) => {
                tracing::warn!(error = %cause, path = %self.path.display(), "a written spool file could not be removed; emptied instead");
                Ok(())
            }
            Err(_) => Err((cause, self)),
        }
    }

    /// Whether the file at the path is still this one.
    fn still_listed(&self) -> io::Result<bool> {
        let held = self.file.metadata()?;
        match std::fs::metadata(&self.path) {
            Ok(listed) => Ok(held.dev() == listed.dev() && held.ino() == listed.ino()),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// Renames the file to `name` in its directory, out of every listing, and lets it go.
    pub fn set_aside(self, name: &str) -> io::Result<PathBuf> {
        let to = self.path.with_file_name(name);
        std::fs::rename(&self.path, &to)?;
        Ok(to)
    }
}

/// Makes a rename or removal at `path` durable (a power loss after it must not bring back what
/// it replaced or removed). Best effort: the change itself is made either way.
fn sync_dir(path: &Path) {
    if let Some(dir) = path.parent() {
        if let Err(e) = File::open(dir).and_then(|d| d.sync_all()) {
            tracing::debug!(error = %e, dir = %dir.display(), "cannot sync a spool directory");
        }
    }
}

/// Takes `path` for this process: `None` if another process (or this one, elsewhere) holds
/// it, or it is gone. Opened for writing too: NFS grants an exclusive lock only on a file
/// open for writing.
pub fn take(path: &Path) -> Option<Taken> {
    let file = match File::options().read(true).write(true).open(path) {
        Ok(file) => file,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return None,
        Err(e) => {
            tracing::error!(error = %e, path = %path.display(), "cannot open a spool file");
            return None;
        }
    };
    hold(path, file)
}

/// Locks `file`, opened from `path`, if it is still the file at `path`.
fn hold(path: &Path, file: File) -> Option<Taken> {
    match file.try_lock() {
        Ok(()) => {}
        Err(std::fs::TryLockError::WouldBlock) => return None,
        Err(std::fs::TryLockError::Error(e)) => {
            tracing::error!(error = %e, path = %path.display(), "cannot lock a spool file");
            return None;
        }
    }
    let taken = Taken {
        path: path.to_path_buf(),
        file,
    };
    // The file may have been replayed and removed between the open and the lock by the
    // process that held it: then this handle is to a file no longer in the directory.
    taken.still_listed().unwrap_or(false).then_some(taken)
}

/// A new file name, `<prefix>-<nanoseconds>-<random>.<extension>`: names sort by the time
/// they were made, and two processes never pick the same one.
pub fn new_name(prefix: &str, extension: &str) -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    format!(
        "{prefix}-{nanos:020}-{}.{extension}",
        crate::ids::new_id("s")
    )
}

/// The files in `dir` whose names `matches` accepts, oldest name first.
pub fn list(dir: &Path, matches: impl Fn(&str) -> bool) -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.file_name().and_then(|n| n.to_str()).is_some_and(&matches))
        .collect();
    files.sort();
    files
}

/// Writes `dir/name` whole or not at all: `fill` writes into a temporary file, which is synced
/// and then renamed. A file already at the path is replaced.
pub fn write(
    dir: &Path,
    name: &str,
    fill: impl FnOnce(&mut io::BufWriter<&File>) -> io::Result<()>,
) -> io::Result<PathBuf> {
    write_file(dir, name, false, fill).map(|taken| taken.path)
}

/// Like [`write`], and the file is held by this process once written: it is locked before it
/// appears under its name, so no other process takes it meanwhile.
pub fn write_taken(
    dir: &Path,
    name: &str,
    fill: impl FnOnce(&mut io::BufWriter<&File>) -> io::Result<()>,
) -> io::Result<Taken> {
    write_file(dir, name, true, fill)
}

/// [`write`], locking the file first if `hold`.
fn write_file(
    dir: &Path,
    name: &str,
    hold: bool,
    fill: impl FnOnce(&mut io::BufWriter<&File>) -> io::Result<()>,
) -> io::Result<Taken> {
    std::fs::create_dir_all(dir)?;
    let path = dir.join(name);
    let tmp = dir.join(format!("{name}.tmp"));
    let written = (|| {
        let file = File::options()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(&tmp)?;
        if hold {
            file.try_lock().map_err(io::Error::from)?;
        }
        let mut out = io::BufWriter::new(&file);
        fill(&mut out)?;
        out.flush()?;
        drop(out);
        file.sync_all()?;
        std::fs::rename(&tmp, &path)?;
        sync_dir(&path);
        Ok(file)
    })();
    match written {
        Ok(file) => Ok(Taken { path, file }),
        Err(e) => {
            let _ = std::fs::remove_file(&tmp);
            Err(e)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_file_is_taken_by_one_holder_at_a_time() {
        let dir = tempfile::tempdir().unwrap();
        let path = write(dir.path(), &new_name("spend", "json"), |out| {
            out.write_all(b"{}")
        })
        .unwrap();
        let mut first = take(&path).expect("a free file is taken");
        assert!(take(&path).is_none(), "a held file is not taken twice");
        assert_eq!(first.read().unwrap(), b"{}");
        first.remove().map_err(|(e, _)| e).unwrap();
        assert!(take(&path).is_none(), "a removed file is gone");
        assert!(list(dir.path(), |_| true).is_empty());
    }

    #[test]
    fn a_file_replayed_and_removed_while_waiting_for_its_lock_is_not_taken() {
        let dir = tempfile::tempdir().unwrap();
        let path = write(dir.path(), "audit-1.jsonl", |out| out.write_all(b"x")).unwrap();
        let holder = take(&path).unwrap();
        // Two readers opened it before the holder replayed and removed it.
        let (late, later) = (File::open(&path).unwrap(), File::open(&path).unwrap());
        holder.remove().map_err(|(e, _)| e).unwrap();
        assert!(hold(&path, late).is_none(), "gone from the directory");
        // Written again under the same name: a new file, not the one `later` opened.
        write(dir.path(), "audit-1.jsonl", |out| out.write_all(b"y")).unwrap();
        assert!(hold(&path, later).is_none(), "another file now");
        let mut again = take(&path).expect("the new file is free");
        assert_eq!(again.read().unwrap(), b"y");
    }

    #[test]
    fn a_file_replaced_at_its_path_is_not_removed_by_the_holder_of_the_old_one() {
        let dir = tempfile::tempdir().unwrap();
        let path = write(dir.path(), "spend.json", |out| out.write_all(b"old")).unwrap();
        let held = take(&path).unwrap();
        // Another process renames a new spool over the same name.
        write(dir.path(), "spend.json", |out| out.write_all(b"new")).unwrap();
        held.remove().map_err(|(e, _)| e).unwrap();
        assert_eq!(std::fs::read(&path).unwrap(), b"new");
    }

    #[test]
    fn a_file_written_taken_is_held_from_the_moment_it_appears() {
        let dir = tempfile::tempdir().unwrap();
        let held = write_taken(dir.path(), "spend-1.json", |out| out.write_all(b"1")).unwrap();
        assert!(take(held.path()).is_none(), "held by its writer");
        // Written again under its name: the new file is held, the old one let go.
        let again = write_taken(dir.path(), "spend-1.json", |out| out.write_all(b"2")).unwrap();
        drop(held);
        assert!(take(again.path()).is_none(), "the new file is held too");
        assert_eq!(std::fs::read(again.path()).unwrap(), b"2");
        let path = again.path().to_path_buf();
        drop(again);
        assert!(
            take(&path).is_some(),
            "free once its holder lets go (or dies)"
        );
    }

    #[test]
    fn names_sort_by_time_and_listing_filters() {
        let dir = tempfile::tempdir().unwrap();
        let a = new_name("audit", "jsonl");
        std::thread::sleep(std::time::Duration::from_millis(2));
        let b = new_name("audit", "jsonl");
        assert!(a < b);
        for name in [&b, &a, &"spend.json".to_string(), &format!("{a}.tmp")] {
            std::fs::write(dir.path().join(name), b"").unwrap();
        }
        let listed = list(dir.path(), |n| {
            n.starts_with("audit-") && n.ends_with(".jsonl")
        });
        assert_eq!(listed, [dir.path().join(&a), dir.path().join(&b)]);
    }
}
