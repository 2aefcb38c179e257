//! The `svcgate` command line: start-up errors, the keys CLI, and shutdown.

mod common;

use common::*;
use serde_json::Value;
use std::process::Stdio;
use std::time::Duration;

/// Runs `svcgate <command> …` against the gateway's admin API.
fn run_admin_cli(gw: &Gateway, command: &str, args: &[&str]) -> std::process::Output {
    svcgate_command()
        .args([
            command,
            "--admin-url",
            &gw.admin,
            "--admin-token",
            ADMIN_TOKEN,
        ])
        .args(args)
        .output()
        .unwrap()
}

fn run_keys(gw: &Gateway, args: &[&str]) -> std::process::Output {
    run_admin_cli(gw, "keys", args)
}

#[tokio::test]
async fn workspaces_cli_creates_lists_and_shows() {
    let gw = Gateway::builder().start().await;
    let out = run_admin_cli(
        &gw,
        "workspaces",
        &[
            "create",
            "--name",
            "Acme",
            "--admin-email",
            "ops@acme.example,cto@acme.example",
            "--monthly-credits",
            "100",
        ],
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let created = printed(&out);
    let id = created["id"].as_str().unwrap();
    assert_eq!(created["admin_emails"].as_array().unwrap().len(), 2);
    assert_eq!(created["monthly_credits"], 100.0);

    let shown = printed(&run_admin_cli(&gw, "workspaces", &["show", id]));
    assert_eq!(shown["name"], "Acme");
    let listed = printed(&run_admin_cli(&gw, "workspaces", &["list", "--limit", "1"]));
    assert_eq!(listed["data"].as_array().unwrap().len(), 1);
    assert_eq!(listed["has_more"], true);
    let first = listed["data"][0]["id"].as_str().unwrap();
    let rest = printed(&run_admin_cli(
        &gw,
        "workspaces",
        &["list", "--starting-after", first],
    ));
    assert_eq!(rest["data"].as_array().unwrap().len(), 1);
    assert_eq!(rest["has_more"], false);
    let budgets = printed(&run_admin_cli(&gw, "workspaces", &["budgets", id]));
    assert_eq!(budgets["data"], serde_json::json!([]));

    // The API's refusal, not a crash: an address that cannot be mailed.
    let out = run_admin_cli(
        &gw,
        "workspaces",
        &["create", "--name", "X", "--admin-email", "not an address"],
    );
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("invalid_request_error"));
}

