//! Wiring: builds the store, the gateway, the admin API and the metrics listener from a
//! validated [`Config`] and runs them in one Pingora server until SIGTERM / SIGINT.

use pingora::server::configuration::{Opt, ServerConf};
use pingora::server::{RunArgs, Server};
use pingora::services::background::background_service;
use std::net::TcpListener;
use std::sync::Arc;

use crate::admin::{self, AdminState};
use crate::config::{Config, StoreKind, DEMO_ADMIN_TOKEN};
use crate::dashboard;
use crate::keys::cache::KeyCache;
use crate::metering::Meter;
use crate::metrics;
use crate::proxy::client_ip::TrustedProxies;
use crate::proxy::cors::Cors;
use crate::proxy::routes::RouteTable;
use crate::proxy::upstream::Upstreams;
use crate::proxy::Gateway;
use crate::scanners::Scanners;
use crate::shared::mail::Mailer;
use crate::shared::router_service::RouterService;
use crate::shutdown::{Draining, DrainingSignalWatch};
use crate::store::{MemoryStore, RedisStore, StoreError, StoreHealth, Stores, WorkerStores};
use crate::telemetry::Tracing;
use crate::webhooks::{Worker, WorkerSettings};

/// Why the server could not start.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    /// A listener address is taken or not ours to bind.
    #[error("cannot listen on {addr} ({key}): {source}")]
    Bind {
        /// The config key of the listener.
        key: &'static str,
        /// The address.
        addr: String,
        /// Why.
        source: std::io::Error,
    },
    /// Part of the configuration could not be turned into a running component.
    #[error("invalid configuration: {0}")]
    Config(String),
    /// The store holds data this build cannot use (a newer version wrote it).
    #[error("cannot use the store: {0}")]
    Store(String),
}

/// Options of `svcgate serve` that are not configuration.
#[derive(Debug, Default, Clone)]
pub struct ServeOptions {
    /// Take the listeners over from a running svcgate (graceful upgrade).
    pub upgrade: bool,
    /// Run no webhook worker in this process (`--no-worker`).
    pub no_worker: bool,
}

/// How much lower the store runtime's threads run than the request workers (added to their
/// nice value): their batched work can wait, and at equal priority it delayed queued requests.
/// Weight 110 against 1,024 still leaves them a tenth of a busy core, twice their need.
const STORE_NICENESS: i32 = 10;

/// Lowers the calling thread's priority by [`STORE_NICENESS`] (on Linux the nice value is a
/// thread's own, so the request workers keep theirs). Where that fails, the thread runs at the
/// workers' priority.
fn run_behind_requests() {
    #[cfg(target_os = "linux")]
    {
        use rustix::process::{getpriority_process, setpriority_process};
        let tid = Some(rustix::thread::gettid());
        let lowered = getpriority_process(tid)
            .and_then(|nice| setpriority_process(tid, (nice + STORE_NICENESS).min(19)));
        if let Err(e) = lowered {
            tracing::debug!(error = %e, "cannot lower the store thread's priority");
        }
    }
}

