//! The command line: `svcgate serve`, `svcgate keys …` and `svcgate events …` which talk to
//! the admin API, `svcgate listen`, which forwards webhook events to a local URL, and
//! `svcgate check`, which checks a configuration before a rollout.

mod check;
mod listen;

use clap::{Args, Parser, Subcommand, ValueEnum};
use serde_json::{json, Value};
use std::path::PathBuf;
use std::process::ExitCode;
use std::str::FromStr;

use crate::config::{Config, Role, DEMO_ADMIN_TOKEN};
use crate::server::{self, ServeOptions};

/// svcgate: an authentication gateway for AI APIs.
#[derive(Debug, Parser)]
#[command(name = "svcgate", version, about)]
pub struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run the gateway, the admin API and the metrics listener.
    Serve {
        /// TOML config file; without one, the embedded demo defaults apply.
        #[arg(long, short, env = "SVCGATE_CONFIG")]
        config: Option<PathBuf>,
        /// Take the listeners over from a running svcgate (send it SIGQUIT afterwards).
        #[arg(long, short = 'u')]
        upgrade: bool,
        /// Run no webhook worker in this process (run `svcgate worker` separately).
        #[arg(long)]
        no_worker: bool,
    },
    /// Check a configuration as `serve` would, without serving: every problem is printed with
    /// its key (exit 2); 0 when it is fine. `SVCGATE_*` variables apply as they do to `serve`,
    /// so run it with the environment of the deployment. For CI, before a rollout.
    Check {
        /// TOML config file to check.
        #[arg(long, short, env = "SVCGATE_CONFIG")]
        config: PathBuf,
        /// Also try what it names: the store (PING and its schema version), each backend
        /// (`upstream.live`, `upstream.sandbox`: a TCP connection), the SMTP relay and the
        /// trace collector; one line each, exit 2 if any fails.
        #[arg(long)]
        connect: bool,
        /// Check it as `svcgate worker` would (no admin token needed) rather than `serve`.
        #[arg(long)]
        worker: bool,
    },
    /// Run the webhook worker alone, with /metrics, /healthz and /readyz on the metrics port.
    Worker {
        /// TOML config file; without one, the embedded demo defaults apply.
        #[arg(long, short, env = "SVCGATE_CONFIG")]
        config: Option<PathBuf>,
    },
    /// Create, list and show workspaces, and their projects' budgets, through the admin API.
    Workspaces {
        #[command(flatten)]
        admin: AdminArgs,
        #[command(subcommand)]
        command: WorkspacesCommand,
    },
    /// Manage API keys through the admin API.
    Keys {
        #[command(flatten)]
        admin: AdminArgs,
        #[command(subcommand)]
        command: KeysCommand,
    },
    /// Publish events through the admin API.
    Events {
        #[command(flatten)]
        admin: AdminArgs,
        #[command(subcommand)]
        command: EventsCommand,
    },
    /// Look after a workspace's webhook endpoints through the admin API: deliveries, resume,
    /// replay.
    Webhooks {
        #[command(flatten)]
        admin: AdminArgs,
        /// Workspace (`ws_…`).
        #[arg(long, global = true, value_parser = parse_id)]
        workspace: Option<String>,
        #[command(subcommand)]
        command: WebhooksCommand,
    },
    /// Forward the workspace's webhook events to a local URL, signed as production signs them.
    Listen(ListenArgs),
    /// Print an API's OpenAPI 3.1 document (JSON), as the running server serves it.
    Openapi {
        /// `admin` (the admin API) or `gateway` (its /v1 operations and configured routes).
        api: OpenapiArg,
        /// TOML config file whose routes the gateway's document lists; without one, the
        /// embedded demo defaults apply.
        #[arg(long, short, env = "SVCGATE_CONFIG")]
        config: Option<PathBuf>,
    },
}

#[derive(Debug, Clone, Copy, ValueEnum)]
enum OpenapiArg {
    Admin,
    Gateway,
}

