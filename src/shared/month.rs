//! Calendar months (UTC) that spend is charged to, and minute windows for rate limits.

/// The UTC calendar month of unix second `unix`, as `YYYY-MM`.
pub fn month_of(unix: u64) -> String {
    let t = time::OffsetDateTime::from_unix_timestamp(unix as i64)
        .unwrap_or(time::OffsetDateTime::UNIX_EPOCH);
    format!("{:04}-{:02}", t.year(), u8::from(t.month()))
}

/// The unix milliseconds from the start of the UTC month of unix second `unix` to the start of
/// the next (empty if the date is out of range).
pub fn month_bounds_ms(unix: u64) -> std::ops::Range<u64> {
    let t = time::OffsetDateTime::from_unix_timestamp(unix as i64)
        .unwrap_or(time::OffsetDateTime::UNIX_EPOCH);
    let (next_year, next_month) = match t.month() {
        time::Month::December => (t.year() + 1, time::Month::January),
        m => (t.year(), m.next()),
    };
    let start_of = |year, month| {
        time::Date::from_calendar_date(year, month, 1)
            .ok()
            .map(|d| d.midnight().assume_utc().unix_timestamp().max(0) as u64 * 1000)
    };
    match (
        start_of(t.year(), t.month()),
        start_of(next_year, next_month),
    ) {
        (Some(start), Some(end)) => start..end,
        _ => 0..0,
    }
}

/// [`month_bounds_ms`] of a `YYYY-MM` month (empty if it is not one).
pub fn bounds_of_month(month: &str) -> std::ops::Range<u64> {
    let (Some(year), Some(number)) = (
        month.get(..4).and_then(|y| y.parse::<i32>().ok()),
        month.get(5..).and_then(|m| m.parse::<u8>().ok()),
    ) else {
        return 0..0;
    };
    time::Month::try_from(number)
        .ok()
        .and_then(|m| time::Date::from_calendar_date(year, m, 1).ok())
        .map(|d| d.midnight().assume_utc().unix_timestamp())
        .filter(|&start| start >= 0)
        .map_or(0..0, |start| month_bounds_ms(start as u64))
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
        let november = month_bounds_ms(1_796_083_199);
        assert_eq!(november, 1_793_491_200_000..1_796_083_200_000);
        assert_eq!(month_of(november.start / 1000), "2026-11");
        assert_eq!(month_of(november.end / 1000 - 1), "2026-11");
        assert_eq!(month_of(november.end / 1000), "2026-12");
        assert_eq!(month_bounds_ms(1_796_083_200).start, november.end);
        assert_eq!(bounds_of_month("2026-11"), november);
        assert_eq!(bounds_of_month("2026-1x"), 0..0);
        let december = month_bounds_ms(1_798_761_599);
        assert_eq!(month_of(december.end / 1000), "2027-01");
        for bad in ["2026-13", "2026-00", "2026-1", "26-11-01", "abcd-ef"] {
            assert!(!is_month(bad), "{bad}");
        }
    }
}
