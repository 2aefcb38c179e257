//! A fast model backend for load tests: answers every request with a small chat-completion
//! JSON body and `Service-Credits: 0.001`.
//!
//! ```sh
//! cargo run --release --example upstream -- 127.0.0.1:9000
//! curl -s localhost:9000/v1/chat/completions -d '{}'
//! ```

use axum::response::IntoResponse;

const BODY: &str = r#"{"id":"chatcmpl_load","object":"chat.completion","model":"load-1","choices":[{"index":0,"message":{"role":"assistant","content":"ok"},"finish_reason":"stop"}],"usage":{"prompt_tokens":1,"completion_tokens":1,"total_tokens":2}}"#;

#[tokio::main]
async fn main() {
    let addr = std::env::args()
        .nth(1)
        .unwrap_or_else(|| "127.0.0.1:9000".into());
    // The body is read, as a real backend does: a backend that leaves it unread makes hyper
    // close the connection, and every proxied request would pay for a new one.
    let app = axum::Router::new().fallback(|_body: axum::body::Bytes| async {
        (
            [
                ("content-type", "application/json"),
                ("service-credits", "0.001"),
            ],
            BODY,
        )
            .into_response()
    });
    let listener = tokio::net::TcpListener::bind(&addr).await.expect("bind");
    axum::serve(listener, app).await.expect("serve");
}