#[derive(Debug, Subcommand)]
enum WebhooksCommand {
    /// List the workspace's endpoints, both environments.
    List,
    /// Show one endpoint.
    Show {
        /// Endpoint id (`we_…`).
        #[arg(value_parser = parse_id)]
        id: String,
    },
    /// An endpoint's latest deliveries, newest first.
    Deliveries {
        /// Endpoint id (`we_…`).
        #[arg(value_parser = parse_id)]
        id: String,
        /// How many (1 to 1000; the server's default is 50).
        #[arg(long)]
        limit: Option<usize>,
    },
    /// Make a paused endpoint active again (what it missed is not resent: replay it).
    Resume {
        /// Endpoint id (`we_…`).
        #[arg(value_parser = parse_id)]
        id: String,
    },
    /// Deliver one event again, or every event the endpoint subscribes to since a time.
    Replay {
        /// Endpoint id (`we_…`).
        #[arg(value_parser = parse_id)]
        id: String,
        /// The event (`evt_…`).
        #[arg(long, conflicts_with = "since", required_unless_present = "since")]
        event_id: Option<String>,
        /// Unix time in seconds, within the last 30 days.
        #[arg(long)]
        since: Option<u64>,
        /// With `--since`: go on past this event (the `next` of a replay cut short).
        #[arg(long, requires = "since")]
        after: Option<String>,
    },
}

#[derive(Debug, Args)]
struct ListenArgs {
    /// API key with the `webhooks:read` scope; a test key gets test-mode events only.
    #[arg(long, env = "SVCGATE_API_KEY", hide_env_values = true)]
    api_key: ApiKey,
    /// Where each event is POSTed, e.g. http://localhost:3000/webhooks.
    #[arg(long, value_parser = parse_forward_url)]
    forward_to: url::Url,
    /// Event names or resource wildcards (agent.run.*), repeated or comma-separated; default all.
    #[arg(long, value_delimiter = ',')]
    events: Vec<String>,
    /// Base URL of the gateway.
    #[arg(
        long,
        env = "SVCGATE_GATEWAY_URL",
        default_value = "http://127.0.0.1:8080"
    )]
    gateway_url: String,
    /// Signature headers to forward with: `service` (Service-Signature…) or
    /// `standard-webhooks` (webhook-id, webhook-timestamp, webhook-signature).
    #[arg(long, value_enum, default_value = "service")]
    format: ListenFormat,
}

/// `svcgate listen --format`.
#[derive(Debug, Clone, Copy, clap::ValueEnum)]
enum ListenFormat {
    Service,
    StandardWebhooks,
}

/// An API key from the command line; its `Debug` does not show it.
#[derive(Clone)]
struct ApiKey(String);

impl FromStr for ApiKey {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        match s.trim() {
            "" => Err("the API key is empty".into()),
            key => Ok(Self(key.to_string())),
        }
    }
}

impl std::fmt::Debug for ApiKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ApiKey(…)")
    }
}

fn parse_forward_url(raw: &str) -> Result<url::Url, String> {
    let url = url::Url::parse(raw).map_err(|e| format!("not a URL: {e}"))?;
    match url.scheme() {
        "http" | "https" => Ok(url),
        other => Err(format!(
            "the URL must be http:// or https://, not {other}://"
        )),
    }
}

/// A budget in credits: a finite number, not negative (`NaN` would reach the API as `null`, which
/// means no budget at all).
fn parse_budget(raw: &str) -> Result<f64, String> {
    match raw.parse::<f64>() {
        Ok(v) if v.is_finite() && v >= 0.0 => Ok(v),
        _ => Err("a budget is a number of credits, 0 or more".into()),
    }
}

/// `--expires-at`: an RFC 3339 time, or `never` (JSON `null`, for `keys update`).
fn parse_expiry(raw: &str) -> Result<serde_json::Value, String> {
    match raw {
        "never" => Ok(serde_json::Value::Null),
        _ => crate::shared::rfc3339::parse(raw)
            .map(|_| json!(raw))
            .ok_or_else(|| "an RFC 3339 time, like 2030-01-31T12:00:00Z, or `never`".into()),
    }
}

/// `--rate-limit`: `N` or `N/BURST` requests per minute, or `none` (JSON `null`).
fn parse_rate_limit(raw: &str) -> Result<serde_json::Value, String> {
    if raw == "none" {
        return Ok(serde_json::Value::Null);
    }
    let number = |s: &str| s.parse::<u32>().ok().filter(|n| *n > 0);
    let (rate, burst) = match raw.split_once('/') {
        Some((rate, burst)) => (number(rate), Some(number(burst))),
        None => (number(raw), None),
    };
    match (rate, burst) {
        (Some(rate), None) => Ok(json!({"requests_per_minute": rate})),
        (Some(rate), Some(Some(burst))) => Ok(json!({"requests_per_minute": rate, "burst": burst})),
        _ => Err("requests per minute, optionally /burst (e.g. 600 or 600/50), or `none`".into()),
    }
}

