//! Authentication: `Authorization: Bearer <key>` → the key's record.
//!
//! Malformed keys are refused by [`format::parse`](crate::keys::format::parse) without
//! touching the store; well-formed ones are looked up by digest.

use http::HeaderValue;
use std::net::IpAddr;
use std::sync::Arc;

use crate::error::ApiError;
use crate::keys::cache::KeyCache;
use crate::keys::format::{self, MAX_KEY_LEN};
use crate::keys::{CachedKey, KeyFormatError, KeyHash, Rejection};
use crate::metering::usage::KeyBudget;
use crate::shared::bearer::{self, BearerError};
use crate::shared::store::StoreError;

use super::unknown_keys::{LimitReached, Refusal, UnknownKeyLimit};

/// Why a request is not authenticated.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AuthFailure {
    /// No `Authorization` header.
    Missing,
    /// More than one `Authorization` header: which one counts would depend on who reads it.
    Ambiguous,
    /// The header is not `Bearer <token>`.
    Scheme,
    /// The token is not a well-formed key.
    Format(KeyFormatError),
    /// No such key.
    Unknown,
    /// A known key that is not accepted now.
    Rejected(Rejection),
    /// The store could not be asked.
    StoreUnavailable,
    /// The client, or all clients together, presented too many unknown keys this minute, and
    /// this one is not cached ([`UnknownKeyLimit`]).
    TooManyUnknownKeys(Refusal),
}

impl AuthFailure {
    /// A short, stable label for metrics and logs.
    pub fn reason(self) -> &'static str {
        match self {
            Self::Missing => "missing",
            Self::Ambiguous => "ambiguous",
            Self::Scheme => "bad_scheme",
            Self::Format(e) => e.reason(),
            Self::Unknown => "unknown_key",
            Self::Rejected(r) => r.reason(),
            Self::StoreUnavailable => "store_unavailable",
            Self::TooManyUnknownKeys(r) => match r.reached {
                LimitReached::Client => "unknown_key_limit",
                LimitReached::AllClients => "unknown_key_limit_all_clients",
            },
        }
    }
}

impl From<AuthFailure> for ApiError {
    fn from(f: AuthFailure) -> Self {
        let message = match f {
            AuthFailure::Missing => {
                "missing Authorization header; send 'Authorization: Bearer <API key>'"
            }
            AuthFailure::Ambiguous => "send one Authorization header, not several",
            AuthFailure::Scheme => "the Authorization header must be 'Bearer <API key>'",
            AuthFailure::Format(_) => "malformed API key",
            AuthFailure::Unknown => "invalid API key",
            AuthFailure::Rejected(Rejection::Revoked) => "this API key has been revoked",
            AuthFailure::Rejected(Rejection::KeyExpired) => "this API key has expired",
            AuthFailure::Rejected(Rejection::GraceExpired) => {
                "this API key was rotated and its grace period has ended"
            }
            AuthFailure::Rejected(Rejection::Expired) => "this scoped token has expired",
            AuthFailure::Rejected(Rejection::ParentInvalid) => {
                "the key this scoped token was minted from is no longer valid"
            }
            AuthFailure::StoreUnavailable => {
                return ApiError::ServiceUnavailable(
                    "the key store is unreachable; retry shortly".into(),
                )
            }
            AuthFailure::TooManyUnknownKeys(refusal) => {
                let message = match refusal.reached {
                    LimitReached::Client => "too many invalid API keys from this address",
                    LimitReached::AllClients => {
                        "too many invalid API keys are being presented to this gateway"
                    }
                };
                return ApiError::RateLimited {
                    message: format!("{message}; retry later").into(),
                    retry_after_secs: refusal.retry_after_secs,
                };
            }
        };
        ApiError::Authentication(message.into())
    }
}

impl From<BearerError> for AuthFailure {
    fn from(e: BearerError) -> Self {
        match e {
            BearerError::Missing => Self::Missing,
            BearerError::Ambiguous => Self::Ambiguous,
            BearerError::Scheme => Self::Scheme,
        }
    }
}

/// The request's one `Authorization` header, if it has one ([`bearer::authorization`]).
pub fn authorization(headers: &http::HeaderMap) -> Result<Option<&HeaderValue>, AuthFailure> {
    Ok(bearer::authorization(headers)?)
}

