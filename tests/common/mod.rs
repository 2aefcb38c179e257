//! Test harness: a real `svcgate` process on loopback ports, real backends that record what
//! they receive, and an admin client. Each test starts its own gateway, so tests share nothing.
#![allow(dead_code)]

use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, Method, Uri};
use axum::response::IntoResponse;
use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, DnType, ExtendedKeyUsagePurpose, IsCa,
    KeyPair, KeyUsagePurpose,
};
use serde_json::{json, Value};
use std::net::{SocketAddr, TcpListener};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// The admin token every test gateway uses.
pub const ADMIN_TOKEN: &str = "test-admin-token";
/// The workspace the in-memory store starts with.
pub const DEMO_WS: &str = "ws_demo";

/// A loopback port that was free a moment ago.
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// Distinct loopback ports that were free a moment ago: held together while picked, so two
/// of them can never be the same port.
pub fn free_ports<const N: usize>() -> [u16; N] {
    let held: Vec<TcpListener> = (0..N)
        .map(|_| TcpListener::bind("127.0.0.1:0").unwrap())
        .collect();
    std::array::from_fn(|i| held[i].local_addr().unwrap().port())
}

/// What a backend received.
#[derive(Debug, Clone)]
pub struct Recorded {
    pub method: Method,
    pub path: String,
    pub headers: HeaderMap,
    pub body: Bytes,
}

/// A backend on loopback that answers every request with the same raw bytes, and keeps the
/// first read of each request as it came (its head, for a small request): for what an HTTP
/// library would parse away, such as a header line given twice.
pub struct RawBackend {
    pub addr: SocketAddr,
    seen: Arc<Mutex<Vec<String>>>,
}

impl RawBackend {
    pub async fn start(response: &'static [u8]) -> Self {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let seen = Arc::new(Mutex::new(Vec::new()));
        let kept = seen.clone();
        tokio::spawn(async move {
            use tokio::io::{AsyncReadExt, AsyncWriteExt};
            while let Ok((mut conn, _)) = listener.accept().await {
                let mut buf = vec![0u8; 64 * 1024];
                let n = conn.read(&mut buf).await.unwrap_or(0);
                kept.lock()
                    .unwrap()
                    .push(String::from_utf8_lossy(&buf[..n]).into_owned());
                let _ = conn.write_all(response).await;
            }
        });
        Self { addr, seen }
    }

    /// The requests so far, as they came.
    pub fn requests(&self) -> Vec<String> {
        self.seen.lock().unwrap().clone()
    }
}

/// A backend on loopback that records every request and answers with JSON and a
/// `Service-Credits` header.
pub struct RecordingUpstream {
    pub addr: SocketAddr,
    seen: Arc<Mutex<Vec<Recorded>>>,
    _task: tokio::task::JoinHandle<()>,
}

impl RecordingUpstream {
    pub async fn start(name: &'static str) -> Self {
        let seen: Arc<Mutex<Vec<Recorded>>> = Arc::default();
        let state = (seen.clone(), name);
        let app = axum::Router::new()
            .fallback(
                |State((seen, name)): State<(Arc<Mutex<Vec<Recorded>>>, &'static str)>,
                 method: Method,
                 uri: Uri,
                 headers: HeaderMap,
                 body: Bytes| async move {
                    // A test can ask for a slow answer.
                    if let Some(ms) = headers
                        .get("x-test-delay-ms")
                        .and_then(|v| v.to_str().ok())
                        .and_then(|v| v.parse().ok())
                    {
                        tokio::time::sleep(Duration::from_millis(ms)).await;
                    }
                    seen.lock().unwrap().push(Recorded {
                        method,
                        path: uri.path().to_string(),
                        headers,
                        body,
                    });
                    (
                        [
                            ("content-type", "application/json"),
                            ("service-credits", "0.5"),
                        ],
                        axum::Json(json!({"upstream": name})),
                    )
                        .into_response()
                },
            )
            .with_state(state);
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let task = tokio::spawn(async move {
            axum::serve(listener, app).await.unwrap();
        });
        Self {
            addr,
            seen,
            _task: task,
        }
    }

    /// Everything received so far.
    pub fn requests(&self) -> Vec<Recorded> {
        self.seen.lock().unwrap().clone()
    }
}

/// A backend that accepts connections and closes them without answering.
pub async fn broken_upstream() -> SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            drop(stream);
        }
    });
    addr
}

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

