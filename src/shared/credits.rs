//! Credit amounts, held as integer micro-credits so sums are exact.

use serde::{Deserialize, Serialize};
use std::fmt;

const MICROS: i64 = 1_000_000;
/// The largest amount accepted from outside: a trillion credits.
const MAX_CREDITS: i64 = 1_000_000_000_000;

/// An amount of credits with six decimal places. JSON shows it as a plain number (`1.25`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Credits(i64);

impl Credits {
    /// Zero credits.
    pub const ZERO: Credits = Credits(0);

    /// An amount in micro-credits.
    pub const fn from_micros(micros: i64) -> Self {
        Self(micros)
    }

    /// The amount in micro-credits.
    pub const fn micros(self) -> i64 {
        self.0
    }

    /// Parses a non-negative decimal such as `"12"`, `"0.5"` or `"3.000125"` exactly, without
    /// going through floating point: what a backend reports in `Service-Credits`. Past six
    /// decimal places the amount is rounded to the nearest micro-credit, and an amount over a
    /// trillion credits counts as a trillion, so whatever a backend reports as a plain decimal is
    /// charged (at most) as much as it says. `None` for anything else (a sign, an exponent,
    /// `NaN`): the caller charges its own price.
    pub fn parse_decimal(s: &str) -> Option<Self> {
        // One pass over the digits: every answer that reports a cost is parsed here.
        let s = s.trim().as_bytes();
        let (int, frac) = match s.iter().position(|&b| b == b'.') {
            Some(dot) => (&s[..dot], &s[dot + 1..]),
            None => (s, &[][..]),
        };
        if int.is_empty() && frac.is_empty() {
            return None;
        }
        let digit = |b: u8| b.is_ascii_digit().then(|| i64::from(b - b'0'));
        // Held at most one past the largest amount, so it cannot overflow.
        let mut whole: i64 = 0;
        for &b in int {
            whole = (whole * 10 + digit(b)?).min(MAX_CREDITS + 1);
        }
        // Six decimal places kept; the seventh rounds them.
        let (mut fraction, mut scale, mut round_up) = (0, MICROS, false);
        for (i, &b) in frac.iter().enumerate() {
            let d = digit(b)?;
            if i < 6 {
                scale /= 10;
                fraction += d * scale;
            } else if i == 6 {
                round_up = d >= 5;
            }
        }
        if whole > MAX_CREDITS {
            return Some(Self(MAX_CREDITS * MICROS));
        }
        let micros = whole * MICROS + fraction + i64::from(round_up);
        Some(Self(micros.min(MAX_CREDITS * MICROS)))
    }

    /// From a JSON number; `None` for negative, non-finite or absurdly large values.
    pub fn from_f64(v: f64) -> Option<Self> {
        if !v.is_finite() || v < 0.0 || v > MAX_CREDITS as f64 {
            return None;
        }
        Some(Self((v * MICROS as f64).round() as i64))
    }

    /// As a JSON-friendly float.
    pub fn as_f64(self) -> f64 {
        self.0 as f64 / MICROS as f64
    }

    /// Sum, saturating instead of overflowing.
    pub fn saturating_add(self, other: Credits) -> Credits {
        Credits(self.0.saturating_add(other.0))
    }
}

impl fmt::Display for Credits {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let whole = self.0 / MICROS;
        let frac = (self.0 % MICROS).abs();
        if frac == 0 {
            write!(f, "{whole}")
        } else {
            let digits = format!("{frac:06}");
            write!(f, "{whole}.{}", digits.trim_end_matches('0'))
        }
    }
}

impl Serialize for Credits {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_f64(self.as_f64())
    }
}

impl<'de> Deserialize<'de> for Credits {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let v = f64::deserialize(d)?;
        Self::from_f64(v).ok_or_else(|| {
            serde::de::Error::custom("credits must be a non-negative number up to 1e12")
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_decimals_exactly() {
        assert_eq!(Credits::parse_decimal("12"), Some(Credits(12_000_000)));
        assert_eq!(Credits::parse_decimal("0.5"), Some(Credits(500_000)));
        assert_eq!(Credits::parse_decimal(".25"), Some(Credits(250_000)));
        assert_eq!(Credits::parse_decimal("3."), Some(Credits(3_000_000)));
        assert_eq!(
            Credits::parse_decimal(" 3.000125 "),
            Some(Credits(3_000_125))
        );
        for bad in [
            "",
            ".",
            "-1",
            "-0",
            "1e3",
            "abc",
            "1.2.3",
            "+1",
            "NaN",
            "inf",
            "1 2",
            "1._",
            "12345678901234567890.5x",
        ] {
            assert_eq!(Credits::parse_decimal(bad), None, "{bad}");
        }
    }

    #[test]
    fn long_fractions_round_and_huge_amounts_are_capped_not_dropped() {
        let parse = |s| Credits::parse_decimal(s).map(Credits::micros);
        assert_eq!(parse("0.1234567"), Some(123_457));
        assert_eq!(parse("0.1234564"), Some(123_456));
        assert_eq!(parse("2.000000000"), Some(2_000_000));
        assert_eq!(parse("0.0000001"), Some(0));
        assert_eq!(parse("0.9999995"), Some(1_000_000));
        let max = MAX_CREDITS * MICROS;
        assert_eq!(parse("1000000000000"), Some(max));
        assert_eq!(parse("10000000000000"), Some(max));
        assert_eq!(parse("99999999999999999999999999.5"), Some(max));
        assert_eq!(parse("999999999999.9999999"), Some(max));
        assert_eq!(parse("000000000000000000012"), Some(12_000_000));
    }

    #[test]
    fn json_roundtrip_and_display() {
        let c: Credits = serde_json::from_str("1.25").unwrap();
        assert_eq!(c, Credits(1_250_000));
        assert_eq!(serde_json::to_string(&c).unwrap(), "1.25");
        assert_eq!(c.to_string(), "1.25");
        assert_eq!(Credits(2_000_000).to_string(), "2");
        assert!(serde_json::from_str::<Credits>("-1").is_err());
        assert!(serde_json::from_str::<Credits>("\"1\"").is_err());
    }

    #[test]
    fn adds_without_overflow() {
        let big = Credits(i64::MAX - 1);
        assert_eq!(big.saturating_add(Credits(10)), Credits(i64::MAX));
    }
}
