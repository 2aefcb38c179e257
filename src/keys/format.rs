//! The API key wire format: generation, parsing and hashing.
//!
//! A key is `<prefix><random><checksum>`:
//! - `prefix` is `svc_live_`, `svc_test_` or `svc_scoped_` and selects the environment;
//! - `random` is 33 characters of `[A-Za-z0-9]` (≈196 bits of entropy);
//! - `checksum` is the CRC-32 of prefix and random part, as 6 base62 characters.
//!
//! The checksum lets the gateway reject a mistyped or truncated key with no store lookup
//! (and lets secret scanners recognise our keys with few false positives). Keys are only ever
//! stored as their SHA-256 digest, [`KeyHash`].

use hmac::{Hmac, Mac};
use rand::distr::{Alphanumeric, SampleString};
use rand::{RngCore, SeedableRng};
use rand_chacha::ChaCha20Rng;
use sha2::{Digest, Sha256};
use std::borrow::Cow;
use std::fmt;
use subtle::ConstantTimeEq;

use super::Environment;

/// Number of random base62 characters in a key body (33 × log2(62) ≈ 196 bits).
pub const RANDOM_LEN: usize = 33;
/// Number of base62 characters of the checksum (62^6 > 2^32).
pub const CHECKSUM_LEN: usize = 6;
/// Length of a key body, after its prefix.
pub const BODY_LEN: usize = RANDOM_LEN + CHECKSUM_LEN;
/// The longest key prefix; anything longer than this plus [`BODY_LEN`] is not a key.
pub const MAX_KEY_LEN: usize = 11 + BODY_LEN;

const BASE62: &[u8; 62] = b"0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz";

/// Why a string is not a well-formed key. Never carries the key itself.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum KeyFormatError {
    /// The string does not start with a known prefix.
    #[error("unknown key prefix")]
    UnknownPrefix,
    /// The body has the wrong length.
    #[error("wrong key length")]
    Length,
    /// The body has a character outside `[A-Za-z0-9]`.
    #[error("invalid character in key")]
    Charset,
    /// The checksum does not match: a typo or a truncated copy.
    #[error("key checksum mismatch")]
    Checksum,
}

impl KeyFormatError {
    /// A short, stable label for metrics and logs.
    pub fn reason(self) -> &'static str {
        match self {
            Self::UnknownPrefix => "unknown_prefix",
            Self::Length => "bad_length",
            Self::Charset => "bad_charset",
            Self::Checksum => "bad_checksum",
        }
    }
}

/// A freshly generated key: the full secret value, shown to its owner exactly once.
pub struct NewKey {
    /// The full key. Handle with care: never log it, never store it.
    pub value: String,
    /// Its digest, the only form that is stored.
    pub hash: KeyHash,
}

impl fmt::Debug for NewKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("NewKey")
            .field("value", &"<redacted>")
            .field("last4", &last4(&self.value))
            .finish()
    }
}

/// Generates a new key for `env`.
pub fn generate(env: Environment) -> NewKey {
    let mut seed = [0u8; 32];
    rand::rng().fill_bytes(&mut seed);
    from_seed(env, seed)
}

/// Derives a key from `secret` and `context`: the same inputs give the same key, which lets a
/// retried operation (an idempotent rotation) hand back the key it created without the key
/// ever being stored. Without the secret the result is as unpredictable as [`generate`]'s.
pub fn derive(env: Environment, secret: &[u8], context: &[&[u8]]) -> NewKey {
    let mut mac = Hmac::<Sha256>::new_from_slice(secret).expect("HMAC takes any key length");
    for part in context {
        mac.update(&(part.len() as u64).to_be_bytes());
        mac.update(part);
    }
    from_seed(env, mac.finalize().into_bytes().into())
}

fn from_seed(env: Environment, seed: [u8; 32]) -> NewKey {
    let prefix = env.key_prefix();
    let mut value = String::with_capacity(prefix.len() + BODY_LEN);
    value.push_str(prefix);
    Alphanumeric.append_string(&mut ChaCha20Rng::from_seed(seed), &mut value, RANDOM_LEN);
    let sum = checksum(value.as_bytes());
    value.push_str(std::str::from_utf8(&sum).expect("base62 is ASCII"));
    let hash = KeyHash::of(&value);
    NewKey { value, hash }
}

/// Checks the shape and checksum of `token` and returns its environment.
///
/// Runs on every request: no allocation, no store access.
pub fn parse(token: &str) -> Result<Environment, KeyFormatError> {
    let (env, body) = Environment::ALL
        .iter()
        .find_map(|env| {
            token
                .strip_prefix(env.key_prefix())
                .map(|body| (*env, body))
        })
        .ok_or(KeyFormatError::UnknownPrefix)?;
    if body.len() != BODY_LEN {
        return Err(KeyFormatError::Length);
    }
    if !body.bytes().all(|b| b.is_ascii_alphanumeric()) {
        return Err(KeyFormatError::Charset);
    }
    let (signed, sum) = token.split_at(token.len() - CHECKSUM_LEN);
    if checksum(signed.as_bytes()) != sum.as_bytes() {
        return Err(KeyFormatError::Checksum);
    }
    Ok(env)
}