/// `svcgate` with no `SVCGATE_*` variables inherited from the developer's shell.
pub fn svcgate_command() -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_svcgate"));
    for (k, _) in std::env::vars() {
        if k.starts_with("SVCGATE_") {
            cmd.env_remove(k);
        }
    }
    cmd.env("RUST_LOG", "info");
    cmd
}

/// A running gateway process, killed on drop.
pub struct Gateway {
    child: Option<Child>,
    /// Gateway base URL.
    pub base: String,
    /// Admin API base URL.
    pub admin: String,
    /// Metrics base URL.
    pub metrics: String,
    pub http: reqwest::Client,
    log_path: PathBuf,
    /// Where this gateway spools spend and audit records.
    pub spool_dir: PathBuf,
    config_path: PathBuf,
    _dir: tempfile::TempDir,
}

impl Gateway {
    pub fn builder() -> GatewayBuilder {
        GatewayBuilder::default()
    }

    /// Waits until both listeners answer; `false` if the process exited because a port was
    /// taken.
    async fn wait_ready(&mut self) -> bool {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if let Some(child) = self.child.as_mut() {
                if child.try_wait().ok().flatten().is_some() {
                    let log = self.logs();
                    assert!(log.contains("cannot listen"), "gateway exited; log:\n{log}");
                    self.child = None;
                    return false;
                }
            }
            let admin_up = self
                .http
                .get(format!("{}/healthz", self.admin))
                .send()
                .await;
            let gw_up = self.http.get(format!("{}/healthz", self.base)).send().await;
            // The metrics listener is Pingora's service too, and may come up last.
            let metrics_up = self
                .http
                .get(format!("{}/metrics", self.metrics))
                .send()
                .await;
            let up = |r: &reqwest::Result<reqwest::Response>| {
                r.as_ref().is_ok_and(|r| r.status() == 200)
            };
            if up(&admin_up) && up(&gw_up) && up(&metrics_up) {
                return true;
            }
            assert!(
                Instant::now() < deadline,
                "gateway did not start; log:\n{}",
                self.logs()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// A graceful upgrade: starts a new process with `serve -u` on the same config, tells the
    /// old one to hand over its listeners (SIGQUIT), and waits for the old one to exit.
    pub fn upgrade(&mut self) {
        let log = std::fs::OpenOptions::new()
            .append(true)
            .open(&self.log_path)
            .unwrap();
        let new = svcgate_command()
            .args(["serve", "-u", "--config"])
            .arg(&self.config_path)
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("svcgate starts");
        // The old process hands over once the new one waits for the listeners (a SIGQUIT
        // before that is refused, and it serves on): ask until it goes.
        let mut old = self.child.replace(new).unwrap();
        let deadline = Instant::now() + Duration::from_secs(20);
        let mut asked = Instant::now() - Duration::from_secs(1);
        while old.try_wait().unwrap().is_none() {
            assert!(Instant::now() < deadline, "the old process did not exit");
            if asked.elapsed() >= Duration::from_millis(500) {
                Command::new("kill")
                    .args(["-QUIT", &old.id().to_string()])
                    .status()
                    .unwrap();
                asked = Instant::now();
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// The config file this gateway runs on.
    pub fn config_path(&self) -> &std::path::Path {
        &self.config_path
    }

    /// Starts `svcgate worker` on this gateway's config (its metrics on a port of its own).
    pub fn start_worker(&self) -> Worker {
        let log_path = self._dir.path().join(format!("worker-{}.log", free_port()));
        let child = svcgate_command()
            .env(
                "SVCGATE_SERVER_METRICS_LISTEN",
                format!("127.0.0.1:{}", free_port()),
            )
            .args(["worker", "--config"])
            .arg(&self.config_path)
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log_path).unwrap())
            .spawn()
            .expect("svcgate worker starts");
        Worker { child, log_path }
    }

    /// The Prometheus text on the metrics listener now.
    pub async fn metrics_text(&self) -> String {
        self.http
            .get(format!("{}/metrics", self.metrics))
            .send()
            .await
            .unwrap()
            .text()
            .await
            .unwrap()
    }

    /// The process's log output so far.
    pub fn logs(&self) -> String {
        std::fs::read_to_string(&self.log_path).unwrap_or_default()
    }

    /// The child process, for signals.
    pub fn pid(&self) -> u32 {
        self.child.as_ref().unwrap().id()
    }

    /// Waits for the process to exit and returns how long that took.
    pub fn wait_exit(&mut self, limit: Duration) -> Option<(std::process::ExitStatus, Duration)> {
        let started = Instant::now();
        let child = self.child.as_mut().unwrap();
        while started.elapsed() < limit {
            if let Some(status) = child.try_wait().unwrap() {
                return Some((status, started.elapsed()));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        None
    }

    /// A request to the gateway.
    pub fn request(&self, method: reqwest::Method, path: &str) -> reqwest::RequestBuilder {
        self.http.request(method, format!("{}{path}", self.base))
    }

    /// A request to the admin API with the admin token.
    pub fn admin_request(&self, method: reqwest::Method, path: &str) -> reqwest::RequestBuilder {
        self.http
            .request(method, format!("{}{path}", self.admin))
            .bearer_auth(ADMIN_TOKEN)
    }

    /// Creates a key in the demo workspace; returns (id, full key value).
    pub async fn create_key(&self, environment: &str, scopes: &[&str]) -> (String, String) {
        self.create_key_in(DEMO_WS, environment, scopes).await
    }

    /// Publishes an event through the admin API (`POST /admin/v1/events`); returns its id.
    pub async fn publish_event(
        &self,
        workspace: &str,
        event_type: &str,
        environment: &str,
        data: Value,
    ) -> String {
        let resp = self
            .admin_request(Method::POST, "/admin/v1/events")
            .json(
                &json!({"workspace": workspace, "type": event_type, "data": data,
                          "environment": environment}),
            )
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), 202);
        resp.json::<Value>().await.unwrap()["id"]
            .as_str()
            .unwrap()
            .to_string()
    }

    /// Creates a workspace through the admin API and returns its id.
    pub async fn create_workspace(&self) -> String {
        let resp = self
            .admin_request(reqwest::Method::POST, "/admin/v1/workspaces")
            .json(&json!({"name": "Test", "admin_emails": ["ops@example.com"]}))
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), 201);
        let body: Value = resp.json().await.unwrap();
        body["id"].as_str().unwrap().to_string()
    }

    /// Creates a key through the admin API; returns (id, full key value).
    pub async fn create_key_in(
        &self,
        workspace: &str,
        environment: &str,
        scopes: &[&str],
    ) -> (String, String) {
        let resp = self
            .admin_request(reqwest::Method::POST, "/admin/v1/keys")
            .json(&json!({"workspace": workspace, "environment": environment, "scopes": scopes}))
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), 201);
        let body: Value = resp.json().await.unwrap();
        (
            body["id"].as_str().unwrap().to_string(),
            body["key"].as_str().unwrap().to_string(),
        )
    }

    /// Mints a scoped token with `key` (`body` as `POST /v1/tokens` takes it); its value.
    pub async fn mint_token(&self, key: &str, body: Value) -> String {
        let resp = self
            .request(reqwest::Method::POST, "/v1/tokens")
            .bearer_auth(key)
            .json(&body)
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), 201);
        let minted: Value = resp.json().await.unwrap();
        minted["value"].as_str().unwrap().to_string()
    }

    /// `GET` on the admin API, as JSON.
    pub async fn admin_get(&self, path: &str) -> Value {
        self.admin_request(reqwest::Method::GET, path)
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap()
    }

    /// `POST` on the admin API with no body.
    pub async fn admin_post(&self, path: &str) -> reqwest::Response {
        self.admin_request(reqwest::Method::POST, path)
            .send()
            .await
            .unwrap()
    }

    /// The keys of a workspace, as the admin API lists them.
    pub async fn list_keys(&self, workspace: &str) -> Vec<Value> {
        let listed = self
            .admin_get(&format!("/admin/v1/keys?workspace={workspace}"))
            .await;
        listed["data"].as_array().cloned().unwrap_or_default()
    }

    /// Revokes a key through the admin API.
    pub async fn revoke(&self, id: &str) {
        let resp = self
            .admin_request(
                reqwest::Method::POST,
                &format!("/admin/v1/keys/{id}/revoke"),
            )
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), 200);
    }

    /// `POST /v1/chat/completions` with `key`.
    pub async fn chat(&self, key: &str) -> reqwest::Response {
        self.request(reqwest::Method::POST, "/v1/chat/completions")
            .bearer_auth(key)
            .json(&json!({"model": "m1", "messages": [{"role": "user", "content": "hi"}]}))
            .send()
            .await
            .unwrap()
    }
}

