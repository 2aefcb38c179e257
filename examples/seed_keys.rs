//! Seeds N keys into a Redis namespace for `benches/load.sh` and prints their values, one per
//! line (the benchmark's only use of full key values; they live in a temporary file).
//!
//! ```sh
//! cargo run --release --example seed_keys -- REDIS_URL NAMESPACE WORKSPACE N > keys.txt
//! ```

use std::io::Write;
use std::sync::Arc;

use svcgate::keys::{self, Environment, KeyParams, Scopes};
use svcgate::store::{KeyStore, RedisStore, StoreHealth};

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [url, namespace, workspace, n] = &args[..] else {
        eprintln!("usage: seed_keys REDIS_URL NAMESPACE WORKSPACE N");
        std::process::exit(2);
    };
    let n: usize = n.parse().expect("N is a number");
    let store = Arc::new(RedisStore::connect(url, namespace).expect("Redis URL"));
    store.ping().await.expect("Redis answers");
    let mut out = std::io::BufWriter::new(std::io::stdout().lock());
    let mut pending = Vec::new();
    for i in 0..n {
        let (new, record) = keys::issue(
            KeyParams {
                workspace: workspace.clone(),
                environment: Environment::Live,
                scopes: Scopes::new(["chat.completions:create"]),
                name: format!("load-{i}"),
                monthly_budget: None,
                expires_at: None,
                rate_limit: None,
                metadata: None,
            },
            svcgate::ids::unix_now(),
        );
        writeln!(out, "{}", new.value).expect("stdout");
        let store = store.clone();
        pending.push(tokio::spawn(async move { store.insert_key(&record).await }));
        if pending.len() == 256 {
            for p in pending.drain(..) {
                p.await.expect("task").expect("insert");
            }
        }
    }
    for p in pending {
        p.await.expect("task").expect("insert");
    }
}