/// The last four characters of a key, the part that stays visible after creation.
pub fn last4(token: &str) -> &str {
    let cut = token.len().saturating_sub(4);
    token.get(cut..).unwrap_or("")
}

/// `text` with anything in it that may be a key or token cut to its prefix and last four
/// characters, the way keys are shown everywhere. For text a client chose that the gateway
/// repeats (a request path in an error message, a log line, an audit record): a client that
/// puts its key in a URL must not find it there.
pub fn redact(text: &str) -> Cow<'_, str> {
    // Longer than this after its prefix may be (part of) a secret; shorter cannot be guessed from.
    const VISIBLE_UP_TO: usize = 8;
    rewrite_words(text, "svc_", |word, out| {
        let prefix = Environment::ALL
            .iter()
            .map(|env| env.key_prefix())
            .find(|p| word.starts_with(p));
        match prefix {
            Some(prefix) if word.len() > prefix.len() + VISIBLE_UP_TO => {
                out.push_str(prefix);
                out.push('…');
                out.push_str(last4(word));
            }
            _ => out.push_str(word),
        }
    })
}

/// `text` with every word (a run of letters, digits and `_`) that starts with `marker`
/// written by `write` instead; borrowed when there is none.
pub fn rewrite_words<'a>(
    text: &'a str,
    marker: &str,
    write: impl Fn(&str, &mut String),
) -> Cow<'a, str> {
    if !text.contains(marker) {
        return Cow::Borrowed(text);
    }
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(at) = rest.find(marker) {
        out.push_str(&rest[..at]);
        let from = &rest[at..];
        let len = from
            .bytes()
            .take_while(|b| b.is_ascii_alphanumeric() || *b == b'_')
            .count();
        write(&from[..len], &mut out);
        rest = &from[len..];
    }
    out.push_str(rest);
    Cow::Owned(out)
}

/// Every well-formed key (prefix, length, checksum) written in `text`, with its environment:
/// what a scanner looks for in text that should hold none (a request body, a URL, an event).
/// A candidate is a whole word of `[A-Za-z0-9_]` starting with `svc_`, so a key glued to
/// other letters is not one.
pub fn find_keys(text: &[u8]) -> impl Iterator<Item = (&str, Environment)> {
    let word = |b: &u8| b.is_ascii_alphanumeric() || *b == b'_';
    memchr::memmem::find_iter(text, b"svc_").filter_map(move |at| {
        if at > 0 && word(&text[at - 1]) {
            return None;
        }
        let len = text[at..].iter().take_while(|b| word(b)).count();
        let candidate = std::str::from_utf8(&text[at..at + len]).ok()?;
        parse(candidate).ok().map(|env| (candidate, env))
    })
}

fn checksum(data: &[u8]) -> [u8; CHECKSUM_LEN] {
    let mut n = crc32fast::hash(data) as u64;
    let mut out = [b'0'; CHECKSUM_LEN];
    for slot in out.iter_mut().rev() {
        *slot = BASE62[(n % 62) as usize];
        n /= 62;
    }
    out
}

/// The SHA-256 digest of a key: how keys are stored and looked up.
///
/// Keys carry ~196 bits of entropy, so a fast hash is enough: there is nothing to brute-force.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct KeyHash(pub [u8; 32]);

impl KeyHash {
    /// Digest of a full key value.
    pub fn of(token: &str) -> Self {
        Self(Sha256::digest(token.as_bytes()).into())
    }

    /// Lower-case hex, the form used in store keys.
    pub fn to_hex(&self) -> String {
        hex::encode(self.0)
    }

    /// Parses the lower-case hex form.
    pub fn from_hex(s: &str) -> Option<Self> {
        let mut out = [0u8; 32];
        hex::decode_to_slice(s, &mut out).ok()?;
        Some(Self(out))
    }

    /// Constant-time equality, for confirming a looked-up record really matches.
    pub fn ct_eq(&self, other: &KeyHash) -> bool {
        self.0.ct_eq(&other.0).into()
    }
}

impl fmt::Debug for KeyHash {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // A prefix of the digest is enough to tell records apart in a debug dump.
        write!(f, "KeyHash({}…)", &hex::encode(&self.0[..4]))
    }
}

impl serde::Serialize for KeyHash {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.to_hex())
    }
}