impl Drop for Gateway {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
        // A failing test shows what the gateway said (the test harness prints a failing test's
        // output only).
        if std::thread::panicking() {
            let log = std::fs::read_to_string(&self.log_path).unwrap_or_default();
            let lines: Vec<&str> = log.lines().collect();
            let tail = &lines[lines.len().saturating_sub(60)..];
            eprintln!(
                "--- last lines of the gateway's log ---\n{}",
                tail.join("\n")
            );
        }
    }
}

/// Asserts an error answer: status, `error.code`, and a request id equal to the header's.
pub async fn assert_error(resp: reqwest::Response, status: u16, code: &str) -> Value {
    assert_eq!(resp.status().as_u16(), status, "status");
    let header = resp
        .headers()
        .get("service-request-id")
        .expect("Service-Request-Id header")
        .to_str()
        .unwrap()
        .to_string();
    let body: Value = resp.json().await.expect("JSON error body");
    assert_eq!(body["error"]["code"], code, "code in {body}");
    assert!(body["error"]["message"]
        .as_str()
        .is_some_and(|m| !m.is_empty()));
    assert_eq!(body["error"]["request_id"], header.as_str());
    assert!(header.starts_with("req_"));
    body
}

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

/// A `redis-server` of the test's own, so a test can stop and restart it. It listens on a Unix
/// socket in a directory of its own: a TCP port freed by a stop could be taken by another test
/// before the restart.
pub struct RedisServer {
    child: Option<Child>,
    dir: tempfile::TempDir,
}