/// Runs the gateway until it is told to stop.
pub fn serve(config: Config, options: ServeOptions) -> Result<(), StartError> {
    writable_dir("metering.spool_dir", &config.metering.spool_dir)?;
    metrics::init();
    let traces = Tracing::start(&config.tracing).map_err(StartError::Config)?;
    // Pingora binds its listeners after start-up and retries a taken port silently; check
    // first so a conflict fails at once with the key to change. In an upgrade the old
    // process still holds the ports and hands them over, so there is nothing to check.
    let server_cfg = &config.server;
    if !options.upgrade {
        drop(bind("server.listen", &server_cfg.listen)?);
        drop(bind("server.admin_listen", &server_cfg.admin_listen)?);
        drop(bind("server.metrics_listen", &server_cfg.metrics_listen)?);
    }
    let admin_listener = bind_shared("server.admin_listen", &server_cfg.admin_listen)?;
    let dashboard_listener = match (&config.dashboard.listen, config.dashboard.enabled) {
        (Some(listen), true) => Some(bind_shared("dashboard.listen", listen)?),
        _ => None,
    };

    // The store's connections, its change listener and the key cache's follower live on a
    // runtime of their own, which outlives every Pingora service runtime.
    let store_runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .thread_name("svcgate-store")
        .on_thread_start(run_behind_requests)
        .enable_all()
        .build()
        .map_err(|e| StartError::Config(format!("cannot start the store runtime: {e}")))?;
    let store = {
        let _guard = store_runtime.enter();
        connect_store(&config)?
    };
    schema_checked(store_runtime.block_on(store.health.check_schema()))?;
    let keys = Arc::new(KeyCache::new(store.keys.clone(), config.store.cache()));
    if let Err(e) = store_runtime.block_on(keys.sync()) {
        tracing::warn!(error = %e, "key store unreachable at start; not ready until it answers");
    }
    store_runtime.spawn(keys.clone().follow());
    store_runtime.spawn(prepare_store(store.health.clone()));
    let (stop_jobs, jobs_stopped) = tokio::sync::watch::channel(false);
    store_runtime.spawn(crate::sandbox::runner::run(
        store.sandbox.clone(),
        jobs_stopped,
    ));
    let meter_config = config.meter();
    let configured_budgets = meter_config.project_budgets.clone();
    let (meter, audit_writer) = Meter::new(store.usage.clone(), store.audit.clone(), meter_config);
    let (stop_meter, meter_stopped) = tokio::sync::watch::channel(false);
    let metering = store_runtime.spawn(meter.clone().run(audit_writer, meter_stopped));
    let (stop_worker, worker_stopped) = tokio::sync::watch::channel(false);
    let worker = match options.no_worker {
        true => None,
        false => {
            let worker = {
                let _guard = store_runtime.enter();
                webhook_worker(&config, store.worker(), traces.clone())?
            };
            Some(store_runtime.spawn(worker.run(worker_stopped)))
        }
    };
    let routes = RouteTable::new(&config.routes()).map_err(StartError::Config)?;
    let upstreams = Upstreams::from_config(&config.upstream).map_err(StartError::Config)?;

    let threads = match server_cfg.threads {
        0 => std::thread::available_parallelism().map_or(2, usize::from),
        n => n,
    };
    let conf = ServerConf {
        threads,
        // SIGTERM first drains for `shutdown_grace_seconds` (`DrainingSignalWatch`); Pingora's
        // grace period starts after that, with the listeners closed: in-flight requests get
        // `shutdown_timeout_seconds`, then the runtimes stop.
        grace_period_seconds: Some(server_cfg.shutdown_timeout_seconds),
        graceful_shutdown_timeout_seconds: Some(1),
        upgrade_sock: server_cfg.upgrade_sock.clone(),
        // Timeouts over 5 s (the backend read timeout and the client keep-alive, 60 s by
        // default, each armed once per request and nearly always cancelled) go to tokio's
        // timer, which forgets a cancelled timer; Pingora's own wheel keeps each until it
        // expires. 118,576 → 117,215 instructions per request at 250/s, 114,702 → 112,025 at
        // 1,500/s (`benches/instructions.sh`).
        fast_timeout_to_tokio_threshold_seconds: Some(5),
        ..ServerConf::default()
    };
    let opt = Opt {
        upgrade: options.upgrade,
        ..Opt::default()
    };
    let mut server = Server::new_with_opt_and_conf(opt, conf);
    server.bootstrap();

    let mailer = {
        let _guard = store_runtime.enter();
        Mailer::new(&config.smtp, &config.webhooks.outbox_dir).map_err(StartError::Config)?
    };
    let scanners = Scanners::new(store.keys.clone(), store.audit.clone(), &config.scanners)
        .with_key_cache(keys.clone())
        .with_mailer(mailer, store_runtime.handle().clone());
    let draining = Draining::default();
    let trusted_proxies = TrustedProxies::new(&server_cfg.trusted_proxies);
    let dashboard = match config.dashboard.enabled {
        true => {
            let _guard = store_runtime.enter();
            Some(dashboard_router(&config, &store, keys.clone())?)
        }
        false => None,
    };
    let mut gateway = Gateway::new(
        store.clone(),
        keys.clone(),
        routes,
        upstreams,
        meter,
        config.webhooks.allow_insecure_targets,
        server_cfg.keepalive_timeout_seconds,
        draining.clone(),
    )
    .with_cors(Cors::new(&config.cors.allowed_origins))
    .with_key_metadata_forwarding(config.upstream.forward_key_metadata)
    .with_scanners(Arc::new(scanners))
    .with_job_seconds(config.simulator.job_seconds)
    .with_trusted_proxies(trusted_proxies.clone())
    .with_unknown_key_limit(
        config.limits.unknown_keys_per_minute,
        config.limits.unknown_keys_per_minute_total,
    )
    .with_tracing(traces.clone());
    if let Some(router) = &dashboard {
        gateway = gateway.with_dashboard(router.clone());
    }
    let mut proxy = pingora::proxy::http_proxy_service_with_name(
        &server.configuration,
        gateway,
        "svcgate gateway",
    );
    // CONNECT reaches the gateway (Pingora otherwise answers it with a bare 405 of its own),
    // which refuses it with the gateway's error body.
    if let Some(app) = proxy.app_logic_mut() {
        let mut options = pingora::apps::HttpServerOptions::default();
        options.allow_connect_method_proxying = true;
        app.server_options = Some(options);
    }
    proxy.add_tcp(&server_cfg.listen);

    let admin_router = admin::router(
        AdminState::new(
            store.clone(),
            keys,
            &server_cfg.admin_token,
            config.keys.rotation_grace_seconds,
        )
        .with_draining(draining.clone())
        .with_configured_budgets(configured_budgets),
    );
    let admin = background_service(
        "admin API",
        RouterService::new("admin API", admin_listener, admin_router),
    );

    let mut prometheus = pingora_prometheus::prometheus_http_service();
    prometheus.add_tcp(&server_cfg.metrics_listen);

    server.add_service(proxy);
    server.add_service(admin);
    server.add_service(prometheus);
    if let (Some(listener), Some(router)) = (dashboard_listener, dashboard) {
        let client_of: dashboard::service::ClientOf = Arc::new(move |peer, headers| {
            trusted_proxies.client_address(peer.ip(), headers, false)
        });
        server.add_service(background_service(
            "dashboard",
            dashboard::own_listener(listener, router, client_of),
        ));
    }

    if server_cfg.admin_token == DEMO_ADMIN_TOKEN {
        tracing::warn!("the admin API uses the demo token; set SVCGATE_SERVER_ADMIN_TOKEN");
    }
    tracing::info!(
        gateway = %server_cfg.listen,
        admin = %server_cfg.admin_listen,
        metrics = %server_cfg.metrics_listen,
        store = ?config.store.kind,
        live_upstream = config.upstream.live.as_deref().unwrap_or("simulated"),
        sandbox_upstream = config.upstream.sandbox.as_deref().unwrap_or("simulated"),
        "svcgate serving"
    );
    server.run(RunArgs {
        shutdown_signal: Box::new(DrainingSignalWatch::new(
            draining,
            std::time::Duration::from_secs(server_cfg.shutdown_grace_seconds),
            server_cfg.upgrade_sock.clone().into(),
        )),
    });
    // The last writes go over connections of the store runtime's own: a connection that a
    // request or the admin API reopened runs on a Pingora runtime, stopped now.
    {
        let _guard = store_runtime.enter();
        store.health.reopen_connections();
    }
    // Requests have drained: write what they spent and their audit records (or spool them),
    // at once, not after the worker: spend is in memory alone until then. Meanwhile the
    // worker's attempts in flight get to finish; anything unfinished is taken over after its
    // lease.
    let _ = stop_meter.send(true);
    let _ = stop_worker.send(true);
    let _ = stop_jobs.send(true);
    store_runtime.block_on(async {
        let worker = async {
            if let Some(worker) = worker {
                let _ = worker.await;
            }
        };
        let metering = async {
            let flushed = tokio::time::timeout(std::time::Duration::from_secs(5), metering).await;
            if flushed.is_err() {
                tracing::error!("metering did not finish its last flush in time");
            }
        };
        tokio::join!(worker, metering);
    });
    store_runtime.shutdown_timeout(std::time::Duration::from_secs(1));
    // After the last requests' spans ended: what is batched goes to the collector.
    if let Some(traces) = traces {
        traces.shutdown();
    }
    tracing::info!("svcgate stopped");
    Ok(())
}

