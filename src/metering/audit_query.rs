//! Reading the audit log back: the filter, and the cursors a listing goes on from.

use compact_str::CompactString;

use super::audit::AuditRecord;

/// Where a page of a listing ended: the records after it are older. Shown to clients as
/// `<unix ms>_<request id>` (`next_cursor`), taken back as `cursor`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AuditCursor {
    time_ms: u64,
    request_id: CompactString,
}

impl AuditCursor {
    /// The cursor after `record`.
    pub fn after(record: &AuditRecord) -> Self {
        Self {
            time_ms: record.time_ms,
            request_id: record.request_id.clone(),
        }
    }

    /// Whether `record` comes after the cursor in a listing (is older).
    fn passes(&self, record: &AuditRecord) -> bool {
        record.position() < (self.time_ms, &*self.request_id)
    }
}

impl std::fmt::Display for AuditCursor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}_{}", self.time_ms, self.request_id)
    }
}

impl std::str::FromStr for AuditCursor {
    type Err = ();

    /// `<unix ms>_req_<id>`, as [`Display`](std::fmt::Display) writes it.
    fn from_str(s: &str) -> Result<Self, ()> {
        let (time, id) = s.split_once('_').ok_or(())?;
        let time_ms: u64 = time.parse().map_err(|_| ())?;
        let random = id.strip_prefix("req_").ok_or(())?;
        if random.is_empty()
            || random.len() > 64
            || !random.bytes().all(|b| b.is_ascii_alphanumeric())
        {
            return Err(());
        }
        Ok(Self {
            time_ms,
            request_id: id.into(),
        })
    }
}

/// A filter for reading the log back.
#[derive(Debug, Clone, Default)]
pub struct AuditQuery {
    /// Required: logs are kept per workspace.
    pub workspace: String,
    /// Only this key.
    pub key_id: Option<String>,
    /// Only this project.
    pub project: Option<String>,
    /// Only records at or after this unix second.
    pub since: Option<u64>,
    /// Only records after this point of the listing (older than the last page's last).
    pub cursor: Option<AuditCursor>,
    /// Where a scan that ran out of its budget stopped: the read goes on from there, in the
    /// order the log holds its batches, instead of from the newest.
    pub resume: Option<AuditResume>,
    /// At most this many, newest first ([`AuditRecord::sort_listing`]).
    pub limit: usize,
    /// Only records of administrative actions (those with an `actor`), `Some(true)`, or only
    /// requests', `Some(false)`; both, `None`.
    pub actions: Option<bool>,
}

impl AuditQuery {
    /// Whether `record` passes the filter (the workspace is chosen by the store).
    pub fn matches(&self, record: &AuditRecord) -> bool {
        self.key_id.as_ref().is_none_or(|k| *record.key_id == **k)
            && self
                .project
                .as_ref()
                .is_none_or(|p| record.project.as_ref() == Some(p))
            && self
                .since
                .is_none_or(|s| record.time_ms >= s.saturating_mul(1000))
            && self.cursor.as_ref().is_none_or(|c| c.passes(record))
            && self.actions.is_none_or(|a| record.actor.is_some() == a)
    }
}

/// Where a read of the log that ran out of its scan budget stopped, to go on from: the log's
/// batch (a stream entry id) and how many of its matching records were already answered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AuditResume {
    /// The batch to read first (`<ms>-<seq>`).
    pub entry: String,
    /// Its matching records already answered, skipped.
    pub skip: usize,
}

/// What a bounded read of the log found: the records, newest first, and, if it stopped before
/// the end of what the query could match, where to go on.
#[derive(Debug, Clone, Default)]
pub struct AuditRead {
    /// The records found.
    pub records: Vec<AuditRecord>,
    /// Where the read stopped; `None` once the query has read everything it can match.
    pub resume: Option<AuditResume>,
}

/// A cursor of a listing as a client holds it: the point after the last record shown, or
/// where a scan stopped (`s<entry>.<skip>`, with the point it started after, if any:
/// `s<entry>.<skip>.<point>`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ListingCursor {
    /// Records older than this.
    After(AuditCursor),
    /// A scan to go on with, past an optional point.
    Scan(AuditResume, Option<AuditCursor>),
}

impl std::fmt::Display for ListingCursor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::After(point) => point.fmt(f),
            Self::Scan(resume, None) => write!(f, "s{}.{}", resume.entry, resume.skip),
            Self::Scan(resume, Some(point)) => {
                write!(f, "s{}.{}.{point}", resume.entry, resume.skip)
            }
        }
    }
}

impl std::str::FromStr for ListingCursor {
    type Err = ();

    fn from_str(s: &str) -> Result<Self, ()> {
        let Some(scan) = s.strip_prefix('s') else {
            return s.parse().map(Self::After);
        };
        let mut parts = scan.splitn(3, '.');
        let entry = parts.next().ok_or(())?;
        let (ms, seq) = entry.split_once('-').ok_or(())?;
        ms.parse::<u64>().map_err(|_| ())?;
        seq.parse::<u64>().map_err(|_| ())?;
        let skip = parts.next().ok_or(())?.parse().map_err(|_| ())?;
        let point = parts.next().map(str::parse).transpose()?;
        Ok(Self::Scan(
            AuditResume {
                entry: entry.to_string(),
                skip,
            },
            point,
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cursors_read_back_as_they_are_written() {
        let point: AuditCursor = "1764000000123_req_abc9".parse().unwrap();
        for cursor in [
            ListingCursor::After(point.clone()),
            ListingCursor::Scan(
                AuditResume {
                    entry: "1764000000200-3".into(),
                    skip: 0,
                },
                None,
            ),
            ListingCursor::Scan(
                AuditResume {
                    entry: "1764000000200-0".into(),
                    skip: 17,
                },
                Some(point),
            ),
        ] {
            assert_eq!(cursor.to_string().parse::<ListingCursor>(), Ok(cursor));
        }
        for bad in [
            "",
            "s",
            "s1-2",
            "s1-2.",
            "s1.2",
            "sx-1.0",
            "s1-2.3.4",
            "1_req_",
            "s1-2.3.x_req_a",
        ] {
            assert!(bad.parse::<ListingCursor>().is_err(), "{bad:?}");
        }
    }
}
