//! Which Redis the store talks to: the one `store.url` names, or the master that a set of
//! Redis Sentinels names, followed through failovers.
//!
//! With Sentinels, a watcher asks them every second which node is the master. When the answer
//! changes (a failover), the store's connections move to the new master: the shared connection
//! is replaced, blocking readers and the change subscription reconnect. Until a Sentinel has
//! answered once, `store.url`'s own host is used, so a replica starts (not ready) while the
//! Sentinels are down, as it does while Redis is.

use arc_swap::ArcSwap;
use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::sentinel::{SentinelClient, SentinelClientBuilder, SentinelServerType};
use redis::{Client, ConnectionAddr, TlsCertificates};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::watch;

use crate::store::StoreError;

/// How often the Sentinels are asked where the master is.
const SENTINEL_POLL: Duration = Duration::from_secs(1);

/// How often the shared connection is checked with a `PING`.
const HEALTH_CHECK: Duration = Duration::from_secs(1);

/// `PING`s in a row that time out before the shared connection is replaced. A timeout does
/// not make the connection manager reconnect (only a dropped connection does): a socket that
/// stays open and carries nothing (a Redis host gone without a reset, a NAT or proxy that
/// dropped the flow) would otherwise time out every command for as long as the kernel keeps
/// it, or for ever.
const TIMEOUTS_BEFORE_RECONNECT: u32 = 3;

/// The Sentinels that name the store's master.
#[derive(Debug, Clone)]
pub struct Sentinels {
    /// `host:port` of each Sentinel.
    pub addresses: Vec<String>,
    /// The name the Sentinels monitor the master under.
    pub master: String,
    /// `requirepass` of the Sentinels, if they have one.
    pub password: Option<String>,
}

/// One Redis node and the store's shared connection to it.
struct Node {
    client: Client,
    manager: ConnectionManager,
}

impl Node {
    fn new(client: Client) -> Result<Self, StoreError> {
        let config = ConnectionManagerConfig::new()
            .set_connection_timeout(Some(Duration::from_millis(500)))
            .set_response_timeout(Some(Duration::from_millis(500)))
            .set_number_of_retries(1)
            .set_max_delay(Duration::from_secs(2));
        let manager = ConnectionManager::new_lazy_with_config(client.clone(), config)
            .map_err(|e| StoreError::Unavailable(e.to_string()))?;
        Ok(Self { client, manager })
    }
}

/// The node the store uses now, and a signal each time it changes.
pub(super) struct Connections {
    node: ArcSwap<Node>,
    moved: watch::Sender<u64>,
}

impl Connections {
    /// Connections to `client`'s node, for good. Inside a Tokio runtime, a watchdog replaces
    /// the shared connection when it stops answering ([`TIMEOUTS_BEFORE_RECONNECT`]).
    pub fn direct(client: Client) -> Result<Arc<Self>, StoreError> {
        let this = Arc::new(Self {
            node: ArcSwap::from_pointee(Node::new(client)?),
            moved: watch::Sender::new(0),
        });
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            runtime.spawn(watch_health(Arc::downgrade(&this)));
        }
        Ok(this)
    }

    /// Connections to the master `sentinels` name, starting with `client`'s node (`store.url`,
    /// whose credentials, database and TLS the master's connections also use). Must run
    /// inside the Tokio runtime: it starts the watcher.
    pub fn via_sentinels(
        client: Client,
        sentinels: &Sentinels,
        tls: Option<TlsCertificates>,
    ) -> Result<Arc<Self>, StoreError> {
        let sentinel = sentinel_client(&client, sentinels, tls.clone())?;
        let this = Self::direct(client)?;
        tokio::spawn(follow_master(Arc::downgrade(&this), sentinel));
        Ok(this)
    }

    /// The shared connection (multiplexed; reconnects by itself).
    pub fn manager(&self) -> ConnectionManager {
        self.node.load().manager.clone()
    }

    /// A client for connections of their own (blocking reads, subscriptions).
    pub fn client(&self) -> Client {
        self.node.load().client.clone()
    }

    /// Changes each time the master moves: whoever holds a connection of its own reconnects.
    pub fn moved(&self) -> watch::Receiver<u64> {
        self.moved.subscribe()
    }

    /// Where the store's connections go now (`host:port`).
    pub fn address(&self) -> String {
        self.node
            .load()
            .client
            .get_connection_info()
            .addr()
            .to_string()
    }

    fn switch_to(&self, client: Client) -> Result<(), StoreError> {
        self.node.store(Arc::new(Node::new(client)?));
        self.moved.send_modify(|n| *n += 1);
        Ok(())
    }

    /// New connections to the same node: the shared one, and (signalled as a move) every
    /// connection of its own.
    pub fn reconnect(&self) -> Result<(), StoreError> {
        self.switch_to(self.client())
    }
}