impl RedisServer {
    pub async fn start() -> Self {
        let mut server = Self {
            child: None,
            dir: tempfile::tempdir().unwrap(),
        };
        server.resume().await;
        server
    }

    pub fn url(&self) -> String {
        format!(
            "redis+unix://{}",
            self.dir.path().join("redis.sock").display()
        )
    }

    /// Sets up (or changes) the ACL user `user`, password `pw`, with `rules` (`ACL SETUSER`);
    /// the URL that connects as it.
    pub async fn set_user(&self, user: &str, rules: &[&str]) -> String {
        let client = redis::Client::open(self.url()).unwrap();
        let mut conn = client.get_multiplexed_async_connection().await.unwrap();
        redis::cmd("ACL")
            .arg(&["SETUSER", user, "on", ">pw"])
            .arg(rules)
            .query_async::<()>(&mut conn)
            .await
            .unwrap();
        format!("{}?user={user}&pass=pw", self.url())
    }

    /// How many times it has run `command` (lower case), from `INFO commandstats`: every
    /// client's, the commands scripts run included.
    pub async fn command_calls(&self, command: &str) -> usize {
        let client = redis::Client::open(self.url()).unwrap();
        let mut conn = client.get_multiplexed_async_connection().await.unwrap();
        let stats: String = redis::cmd("INFO")
            .arg("commandstats")
            .query_async(&mut conn)
            .await
            .unwrap();
        stats
            .lines()
            .find_map(|l| l.strip_prefix(&format!("cmdstat_{command}:calls=")))
            .and_then(|rest| rest.split(',').next())
            .map_or(0, |n| n.parse().unwrap())
    }

    /// Freezes it (`SIGSTOP`): connections stay open and nothing answers, as on a network that
    /// drops packets. [`RedisServer::thaw`] lets it go on.
    pub fn freeze(&self) {
        self.signal("STOP");
    }

