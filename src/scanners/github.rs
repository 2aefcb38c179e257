//! GitHub's secret-scanning partner alerts: the signature check and the answer.
//!
//! GitHub signs each alert with ECDSA P-256 over SHA-256 of the raw body, sends the signature
//! (base64 of its DER form) in `Github-Public-Key-Signature` and the signing key's id in
//! `Github-Public-Key-Identifier`, and publishes its keys as
//! `{"public_keys": [{"key_identifier", "key" (PEM), "is_current"}]}`. The keys are read once
//! and kept; an identifier not among them has them read again, at most once a minute, so a key
//! GitHub adds is picked up and a stream of made-up identifiers costs one fetch a minute.

use base64::Engine;
use p256::ecdsa::signature::Verifier;
use p256::ecdsa::{Signature, VerifyingKey};
use p256::pkcs8::DecodePublicKey;
use serde::Deserialize;
use std::collections::HashMap;
use std::time::{Duration, Instant};

/// Least time between two readings of the key list.
const REFETCH_AFTER: Duration = Duration::from_secs(60);
/// Longest wait for the key list.
const FETCH_TIMEOUT: Duration = Duration::from_secs(10);
/// Most bytes of a key list.
const MAX_KEY_LIST: usize = 256 * 1024;

/// Why an alert's signature was not accepted. None of them says more than the alert's sender
/// already knows.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SignatureError {
    /// No `Github-Public-Key-Identifier` or `Github-Public-Key-Signature`.
    #[error("the alert is not signed (Github-Public-Key-Identifier, Github-Public-Key-Signature)")]
    Unsigned,
    /// The identifier names no key GitHub publishes.
    #[error("the alert is signed with a key that is not GitHub's")]
    UnknownKey,
    /// The signature is not base64 DER, or does not match the body.
    #[error("the alert's signature does not match it")]
    BadSignature,
    /// The key list could not be read: nothing can be checked.
    #[error("GitHub's signing keys cannot be read now; send the alert again later")]
    KeysUnavailable(String),
}

#[derive(Deserialize)]
struct KeyList {
    public_keys: Vec<PublishedKey>,
}

#[derive(Deserialize)]
struct PublishedKey {
    key_identifier: String,
    key: String,
}

#[derive(Default)]
struct Known {
    keys: HashMap<String, VerifyingKey>,
    fetched: Option<Instant>,
}

/// GitHub's signing keys, read from `[scanners] github_keys_url` and kept.
pub struct GithubKeys {
    url: String,
    http: reqwest::Client,
    known: tokio::sync::Mutex<Known>,
}

impl GithubKeys {
    /// Keys to be read from `url`: `https://…`, or `file://…` or a path.
    pub fn new(url: &str) -> Self {
        let http = reqwest::Client::builder()
            .timeout(FETCH_TIMEOUT)
            .user_agent(concat!("svcgate/", env!("CARGO_PKG_VERSION")))
            .build()
            .unwrap_or_default();
        Self {
            url: url.to_string(),
            http,
            known: tokio::sync::Mutex::new(Known::default()),
        }
    }

    /// Checks `signature` (base64 DER) of `body` by the key `identifier`.
    pub async fn verify(
        &self,
        identifier: Option<&str>,
        signature: Option<&str>,
        body: &[u8],
    ) -> Result<(), SignatureError> {
        let (Some(identifier), Some(signature)) = (identifier, signature) else {
            return Err(SignatureError::Unsigned);
        };
        let signature = base64::engine::general_purpose::STANDARD
            .decode(signature.trim())
            .ok()
            .and_then(|der| Signature::from_der(&der).ok())
            .ok_or(SignatureError::BadSignature)?;
        let key = self.key(identifier).await?;
        match key.verify(body, &signature) {
            Ok(()) => Ok(()),
            // The same signature with its `s` in the lower half is just as valid.
            Err(_) => match signature.normalize_s() {
                Some(low) if key.verify(body, &low).is_ok() => Ok(()),
                _ => Err(SignatureError::BadSignature),
            },
        }
    }

    /// The key `identifier`, reading the list again if it is not known and the last reading
    /// is older than [`REFETCH_AFTER`].
    async fn key(&self, identifier: &str) -> Result<VerifyingKey, SignatureError> {
        let mut known = self.known.lock().await;
        if let Some(key) = known.keys.get(identifier) {
            return Ok(*key);
        }
        if known.fetched.is_some_and(|at| at.elapsed() < REFETCH_AFTER) {
            return Err(SignatureError::UnknownKey);
        }
        known.fetched = Some(Instant::now());
        match self.fetch().await {
            Ok(keys) => known.keys = keys,
            Err(why) => {
                tracing::warn!(url = %self.url, error = %why, "GitHub's secret-scanning keys not read");
                // A first reading that failed may be retried at once by the next alert.
                if known.keys.is_empty() {
                    known.fetched = None;
                }
                return Err(SignatureError::KeysUnavailable(why));
            }
        }
        known
            .keys
            .get(identifier)
            .copied()
            .ok_or(SignatureError::UnknownKey)
    }

