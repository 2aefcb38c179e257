//! Names of webhook endpoints resolved in process and asynchronously.
//!
//! The system resolver (`getaddrinfo`) blocks a thread for as long as a name server takes to
//! answer, or to be given up on (by default 5 s per try, two tries), and a lookup the caller
//! has stopped waiting for goes on there: a name server that never answers held a blocking
//! thread per lookup, for every endpoint saved or delivered to under such a name. This
//! resolver (hickory) reads the same `/etc/resolv.conf` (name servers, search domains, `ndots`,
//! `timeout`, `attempts`) and `/etc/hosts`, and a lookup dropped is a lookup ended.

use hickory_resolver::config::LookupIpStrategy;
use hickory_resolver::TokioResolver;
use std::net::IpAddr;
use std::sync::LazyLock;

/// The process's resolver, set up from the system's configuration when first used (logged
/// once if it cannot be).
static RESOLVER: LazyLock<Result<TokioResolver, String>> = LazyLock::new(|| {
    let resolver = TokioResolver::builder_tokio()
        .map_err(|e| format!("cannot read the system's resolver configuration: {e}"))
        .and_then(|mut builder| {
            // Both families, as the system resolver answers: an endpoint is refused if any
            // address its name has is internal, not only the first family's.
            builder.options_mut().ip_strategy = LookupIpStrategy::Ipv4AndIpv6;
            builder
                .build()
                .map_err(|e| format!("cannot set up the name resolver: {e}"))
        });
    if let Err(e) = &resolver {
        tracing::error!(error = %e, "webhook endpoint names cannot be resolved");
    }
    resolver
});

/// Why a name did not resolve.
#[derive(Debug, thiserror::Error)]
pub enum LookupError {
    /// The name servers answered: no such name, or no address for it.
    #[error("does not resolve")]
    NotFound,
    /// The resolver could not be set up, or the name servers could not be reached.
    #[error("{0}")]
    Failed(String),
}

/// The addresses `host` (a name, not an address literal) resolves to now. Must run inside a
/// Tokio runtime.
pub async fn lookup(host: &str) -> Result<Vec<IpAddr>, LookupError> {
    let resolver = RESOLVER
        .as_ref()
        .map_err(|e| LookupError::Failed(e.clone()))?;
    match resolver.lookup_ip(host).await {
        Ok(found) => {
            let addrs: Vec<IpAddr> = found.iter().collect();
            if addrs.is_empty() {
                Err(LookupError::NotFound)
            } else {
                Ok(addrs)
            }
        }
        Err(e) if e.is_no_records_found() => Err(LookupError::NotFound),
        Err(e) => Err(LookupError::Failed(e.to_string())),
    }
}