    pub fn thaw(&self) {
        self.signal("CONT");
    }

    fn signal(&self, name: &str) {
        let pid = self.child.as_ref().expect("running").id();
        let status = Command::new("kill")
            .args([format!("-{name}"), pid.to_string()])
            .status()
            .unwrap();
        assert!(status.success());
    }

    /// Starts it (again), with the data it had (an RDB dump is kept).
    pub async fn resume(&mut self) {
        assert!(self.child.is_none());
        let child = Command::new("redis-server")
            .args(["--port", "0", "--unixsocket"])
            .arg(self.dir.path().join("redis.sock"))
            .args([
                "--save",
                "",
                "--appendonly",
                "no",
                "--dbfilename",
                "dump.rdb",
            ])
            .arg("--dir")
            .arg(self.dir.path())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("redis-server is installed (.ci/install)");
        self.child = Some(child);
        let client = redis::Client::open(self.url()).unwrap();
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            if let Ok(mut conn) = client.get_multiplexed_async_connection().await {
                if redis::cmd("PING")
                    .query_async::<String>(&mut conn)
                    .await
                    .is_ok()
                {
                    return;
                }
            }
            assert!(Instant::now() < deadline, "redis-server did not start");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Saves its data and stops it (`SHUTDOWN SAVE`: the data is on disk before it exits).
    pub async fn stop(&mut self) {
        let client = redis::Client::open(self.url()).unwrap();
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            if let Ok(mut conn) = client.get_multiplexed_async_connection().await {
                // The connection closes as the server exits, so the reply is an error either way.
                let _: redis::RedisResult<()> = redis::cmd("SHUTDOWN")
                    .arg("SAVE")
                    .query_async(&mut conn)
                    .await;
            }
            let exited = self
                .child
                .as_mut()
                .is_none_or(|c| c.try_wait().ok().flatten().is_some());
            if exited {
                break;
            }
            assert!(Instant::now() < deadline, "redis-server did not shut down");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        self.child = None;
        assert!(
            self.dir.path().join("dump.rdb").exists(),
            "redis-server saved its data"
        );
        let _ = std::fs::remove_file(self.dir.path().join("redis.sock"));
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// A `svcgate worker` process, killed on drop.
pub struct Worker {
    pub child: Child,
    log_path: PathBuf,
}

impl Worker {
    /// SIGKILL: no chance to finish anything.
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    pub fn logs(&self) -> String {
        std::fs::read_to_string(&self.log_path).unwrap_or_default()
    }
}

impl Drop for Worker {
    fn drop(&mut self) {
        self.kill();
    }
}

/// What a webhook receiver does with a request to one path.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reply {
    /// Answer with this status at once.
    Status(u16),
    /// Wait this long, then answer 200.
    Slow(Duration),
    /// Redirect elsewhere (302).
    Redirect,
}

/// One request a receiver got.
#[derive(Debug, Clone)]
pub struct Received {
    pub path: String,
    pub headers: HeaderMap,
    pub body: Bytes,
    pub at: Instant,
}

type Replies = Arc<Mutex<std::collections::HashMap<String, Vec<Reply>>>>;

/// A webhook receiver on loopback that records every request; what it answers is set per path
/// (a queue of replies, the last one repeating; default 200).
pub struct Receiver {
    pub addr: SocketAddr,
    seen: Arc<Mutex<Vec<Received>>>,
    replies: Replies,
    _task: tokio::task::JoinHandle<()>,
}

impl Receiver {
    pub async fn start() -> Self {
        let seen: Arc<Mutex<Vec<Received>>> = Arc::default();
        let replies: Replies = Arc::default();
        let state = (seen.clone(), replies.clone());
        let app = axum::Router::new()
            .fallback(
                |State((seen, replies)): State<(Arc<Mutex<Vec<Received>>>, Replies)>,
                 uri: Uri,
                 headers: HeaderMap,
                 body: Bytes| async move {
                    let path = uri.path().to_string();
                    seen.lock().unwrap().push(Received {
                        path: path.clone(),
                        headers,
                        body,
                        at: Instant::now(),
                    });
                    let reply = {
                        let mut replies = replies.lock().unwrap();
                        match replies.get_mut(&path) {
                            Some(queue) if queue.len() > 1 => queue.remove(0),
                            Some(queue) => queue[0],
                            None => Reply::Status(200),
                        }
                    };
                    match reply {
                        Reply::Status(code) => axum::http::StatusCode::from_u16(code)
                            .unwrap()
                            .into_response(),
                        Reply::Slow(wait) => {
                            tokio::time::sleep(wait).await;
                            axum::http::StatusCode::OK.into_response()
                        }
                        Reply::Redirect => (
                            axum::http::StatusCode::FOUND,
                            [(axum::http::header::LOCATION, "/elsewhere")],
                        )
                            .into_response(),
                    }
                },
            )
            .with_state(state);
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let task = tokio::spawn(async move {
            axum::serve(listener, app).await.unwrap();
        });
        Self {
            addr,
            seen,
            replies,
            _task: task,
        }
    }

    /// The URL of `path` on this receiver.
    pub fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr)
    }