/// The workspace dashboard's router, on `store`, mailing as pause notices are mailed; called
/// within the runtime its mail goes out on.
fn dashboard_router(
    config: &Config,
    store: &Stores,
    keys: Arc<KeyCache>,
) -> Result<axum::Router, StartError> {
    if config.smtp.host.is_none() {
        writable_dir("webhooks.outbox_dir", &config.webhooks.outbox_dir)?;
    }
    let mailer =
        Mailer::new(&config.smtp, &config.webhooks.outbox_dir).map_err(StartError::Config)?;
    let mut scopes: Vec<String> = config.routes().into_iter().map(|r| r.scope).collect();
    scopes.extend(
        crate::proxy::routes::built_in_scopes()
            .into_iter()
            .map(String::from),
    );
    scopes.sort();
    scopes.dedup();
    let stores = dashboard::DashboardStores {
        keys: store.keys.clone(),
        usage: store.usage.clone(),
        audit: store.audit.clone(),
        events: store.events.clone(),
        deliveries: store.deliveries.clone(),
        sessions: store.sessions.clone(),
    };
    let settings = dashboard::DashboardSettings {
        config: config.dashboard.clone(),
        admin_token: config.server.admin_token.clone(),
        demo_token: config.server.admin_token == DEMO_ADMIN_TOKEN,
        rotation_grace_seconds: config.keys.rotation_grace_seconds,
        scopes,
        allow_insecure_targets: config.webhooks.allow_insecure_targets,
    };
    Ok(dashboard::router(dashboard::Dashboard::new(
        stores,
        keys,
        mailer,
        settings,
        tokio::runtime::Handle::current(),
    )))
}