/// `PING`s the shared connection every [`HEALTH_CHECK`], and replaces it after
/// [`TIMEOUTS_BEFORE_RECONNECT`] timeouts in a row. Ends with the store.
async fn watch_health(connections: std::sync::Weak<Connections>) {
    let mut timeouts = 0;
    loop {
        tokio::time::sleep(HEALTH_CHECK).await;
        let Some(this) = connections.upgrade() else {
            return;
        };
        let mut conn = this.manager();
        let cmd = redis::cmd("PING");
        let ping = cmd.query_async::<()>(&mut conn);
        timeouts = match tokio::time::timeout(HEALTH_CHECK * 2, ping).await {
            Ok(Err(e)) if e.is_timeout() => timeouts + 1,
            Err(_) => timeouts + 1,
            // Answered, or refused: a connection the manager itself replaces.
            Ok(_) => 0,
        };
        if timeouts >= TIMEOUTS_BEFORE_RECONNECT {
            timeouts = 0;
            tracing::warn!(
                redis = %this.address(),
                "Redis does not answer on its connection; opening new connections"
            );
            if let Err(e) = this.reconnect() {
                tracing::error!(error = %e, "cannot open new Redis connections");
            }
        }
    }
}

/// A Sentinel client that hands out clients for the master with `client`'s settings.
fn sentinel_client(
    client: &Client,
    sentinels: &Sentinels,
    tls: Option<TlsCertificates>,
) -> Result<SentinelClient, StoreError> {
    let bad = |e: redis::RedisError| StoreError::Unavailable(format!("Sentinel settings: {e}"));
    let addresses = sentinels
        .addresses
        .iter()
        .map(|a| sentinel_address(a))
        .collect::<Result<Vec<_>, _>>()
        .map_err(StoreError::Unavailable)?;
    let info = client.get_connection_info();
    let redis = info.redis_settings();
    let mut builder =
        SentinelClientBuilder::new(addresses, &sentinels.master, SentinelServerType::Master)
            .map_err(bad)?
            .set_client_to_redis_db(redis.db())
            .set_client_to_redis_tcp_settings(tcp_settings())
            .set_client_to_sentinel_tcp_settings(tcp_settings());
    if let Some(username) = redis.username() {
        builder = builder.set_client_to_redis_username(username);
    }
    if let Some(password) = redis.password() {
        builder = builder.set_client_to_redis_password(password);
    }
    if let ConnectionAddr::TcpTls { insecure, .. } = info.addr() {
        builder = builder.set_client_to_redis_tls_mode(match insecure {
            true => redis::TlsMode::Insecure,
            false => redis::TlsMode::Secure,
        });
        if let Some(certificates) = tls {
            builder = builder.set_client_to_redis_certificates(certificates);
        }
    }
    if let Some(password) = &sentinels.password {
        builder = builder.set_client_to_sentinel_password(password);
    }
    builder.build().map_err(bad)
}

/// `host:port` of a Sentinel.
pub fn sentinel_address(address: &str) -> Result<ConnectionAddr, String> {
    let (host, port) = address
        .rsplit_once(':')
        .filter(|(host, _)| !host.is_empty())
        .ok_or_else(|| format!("'{address}' is not host:port"))?;
    let port: u16 = port
        .parse()
        .ok()
        .filter(|p| *p != 0)
        .ok_or_else(|| format!("'{address}' has no valid port"))?;
    let host = host.trim_start_matches('[').trim_end_matches(']');
    Ok(ConnectionAddr::Tcp(host.to_string(), port))
}