#[tokio::test]
async fn keys_cli_creates_lists_shows_and_revokes() {
    let gw = Gateway::builder().start().await;
    let out = run_keys(
        &gw,
        &[
            "create",
            "--workspace",
            DEMO_WS,
            "--scope",
            "chat.completions:create,models:read",
            "--name",
            "cli",
        ],
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let created: Value = serde_json::from_slice(&out.stdout).unwrap();
    let key = created["key"].as_str().unwrap().to_string();
    let id = created["id"].as_str().unwrap().to_string();
    assert_eq!(created["scopes"].as_array().unwrap().len(), 2);
    assert_eq!(gw.chat(&key).await.status(), 200);

    let out = run_keys(&gw, &["list", "--workspace", DEMO_WS]);
    let listed: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(listed["data"][0]["id"], id.as_str());
    assert!(!String::from_utf8_lossy(&out.stdout).contains(&key));

    let out = run_keys(&gw, &["show", &id]);
    let shown: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(shown["status"], "active");

    let out = run_keys(&gw, &["revoke", &id]);
    assert!(out.status.success());
    assert_eq!(gw.chat(&key).await.status(), 401);

    let out = run_keys(&gw, &["show", "key_missing"]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("not_found"));
}

#[tokio::test]
async fn keys_cli_sets_expiry_rate_limit_and_metadata_and_takes_an_operator_token() {
    let gw = Gateway::builder().start().await;
    let expires_at = svcgate::shared::rfc3339::format(svcgate::ids::unix_now() + 3600);
    let created = printed(&run_keys(
        &gw,
        &[
            "create",
            "--workspace",
            DEMO_WS,
            "--scope",
            "chat.completions:create",
            "--expires-at",
            &expires_at,
            "--rate-limit",
            "5/2",
            "--metadata",
            r#"{"customer":"cus_42"}"#,
        ],
    ));
    let id = created["id"].as_str().unwrap().to_string();
    assert_eq!(created["expires_at"], expires_at.as_str());
    assert_eq!(created["rate_limit"]["requests_per_minute"], 5);
    assert_eq!(created["rate_limit"]["burst"], 2);
    assert_eq!(created["metadata"]["customer"], "cus_42");

    let updated = printed(&run_keys(
        &gw,
        &[
            "update",
            &id,
            "--rate-limit",
            "none",
            "--expires-at",
            "never",
            "--metadata",
            "null",
        ],
    ));
    assert_eq!(updated["rate_limit"], Value::Null);
    assert_eq!(updated["expires_at"], Value::Null);
    assert_eq!(updated["metadata"], Value::Null);

    // Malformed values are refused before any call.
    for bad in [
        ["--rate-limit", "fast"],
        ["--expires-at", "soon"],
        ["--metadata", "[1]"],
    ] {
        let out = run_keys(&gw, &["update", &id, bad[0], bad[1]]);
        assert!(!out.status.success());
    }

    // An operator token where the admin token goes: a reader lists, and may not change.
    let resp = gw
        .admin_request(reqwest::Method::POST, "/admin/v1/tokens")
        .json(&serde_json::json!({"name": "cli-reader", "role": "read"}))
        .send()
        .await
        .unwrap();
    let token: Value = resp.json().await.unwrap();
    let token = token["token"].as_str().unwrap();
    let as_reader = |args: &[&str]| {
        svcgate_command()
            .args(["keys", "--admin-url", &gw.admin, "--admin-token", token])
            .args(args)
            .output()
            .unwrap()
    };
    let listed = printed(&as_reader(&["list", "--workspace", DEMO_WS]));
    assert_eq!(listed["data"][0]["id"], id.as_str());
    let out = as_reader(&["update", &id, "--name", "x"]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("permission_error"));
}

fn run_webhooks(gw: &Gateway, args: &[&str]) -> std::process::Output {
    run_admin_cli(gw, "webhooks", args)
}

/// The JSON a successful CLI call printed.
fn printed(out: &std::process::Output) -> Value {
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

#[tokio::test]
async fn webhooks_cli_lists_deliveries_resumes_and_replays() {
    let gw = Gateway::builder()
        .config(|c| c.webhooks.allow_insecure_targets = true)
        .start()
        .await;
    let (_, key) = gw
        .create_key("live", &["webhooks:read", "webhooks:write"])
        .await;
    let receiver = Receiver::start().await;
    let created = call(
        &gw,
        &key,
        reqwest::Method::POST,
        "/v1/webhooks",
        Some(serde_json::json!({"url": receiver.url("/hook"), "events": ["agent.run.*"]})),
    )
    .await;
    assert_eq!(created.status(), 201);
    let id = created.json::<Value>().await.unwrap()["id"]
        .as_str()
        .unwrap()
        .to_string();
    let event = printed(&run_admin_cli(
        &gw,
        "events",
        &["trigger", "agent.run.completed", "--workspace", DEMO_WS],
    ));
    let event_id = event["id"].as_str().unwrap();
    eventually(Duration::from_secs(10), || async {
        receiver.received("/hook").len() == 1
    })
    .await
    .expect("delivered");

    let listed = printed(&run_webhooks(&gw, &["list", "--workspace", DEMO_WS]));
    assert_eq!(listed["data"][0]["id"], id.as_str());
    let shown = printed(&run_webhooks(&gw, &["--workspace", DEMO_WS, "show", &id]));
    assert_eq!(shown["status"], "active");
    let listed = printed(&run_webhooks(
        &gw,
        &["deliveries", &id, "--limit", "5", "--workspace", DEMO_WS],
    ));
    assert_eq!(listed["data"][0]["event_id"], event_id);
    let resumed = printed(&run_webhooks(&gw, &["resume", &id, "--workspace", DEMO_WS]));
    assert_eq!(resumed["status"], "active");
    let replayed = printed(&run_webhooks(
        &gw,
        &[
            "replay",
            &id,
            "--event-id",
            event_id,
            "--workspace",
            DEMO_WS,
        ],
    ));
    assert_eq!(replayed["replayed"], 1);
    eventually(Duration::from_secs(10), || async {
        receiver.received("/hook").len() == 2
    })
    .await
    .expect("replayed");

    // Refused: no workspace, neither or both of --event-id and --since, an id that is no id,
    // an unknown event.
    for args in [
        &["list"][..],
        &["replay", &id, "--workspace", DEMO_WS],
        &[
            "replay",
            &id,
            "--event-id",
            event_id,
            "--since",
            "1",
            "--workspace",
            DEMO_WS,
        ],
        &["show", "../keys", "--workspace", DEMO_WS],
    ] {
        let out = run_webhooks(&gw, args);
        assert!(!out.status.success(), "{args:?}");
        assert!(out.stdout.is_empty(), "{args:?}");
    }
    let out = run_webhooks(
        &gw,
        &[
            "replay",
            &id,
            "--event-id",
            "evt_nope",
            "--workspace",
            DEMO_WS,
        ],
    );
    assert!(String::from_utf8_lossy(&out.stderr).contains("not_found (404)"));
}

#[tokio::test]
async fn keys_cli_with_a_wrong_token_fails_cleanly() {
    let gw = Gateway::builder().start().await;
    let out = svcgate_command()
        .args([
            "keys",
            "--admin-url",
            &gw.admin,
            "--admin-token",
            "wrong",
            "list",
            "--workspace",
            DEMO_WS,
        ])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("authentication_error"));
}

#[test]
fn keys_cli_refuses_bad_arguments_before_calling_the_api_and_hides_the_token() {
    let run = |args: &[&str]| {
        svcgate_command()
            .env("SVCGATE_SERVER_ADMIN_TOKEN", "admin-token-never-shown")
            .args(args)
            .output()
            .unwrap()
    };
    let help = run(&["keys", "create", "--help"]);
    let text = String::from_utf8_lossy(&help.stdout);
    assert!(text.contains("SVCGATE_SERVER_ADMIN_TOKEN"), "{text}");
    assert!(!text.contains("admin-token-never-shown"), "{text}");
    // Port 9 is discard: were any of these sent, it would fail for another reason.
    let create = ["create", "--workspace", "ws_1", "--scope", "a:b"];
    for tail in [
        [&create[..], &["--monthly-budget", "NaN"]].concat(),
        [&create[..], &["--monthly-budget=-1"]].concat(),
        vec!["revoke", "key_1/rotate?x="],
        vec!["show", "../keys"],
    ] {
        let args = [&["keys", "--admin-url", "http://127.0.0.1:9"][..], &tail].concat();
        let out = run(&args);
        assert_eq!(out.status.code(), Some(2), "{args:?}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains("invalid value"), "{args:?}: {err}");
    }
}

#[test]
fn a_bad_config_exits_non_zero_naming_the_key() {
    let dir = tempfile::tempdir().unwrap();
    let cases = [
        ("[server]\nlisten = \"not-an-address\"\n", "server.listen"),
        ("[server]\nthreads = \"two\"\n", "server.threads"),
        ("[store]\nkind = \"postgres\"\n", "store.kind"),
        (
            "[upstream]\nlive = \"no-such-host.invalid:9000\"\n",
            "upstream.live",
        ),
        (
            "[[routes]]\nmethod = \"GET\"\npath = \"/models\"\nscope = \"models:read\"\n",
            "routes[0].path",
        ),
        ("[server\n", "not valid TOML"),
    ];
    for (text, expected) in cases {
        let path = dir.path().join("bad.toml");
        std::fs::write(&path, text).unwrap();
        let out = svcgate_command()
            .args(["serve", "--config"])
            .arg(&path)
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(2), "for {text:?}");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(stderr.contains(expected), "{expected} not in {stderr}");
        assert!(!stderr.contains("panicked"), "{stderr}");
    }
    let out = svcgate_command()
        .args(["serve", "--config", "/nonexistent/svcgate.toml"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));

    let out = svcgate_command()
        .args(["serve"])
        .env("SVCGATE_SERVER_THREADS", "many")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("SVCGATE_SERVER_THREADS"));

    // A spool directory that cannot take files stops start-up before anything is bound: an
    // outage would otherwise lose the audit records meant for it.
    let file = dir.path().join("a-file");
    std::fs::write(&file, "").unwrap();
    let out = svcgate_command()
        .args(["serve"])
        .env("SVCGATE_METERING_SPOOL_DIR", file.join("spool"))
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("metering.spool_dir"), "{stderr}");
}