/// The credential of a `Bearer` header ([`bearer::bearer_credential`]).
pub fn bearer_credential(header: Option<&HeaderValue>) -> Result<&[u8], AuthFailure> {
    Ok(bearer::bearer_credential(header)?)
}

/// The API key or token of a `Bearer` header ([`bearer_credential`]), if it can be one.
pub fn bearer_token(header: Option<&HeaderValue>) -> Result<&str, AuthFailure> {
    let token = bearer_credential(header)?;
    if token.len() > MAX_KEY_LEN {
        return Err(AuthFailure::Format(KeyFormatError::Length));
    }
    std::str::from_utf8(token).map_err(|_| AuthFailure::Format(KeyFormatError::Charset))
}

/// Resolves bearer tokens to key records, through the key cache.
pub struct Authenticator {
    keys: Arc<KeyCache>,
    unknown: UnknownKeyLimit,
}

impl Authenticator {
    /// An authenticator reading from `keys`, with no limit on unknown keys.
    pub fn new(keys: Arc<KeyCache>) -> Self {
        Self {
            keys,
            unknown: UnknownKeyLimit::new(u32::MAX, u32::MAX),
        }
    }

    /// Lets a client present at most `per_minute` keys that do not exist, and all clients
    /// together `total_per_minute` ([`UnknownKeyLimit`]).
    pub fn with_unknown_key_limit(self, per_minute: u32, total_per_minute: u32) -> Self {
        Self {
            unknown: UnknownKeyLimit::new(per_minute, total_per_minute),
            ..self
        }
    }

    /// Applies every key change the store has logged so far, without waiting for its
    /// notification (one store round trip).
    pub async fn catch_up(&self) -> Result<(), StoreError> {
        self.keys.sync().await
    }

    /// Whether cached keys may still be trusted (the last sync is within the staleness bound).
    pub fn keys_are_fresh(&self) -> bool {
        self.keys.is_fresh()
    }

    /// Authenticates one request's `Authorization` header at unix second `now`, from the
    /// client at the address `client` tells (asked only if the key is not cached).
    pub async fn authenticate(
        &self,
        header: Option<&HeaderValue>,
        now: u64,
        client: impl FnOnce() -> Option<IpAddr>,
    ) -> Result<Authenticated, AuthFailure> {
        self.authenticate_or_name(header, now, client)
            .await
            .map_err(|(failure, _)| failure)
    }

    /// [`authenticate`](Self::authenticate); a refusal of a key that exists (revoked, past
    /// its grace period, expired, its parent gone) comes with the key, for the audit log.
    pub async fn authenticate_or_name(
        &self,
        header: Option<&HeaderValue>,
        now: u64,
        client: impl FnOnce() -> Option<IpAddr>,
    ) -> Result<Authenticated, (AuthFailure, Option<Arc<CachedKey>>)> {
        let token = bearer_token(header).map_err(|f| (f, None))?;
        format::parse(token).map_err(|e| (AuthFailure::Format(e), None))?;
        let hash = KeyHash::of(token);
        // Found by digest: the map compares digests, never the key itself, and a digest
        // reveals nothing of the key.
        let found = match self.keys.cached(&hash) {
            Some((record, outcome)) => {
                crate::metrics::record_key_lookup(outcome);
                record
            }
            None => Box::pin(self.fetch(&hash, now, client()))
                .await
                .map_err(|f| (f, None))?,
        };
        let record = found.ok_or((AuthFailure::Unknown, None))?;
        if let Err(rejection) = record.check_usable(now) {
            return Err((AuthFailure::Rejected(rejection), Some(record)));
        }
        if let Some(grant) = &record.scoped {
            // A scoped token lives only as long as its parent: revoked, past grace or gone,
            // and the token goes with it. The parent is almost always cached.
            let parent_invalid = AuthFailure::Rejected(Rejection::ParentInvalid);
            let parent = match self.lookup(&grant.parent_hash).await {
                Ok(Some(parent)) if parent.check_usable(now).is_ok() => parent,
                Ok(_) => return Err((parent_invalid, Some(record))),
                Err(failure) => return Err((failure, None)),
            };
            return Ok(Authenticated {
                key: record,
                hash,
                parent: Some(parent),
            });
        }
        Ok(Authenticated {
            key: record,
            hash,
            parent: None,
        })
    }

