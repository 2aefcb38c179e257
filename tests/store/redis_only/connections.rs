//! Redis connections and subscriptions that stop answering are replaced.

use super::*;

/// Carries bytes from `from` to `to` until `frozen`; notes in `subscriber` a `SUBSCRIBE` sent.
async fn pump(
    mut from: impl tokio::io::AsyncRead + Unpin,
    mut to: impl tokio::io::AsyncWrite + Unpin,
    frozen: Arc<std::sync::atomic::AtomicBool>,
    subscriber: Option<Arc<std::sync::atomic::AtomicBool>>,
) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut buf = vec![0; 16 * 1024];
    loop {
        let n = match from.read(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(n) => n,
        };
        if let Some(subscriber) = &subscriber {
            if buf[..n]
                .windows(9)
                .any(|w| w.eq_ignore_ascii_case(b"SUBSCRIBE"))
            {
                subscriber.store(true, std::sync::atomic::Ordering::SeqCst);
            }
        }
        if frozen.load(std::sync::atomic::Ordering::SeqCst) {
            // Holds both sockets open, and forwards nothing.
            std::future::pending::<()>().await;
        }
        if to.write_all(&buf[..n]).await.is_err() {
            return;
        }
    }
}

impl FreezingRelay {
    async fn start(redis: &RedisServer) -> Self {
        let socket = redis
            .url()
            .strip_prefix("redis+unix://")
            .unwrap()
            .to_string();
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let connections: Arc<std::sync::Mutex<Vec<_>>> = Arc::default();
        let registry = connections.clone();
        tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let Ok(server) = tokio::net::UnixStream::connect(&socket).await else {
                    continue;
                };
                let connection = RelayedConnection::default();
                registry.lock().unwrap().push(connection.clone());
                let (client_read, client_write) = client.into_split();
                let (server_read, server_write) = server.into_split();
                tokio::spawn(pump(
                    client_read,
                    server_write,
                    connection.frozen.clone(),
                    Some(connection.subscriber),
                ));
                tokio::spawn(pump(server_read, client_write, connection.frozen, None));
            }
        });
        Self { addr, connections }
    }

    /// Every connection made so far carries nothing more; new ones work.
    fn freeze_existing(&self) {
        self.freeze(|_| true);
    }

    /// The subscriptions made so far carry nothing more; the other connections work.
    fn freeze_subscribers(&self) {
        self.freeze(|c| c.subscriber.load(std::sync::atomic::Ordering::SeqCst));
    }

    fn freeze(&self, which: impl Fn(&RelayedConnection) -> bool) {
        for connection in self.connections.lock().unwrap().iter().filter(|c| which(c)) {
            connection
                .frozen
                .store(true, std::sync::atomic::Ordering::SeqCst);
        }
    }
}

/// One connection through a [`FreezingRelay`].
#[derive(Clone, Default)]
struct RelayedConnection {
    frozen: Arc<std::sync::atomic::AtomicBool>,
    /// It has sent `SUBSCRIBE`.
    subscriber: Arc<std::sync::atomic::AtomicBool>,
}

/// A TCP relay to a Redis that can stop carrying the connections it has, keeping their
/// sockets open, while it carries new ones: a Redis host gone without a reset, or a NAT or
/// proxy that dropped the flow.
struct FreezingRelay {
    addr: std::net::SocketAddr,
    connections: Arc<std::sync::Mutex<Vec<RelayedConnection>>>,
}

/// A command that times out leaves the connection manager's socket in place: without a
/// watchdog, every command on it would time out for as long as the socket stays open.
#[tokio::test]
async fn redis_a_connection_that_stops_answering_is_replaced() {
    let redis = RedisServer::start().await;
    let relay = FreezingRelay::start(&redis).await;
    let store = RedisStore::connect(&format!("redis://{}", relay.addr), "frozen").unwrap();
    store.ping().await.expect("Redis answers through the relay");
    relay.freeze_existing();
    assert!(
        store.ping().await.is_err(),
        "the frozen connection times out"
    );
    eventually(Duration::from_secs(15), || async {
        store.ping().await.is_ok()
    })
    .await
    .expect("a new connection answers");
}

/// A subscription whose connection stays open and carries nothing (a NAT or proxy that dropped
/// the flow, while the store's other connections work) is noticed by its PING, and opened anew:
/// changes reach the key cache at once again, not only from its poll.
#[tokio::test]
async fn redis_a_subscription_that_stops_answering_is_replaced() {
    let redis = RedisServer::start().await;
    let relay = FreezingRelay::start(&redis).await;
    let store = RedisStore::connect(&format!("redis://{}", relay.addr), "silent").unwrap();
    let signal = store.key_change_signal();
    tokio::time::timeout(Duration::from_secs(5), signal.notified())
        .await
        .expect("subscribed");
    relay.freeze_subscribers();
    // Changes go on through the store's own connection, and are published.
    let ws = new_id("ws");
    let writes = async {
        loop {
            store.insert_key(&key(&ws, 1)).await.unwrap();
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    };
    tokio::select! {
        _ = writes => unreachable!(),
        _ = signal.notified() => {}
        _ = tokio::time::sleep(Duration::from_secs(15)) => {
            panic!("the silent subscription was never replaced");
        }
    }
    assert!(
        relay.connections.lock().unwrap().len() >= 3,
        "a new subscription was opened"
    );
}