    /// Sets what `path` answers: these replies in turn, the last one repeating.
    pub fn reply(&self, path: &str, replies: &[Reply]) {
        self.replies
            .lock()
            .unwrap()
            .insert(path.to_string(), replies.to_vec());
    }

    /// Requests to `path` so far.
    pub fn received(&self, path: &str) -> Vec<Received> {
        self.seen
            .lock()
            .unwrap()
            .iter()
            .filter(|r| r.path == path)
            .cloned()
            .collect()
    }
}

/// A gateway request with `key` as the bearer, and a JSON body if given.
pub async fn call(
    gw: &Gateway,
    key: &str,
    method: reqwest::Method,
    path: &str,
    body: Option<Value>,
) -> reqwest::Response {
    let mut req = gw.request(method, path).bearer_auth(key);
    if let Some(b) = body {
        req = req.json(&b);
    }
    req.send().await.unwrap()
}

/// Lowercase hex HMAC-SHA256 of `<timestamp>.<body>` keyed with the secret's bytes, computed
/// here, independently of the crate's signing code.
pub fn expected_signature(secret: &str, timestamp: &str, body: &[u8]) -> String {
    use hmac::{Hmac, Mac};
    let mut mac = Hmac::<sha2::Sha256>::new_from_slice(secret.as_bytes()).unwrap();
    mac.update(timestamp.as_bytes());
    mac.update(b".");
    mac.update(body);
    hex::encode(mac.finalize().into_bytes())
}

