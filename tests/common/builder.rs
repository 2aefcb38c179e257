//! Builds the configuration of a test gateway and starts it.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use svcgate::config::{Config, StoreKind};

use super::cli::svcgate_command;
use super::gateway::Gateway;
use super::namespace::{redis_url, TestNamespace};
use super::ports::free_ports;
use super::ADMIN_TOKEN;

/// A gateway on the shared Redis, in `namespace`.
pub async fn on_redis(namespace: &TestNamespace) -> Gateway {
    Gateway::builder()
        .redis(&redis_url(), &namespace.name)
        .start()
        .await
}

/// Two gateway replicas sharing one Redis namespace.
pub async fn replicas(namespace: &TestNamespace) -> (Gateway, Gateway) {
    (on_redis(namespace).await, on_redis(namespace).await)
}

/// Builder for a gateway process: a typed [`Config`] that tests change, written as TOML to
/// the file the gateway reads.
pub struct GatewayBuilder {
    config: Config,
    spool_dir: Option<PathBuf>,
    log_filter: Option<String>,
    raw_toml: String,
    no_worker: bool,
    name_server: Option<std::net::IpAddr>,
}

impl Default for GatewayBuilder {
    fn default() -> Self {
        let mut config = Config::default();
        config.server.admin_token = ADMIN_TOKEN.to_string();
        config.server.threads = 2;
        config.server.shutdown_grace_seconds = 0;
        config.server.shutdown_timeout_seconds = 1;
        config.upstream.connect_timeout_ms = 500;
        config.upstream.read_timeout_ms = 3000;
        // Flushes every 20 ms unless the test sets its own interval.
        config.metering.flush_interval_ms = 20;
        Self {
            config,
            spool_dir: None,
            log_filter: None,
            raw_toml: String::new(),
            no_worker: false,
            name_server: None,
        }
    }
}

impl GatewayBuilder {
    /// Use the Redis store at `url` under `namespace`. A shared store needs `upstream.live`:
    /// the simulator, said explicitly, unless the test sets a backend.
    pub fn redis(self, url: &str, namespace: &str) -> Self {
        self.config(|c| {
            c.store.kind = StoreKind::Redis;
            c.store.url = url.to_string();
            c.store.namespace = namespace.to_string();
            c.upstream
                .live
                .get_or_insert_with(|| "simulated".to_string());
        })
    }

    pub fn live(self, addr: SocketAddr) -> Self {
        self.config(|c| c.upstream.live = Some(addr.to_string()))
    }

    pub fn sandbox(self, addr: SocketAddr) -> Self {
        self.config(|c| c.upstream.sandbox = Some(addr.to_string()))
    }

    /// Changes the configuration; the listeners, the upgrade socket and (unless
    /// [`GatewayBuilder::spool_dir`] names one) the spool are the harness's own.
    pub fn config(mut self, change: impl FnOnce(&mut Config)) -> Self {
        change(&mut self.config);
        self
    }

    /// `RUST_LOG` of the gateway (default `info`).
    pub fn log_filter(mut self, filter: &str) -> Self {
        self.log_filter = Some(filter.to_string());
        self
    }

    /// Spool into `dir` (to restart a gateway on the spool of another).
    pub fn spool_dir(mut self, dir: &std::path::Path) -> Self {
        self.spool_dir = Some(dir.to_path_buf());
        self
    }

    /// `serve --no-worker`: no webhook worker in the gateway process.
    pub fn no_worker(mut self) -> Self {
        self.no_worker = true;
        self
    }

    /// Resolve host names through the name server at `addr` (port 53) only: the gateway runs
    /// in a mount namespace of its own, with its own `/etc/resolv.conf` (`unshare`, as root).
    pub fn name_server(mut self, addr: std::net::IpAddr) -> Self {
        self.name_server = Some(addr);
        self
    }

    /// Text appended as it is to the generated TOML: for a file [`Config`] cannot express
    /// (invalid syntax, an unknown key, a table given twice).
    pub fn raw_toml(mut self, text: &str) -> Self {
        self.raw_toml.push_str(text);
        self.raw_toml.push('\n');
        self
    }

    /// Starts the gateway; if a port picked for it was taken meanwhile by another test, starts
    /// it again on fresh ports.
    pub async fn start(self) -> Gateway {
        for _ in 0..3 {
            if let Some(gw) = self.try_start().await {
                return gw;
            }
        }
        panic!("gateway did not start on three sets of ports");
    }

    async fn try_start(&self) -> Option<Gateway> {
        let dir = tempfile::tempdir().unwrap();
        let [listen, admin, metrics] = free_ports();
        let spool_dir = self
            .spool_dir
            .clone()
            .unwrap_or_else(|| dir.path().join("spool"));
        let mut config = self.config.clone();
        config.server.listen = format!("127.0.0.1:{listen}");
        config.server.admin_listen = format!("127.0.0.1:{admin}");
        config.server.metrics_listen = format!("127.0.0.1:{metrics}");
        config.server.upgrade_sock = dir.path().join("upgrade.sock").display().to_string();
        config.metering.spool_dir = spool_dir.display().to_string();
        let config = format!("{}{}", toml::to_string(&config).unwrap(), self.raw_toml);
        let config_path = dir.path().join("svcgate.toml");
        std::fs::write(&config_path, config).unwrap();
        let log_path = dir.path().join("svcgate.log");
        let mut command = match self.name_server {
            None => svcgate_command(),
            Some(addr) => {
                let resolv = dir.path().join("resolv.conf");
                // One try, waited for longer than any timeout of the gateway's own.
                let conf = format!("nameserver {addr}\noptions timeout:30 attempts:1\n");
                std::fs::write(&resolv, conf).unwrap();
                let inner = svcgate_command();
                let mut wrapped = Command::new("unshare");
                wrapped
                    .args(["--mount", "sh", "-c"])
                    .arg(r#"mount --bind "$0" /etc/resolv.conf && exec "$@""#)
                    .arg(&resolv)
                    .arg(inner.get_program());
                for (k, v) in inner.get_envs() {
                    match v {
                        Some(v) => wrapped.env(k, v),
                        None => wrapped.env_remove(k),
                    };
                }
                wrapped
            }
        };
        if let Some(filter) = &self.log_filter {
            command.env("RUST_LOG", filter);
        }
        if self.no_worker {
            command.arg("serve").arg("--no-worker");
        } else {
            command.arg("serve");
        }
        let child = command
            .arg("--config")
            .arg(&config_path)
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log_path).unwrap())
            .spawn()
            .expect("svcgate starts");
        let mut gw = Gateway {
            config_path: config_path.clone(),
            spool_dir,
            child: Some(child),
            base: format!("http://127.0.0.1:{listen}"),
            admin: format!("http://127.0.0.1:{admin}"),
            metrics: format!("http://127.0.0.1:{metrics}"),
            http: reqwest::Client::new(),
            log_path,
            _dir: dir,
        };
        let ready = gw.wait_ready().await;
        ready.then_some(gw)
    }
}
