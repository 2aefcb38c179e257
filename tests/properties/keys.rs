//! Key format: the checksum catches a mistyped key without the store.

use proptest::prelude::*;
use svcgate::keys::format::{self, last4, redact, BODY_LEN};
use svcgate::keys::Environment;

fn environment() -> impl Strategy<Value = Environment> {
    prop::sample::select(Environment::ALL.to_vec())
}

/// A base62 character.
fn alphanumeric() -> impl Strategy<Value = char> {
    prop::sample::select(
        ('0'..='9')
            .chain('a'..='z')
            .chain('A'..='Z')
            .collect::<Vec<char>>(),
    )
}

proptest! {
    #[test]
    fn any_text_is_a_key_or_refused_without_panicking(text in ".{0,80}") {
        if let Ok(env) = format::parse(&text) {
            prop_assert!(text.starts_with(env.key_prefix()));
            prop_assert_eq!(text.len(), env.key_prefix().len() + BODY_LEN);
        }
    }

    #[test]
    fn a_made_key_parses_and_one_changed_character_does_not(
        env in environment(),
        secret in prop::collection::vec(any::<u8>(), 1..64),
        at in 0..BODY_LEN,
        with in alphanumeric(),
    ) {
        let key = format::derive(env, &secret, &[b"context"]);
        prop_assert_eq!(format::parse(&key.value), Ok(env));
        let mut changed: Vec<char> = key.value.chars().collect();
        let i = env.key_prefix().len() + at;
        prop_assume!(changed[i] != with);
        changed[i] = with;
        let changed: String = changed.into_iter().collect();
        prop_assert!(format::parse(&changed).is_err(), "{} accepted", changed);
    }

    #[test]
    fn redacted_text_never_holds_a_key(
        env in environment(),
        secret in prop::collection::vec(any::<u8>(), 1..32),
        before in "[ -~]{0,20}",
        after in "[ -~]{0,20}",
    ) {
        let key = format::derive(env, &secret, &[]);
        let text = format!("{before}{}{after}", key.value);
        let shown = redact(&text);
        prop_assert!(!shown.contains(&key.value), "{}", shown);
        // Where the key stands as a word of its own, its last four stay to tell which it was.
        let alone = !after.starts_with(|c: char| c.is_ascii_alphanumeric() || c == '_');
        prop_assert!(!alone || shown.contains(last4(&key.value)), "{}", shown);
    }
}