    async fn fetch(&self) -> Result<HashMap<String, VerifyingKey>, String> {
        let text = match self.url.strip_prefix("file://") {
            Some(path) => read_file(path).await?,
            None if self.url.starts_with('/') => read_file(&self.url).await?,
            None => {
                let resp = self
                    .http
                    .get(&self.url)
                    .header("Accept", "application/json")
                    .send()
                    .await
                    .map_err(|e| format!("cannot fetch: {e}"))?;
                if !resp.status().is_success() {
                    return Err(format!("answered {}", resp.status()));
                }
                let bytes = resp.bytes().await.map_err(|e| e.to_string())?;
                if bytes.len() > MAX_KEY_LIST {
                    return Err("the key list is too large".into());
                }
                String::from_utf8(bytes.to_vec()).map_err(|_| "not UTF-8".to_string())?
            }
        };
        parse_keys(&text)
    }
}

async fn read_file(path: &str) -> Result<String, String> {
    tokio::fs::read_to_string(path)
        .await
        .map_err(|e| format!("cannot read {path}: {e}"))
}

/// The usable keys of a key list; keys that do not parse are skipped.
fn parse_keys(text: &str) -> Result<HashMap<String, VerifyingKey>, String> {
    let list: KeyList = serde_json::from_str(text).map_err(|e| format!("not a key list: {e}"))?;
    let keys: HashMap<_, _> = list
        .public_keys
        .into_iter()
        .filter_map(|k| {
            let key = VerifyingKey::from_public_key_pem(k.key.trim())
                .inspect_err(|_| tracing::warn!(key_identifier = %k.key_identifier, "skipping a GitHub key that is not a P-256 public key"))
                .ok()?;
            Some((k.key_identifier, key))
        })
        .collect();
    if keys.is_empty() {
        return Err("the list holds no P-256 key".into());
    }
    Ok(keys)
}

/// One token in an alert.
#[derive(Debug, Deserialize)]
pub struct AlertToken {
    /// The token as found.
    pub token: String,
    /// GitHub's name of the pattern that matched.
    #[serde(default, rename = "type")]
    pub token_type: String,
    /// Where it was found.
    #[serde(default)]
    pub url: Option<String>,
    /// What GitHub scanned (`content`, `commit`, `issue`, …).
    #[serde(default)]
    pub source: Option<String>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use p256::ecdsa::signature::Signer;
    use p256::ecdsa::SigningKey;
    use p256::pkcs8::{EncodePublicKey, LineEnding};

    fn key_list(pairs: &[(&str, &SigningKey)]) -> String {
        let keys: Vec<_> = pairs
            .iter()
            .map(|(id, k)| {
                let pem = k.verifying_key().to_public_key_pem(LineEnding::LF).unwrap();
                serde_json::json!({"key_identifier": id, "key": pem, "is_current": true})
            })
            .collect();
        serde_json::json!({ "public_keys": keys }).to_string()
    }

    #[tokio::test]
    async fn a_signature_is_checked_against_the_named_key() {
        let github = SigningKey::from_slice(&rand::random::<[u8; 32]>()).unwrap();
        let other = SigningKey::from_slice(&rand::random::<[u8; 32]>()).unwrap();
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("keys.json");
        std::fs::write(&path, key_list(&[("k1", &github)])).unwrap();
        let keys = GithubKeys::new(&format!("file://{}", path.display()));
        let body = br#"[{"token":"x"}]"#;
        let sign = |k: &SigningKey, body: &[u8]| {
            let sig: Signature = k.sign(body);
            base64::engine::general_purpose::STANDARD.encode(sig.to_der().as_bytes())
        };
        let good = sign(&github, body);
        assert_eq!(keys.verify(Some("k1"), Some(&good), body).await, Ok(()));
        assert_eq!(
            keys.verify(Some("k1"), Some(&good), b"[]").await,
            Err(SignatureError::BadSignature)
        );
        assert_eq!(
            keys.verify(Some("k1"), Some(&sign(&other, body)), body)
                .await,
            Err(SignatureError::BadSignature)
        );
        assert_eq!(
            keys.verify(Some("k2"), Some(&good), body).await,
            Err(SignatureError::UnknownKey)
        );
        assert_eq!(
            keys.verify(None, Some(&good), body).await,
            Err(SignatureError::Unsigned)
        );
        assert_eq!(
            keys.verify(Some("k1"), Some("not base64!"), body).await,
            Err(SignatureError::BadSignature)
        );
    }
}