/// `--metadata`: a JSON object, or `null`.
fn parse_metadata(raw: &str) -> Result<serde_json::Value, String> {
    match serde_json::from_str::<serde_json::Value>(raw) {
        Ok(v) if v.is_object() || v.is_null() => Ok(v),
        _ => Err("a JSON object, like {\"customer\":\"cus_42\"}, or null".into()),
    }
}

/// An id goes into the admin API's URL path, so it is checked as one: letters, digits, `_`.
fn parse_id(raw: &str) -> Result<String, String> {
    let valid = !raw.is_empty() && raw.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_');
    match valid {
        true => Ok(raw.to_string()),
        false => Err("an id is letters, digits and `_` (key_…, ws_…, we_…)".into()),
    }
}

#[derive(Debug, Subcommand)]
enum EventsCommand {
    /// Publish a test event: a realistic sample payload of TYPE, unless --data is given.
    Trigger {
        /// One of the service's event types, e.g. agent.run.completed.
        event_type: String,
        /// Workspace (`ws_…`).
        #[arg(long)]
        workspace: String,
        /// The payload, a JSON object (default: a sample for the type).
        #[arg(long)]
        data: Option<String>,
        /// Event environment.
        #[arg(long, value_enum, default_value = "live")]
        environment: EnvironmentArg,
    },
}

#[derive(Debug, Args)]
struct AdminArgs {
    /// Base URL of the admin API.
    #[arg(
        long,
        env = "SVCGATE_ADMIN_URL",
        default_value = "http://127.0.0.1:8081",
        global = true
    )]
    admin_url: String,
    /// Admin token, or an operator token (`svcop_…`) whose role allows the command.
    #[arg(long, alias = "operator-token", env = "SVCGATE_SERVER_ADMIN_TOKEN", hide_env_values = true, default_value = DEMO_ADMIN_TOKEN, hide_default_value = true, global = true)]
    admin_token: String,
}

#[derive(Debug, Clone, Copy, ValueEnum)]
enum EnvironmentArg {
    Live,
    Test,
}

#[derive(Debug, Subcommand)]
enum WorkspacesCommand {
    /// Create a workspace; prints it with its id.
    Create {
        /// Display name.
        #[arg(long)]
        name: String,
        /// Who is e-mailed when a webhook endpoint is paused; repeated or comma-separated.
        #[arg(long = "admin-email", value_delimiter = ',', required = true)]
        admin_emails: Vec<String>,
        /// Monthly credit allowance.
        #[arg(long, value_parser = parse_budget)]
        monthly_credits: Option<f64>,
        /// Remaining credits below which `billing.credits.low` fires.
        #[arg(long, value_parser = parse_budget)]
        credits_low_threshold: Option<f64>,
    },
    /// List workspaces, oldest first, a page at a time (`has_more`: ask again with
    /// `--starting-after` the last id shown).
    List {
        /// Workspaces per page (1 to 1000; the server's default is 100).
        #[arg(long)]
        limit: Option<usize>,
        /// The last workspace id of the previous page.
        #[arg(long, value_parser = parse_id)]
        starting_after: Option<String>,
    },
    /// Show one workspace.
    Show {
        /// Workspace id (`ws_…`).
        #[arg(value_parser = parse_id)]
        id: String,
    },
    /// The monthly budgets of a workspace's projects, and where each comes from.
    Budgets {
        /// Workspace id (`ws_…`).
        #[arg(value_parser = parse_id)]
        id: String,
    },
}

