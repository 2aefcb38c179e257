//! The retry schedule: how long an endpoint whose delivery failed waits before it is tried
//! again, as a pure function of the schedule, the failures so far, the receiver's
//! `Retry-After` and a jitter the caller draws ([`random_jitter`]), so it can be tested.

use std::time::{Duration, SystemTime};

/// How far a scheduled wait is spread, each way: ±10 %, so endpoints that failed together
/// (one receiver behind them went down) are not all retried in the same instant.
pub const JITTER: f64 = 0.1;

/// The wait before the next attempt after an endpoint's failure number `failures + 1`:
/// `schedule[failures]` spread by `jitter` (−1 to 1, a fraction of [`JITTER`]), and at least
/// the receiver's `retry_after` (429 or 503 with `Retry-After`), itself at most
/// `max_retry_after`. `None` when the schedule is spent: the endpoint is paused.
pub fn next_wait(
    schedule: &[Duration],
    failures: u32,
    retry_after: Option<Duration>,
    max_retry_after: Duration,
    jitter: f64,
) -> Option<Duration> {
    let scheduled = schedule.get(failures as usize)?;
    let spread = 1.0 + JITTER * jitter.clamp(-1.0, 1.0);
    let jittered = scheduled.mul_f64(spread);
    let asked = retry_after.map_or(Duration::ZERO, |wait| wait.min(max_retry_after));
    Some(jittered.max(asked))
}

/// A jitter for [`next_wait`], drawn uniformly from −1 to 1.
pub fn random_jitter() -> f64 {
    use rand::Rng;
    rand::rng().random_range(-1.0..=1.0)
}

/// The wait a `Retry-After` value asks for at `now`: delay seconds, or an HTTP date (a date
/// past is no wait). `None` if it is neither.
pub fn parse_retry_after(value: &str, now: SystemTime) -> Option<Duration> {
    let value = value.trim();
    if let Ok(seconds) = value.parse::<u64>() {
        return Some(Duration::from_secs(seconds));
    }
    let at = httpdate::parse_http_date(value).ok()?;
    Some(at.duration_since(now).unwrap_or(Duration::ZERO))
}

#[cfg(test)]
mod tests {
    use super::*;

    const MAX: Duration = Duration::from_secs(3600);

    fn secs(s: &[u64]) -> Vec<Duration> {
        s.iter().map(|s| Duration::from_secs(*s)).collect()
    }

    #[test]
    fn scheduled_waits_are_spread_by_at_most_ten_percent() {
        let schedule = secs(&[60, 300]);
        assert_eq!(
            next_wait(&schedule, 0, None, MAX, 0.0),
            Some(Duration::from_secs(60))
        );
        assert_eq!(
            next_wait(&schedule, 0, None, MAX, -1.0),
            Some(Duration::from_secs(54))
        );
        assert_eq!(
            next_wait(&schedule, 1, None, MAX, 1.0),
            Some(Duration::from_secs(330))
        );
        // Out of range is held to the range.
        assert_eq!(
            next_wait(&schedule, 1, None, MAX, 7.0),
            Some(Duration::from_secs(330))
        );
        assert_eq!(next_wait(&schedule, 2, None, MAX, 0.0), None);
        for _ in 0..1000 {
            let j = random_jitter();
            assert!((-1.0..=1.0).contains(&j), "{j}");
        }
    }

    #[test]
    fn retry_after_is_a_floor_up_to_the_cap_and_never_stretches_the_schedule_past_its_end() {
        let schedule = secs(&[1, 2]);
        let four = Some(Duration::from_secs(4));
        assert_eq!(
            next_wait(&schedule, 0, four, MAX, 1.0),
            Some(Duration::from_secs(4))
        );
        // Shorter than the scheduled wait: the schedule holds.
        let schedule = secs(&[60]);
        assert_eq!(
            next_wait(&schedule, 0, four, MAX, 0.0),
            Some(Duration::from_secs(60))
        );
        // A day asked, an hour at most.
        let day = Some(Duration::from_secs(86_400));
        assert_eq!(next_wait(&schedule, 0, day, MAX, 0.0), Some(MAX));
        // The schedule spent: paused, whatever the receiver asks.
        assert_eq!(next_wait(&schedule, 1, four, MAX, 0.0), None);
    }

    #[test]
    fn retry_after_reads_seconds_and_http_dates() {
        let now = SystemTime::UNIX_EPOCH + Duration::from_secs(1_445_412_480);
        assert_eq!(parse_retry_after(" 4 ", now), Some(Duration::from_secs(4)));
        assert_eq!(
            parse_retry_after("Wed, 21 Oct 2015 07:28:10 GMT", now),
            Some(Duration::from_secs(10))
        );
        assert_eq!(
            parse_retry_after("Wed, 21 Oct 2015 07:27:00 GMT", now),
            Some(Duration::ZERO)
        );
        for bad in ["", "-1", "soon", "4.5"] {
            assert_eq!(parse_retry_after(bad, now), None, "{bad}");
        }
    }
}
