//! `Service-Credits`: a backend's decimal, parsed exactly, never negative, never past the cap.

use proptest::prelude::*;
use svcgate::metering::Credits;

/// A trillion credits, in micro-credits: the most any figure counts as.
const MAX_MICROS: i64 = 1_000_000_000_000 * 1_000_000;

proptest! {
    #[test]
    fn any_text_parses_to_an_amount_in_range_or_none(text in ".{0,40}") {
        if let Some(c) = Credits::parse_decimal(&text) {
            prop_assert!((0..=MAX_MICROS).contains(&c.micros()), "{text:?} → {c:?}");
        }
    }

    #[test]
    fn a_plain_decimal_parses_exactly(whole in 0i64..1_000_000_000_000, micros in 0i64..1_000_000) {
        let text = format!("{whole}.{micros:06}");
        prop_assert_eq!(
            Credits::parse_decimal(&text),
            Some(Credits::from_micros(whole * 1_000_000 + micros))
        );
        // Padding around it and a whole number read the same.
        let padded = format!(" {text}\t");
        prop_assert_eq!(Credits::parse_decimal(&padded), Credits::parse_decimal(&text));
        prop_assert_eq!(
            Credits::parse_decimal(&whole.to_string()),
            Some(Credits::from_micros(whole * 1_000_000))
        );
    }

    #[test]
    fn signs_exponents_and_words_are_no_figure(
        number in "[0-9]{1,6}(\\.[0-9]{1,4})?",
        spoiler in prop::sample::select(vec!["-", "+", "e3", "E-2", "NaN", "inf", "0x", ",5"]),
    ) {
        let signed = format!("{spoiler}{number}");
        prop_assert_eq!(Credits::parse_decimal(&signed), None, "{}", signed);
        let suffixed = format!("{number}{spoiler}");
        prop_assert_eq!(Credits::parse_decimal(&suffixed), None, "{}", suffixed);
    }

    #[test]
    fn huge_figures_count_as_the_cap(digits in "[1-9][0-9]{13,60}") {
        prop_assert_eq!(
            Credits::parse_decimal(&digits),
            Some(Credits::from_micros(MAX_MICROS))
        );
    }
}
