//! Builds the configuration of a test gateway and starts it.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::{Command, Stdio};

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

/// Builder for a gateway process.
#[derive(Default)]
pub struct GatewayBuilder {
    live: Option<SocketAddr>,
    sandbox: Option<SocketAddr>,
    redis: Option<(String, String)>,
    store_toml: String,
    metering_toml: String,
    spool_dir: Option<PathBuf>,
    server_toml: String,
    log_filter: Option<String>,
    extra_toml: String,
    no_worker: bool,
    name_server: Option<std::net::IpAddr>,
}

impl GatewayBuilder {
    /// Use the Redis store at `url` under `namespace`.
    pub fn redis(mut self, url: &str, namespace: &str) -> Self {
        self.redis = Some((url.to_string(), namespace.to_string()));
        self
    }

    pub fn live(mut self, addr: SocketAddr) -> Self {
        self.live = Some(addr);
        self
    }

    pub fn sandbox(mut self, addr: SocketAddr) -> Self {
        self.sandbox = Some(addr);
        self
    }

    /// Extra `[store]` keys (with the Redis store).
    pub fn store_settings(mut self, toml: &str) -> Self {
        self.store_toml.push_str(toml);
        self.store_toml.push('\n');
        self
    }

    /// Extra `[server]` keys (they override the harness's).
    pub fn server(mut self, toml: &str) -> Self {
        self.server_toml.push_str(toml);
        self.server_toml.push('\n');
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

    /// Extra `[metering]` keys.
    pub fn metering(mut self, toml: &str) -> Self {
        self.metering_toml.push_str(toml);
        self.metering_toml.push('\n');
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

    /// Extra TOML appended to the generated config (whole sections).
    pub fn toml(mut self, extra: &str) -> Self {
        self.extra_toml.push_str(extra);
        self.extra_toml.push('\n');
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
        let mut upstream =
            String::from("[upstream]\nconnect_timeout_ms = 500\nread_timeout_ms = 3000\n");
        if let Some(a) = self.live {
            upstream.push_str(&format!("live = \"{a}\"\n"));
        }
        if let Some(a) = self.sandbox {
            upstream.push_str(&format!("sandbox = \"{a}\"\n"));
        }
        let store = match &self.redis {
            Some((url, ns)) => format!(
                "[store]\nkind = \"redis\"\nurl = \"{url}\"\nnamespace = \"{ns}\"\n{}\n",
                self.store_toml
            ),
            None => String::new(),
        };
        let spool_dir = self
            .spool_dir
            .clone()
            .unwrap_or_else(|| dir.path().join("spool"));
        // Flushes every 20 ms unless the test sets its own interval.
        let interval = match self.metering_toml.contains("flush_interval_ms") {
            true => "",
            false => "flush_interval_ms = 20\n",
        };
        let metering = format!(
            "[metering]\n{interval}spool_dir = \"{}\"\n{}\n",
            spool_dir.display(),
            self.metering_toml
        );
        let mut server: toml::Table = format!(
            "listen = \"127.0.0.1:{listen}\"\nadmin_listen = \"127.0.0.1:{admin}\"\n\
             metrics_listen = \"127.0.0.1:{metrics}\"\nadmin_token = \"{ADMIN_TOKEN}\"\n\
             threads = 2\nshutdown_grace_seconds = 0\nshutdown_timeout_seconds = 1\n\
             upgrade_sock = \"{sock}\"\n",
            sock = dir.path().join("upgrade.sock").display(),
        )
        .parse()
        .unwrap();
        let overrides: toml::Table = self.server_toml.parse().unwrap();
        server.extend(overrides);
        let config = format!(
            "{store}{metering}[server]\n{server}{upstream}{extra}",
            extra = self.extra_toml,
        );
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
