//! Signals, draining, graceful upgrade, and the process's threads.

use super::*;

#[tokio::test]
async fn sigterm_drains_then_closes_the_listeners_and_lets_requests_in_flight_finish() {
    let live = RecordingUpstream::start("live").await;
    let mut gw = Gateway::builder()
        .live(live.addr)
        .config(|c| {
            c.server.shutdown_grace_seconds = 2;
            c.server.shutdown_timeout_seconds = 3;
        })
        .start()
        .await;
    let (_, key) = gw.create_key("live", &["chat.completions:create"]).await;
    // Each request on a connection of its own, as a client arriving after SIGTERM.
    let fresh = || {
        reqwest::Client::builder()
            .pool_max_idle_per_host(0)
            .build()
            .unwrap()
    };
    let chat = |delay_ms: u64| {
        fresh()
            .post(format!("{}/v1/chat/completions", gw.base))
            .bearer_auth(&key)
            .header("x-test-delay-ms", delay_ms.to_string())
            .json(&json!({"model": "m"}))
    };
    let ready = |base: &str| fresh().get(format!("{base}/readyz")).send();
    assert_eq!(ready(&gw.base).await.unwrap().status(), 200);
    let in_flight_at_sigterm = tokio::spawn(chat(1500).send());
    tokio::time::sleep(Duration::from_millis(300)).await;

    let signalled = Instant::now();
    std::process::Command::new("kill")
        .args(["-TERM", &gw.pid().to_string()])
        .status()
        .unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;

    // Draining: not ready on either port, but still accepting and serving, and each
    // response closes its connection.
    assert_error(ready(&gw.base).await.unwrap(), 503, "service_unavailable").await;
    assert_error(ready(&gw.admin).await.unwrap(), 503, "service_unavailable").await;
    let resp = chat(0).send().await.expect("accepted while draining");
    assert_eq!(resp.status(), 200);
    assert_eq!(resp.headers()["connection"], "close");
    // Started during the drain, finishing after the listeners have closed.
    let in_flight_at_close = tokio::spawn(chat(2500).send());

    tokio::time::sleep(Duration::from_millis(2600).saturating_sub(signalled.elapsed())).await;
    let refused = chat(0).send().await;
    assert!(
        refused.as_ref().is_err_and(|e| e.is_connect()),
        "the listener is closed after the drain: {refused:?}"
    );
    for request in [in_flight_at_sigterm, in_flight_at_close] {
        let resp = request
            .await
            .unwrap()
            .expect("the request in flight is answered");
        assert_eq!(resp.status(), 200);
        assert_eq!(resp.json::<Value>().await.unwrap()["upstream"], "live");
    }
    let (status, _) = tokio::task::spawn_blocking(move || gw.wait_exit(Duration::from_secs(15)))
        .await
        .unwrap()
        .expect("the gateway exits");
    assert!(status.success(), "{status:?}");
    // Drain, then the in-flight window, then the last flush: not the 15 s limit.
    assert!(signalled.elapsed() < Duration::from_secs(10));
}