    /// Asks the store for a key that is not cached. One the key directory lists is read at
    /// once; any other only if `client` has not presented its share of unknown keys this
    /// minute, and counts against it if the store does not know it either.
    async fn fetch(
        &self,
        hash: &KeyHash,
        now: u64,
        client: Option<IpAddr>,
    ) -> Result<Option<Arc<CachedKey>>, AuthFailure> {
        let reservation = if self.keys.listed(hash, now) {
            None
        } else {
            let reserved = self.unknown.reserve(client, now);
            Some(reserved.map_err(AuthFailure::TooManyUnknownKeys)?)
        };
        let fetched = self.keys.fetch(hash).await;
        if let Some(reservation) = reservation {
            if !matches!(fetched, Ok((None, _))) {
                self.unknown.give_back(reservation);
            }
        }
        let (record, outcome) = fetched.map_err(|_| AuthFailure::StoreUnavailable)?;
        crate::metrics::record_key_lookup(outcome);
        Ok(record)
    }

    async fn lookup(&self, hash: &KeyHash) -> Result<Option<Arc<CachedKey>>, AuthFailure> {
        let (record, outcome) = self
            .keys
            .get(hash)
            .await
            .map_err(|_| AuthFailure::StoreUnavailable)?;
        crate::metrics::record_key_lookup(outcome);
        Ok(record)
    }
}

/// An authenticated caller.
#[derive(Debug, Clone)]
pub struct Authenticated {
    /// The key or scoped token presented.
    pub key: Arc<CachedKey>,
    /// Its digest.
    pub hash: KeyHash,
    /// For a scoped token, its parent key as it is now.
    pub parent: Option<Arc<CachedKey>>,
}

impl Authenticated {
    /// Whether the caller may use `scope`: a scoped token needs it granted and still held by
    /// its parent (a parent's scopes can shrink after minting).
    pub fn allows(&self, scope: &str) -> bool {
        self.key.scopes.allows(scope) && self.parent.as_ref().is_none_or(|p| p.scopes.allows(scope))
    }

    /// The key billed: the parent, for a scoped token. Its rate limit and metadata are the
    /// token's too.
    pub fn billed(&self) -> &Arc<CachedKey> {
        self.parent.as_ref().unwrap_or(&self.key)
    }

    /// The monthly budget of the key billed: a scoped token has none of its own, and spends
    /// its parent's.
    pub fn monthly_budget(&self) -> Option<KeyBudget<'_>> {
        KeyBudget::of(self.parent.as_ref().unwrap_or(&self.key))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hv(s: &[u8]) -> HeaderValue {
        HeaderValue::from_bytes(s).unwrap()
    }

    #[test]
    fn bearer_parsing_follows_the_rfcs() {
        assert_eq!(bearer_token(None), Err(AuthFailure::Missing));
        for bad in [
            b"".as_slice(),
            b"Bearer",
            b"Bearer ",
            b"Bearer   ",
            b"Bearerabc",
            b"Bearer\tabc",
            b"Basic abc",
            b"Bearer-abc",
        ] {
            let shown = String::from_utf8_lossy(bad).into_owned();
            assert_eq!(
                bearer_token(Some(&hv(bad))),
                Err(AuthFailure::Scheme),
                "{shown}"
            );
        }
        for good in [
            b"Bearer abc".as_slice(),
            b"bearer abc",
            b"BEARER abc",
            b"Bearer  abc",
        ] {
            let shown = String::from_utf8_lossy(good).into_owned();
            assert_eq!(bearer_token(Some(&hv(good))), Ok("abc"), "{shown}");
        }
        assert_eq!(
            bearer_token(Some(&hv(
                &[b"Bearer svc_live_".as_slice(), &[0xE9]].concat()
            ))),
            Err(AuthFailure::Format(KeyFormatError::Charset))
        );
        let long = format!("Bearer {}", "a".repeat(8192));
        assert_eq!(
            bearer_token(Some(&hv(long.as_bytes()))),
            Err(AuthFailure::Format(KeyFormatError::Length))
        );
    }

    #[test]
    fn failures_map_to_401_or_503() {
        for f in [
            AuthFailure::Missing,
            AuthFailure::Scheme,
            AuthFailure::Format(KeyFormatError::Checksum),
            AuthFailure::Unknown,
            AuthFailure::Rejected(Rejection::Revoked),
            AuthFailure::Rejected(Rejection::GraceExpired),
        ] {
            assert_eq!(ApiError::from(f).status(), 401, "{f:?}");
        }
        assert_eq!(ApiError::from(AuthFailure::StoreUnavailable).status(), 503);
    }
}