impl<'de> serde::Deserialize<'de> for KeyHash {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = <std::borrow::Cow<'de, str>>::deserialize(d)?;
        Self::from_hex(&s).ok_or_else(|| serde::de::Error::custom("invalid key hash"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn generated_keys_parse_with_their_environment() {
        for env in Environment::ALL {
            let key = generate(env);
            assert!(key.value.starts_with(env.key_prefix()));
            assert_eq!(key.value.len(), env.key_prefix().len() + BODY_LEN);
            assert_eq!(parse(&key.value), Ok(env));
            assert_eq!(key.hash, KeyHash::of(&key.value));
        }
    }

    #[test]
    fn derived_keys_are_stable_and_depend_on_every_input() {
        let a = derive(Environment::Live, b"secret", &[b"key_1", b"idem"]);
        assert_eq!(parse(&a.value), Ok(Environment::Live));
        let again = derive(Environment::Live, b"secret", &[b"key_1", b"idem"]);
        assert_eq!(a.value, again.value);
        for other in [
            derive(Environment::Live, b"secret2", &[b"key_1", b"idem"]),
            derive(Environment::Live, b"secret", &[b"key_2", b"idem"]),
            derive(Environment::Live, b"secret", &[b"key_1", b"idem2"]),
            // Length-prefixing keeps part boundaries distinct.
            derive(Environment::Live, b"secret", &[b"key_1i", b"dem"]),
        ] {
            assert_ne!(a.value, other.value);
        }
        let test = derive(Environment::Test, b"secret", &[b"key_1", b"idem"]);
        assert!(test.value.starts_with("svc_test_"));
    }

    #[test]
    fn generated_keys_differ() {
        let a = generate(Environment::Live);
        let b = generate(Environment::Live);
        assert_ne!(a.value, b.value);
        assert_ne!(a.hash, b.hash);
    }

    #[test]
    fn every_single_character_flip_is_caught() {
        let key = generate(Environment::Live).value;
        let prefix_len = Environment::Live.key_prefix().len();
        for i in prefix_len..key.len() {
            let mut bytes = key.clone().into_bytes();
            bytes[i] = if bytes[i] == b'a' { b'b' } else { b'a' };
            let flipped = String::from_utf8(bytes).unwrap();
            assert_eq!(
                parse(&flipped),
                Err(KeyFormatError::Checksum),
                "position {i}"
            );
        }
    }

    #[test]
    fn malformed_keys_are_rejected() {
        let key = generate(Environment::Test).value;
        assert_eq!(parse(""), Err(KeyFormatError::UnknownPrefix));
        assert_eq!(parse("sk-abc"), Err(KeyFormatError::UnknownPrefix));
        assert_eq!(
            parse(&key.replace("svc_test_", "svc_prod_")),
            Err(KeyFormatError::UnknownPrefix)
        );
        assert_eq!(parse(&key[..key.len() - 1]), Err(KeyFormatError::Length));
        assert_eq!(parse(&format!("{key}0")), Err(KeyFormatError::Length));
        let mut bytes = key.clone().into_bytes();
        bytes[12] = b'-';
        assert_eq!(
            parse(&String::from_utf8(bytes).unwrap()),
            Err(KeyFormatError::Charset)
        );
        // A multi-byte character of the right byte length must not panic on slicing.
        let body = "é".repeat(BODY_LEN / 2) + "a";
        assert_eq!(
            parse(&format!("svc_live_{body}")),
            Err(KeyFormatError::Charset)
        );
    }

    #[test]
    fn checksum_is_fixed_width_base62() {
        assert_eq!(checksum(b""), *b"000000");
        let sum = checksum(b"svc_live_x");
        assert!(sum.iter().all(|b| b.is_ascii_alphanumeric()));
    }

    #[test]
    fn hash_roundtrips_through_hex_and_debug_hides_it() {
        let h = KeyHash::of("svc_live_whatever");
        assert_eq!(KeyHash::from_hex(&h.to_hex()), Some(h));
        assert!(KeyHash::from_hex("zz").is_none());
        assert!(!format!("{h:?}").contains(&h.to_hex()));
        assert!(h.ct_eq(&h));
        assert!(!h.ct_eq(&KeyHash::of("other")));
    }

    #[test]
    fn last4_is_the_tail() {
        assert_eq!(last4("svc_live_abcdef"), "cdef");
        assert_eq!(last4("ab"), "ab");
    }

    #[test]
    fn keys_in_text_are_cut_to_prefix_and_last_four() {
        let key = generate(Environment::Live).value;
        let token = generate(Environment::Scoped).value;
        let path = format!("/v1/{key}/x/{token}");
        let redacted = redact(&path);
        assert_eq!(
            redacted,
            format!(
                "/v1/svc_live_…{}/x/svc_scoped_…{}",
                last4(&key),
                last4(&token)
            )
        );
        assert!(!redacted.contains(&key[12..20]));
        // Nothing that looks like a key: borrowed as it is.
        assert!(matches!(redact("/v1/chat/completions"), Cow::Borrowed(_)));
        for kept in [
            "/v1/svc_live_",
            "/v1/svc_live_short",
            "svc_other_1234567890abc",
            "svc_",
        ] {
            assert_eq!(redact(kept), kept);
        }
        // A truncated key is still cut.
        assert_eq!(
            redact(&key[..30]),
            format!("svc_live_…{}", last4(&key[..30]))
        );
    }

    #[test]
    fn keys_are_found_as_whole_words_with_a_valid_checksum() {
        let live = generate(Environment::Live).value;
        let test = generate(Environment::Test).value;
        let text = format!("key={live}, \"{test}\" svc_live_short x{live} {live}x");
        let found: Vec<_> = find_keys(text.as_bytes()).collect();
        assert_eq!(
            found,
            [
                (live.as_str(), Environment::Live),
                (test.as_str(), Environment::Test)
            ]
        );
        assert_eq!(find_keys(b"no keys here").count(), 0);
    }
}