#[derive(Debug, Subcommand)]
enum KeysCommand {
    /// Create a key; prints its full value, which is shown this once.
    Create {
        /// Owning workspace (`ws_…`).
        #[arg(long)]
        workspace: String,
        /// Key environment.
        #[arg(long, value_enum, default_value = "live")]
        environment: EnvironmentArg,
        /// Scopes, repeated or comma-separated.
        #[arg(long = "scope", value_delimiter = ',', required = true)]
        scopes: Vec<String>,
        /// Label.
        #[arg(long)]
        name: Option<String>,
        /// Monthly budget in credits.
        #[arg(long, value_parser = parse_budget)]
        monthly_budget: Option<f64>,
        /// When the key stops working (RFC 3339).
        #[arg(long, value_parser = parse_expiry)]
        expires_at: Option<serde_json::Value>,
        /// The key's own rate limit: N or N/BURST requests per minute.
        #[arg(long, value_parser = parse_rate_limit)]
        rate_limit: Option<serde_json::Value>,
        /// Metadata: a JSON object of at most 4 KiB.
        #[arg(long, value_parser = parse_metadata)]
        metadata: Option<serde_json::Value>,
        /// Makes a retried creation return the same key rather than a second one.
        #[arg(long)]
        idempotency_key: Option<String>,
    },
    /// Change a key; what is not given stays.
    Update {
        /// Key id (`key_…`).
        #[arg(value_parser = parse_id)]
        id: String,
        /// Label.
        #[arg(long)]
        name: Option<String>,
        /// Scopes, repeated or comma-separated: replace the key's.
        #[arg(long = "scope", value_delimiter = ',')]
        scopes: Vec<String>,
        /// Monthly budget in credits.
        #[arg(long, value_parser = parse_budget, conflicts_with = "no_budget")]
        monthly_budget: Option<f64>,
        /// Remove the monthly budget.
        #[arg(long)]
        no_budget: bool,
        /// When the key stops working (RFC 3339), or `never`.
        #[arg(long, value_parser = parse_expiry)]
        expires_at: Option<serde_json::Value>,
        /// N or N/BURST requests per minute, or `none` for the workspace's or environment's.
        #[arg(long, value_parser = parse_rate_limit)]
        rate_limit: Option<serde_json::Value>,
        /// Metadata: a JSON object (replaces the key's), or null.
        #[arg(long, value_parser = parse_metadata)]
        metadata: Option<serde_json::Value>,
    },
    /// List the keys of a workspace, a page at a time (`has_more`: ask again with
    /// `--starting-after` the last id shown).
    List {
        /// Workspace (`ws_…`).
        #[arg(long)]
        workspace: String,
        /// Keys per page (1 to 1000; the server's default is 100).
        #[arg(long)]
        limit: Option<usize>,
        /// The last key id of the previous page.
        #[arg(long)]
        starting_after: Option<String>,
        /// Only keys expiring within this many seconds (those expired included).
        #[arg(long)]
        expiring_within_seconds: Option<u64>,
    },
    /// Show one key.
    Show {
        /// Key id (`key_…`).
        #[arg(value_parser = parse_id)]
        id: String,
    },
    /// Revoke a key at once.
    Revoke {
        /// Key id (`key_…`).
        #[arg(value_parser = parse_id)]
        id: String,
    },
    /// Issue a successor key; the old one keeps working for the grace period.
    Rotate {
        /// Key id (`key_…`).
        #[arg(value_parser = parse_id)]
        id: String,
        /// Grace period in seconds (default: the server's `keys.rotation_grace_seconds`).
        #[arg(long)]
        grace_period_seconds: Option<u64>,
        /// Makes a retried rotation return the same new key.
        #[arg(long)]
        idempotency_key: Option<String>,
    },
    /// End a rotated key's grace period now.
    EndGrace {
        /// Key id (`key_…`) of the rotated (old) key.
        #[arg(value_parser = parse_id)]
        id: String,
    },
}

/// Runs the parsed command line and returns the process exit code.
pub fn run(cli: Cli) -> ExitCode {
    match cli.command {
        Command::Serve {
            config,
            upgrade,
            no_worker,
        } => run_server(config, Role::Server, |config| {
            server::serve(config, ServeOptions { upgrade, no_worker })
        }),
        Command::Worker { config } => run_server(config, Role::Worker, server::work),
        Command::Check {
            config,
            connect,
            worker,
        } => {
            let role = match worker {
                true => Role::Worker,
                false => Role::Server,
            };
            match load_config(Some(config), role) {
                Ok(config) => check::run(&config, connect),
                Err(code) => code,
            }
        }
        Command::Workspaces { admin, command } => {
            call_admin(&admin, |client, base| Ok(workspaces(client, base, command)))
        }
        Command::Keys { admin, command } => {
            call_admin(&admin, |client, base| keys(client, base, command))
        }
        Command::Events { admin, command } => {
            call_admin(&admin, |client, base| events(client, base, command))
        }
        Command::Webhooks {
            admin,
            workspace,
            command,
        } => call_admin(&admin, |client, base| {
            webhooks(client, base, workspace, command)
        }),
        Command::Listen(args) => listen(args),
        Command::Openapi { api, config } => openapi(api, config),
    }
}