fn webhook_worker(
    config: &Config,
    store: WorkerStores,
    traces: Option<Tracing>,
) -> Result<Arc<Worker>, StartError> {
    if config.smtp.host.is_none() {
        writable_dir("webhooks.outbox_dir", &config.webhooks.outbox_dir)?;
    }
    let mailer =
        Mailer::new(&config.smtp, &config.webhooks.outbox_dir).map_err(StartError::Config)?;
    let settings = WorkerSettings {
        tracing: traces,
        ..WorkerSettings::from_config(&config.webhooks)
    };
    Worker::new(store, settings, mailer).map_err(StartError::Config)
}

/// Makes sure `dir` exists and takes files: what is spooled there (audit records, spend, mail)
/// is what an outage must not lose, so a directory that cannot hold it stops start-up.
fn writable_dir(key: &str, dir: &str) -> Result<(), StartError> {
    let fail = |e: std::io::Error| StartError::Config(format!("{key}: cannot write to {dir}: {e}"));
    std::fs::create_dir_all(dir).map_err(fail)?;
    // A name of its own: replicas sharing a spool volume may check it at the same moment, and
    // in containers all of them are process 1.
    let probe = std::path::Path::new(dir).join(format!(".svcgate-{}", crate::ids::new_id("probe")));
    std::fs::write(&probe, b"").map_err(fail)?;
    std::fs::remove_file(&probe).map_err(fail)
}

/// The store `config` names, connected (lazily: a Redis that does not answer yet is no error
/// here).
pub(crate) fn connect_store(config: &Config) -> Result<Stores, StartError> {
    Ok(match config.store.kind {
        StoreKind::Memory => Stores::of(Arc::new(MemoryStore::with_demo_workspace())),
        StoreKind::Redis => {
            let tls = config
                .store
                .tls()
                .map_err(|p| StartError::Config(format!("{}: {}", p.key, p.reason)))?;
            let sentinels = config.store.sentinels();
            Stores::of(Arc::new(
                RedisStore::connect_with(
                    &config.store.url,
                    &config.store.namespace,
                    tls,
                    sentinels.as_ref(),
                )
                .map_err(|e| StartError::Config(format!("store.url: {e}")))?
                .with_audit_retention_days(config.metering.audit_retention_days),
            ))
        }
    })
}

/// Refuses to start on data a newer version wrote; a store that does not answer yet is checked
/// again by its upkeep ([`prepare_store`]).
fn schema_checked(checked: Result<(), StoreError>) -> Result<(), StartError> {
    match checked {
        Err(StoreError::Conflict(why)) => Err(StartError::Store(why)),
        Err(e) => {
            tracing::warn!(error = %e, "store schema version not checked at start");
            Ok(())
        }
        Ok(()) => Ok(()),
    }
}

