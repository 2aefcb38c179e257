//! Calendar months (UTC) that spend is charged to, and minute windows for rate limits.

/// The UTC calendar month of unix second `unix`, as `YYYY-MM`.
pub fn month_of(unix: u64) -> String {
    let t = time::OffsetDateTime::from_unix_timestamp(unix as i64)
        .unwrap_or(time::OffsetDateTime::UNIX_EPOCH);
    format!("{:04}-{:02}", t.year(), u8::from(t.month()))
}

/// Whether `s` is a month in the `YYYY-MM` form.
pub fn is_month(s: &str) -> bool {
    let b = s.as_bytes();
    b.len() == 7
        && b[4] == b'-'
        && b[..4].iter().chain(&b[5..]).all(u8::is_ascii_digit)
        && matches!(s[5..].parse::<u8>(), Ok(1..=12))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn months_are_utc() {
        assert_eq!(month_of(0), "1970-01");
        // 2026-11-30T23:59:59Z and one second later.
        assert_eq!(month_of(1_796_083_199), "2026-11");
        assert_eq!(month_of(1_796_083_200), "2026-12");
        assert!(is_month("2026-11"));
        for bad in ["2026-13", "2026-00", "2026-1", "26-11-01", "abcd-ef"] {
            assert!(!is_month(bad), "{bad}");
        }
    }
}
