//! Dashboard sessions, sign-in links and sign-in attempt counts in Redis: plain strings with a
//! TTL, each read or written in one round trip.

use async_trait::async_trait;
use redis::AsyncCommands;

use super::*;
use crate::dashboard::store::{DashboardSession, SessionStore, SignInLink};

impl RedisStore {
    fn session_key(&self, digest: &str) -> String {
        format!("{}:dash:session:{digest}", self.prefix())
    }
    fn link_key(&self, digest: &str) -> String {
        format!("{}:dash:link:{digest}", self.prefix())
    }
    fn attempts_key(&self, bucket: &str, window_end: u64) -> String {
        format!("{}:dash:tries:{bucket}:{window_end}", self.prefix())
    }
}

#[async_trait]
impl SessionStore for RedisStore {
    async fn save_session(
        &self,
        digest: &str,
        session: &DashboardSession,
        idle_seconds: u64,
    ) -> Result<(), StoreError> {
        self.conn()
            .set_ex::<_, _, ()>(self.session_key(digest), encode(session), idle_seconds)
            .await
            .map_err(unavailable)
    }

    async fn touch_session(
        &self,
        digest: &str,
        idle_seconds: u64,
    ) -> Result<Option<DashboardSession>, StoreError> {
        let key = self.session_key(digest);
        let raw: Option<String> = self
            .conn()
            .get_ex(&key, redis::Expiry::EX(idle_seconds))
            .await
            .map_err(unavailable)?;
        raw.map(|s| decode(&key, &s)).transpose()
    }

    async fn end_session(&self, digest: &str) -> Result<(), StoreError> {
        self.conn()
            .del::<_, ()>(self.session_key(digest))
            .await
            .map_err(unavailable)
    }

    async fn save_sign_in_link(
        &self,
        digest: &str,
        link: &SignInLink,
        ttl_seconds: u64,
    ) -> Result<(), StoreError> {
        self.conn()
            .set_ex::<_, _, ()>(self.link_key(digest), encode(link), ttl_seconds)
            .await
            .map_err(unavailable)
    }

    async fn take_sign_in_link(&self, digest: &str) -> Result<Option<SignInLink>, StoreError> {
        // GETDEL: of two requests with the same link, one gets it.
        let key = self.link_key(digest);
        let raw: Option<String> = self.conn().get_del(&key).await.map_err(unavailable)?;
        raw.map(|s| decode(&key, &s)).transpose()
    }

    async fn count_attempt(&self, bucket: &str, window_seconds: u64) -> Result<u64, StoreError> {
        let window = window_seconds.max(1);
        let window_end = (crate::ids::unix_now() / window + 1) * window;
        let key = self.attempts_key(bucket, window_end);
        let (count,): (u64,) = redis::pipe()
            .atomic()
            .incr(&key, 1)
            .expire(&key, window as i64)
            .ignore()
            .query_async(&mut self.conn())
            .await
            .map_err(unavailable)?;
        Ok(count)
    }
}