/// Runs the webhook worker alone (`svcgate worker`) with `/metrics`, `/healthz` and `/readyz`
/// on the metrics listener, until SIGTERM or SIGINT.
pub fn work(config: Config) -> Result<(), StartError> {
    metrics::init_webhooks();
    let traces = Tracing::start(&config.tracing).map_err(StartError::Config)?;
    let listener = bind("server.metrics_listen", &config.server.metrics_listen)?;
    listener
        .set_nonblocking(true)
        .map_err(|e| StartError::Config(format!("server.metrics_listen: {e}")))?;
    let threads = match config.server.threads {
        0 => std::thread::available_parallelism().map_or(2, usize::from),
        n => n,
    };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(threads)
        .thread_name("svcgate-worker")
        .enable_all()
        .build()
        .map_err(|e| StartError::Config(format!("cannot start the runtime: {e}")))?;
    let worker_traces = traces.clone();
    let ran = runtime.block_on(async move {
        if config.store.kind == StoreKind::Memory {
            tracing::warn!(
                "the worker runs on the in-memory store: it sees only events of this process; \
                 set store.kind = \"redis\""
            );
        }
        let store = connect_store(&config)?;
        schema_checked(store.health.check_schema().await)?;
        let worker = webhook_worker(&config, store.worker(), worker_traces)?;
        let (stop, stopped) = tokio::sync::watch::channel(false);
        let running = tokio::spawn(worker.run(stopped));
        let listener = tokio::net::TcpListener::from_std(listener)
            .map_err(|e| StartError::Config(format!("server.metrics_listen: {e}")))?;
        let probes =
            tokio::spawn(
                async move { axum::serve(listener, admin::probes_router(store.health)).await },
            );
        tracing::info!(
            metrics = %config.server.metrics_listen,
            store = ?config.store.kind,
            "svcgate worker running"
        );
        shutdown_signal().await;
        tracing::info!("stopping: attempts in flight get to finish");
        let _ = stop.send(true);
        let _ = running.await;
        probes.abort();
        Ok(())
    });
    if let Some(traces) = traces {
        traces.shutdown();
    }
    ran
}

/// Brings what an earlier version wrote up to date ([`StoreHealth::prepare`]), off every request's
/// path, trying again while it fails: after 10 s, then twice as long each time, up to 5 min (a
/// Redis that refuses it — full, read-only after a failover — is not scanned again and again).
async fn prepare_store(store: Arc<dyn StoreHealth>) {
    const FIRST_RETRY: std::time::Duration = std::time::Duration::from_secs(10);
    const LONGEST_RETRY: std::time::Duration = std::time::Duration::from_secs(300);
    let mut retry = FIRST_RETRY;
    loop {
        match store.prepare().await {
            Ok(()) => return,
            Err(e) if retry == FIRST_RETRY => {
                tracing::warn!(error = %e, "store upkeep from an earlier version not done; trying again")
            }
            Err(e) => tracing::debug!(error = %e, "store upkeep from an earlier version not done"),
        }
        tokio::time::sleep(retry).await;
        retry = (retry * 2).min(LONGEST_RETRY);
    }
}

/// Resolves on SIGTERM or SIGINT; SIGHUP is ignored (the configuration is not re-read).
async fn shutdown_signal() {
    use tokio::signal::unix::{signal, SignalKind};
    let (Ok(mut term), Ok(mut hup)) = (
        signal(SignalKind::terminate()),
        signal(SignalKind::hangup()),
    ) else {
        let _ = tokio::signal::ctrl_c().await;
        return;
    };
    loop {
        tokio::select! {
            _ = term.recv() => return,
            _ = tokio::signal::ctrl_c() => return,
            _ = hup.recv() => tracing::warn!("SIGHUP ignored: the configuration is not re-read"),
        }
    }
}

/// Binds the admin listener with `SO_REUSEPORT`, so during a graceful upgrade the new process
/// can listen beside the old one (Pingora hands over its own listeners; this one is ours).
fn bind_shared(key: &'static str, addr: &str) -> Result<TcpListener, StartError> {
    let error = |source: std::io::Error| StartError::Bind {
        key,
        addr: addr.to_string(),
        source,
    };
    let sockaddr: std::net::SocketAddr = addr
        .parse()
        .map_err(|_| error(std::io::Error::other("not an address")))?;
    let socket = socket2::Socket::new(
        socket2::Domain::for_address(sockaddr),
        socket2::Type::STREAM,
        None,
    )
    .map_err(error)?;
    socket.set_reuse_address(true).map_err(error)?;
    socket.set_reuse_port(true).map_err(error)?;
    socket.bind(&sockaddr.into()).map_err(error)?;
    socket.listen(1024).map_err(error)?;
    Ok(socket.into())
}

fn bind(key: &'static str, addr: &str) -> Result<TcpListener, StartError> {
    TcpListener::bind(addr).map_err(|source| StartError::Bind {
        key,
        addr: addr.to_string(),
        source,
    })
}