#[test]
fn a_taken_port_fails_fast_with_a_clear_message() {
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = taken.local_addr().unwrap().port();
    let started = std::time::Instant::now();
    let out = svcgate_command()
        .args(["serve"])
        .env("SVCGATE_SERVER_LISTEN", format!("127.0.0.1:{port}"))
        .env(
            "SVCGATE_SERVER_ADMIN_LISTEN",
            format!("127.0.0.1:{}", free_port()),
        )
        .env(
            "SVCGATE_SERVER_METRICS_LISTEN",
            format!("127.0.0.1:{}", free_port()),
        )
        .stdout(Stdio::null())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("server.listen"), "{stderr}");
    assert!(started.elapsed() < Duration::from_secs(10));
}

#[tokio::test]
async fn sigterm_stops_the_gateway_promptly() {
    let mut gw = Gateway::builder().start().await;
    let status = std::process::Command::new("kill")
        .args(["-TERM", &gw.pid().to_string()])
        .status()
        .unwrap();
    assert!(status.success());
    let (exit, _took) = gw
        .wait_exit(Duration::from_secs(10))
        .expect("gateway exits after SIGTERM");
    assert!(exit.success(), "{exit:?}\n{}", gw.logs());
}

#[tokio::test]
async fn keys_cli_rotates_and_ends_the_grace_period() {
    let gw = Gateway::builder().start().await;
    let (id, old_key) = gw.create_key("live", &["chat.completions:create"]).await;
    let out = run_keys(
        &gw,
        &[
            "rotate",
            &id,
            "--grace-period-seconds",
            "600",
            "--idempotency-key",
            "k1",
        ],
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let rotated: Value = serde_json::from_slice(&out.stdout).unwrap();
    let again: Value =
        serde_json::from_slice(&run_keys(&gw, &["rotate", &id, "--idempotency-key", "k1"]).stdout)
            .unwrap();
    assert_eq!(rotated["key"], again["key"]);
    let new_key = rotated["key"].as_str().unwrap();
    assert_eq!(gw.chat(&old_key).await.status(), 200);
    assert_eq!(gw.chat(new_key).await.status(), 200);

    let out = run_keys(&gw, &["end-grace", &id]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(gw.chat(&old_key).await.status(), 401);
    assert_eq!(gw.chat(new_key).await.status(), 200);
}

/// `svcgate worker` serves no admin API: on Redis it starts without an admin token (the
/// gateway's start refuses the placeholder there), so its manifest keeps the token out of the
/// process that calls customers' URLs.
#[tokio::test]
async fn a_worker_on_redis_starts_without_an_admin_token() {
    let ns = TestNamespace::new();
    let outbox = tempfile::tempdir().unwrap();
    let port = free_port();
    let mut worker = svcgate_command()
        .arg("worker")
        .env("SVCGATE_STORE_KIND", "redis")
        .env("SVCGATE_STORE_URL", redis_url())
        .env("SVCGATE_STORE_NAMESPACE", &ns.name)
        .env("SVCGATE_SERVER_METRICS_LISTEN", format!("127.0.0.1:{port}"))
        .env("SVCGATE_WEBHOOKS_OUTBOX_DIR", outbox.path())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let started = eventually(Duration::from_secs(10), || async {
        tokio::net::TcpStream::connect(("127.0.0.1", port))
            .await
            .is_ok()
    })
    .await;
    let exited = worker.try_wait().unwrap();
    let _ = worker.kill();
    let output = worker.wait_with_output().unwrap();
    assert!(
        started.is_some() && exited.is_none(),
        "the worker did not start: {}",
        String::from_utf8_lossy(&output.stderr)
    );
}

/// `svcgate check --config FILE …`, with no `SVCGATE_*` variables of the developer's.
fn check(config: &std::path::Path, args: &[&str]) -> std::process::Output {
    svcgate_command()
        .arg("check")
        .arg("--config")
        .arg(config)
        .args(args)
        .output()
        .unwrap()
}

#[test]
fn check_passes_the_shipped_file_and_names_every_bad_key_of_a_broken_one() {
    let shipped = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("config/svcgate.toml");
    let out = check(&shipped, &[]);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(String::from_utf8_lossy(&out.stdout).contains("valid"));

    let dir = tempfile::tempdir().unwrap();
    let broken = dir.path().join("broken.toml");
    std::fs::write(
        &broken,
        "[server]\nlisten = \"nowhere\"\n[tracing]\notlp_endpoint = \"grpc://collector:4317\"\n\
         sampling_ratio = 2.0\n",
    )
    .unwrap();
    let out = check(&broken, &[]);
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&out.stderr);
    for key in [
        "server.listen",
        "tracing.otlp_endpoint",
        "tracing.sampling_ratio",
    ] {
        assert!(stderr.contains(key), "{key} not in {stderr}");
    }
    // The same file stops `serve` with the same report.
    let serve = svcgate_command()
        .args(["serve", "--config"])
        .arg(&broken)
        .output()
        .unwrap();
    assert_eq!(serve.status.code(), Some(2));
    assert_eq!(String::from_utf8_lossy(&serve.stderr), stderr);

    // Syntax errors and an unknown key too.
    std::fs::write(&broken, "[server]\nlisen = \"x\"\n").unwrap();
    let out = check(&broken, &[]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("lisen"));
    let out = check(&dir.path().join("missing.toml"), &[]);
    assert_eq!(out.status.code(), Some(2));

    // A worker's file needs no admin token; a gateway's does.
    std::fs::write(&broken, "[store]\nkind = \"redis\"\n").unwrap();
    let out = check(&broken, &[]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("server.admin_token"));
    assert_eq!(check(&broken, &["--worker"]).status.code(), Some(0));
}

#[tokio::test]
async fn check_connect_reports_what_answers_and_what_does_not() {
    let ns = TestNamespace::new();
    let backend = RecordingUpstream::start("live").await;
    let closed = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap()
    };
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("svcgate.toml");
    let write = |store_url: &str, sandbox: std::net::SocketAddr| {
        std::fs::write(
            &path,
            format!(
                "[server]\nadmin_token = \"{ADMIN_TOKEN}-long-enough\"\n\
                 [store]\nkind = \"redis\"\nurl = \"{store_url}\"\nnamespace = \"{}\"\n\
                 [upstream]\nlive = \"{}\"\nsandbox = \"{sandbox}\"\nconnect_timeout_ms = 500\n",
                ns.name, backend.addr
            ),
        )
        .unwrap();
    };
    write(&redis_url(), backend.addr);
    let out = check(&path, &["--connect"]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    for line in ["store: ok", "upstream.live: ok", "upstream.sandbox: ok"] {
        assert!(stdout.contains(line), "{line} not in {stdout}");
    }

    // A store and a backend that do not answer: each reported, exit 2.
    write(&format!("redis://{closed}/0"), closed);
    let out = check(&path, &["--connect"]);
    assert_eq!(out.status.code(), Some(2));
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stdout.contains("upstream.live: ok"), "{stdout}");
    assert!(stderr.contains("store: FAILED"), "{stderr}");
    assert!(
        stderr.contains(&format!(
            "upstream.sandbox: FAILED: cannot connect to {closed}"
        )),
        "{stderr}"
    );
    assert!(
        !stderr.contains("long-enough"),
        "no secret is shown: {stderr}"
    );
}