/// Prints `api`'s document; the gateway's is built from the configuration's routes (exit 2 if
/// it is invalid).
fn openapi(api: OpenapiArg, config: Option<PathBuf>) -> ExitCode {
    let print = |doc: utoipa::openapi::OpenApi| match doc.to_pretty_json() {
        Ok(json) => {
            println!("{json}");
            Ok(())
        }
        Err(e) => Err(server::StartError::Config(format!("cannot serialize: {e}"))),
    };
    match api {
        OpenapiArg::Admin => match print(crate::admin::openapi_document()) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("svcgate: {e}");
                ExitCode::from(1)
            }
        },
        OpenapiArg::Gateway => run_server(config, Role::Server, |config| {
            let routes = crate::proxy::routes::RouteTable::new(&config.routes())
                .map_err(server::StartError::Config)?;
            print(crate::proxy::api::openapi::document(&routes))
        }),
    }
}

/// A runtime on the calling thread for a command's I/O; exit 1 if there is none to be had.
fn command_runtime() -> Result<tokio::runtime::Runtime, ExitCode> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| {
            eprintln!("svcgate: cannot start a runtime: {e}");
            ExitCode::from(1)
        })
}

/// Runs `svcgate listen` until its stream ends (it exits 1 then: the stream is meant to last).
fn listen(args: ListenArgs) -> ExitCode {
    let runtime = match command_runtime() {
        Ok(rt) => rt,
        Err(code) => return code,
    };
    let options = listen::Options {
        api_key: args.api_key.0,
        forward_to: args.forward_to,
        events: args.events,
        gateway_url: args.gateway_url,
        format: match args.format {
            ListenFormat::Service => crate::webhooks::endpoint::WebhookFormat::Service,
            ListenFormat::StandardWebhooks => {
                crate::webhooks::endpoint::WebhookFormat::StandardWebhooks
            }
        },
    };
    match runtime.block_on(listen::run(options)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(message) => {
            eprintln!("svcgate: {message}");
            ExitCode::from(1)
        }
    }
}

/// Loads the configuration (exit 2 if it is invalid), then runs a server (exit 1 if it cannot
/// start).
fn run_server(
    path: Option<PathBuf>,
    role: Role,
    run: impl FnOnce(Config) -> Result<(), server::StartError>,
) -> ExitCode {
    let config = match load_config(path, role) {
        Ok(c) => c,
        Err(code) => return code,
    };
    crate::logging::init(&config.log);
    match run(config) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("svcgate: {e}");
            ExitCode::from(1)
        }
    }
}

/// The configuration from `path` and the `SVCGATE_*` variables, validated for `role`; when it
/// is invalid, every problem is printed with its key and the exit code is 2.
fn load_config(path: Option<PathBuf>, role: Role) -> Result<Config, ExitCode> {
    // Only `SVCGATE_*` variables are settings; another that is not UTF-8 is none of ours (with
    // `env::vars` it was a panic). One of ours that is not UTF-8 is refused by name.
    let mut env = Vec::new();
    for (name, value) in std::env::vars_os() {
        let Some(name) = name.to_str().filter(|n| n.starts_with("SVCGATE_")) else {
            continue;
        };
        match value.into_string() {
            Ok(value) => env.push((name.to_string(), value)),
            Err(_) => {
                eprintln!("svcgate: invalid configuration: {name}: not UTF-8");
                return Err(ExitCode::from(2));
            }
        }
    }
    Config::load_as(path.as_deref(), env, role).map_err(|e| {
        eprintln!("svcgate: {e}");
        ExitCode::from(2)
    })
}

