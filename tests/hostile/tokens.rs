//! Scoped tokens are records in the store, each kept until an hour after it expires: one key
//! mints at most `limits.token_mints_per_minute` of them, each with metadata of at most
//! `limits.token_metadata_bytes`.

use reqwest::Method;
use serde_json::{json, Value};

use super::common::*;

async fn mint(gw: &Gateway, key: &str, body: Value) -> reqwest::Response {
    gw.mint_request(key, body).await
}

#[tokio::test]
async fn a_key_mints_at_most_its_rate_of_tokens_and_then_gets_429() {
    let gw = Gateway::builder()
        .config(|c| c.limits.token_mints_per_minute = 5)
        .start()
        .await;
    let (_, key) = gw
        .create_key("live", &["tokens:create", "models:read"])
        .await;
    let (_, other) = gw
        .create_key("live", &["tokens:create", "models:read"])
        .await;
    let body = json!({"scopes": ["models:read"], "metadata": {"user": "u_1"}});
    for _ in 0..5 {
        assert_eq!(mint(&gw, &key, body.clone()).await.status(), 201);
    }
    let refused = mint(&gw, &key, body.clone()).await;
    assert!(refused.headers().contains_key("retry-after"));
    let error = assert_error(refused, 429, "rate_limit_error").await;
    assert!(
        error["error"]["message"]
            .as_str()
            .unwrap()
            .contains("5 scoped tokens per minute"),
        "{error}"
    );
    // Another key has its own; and the key's requests are not held back by its mints.
    assert_eq!(mint(&gw, &other, body).await.status(), 201);
    let models = gw
        .request(Method::GET, "/v1/models")
        .bearer_auth(&key)
        .send()
        .await
        .unwrap();
    assert_eq!(models.status(), 200);
}

#[tokio::test]
async fn metadata_over_the_cap_is_refused_with_400() {
    let gw = Gateway::builder()
        .config(|c| c.limits.token_metadata_bytes = 64)
        .start()
        .await;
    let (_, key) = gw
        .create_key("live", &["tokens:create", "models:read"])
        .await;
    // `{"u":"…"}` is 8 bytes around its value.
    let fits = json!({"scopes": ["models:read"], "metadata": {"u": "a".repeat(56)}});
    assert_eq!(mint(&gw, &key, fits).await.status(), 201);
    let over = json!({"scopes": ["models:read"], "metadata": {"u": "a".repeat(57)}});
    let error = assert_error(mint(&gw, &key, over).await, 400, "invalid_request_error").await;
    assert_eq!(
        error["error"]["message"],
        "metadata must be at most 64 bytes of JSON"
    );
}

#[tokio::test]
async fn a_tokens_redis_memory_is_its_metadata_and_a_bounded_overhead() {
    let namespace = TestNamespace::new();
    let gw = on_redis(&namespace).await;
    let ws = gw.create_workspace().await;
    let (_, key) = gw
        .create_key_in(&ws, "live", &["tokens:create", "models:read"])
        .await;
    let client = redis::Client::open(redis_url()).unwrap();
    let mut conn = client.get_multiplexed_async_connection().await.unwrap();
    let used = |conn: &mut redis::aio::MultiplexedConnection| {
        let mut conn = conn.clone();
        let patterns = [
            format!("{}:*", namespace.name),
            format!("{{{}}}*", namespace.name),
        ];
        async move {
            let mut keys: Vec<String> = Vec::new();
            for pattern in patterns {
                let found: Vec<String> = redis::cmd("KEYS")
                    .arg(&pattern)
                    .query_async(&mut conn)
                    .await
                    .unwrap();
                keys.extend(found);
            }
            let mut total = 0u64;
            for k in keys {
                let n: Option<u64> = redis::cmd("MEMORY")
                    .arg("USAGE")
                    .arg(&k)
                    .arg("SAMPLES")
                    .arg(0)
                    .query_async(&mut conn)
                    .await
                    .unwrap();
                total += n.unwrap_or(0);
            }
            total
        }
    };
    let before = used(&mut conn).await;
    let tokens = 50u64;
    let metadata = json!({"user": "a".repeat(4096 - 11)});
    assert_eq!(metadata.to_string().len(), 4096);
    for _ in 0..tokens {
        let body = json!({"scopes": ["models:read"], "metadata": metadata});
        assert_eq!(mint(&gw, &key, body).await.status(), 201);
    }
    let per_token = (used(&mut conn).await - before) / tokens;
    // docs/keys.md: `limits.token_metadata_bytes` + 2 KiB at most.
    assert!(per_token <= 4096 + 2048, "{per_token} bytes a token");
}