/// Asks the Sentinels where the master is, every [`SENTINEL_POLL`], and moves the store's
/// connections when it moves. Ends with the store.
async fn follow_master(connections: std::sync::Weak<Connections>, mut sentinel: SentinelClient) {
    let mut unreachable_logged = false;
    loop {
        let Some(this) = connections.upgrade() else {
            return;
        };
        match tokio::time::timeout(SENTINEL_POLL * 2, sentinel.async_get_client()).await {
            Ok(Ok(master)) => {
                unreachable_logged = false;
                let address = master.get_connection_info().addr().to_string();
                tracing::debug!(master = %address, "Sentinel names the Redis master");
                let was = this.address();
                if address != was {
                    // Logged once the connections go there: whoever reads the log then knows
                    // that what the store does next goes to the new master.
                    match this.switch_to(master) {
                        Ok(()) => {
                            tracing::warn!(master = %address, %was, "Redis master moved (Sentinel); the store's connections go there now")
                        }
                        Err(e) => {
                            tracing::error!(error = %e, master = %address, "the Sentinels name a new Redis master that cannot be connected to; trying again")
                        }
                    }
                }
            }
            Ok(Err(e)) if !unreachable_logged => {
                unreachable_logged = true;
                tracing::warn!(error = %e, "no Sentinel names a Redis master; keeping the current one");
            }
            Ok(Err(e)) => tracing::debug!(error = %e, "no Sentinel names a Redis master"),
            Err(_) if !unreachable_logged => {
                unreachable_logged = true;
                tracing::warn!("the Sentinels do not answer; keeping the current Redis master");
            }
            Err(_) => {}
        }
        drop(this);
        tokio::time::sleep(SENTINEL_POLL).await;
    }
}

/// `store.url` read as a client (its host is where a store with Sentinels starts). Its TCP
/// connections probe an idle peer (keepalive) and give up on data not acknowledged within
/// [`TCP_USER_TIMEOUT`]: a connection to a host that is gone fails, and is replaced, in
/// seconds instead of the kernel's ~15 minutes. The change subscription, idle most of the
/// time, relies on this.
pub fn client_for(url: &str, tls: Option<TlsCertificates>) -> Result<Client, StoreError> {
    use redis::IntoConnectionInfo;
    let bad =
        |e: redis::RedisError| StoreError::Unavailable(format!("bad Redis URL or TLS files: {e}"));
    let info = url
        .into_connection_info()
        .map_err(bad)?
        .set_tcp_settings(tcp_settings());
    match tls {
        Some(certificates) => Client::build_with_tls(info, certificates),
        None => Client::open(info),
    }
    .map_err(bad)
}

/// The TCP settings of every connection to Redis and to the Sentinels ([`client_for`]).
fn tcp_settings() -> redis::io::tcp::TcpSettings {
    use redis::io::tcp::{socket2::TcpKeepalive, TcpSettings};
    let keepalive = TcpKeepalive::new()
        .with_time(TCP_KEEPALIVE)
        .with_interval(TCP_KEEPALIVE)
        .with_retries(3);
    TcpSettings::default()
        .set_nodelay(true)
        .set_keepalive(keepalive)
        .set_user_timeout(TCP_USER_TIMEOUT)
}

/// Idle time before a keepalive probe, and between probes.
const TCP_KEEPALIVE: Duration = Duration::from_secs(5);

/// How long sent data may go unacknowledged before the connection fails.
const TCP_USER_TIMEOUT: Duration = Duration::from_secs(10);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sentinel_addresses_are_host_and_port() {
        assert_eq!(
            sentinel_address("10.0.0.1:26379").unwrap(),
            ConnectionAddr::Tcp("10.0.0.1".into(), 26379)
        );
        assert_eq!(
            sentinel_address("redis-sentinel.db.svc:26379").unwrap(),
            ConnectionAddr::Tcp("redis-sentinel.db.svc".into(), 26379)
        );
        assert_eq!(
            sentinel_address("[::1]:26379").unwrap(),
            ConnectionAddr::Tcp("::1".into(), 26379)
        );
        for bad in [
            "",
            "host",
            ":26379",
            "host:",
            "host:0",
            "host:70000",
            "host:x",
        ] {
            assert!(sentinel_address(bad).is_err(), "{bad}");
        }
    }
}
