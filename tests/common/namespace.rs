//! The shared Redis, and a namespace of its own for each test.

/// The Redis the tests use (`REDIS_URL`, default the local one).
pub fn redis_url() -> String {
    std::env::var("REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379".to_string())
}

/// A namespace of its own for one test, removed from Redis when dropped.
pub struct TestNamespace {
    pub name: String,
}

impl TestNamespace {
    pub fn new() -> Self {
        Self {
            name: format!("test-{}", svcgate::ids::new_id("ns")),
        }
    }

    /// Every entry of the namespace's event log, oldest first.
    pub async fn logged_events(&self) -> Vec<redis::streams::StreamId> {
        let client = redis::Client::open(redis_url()).unwrap();
        let mut conn = client.get_multiplexed_async_connection().await.unwrap();
        let entries: redis::streams::StreamRangeReply = redis::cmd("XRANGE")
            .arg(format!("{{{}}}:events", self.name))
            .arg("-")
            .arg("+")
            .query_async(&mut conn)
            .await
            .unwrap();
        entries.ids
    }
}

impl Drop for TestNamespace {
    fn drop(&mut self) {
        let Ok(client) = redis::Client::open(redis_url()) else {
            return;
        };
        let Ok(mut conn) = client.get_connection() else {
            return;
        };
        for pattern in [format!("{}:*", self.name), format!("{{{}}}*", self.name)] {
            let keys: Vec<String> = redis::cmd("KEYS")
                .arg(&pattern)
                .query(&mut conn)
                .unwrap_or_default();
            if !keys.is_empty() {
                let _: redis::RedisResult<()> = redis::cmd("DEL").arg(keys).query(&mut conn);
            }
        }
    }
}
