//! Instants as the API shows and takes them where a person reads them: RFC 3339, in UTC.

use time::format_description::well_known::Rfc3339;
use time::OffsetDateTime;

/// Unix second `unix` as RFC 3339 in UTC (`2026-12-02T13:07:50Z`).
pub fn format(unix: u64) -> String {
    i64::try_from(unix)
        .ok()
        .and_then(|s| OffsetDateTime::from_unix_timestamp(s).ok())
        .and_then(|t| t.format(&Rfc3339).ok())
        .unwrap_or_else(|| "9999-12-31T23:59:59Z".into())
}

/// The unix second of an RFC 3339 instant (any offset; fractions of a second dropped), if it
/// is one and not before 1970.
pub fn parse(text: &str) -> Option<u64> {
    let t = OffsetDateTime::parse(text, &Rfc3339).ok()?;
    u64::try_from(t.unix_timestamp()).ok()
}

/// Serializes an optional unix second as RFC 3339 (for `#[serde(serialize_with)]`).
pub fn serialize_opt<S: serde::Serializer>(unix: &Option<u64>, s: S) -> Result<S::Ok, S::Error> {
    match unix {
        Some(unix) => s.serialize_str(&format(*unix)),
        None => s.serialize_none(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn instants_go_both_ways() {
        assert_eq!(format(0), "1970-01-01T00:00:00Z");
        assert_eq!(parse("1970-01-01T00:00:00Z"), Some(0));
        assert_eq!(
            parse("2026-12-02T14:07:50+01:00"),
            parse("2026-12-02T13:07:50Z")
        );
        assert_eq!(
            parse("2026-12-02T13:07:50.999Z"),
            parse("2026-12-02T13:07:50Z")
        );
        let now = 1_796_216_870;
        assert_eq!(parse(&format(now)), Some(now));
        assert_eq!(parse("tomorrow"), None);
        assert_eq!(parse("1969-12-31T23:59:59Z"), None);
    }
}