/// Waits (at most 10 s) until something accepts connections on `127.0.0.1:port`.
pub async fn wait_for_port(port: u16, what: &str) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .is_err()
    {
        assert!(Instant::now() < deadline, "{what} did not start");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Polls `check` until it returns true or `limit` passes; returns how long it took.
pub async fn eventually<F, Fut>(limit: Duration, mut check: F) -> Option<Duration>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let started = Instant::now();
    while started.elapsed() < limit {
        if check().await {
            return Some(started.elapsed());
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    None
}

/// A CA, a server certificate for `localhost` and a client certificate, as PEM files.
pub struct Certificates {
    dir: tempfile::TempDir,
}

impl Certificates {
    pub fn make() -> Self {
        let dir = tempfile::tempdir().unwrap();
        let write = |name: &str, pem: String| std::fs::write(dir.path().join(name), pem).unwrap();

        let mut ca = CertificateParams::new(Vec::<String>::new()).unwrap();
        ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        ca.distinguished_name
            .push(DnType::CommonName, "svcgate test CA");
        ca.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
        let ca = CertifiedIssuer::self_signed(ca, KeyPair::generate().unwrap()).unwrap();
        write("ca.pem", ca.pem());

        for (name, sans, purpose) in [
            (
                "server",
                vec!["localhost".to_string()],
                ExtendedKeyUsagePurpose::ServerAuth,
            ),
            ("client", Vec::new(), ExtendedKeyUsagePurpose::ClientAuth),
        ] {
            let key = KeyPair::generate().unwrap();
            let mut params = CertificateParams::new(sans).unwrap();
            params
                .distinguished_name
                .push(DnType::CommonName, format!("svcgate test {name}"));
            params.extended_key_usages = vec![purpose];
            let cert = params.signed_by(&key, &ca).unwrap();
            write(&format!("{name}.pem"), cert.pem());
            write(&format!("{name}.key"), key.serialize_pem());
        }
        Self { dir }
    }

    pub fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }
}

/// One message an [`SmtpSink`] accepted.
#[derive(Debug, Clone)]
pub struct Mail {
    pub from: String,
    pub to: Vec<String>,
    pub data: String,
}

/// A real SMTP server on loopback (mailin) that keeps every message it accepts.
pub struct SmtpSink {
    pub port: u16,
    mails: Arc<Mutex<Vec<Mail>>>,
    logins: Arc<Mutex<Vec<(String, String)>>>,
}

#[derive(Clone)]
struct SinkHandler {
    mails: Arc<Mutex<Vec<Mail>>>,
    current: Option<Mail>,
    /// `(user, password)` a client must log in with; `None`: no AUTH.
    login: Option<(String, String)>,
    logins: Arc<Mutex<Vec<(String, String)>>>,
}

impl mailin_embedded::Handler for SinkHandler {
    fn auth_plain(
        &mut self,
        _authorization_id: &str,
        user: &str,
        password: &str,
    ) -> mailin_embedded::Response {
        self.logins
            .lock()
            .unwrap()
            .push((user.to_string(), password.to_string()));
        match &self.login {
            Some((u, p)) if u == user && p == password => mailin_embedded::response::AUTH_OK,
            _ => mailin_embedded::response::INVALID_CREDENTIALS,
        }
    }

    fn data_start(
        &mut self,
        _domain: &str,
        from: &str,
        _is8bit: bool,
        to: &[String],
    ) -> mailin_embedded::Response {
        self.current = Some(Mail {
            from: from.to_string(),
            to: to.to_vec(),
            data: String::new(),
        });
        mailin_embedded::response::OK
    }

    fn data(&mut self, buf: &[u8]) -> std::io::Result<()> {
        if let Some(mail) = self.current.as_mut() {
            mail.data.push_str(&String::from_utf8_lossy(buf));
        }
        Ok(())
    }

    fn data_end(&mut self) -> mailin_embedded::Response {
        if let Some(mail) = self.current.take() {
            self.mails.lock().unwrap().push(mail);
        }
        mailin_embedded::response::OK
    }
}

impl SmtpSink {
    /// Plain SMTP, no AUTH: a relay in the cluster.
    pub fn start() -> Self {
        Self::serve(None, None)
    }

    /// STARTTLS with the `server` certificate of `certs`, and AUTH PLAIN (offered only after
    /// STARTTLS) that takes `user` and `password` alone.
    pub fn start_tls(certs: &Certificates, user: &str, password: &str) -> Self {
        Self::serve(
            Some(mailin_embedded::SslConfig::SelfSigned {
                cert_path: certs.path("server.pem").display().to_string(),
                key_path: certs.path("server.key").display().to_string(),
            }),
            Some((user.to_string(), password.to_string())),
        )
    }

    fn serve(ssl: Option<mailin_embedded::SslConfig>, login: Option<(String, String)>) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let mails: Arc<Mutex<Vec<Mail>>> = Arc::default();
        let logins: Arc<Mutex<Vec<(String, String)>>> = Arc::default();
        let requires_login = login.is_some();
        let mut server = mailin_embedded::Server::new(SinkHandler {
            mails: mails.clone(),
            current: None,
            login,
            logins: logins.clone(),
        });
        server.with_num_threads(2).with_tcp_listener(listener);
        if let Some(ssl) = ssl {
            server.with_ssl(ssl).unwrap();
        }
        if requires_login {
            server.with_auth(mailin_embedded::AuthMechanism::Plain);
        }
        std::thread::spawn(move || {
            let _ = server.serve();
        });
        Self {
            port,
            mails,
            logins,
        }
    }

    /// Every `(user, password)` a client tried.
    pub fn logins(&self) -> Vec<(String, String)> {
        self.logins.lock().unwrap().clone()
    }

    pub fn mails(&self) -> Vec<Mail> {
        self.mails.lock().unwrap().clone()
    }
}
