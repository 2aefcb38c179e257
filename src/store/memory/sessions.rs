//! Dashboard sessions, sign-in links and sign-in attempt counts in memory.

use super::*;
use crate::dashboard::store::{DashboardSession, SessionStore, SignInLink};

/// The dashboard's records, each with when it expires (unix milliseconds).
#[derive(Default)]
pub(super) struct DashboardState {
    sessions: HashMap<String, (DashboardSession, u64)>,
    links: HashMap<String, (SignInLink, u64)>,
    attempts: HashMap<(String, u64), u64>,
}

impl DashboardState {
    /// Forgets what has expired; called on every write, so the maps stay as small as what is
    /// live.
    fn expire(&mut self, now_ms: u64) {
        self.sessions.retain(|_, (_, until)| *until > now_ms);
        self.links.retain(|_, (_, until)| *until > now_ms);
        let window_floor = now_ms / 1000;
        self.attempts
            .retain(|(_, window_end), _| *window_end > window_floor);
    }
}

#[async_trait]
impl SessionStore for MemoryStore {
    async fn save_session(
        &self,
        digest: &str,
        session: &DashboardSession,
        idle_seconds: u64,
    ) -> Result<(), StoreError> {
        let now = crate::ids::unix_millis();
        let mut inner = self.write();
        inner.dashboard.expire(now);
        inner.dashboard.sessions.insert(
            digest.to_string(),
            (session.clone(), now + idle_seconds * 1000),
        );
        Ok(())
    }

    async fn touch_session(
        &self,
        digest: &str,
        idle_seconds: u64,
    ) -> Result<Option<DashboardSession>, StoreError> {
        let now = crate::ids::unix_millis();
        let mut inner = self.write();
        Ok(match inner.dashboard.sessions.get_mut(digest) {
            Some((session, until)) if *until > now => {
                *until = now + idle_seconds * 1000;
                Some(session.clone())
            }
            _ => None,
        })
    }

    async fn end_session(&self, digest: &str) -> Result<(), StoreError> {
        self.write().dashboard.sessions.remove(digest);
        Ok(())
    }

    async fn save_sign_in_link(
        &self,
        digest: &str,
        link: &SignInLink,
        ttl_seconds: u64,
    ) -> Result<(), StoreError> {
        let now = crate::ids::unix_millis();
        let mut inner = self.write();
        inner.dashboard.expire(now);
        inner
            .dashboard
            .links
            .insert(digest.to_string(), (link.clone(), now + ttl_seconds * 1000));
        Ok(())
    }

    async fn take_sign_in_link(&self, digest: &str) -> Result<Option<SignInLink>, StoreError> {
        let now = crate::ids::unix_millis();
        Ok(match self.write().dashboard.links.remove(digest) {
            Some((link, until)) if until > now => Some(link),
            _ => None,
        })
    }

    async fn count_attempt(&self, bucket: &str, window_seconds: u64) -> Result<u64, StoreError> {
        let now = crate::ids::unix_millis();
        let window = window_seconds.max(1);
        let window_end = (now / 1000 / window + 1) * window;
        let mut inner = self.write();
        inner.dashboard.expire(now);
        let count = inner
            .dashboard
            .attempts
            .entry((bucket.to_string(), window_end))
            .or_default();
        *count += 1;
        Ok(*count)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_link_is_taken_once_and_a_session_ends_when_ended() {
        let store = MemoryStore::new();
        let link = SignInLink {
            email: "a@example.com".into(),
            created_at: 1,
        };
        store.save_sign_in_link("d1", &link, 900).await.unwrap();
        assert_eq!(store.take_sign_in_link("d1").await.unwrap(), Some(link));
        assert_eq!(store.take_sign_in_link("d1").await.unwrap(), None);
        let session = DashboardSession {
            email: None,
            csrf: "c".into(),
            created_at: 1,
        };
        store.save_session("s1", &session, 60).await.unwrap();
        assert_eq!(store.touch_session("s1", 60).await.unwrap(), Some(session));
        store.end_session("s1").await.unwrap();
        assert_eq!(store.touch_session("s1", 60).await.unwrap(), None);
        assert_eq!(store.count_attempt("ip:1", 3600).await.unwrap(), 1);
        assert_eq!(store.count_attempt("ip:1", 3600).await.unwrap(), 2);
        assert_eq!(store.count_attempt("ip:2", 3600).await.unwrap(), 1);
    }
}