#[tokio::test]
async fn a_graceful_upgrade_hands_over_without_refusing_requests() {
    let ns = TestNamespace::new();
    let mut gw = Gateway::builder()
        .redis(&redis_url(), &ns.name)
        .config(|c| {
            c.server.shutdown_grace_seconds = 1;
            c.server.shutdown_timeout_seconds = 1;
        })
        .start()
        .await;
    let ws = gw.create_workspace().await;
    let (_, key) = gw
        .create_key_in(&ws, "live", &["chat.completions:create"])
        .await;
    let base = gw.base.clone();
    let client = reqwest::Client::builder()
        .pool_max_idle_per_host(0)
        .build()
        .unwrap();
    let load = tokio::spawn(async move {
        let mut statuses = Vec::new();
        let started = std::time::Instant::now();
        while started.elapsed() < Duration::from_secs(8) {
            let status = client
                .post(format!("{base}/v1/chat/completions"))
                .bearer_auth(&key)
                .json(&json!({}))
                .send()
                .await
                .map(|r| r.status().as_u16())
                .map_err(|e| format!("{e:?}"));
            statuses.push(status);
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        statuses
    });
    let gw = tokio::task::spawn_blocking(move || {
        gw.upgrade();
        gw
    })
    .await
    .unwrap();
    let statuses = load.await.unwrap();
    assert!(statuses.len() > 50);
    assert!(
        statuses.iter().all(|s| *s == Ok(200)),
        "refused or failed during the upgrade: {:?}",
        statuses
            .iter()
            .filter(|s| **s != Ok(200))
            .collect::<Vec<_>>()
    );
    // The new process serves the admin API and the gateway.
    let (id, _) = gw.create_key_in(&ws, "live", &["models:read"]).await;
    assert!(id.starts_with("key_"));
    assert!(gw.logs().contains("svcgate serving"));
}

/// SIGQUIT hands the listeners to a new process only once one waits for them (before, the
/// gateway gave up after 5 s and closed them, leaving nothing to serve); SIGHUP is ignored
/// (by default it ended the process on the spot, requests in flight and unflushed spend with
/// it).
#[tokio::test]
async fn a_sigquit_with_no_new_process_and_a_sighup_leave_the_gateway_serving() {
    let gw = Gateway::builder().start().await;
    let (_, key) = gw.create_key("live", &["chat.completions:create"]).await;
    for signal in ["-QUIT", "-HUP"] {
        std::process::Command::new("kill")
            .args([signal, &gw.pid().to_string()])
            .status()
            .unwrap();
    }
    // Longer than the hand-over's retries (5 × 1 s).
    tokio::time::sleep(Duration::from_secs(7)).await;
    assert_eq!(gw.chat(&key).await.status(), 200, "{}", gw.logs());
    let logs = gw.logs();
    assert!(logs.contains("SIGQUIT refused"), "{logs}");
    assert!(logs.contains("SIGHUP ignored"), "{logs}");
}

/// The threads of a process: id, name and nice value, from `/proc/<pid>/task`.
fn threads_of(pid: u32) -> Vec<(u32, String, i32)> {
    std::fs::read_dir(format!("/proc/{pid}/task"))
        .expect("/proc")
        .filter_map(|task| {
            let task = task.ok()?;
            let tid = task.file_name().to_str()?.parse().ok()?;
            let stat = std::fs::read_to_string(task.path().join("stat")).ok()?;
            // `tid (name) state …`: the name may hold spaces and parentheses; the nice value is
            // the 19th field, the 17th after the name.
            let (head, rest) = stat.rsplit_once(')')?;
            let name = head.split_once('(')?.1.to_string();
            let nice = rest.split_whitespace().nth(16)?.parse().ok()?;
            Some((tid, name, nice))
        })
        .collect()
}

/// mimalloc's 2 MiB regions, backed by huge pages, kept resident memory with 100,000 cached keys
/// above 100 MB: the gateway turns them off for itself.
#[tokio::test]
#[cfg(target_os = "linux")]
async fn the_gateway_runs_without_transparent_huge_pages() {
    let thp_enabled = |pid: &str| {
        let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
        status
            .lines()
            .find_map(|l| l.strip_prefix("THP_enabled:"))
            .map(|v| v.trim().to_string())
    };
    if thp_enabled("self").as_deref() != Some("1") {
        eprintln!("this kernel has no transparent huge pages to turn off; nothing to check");
        return;
    }
    let gw = Gateway::builder().start().await;
    assert_eq!(thp_enabled(&gw.pid().to_string()).as_deref(), Some("0"));
}

#[tokio::test]
async fn the_stores_threads_run_behind_the_request_workers() {
    let gw = Gateway::builder().start().await;
    let (_, key) = gw.create_key("live", &["chat.completions:create"]).await;
    assert_eq!(gw.chat(&key).await.status(), 200, "{}", gw.logs());
    let threads = threads_of(gw.pid());
    let nice_of = |name: &str| -> Vec<i32> {
        threads
            .iter()
            .filter(|(_, n, _)| n == name)
            .map(|(_, _, nice)| *nice)
            .collect()
    };
    let main = threads
        .iter()
        .find(|(tid, _, _)| *tid == gw.pid())
        .map(|(_, _, nice)| *nice)
        .expect("the main thread");
    let (store, workers) = (nice_of("svcgate-store"), nice_of("svcgate gateway"));
    assert!(!store.is_empty() && !workers.is_empty(), "{threads:?}");
    assert!(workers.iter().all(|&n| n == main), "{threads:?}");
    assert!(
        store.iter().all(|&n| n == (main + 10).min(19)),
        "{threads:?}"
    );
}

#[test]
fn a_redis_store_with_no_live_backend_refuses_to_start_unless_simulated_is_said() {
    let ns = TestNamespace::new();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("svcgate.toml");
    let ports: [u16; 3] = free_ports();
    let config = |live: &str| {
        format!(
            "[server]\nadmin_token = \"{ADMIN_TOKEN}-long-enough\"\nlisten = \"127.0.0.1:{}\"\n\
             admin_listen = \"127.0.0.1:{}\"\nmetrics_listen = \"127.0.0.1:{}\"\n\
             [store]\nkind = \"redis\"\nurl = \"{}\"\nnamespace = \"{}\"\n[upstream]\n{live}\n",
            ports[0],
            ports[1],
            ports[2],
            redis_url(),
            ns.name
        )
    };
    std::fs::write(&path, config("")).unwrap();
    let out = svcgate_command()
        .args(["serve", "--config"])
        .arg(&path)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("upstream.live"), "{stderr}");
    assert!(stderr.contains(r#"live = "simulated""#), "{stderr}");

    // Said explicitly, the simulator serves.
    std::fs::write(&path, config("live = \"simulated\"")).unwrap();
    let mut child = svcgate_command()
        .args(["serve", "--config"])
        .arg(&path)
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let ready = (0..200).any(|_| {
        std::thread::sleep(std::time::Duration::from_millis(25));
        std::net::TcpStream::connect(("127.0.0.1", ports[0])).is_ok()
    });
    let _ = child.kill();
    let _ = child.wait();
    assert!(ready, "the gateway serves with live = \"simulated\"");
}