/// Runs one admin API call and prints its JSON answer.
fn call_admin(
    admin: &AdminArgs,
    build: impl FnOnce(&reqwest::Client, &str) -> Result<reqwest::RequestBuilder, String>,
) -> ExitCode {
    let runtime = match command_runtime() {
        Ok(rt) => rt,
        Err(code) => return code,
    };
    let base = admin.admin_url.trim_end_matches('/');
    let client = reqwest::Client::new();
    let outcome = build(&client, base)
        .and_then(|request| runtime.block_on(send(request.bearer_auth(&admin.admin_token), base)));
    match outcome {
        Ok(body) => {
            println!(
                "{}",
                serde_json::to_string_pretty(&body).unwrap_or_default()
            );
            ExitCode::SUCCESS
        }
        Err(message) => {
            eprintln!("svcgate: {message}");
            ExitCode::from(1)
        }
    }
}

fn environment_name(environment: EnvironmentArg) -> &'static str {
    match environment {
        EnvironmentArg::Live => "live",
        EnvironmentArg::Test => "test",
    }
}

fn events(
    client: &reqwest::Client,
    base: &str,
    command: EventsCommand,
) -> Result<reqwest::RequestBuilder, String> {
    let EventsCommand::Trigger {
        event_type,
        workspace,
        data,
        environment,
    } = command;
    let data: Value = match data {
        Some(text) => {
            serde_json::from_str(&text).map_err(|e| format!("--data is not JSON: {e}"))?
        }
        None => crate::events::sample_data(&event_type, &workspace).ok_or_else(|| {
            format!(
                "unknown event type '{event_type}'; one of: {}",
                crate::events::EVENT_TYPES.join(", ")
            )
        })?,
    };
    Ok(client.post(format!("{base}/admin/v1/events")).json(&json!({
        "workspace": workspace,
        "type": event_type,
        "data": data,
        "environment": environment_name(environment),
    })))
}

fn workspaces(
    client: &reqwest::Client,
    base: &str,
    command: WorkspacesCommand,
) -> reqwest::RequestBuilder {
    let base = format!("{base}/admin/v1/workspaces");
    match command {
        WorkspacesCommand::Create {
            name,
            admin_emails,
            monthly_credits,
            credits_low_threshold,
        } => {
            let mut body = json!({ "name": name, "admin_emails": admin_emails });
            if let Some(credits) = monthly_credits {
                body["monthly_credits"] = json!(credits);
            }
            if let Some(threshold) = credits_low_threshold {
                body["credits_low_threshold"] = json!(threshold);
            }
            client.post(base).json(&body)
        }
        WorkspacesCommand::List {
            limit,
            starting_after,
        } => {
            let mut query = Vec::new();
            if let Some(limit) = limit {
                query.push(("limit", limit.to_string()));
            }
            if let Some(after) = starting_after {
                query.push(("starting_after", after));
            }
            client.get(base).query(&query)
        }
        WorkspacesCommand::Show { id } => client.get(format!("{base}/{id}")),
        WorkspacesCommand::Budgets { id } => client.get(format!("{base}/{id}/projects")),
    }
}

fn keys(
    client: &reqwest::Client,
    base: &str,
    command: KeysCommand,
) -> Result<reqwest::RequestBuilder, String> {
    Ok(match command {
        KeysCommand::Create {
            workspace,
            environment,
            scopes,
            name,
            monthly_budget,
            expires_at,
            rate_limit,
            metadata,
            idempotency_key,
        } => {
            let environment = environment_name(environment);
            let mut body = json!({
                "workspace": workspace,
                "environment": environment,
                "scopes": scopes,
            });
            if let Some(name) = name {
                body["name"] = json!(name);
            }
            if let Some(budget) = monthly_budget {
                body["monthly_budget"] = json!(budget);
            }
            for (field, value) in [
                ("expires_at", expires_at),
                ("rate_limit", rate_limit),
                ("metadata", metadata),
            ] {
                if let Some(value) = value.filter(|v| !v.is_null()) {
                    body[field] = value;
                }
            }
            let request = client.post(format!("{base}/admin/v1/keys")).json(&body);
            match idempotency_key {
                Some(k) => request.header("Idempotency-Key", k),
                None => request,
            }
        }
        KeysCommand::Update {
            id,
            name,
            scopes,
            monthly_budget,
            no_budget,
            expires_at,
            rate_limit,
            metadata,
        } => {
            let mut body = json!({});
            if let Some(name) = name {
                body["name"] = json!(name);
            }
            if !scopes.is_empty() {
                body["scopes"] = json!(scopes);
            }
            match (monthly_budget, no_budget) {
                (Some(budget), _) => body["monthly_budget"] = json!(budget),
                (None, true) => body["monthly_budget"] = serde_json::Value::Null,
                (None, false) => {}
            }
            for (field, value) in [
                ("expires_at", expires_at),
                ("rate_limit", rate_limit),
                ("metadata", metadata),
            ] {
                if let Some(value) = value {
                    body[field] = value;
                }
            }
            client
                .patch(format!("{base}/admin/v1/keys/{id}"))
                .json(&body)
        }
        KeysCommand::List {
            workspace,
            limit,
            starting_after,
            expiring_within_seconds,
        } => {
            let mut query = vec![("workspace", workspace)];
            if let Some(within) = expiring_within_seconds {
                query.push(("expiring_within_seconds", within.to_string()));
            }
            if let Some(limit) = limit {
                query.push(("limit", limit.to_string()));
            }
            if let Some(after) = starting_after {
                query.push(("starting_after", after));
            }
            client.get(format!("{base}/admin/v1/keys")).query(&query)
        }
        KeysCommand::Show { id } => client.get(format!("{base}/admin/v1/keys/{id}")),
        KeysCommand::Revoke { id } => client.post(format!("{base}/admin/v1/keys/{id}/revoke")),
        KeysCommand::Rotate {
            id,
            grace_period_seconds,
            idempotency_key,
        } => {
            let mut body = json!({});
            if let Some(grace) = grace_period_seconds {
                body["grace_period_seconds"] = json!(grace);
            }
            let request = client
                .post(format!("{base}/admin/v1/keys/{id}/rotate"))
                .json(&body);
            match idempotency_key {
                Some(k) => request.header("Idempotency-Key", k),
                None => request,
            }
        }
        KeysCommand::EndGrace { id } => client.post(format!("{base}/admin/v1/keys/{id}/end-grace")),
    })
}

fn webhooks(
    client: &reqwest::Client,
    base: &str,
    workspace: Option<String>,
    command: WebhooksCommand,
) -> Result<reqwest::RequestBuilder, String> {
    let workspace = workspace.ok_or("--workspace is required")?;
    let base = format!("{base}/admin/v1/workspaces/{workspace}/webhooks");
    Ok(match command {
        WebhooksCommand::List => client.get(base),
        WebhooksCommand::Show { id } => client.get(format!("{base}/{id}")),
        WebhooksCommand::Deliveries { id, limit } => {
            let query: Vec<(&str, String)> = limit
                .map(|l| ("limit", l.to_string()))
                .into_iter()
                .collect();
            client.get(format!("{base}/{id}/deliveries")).query(&query)
        }
        WebhooksCommand::Resume { id } => client.post(format!("{base}/{id}/resume")),
        WebhooksCommand::Replay {
            id,
            event_id,
            since,
            after,
        } => {
            let body = match (event_id, since, after) {
                (Some(event_id), _, _) => json!({ "event_id": event_id }),
                (None, since, None) => json!({ "since": since }),
                (None, since, Some(after)) => json!({ "since": since, "after": after }),
            };
            client.post(format!("{base}/{id}/replay")).json(&body)
        }
    })
}

/// Sends an admin API request; the JSON answer, or the error's code and message.
async fn send(request: reqwest::RequestBuilder, base: &str) -> Result<Value, String> {
    let response = request
        .send()
        .await
        .map_err(|e| format!("cannot reach the admin API at {base}: {e}"))?;
    let status = response.status();
    let body: Value = response
        .json()
        .await
        .map_err(|e| format!("unreadable answer from the admin API ({status}): {e}"))?;
    if status.is_success() {
        Ok(body)
    } else {
        Err(api_error(Some(status.as_u16()), &body))
    }
}

/// An error answer with the gateway's error body, as one line: `permission_error (403): …`.
fn api_error(status: Option<u16>, body: &Value) -> String {
    let code = body["error"]["code"].as_str().unwrap_or("error");
    let message = body["error"]["message"].as_str().unwrap_or("no message");
    match status {
        Some(status) => format!("{code} ({status}): {message}"),
        None => format!("{code}: {message}"),
    }
}
