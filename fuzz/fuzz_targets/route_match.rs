//! A request path against the default route table: one route or none, and a route's parameter
//! never holds a dot-segment, a `;` or an encoded character.
#![no_main]

use libfuzzer_sys::fuzz_target;
use std::sync::LazyLock;
use svcgate::proxy::config::default_routes;
use svcgate::proxy::routes::RouteTable;

/// What a parameter never holds: a separator, or an encoded dot, slash, backslash, NUL or
/// overlong UTF-8 lead byte.
const HIDDEN: [&str; 8] = [";", "%2e", "%2f", "%5c", "%00", "%c0", "%c1", "%25"];

static TABLE: LazyLock<RouteTable> =
    LazyLock::new(|| RouteTable::new(&default_routes()).expect("the default routes"));

fuzz_target!(|data: &[u8]| {
    let Ok(path) = std::str::from_utf8(data) else {
        return;
    };
    for method in [http::Method::GET, http::Method::POST, http::Method::HEAD] {
        let Some(route) = TABLE.find(&method, path) else {
            continue;
        };
        let template: Vec<&str> = route.template.split('/').collect();
        let given: Vec<&str> = path.split('/').collect();
        assert_eq!(template.len(), given.len());
        for (t, g) in template.iter().zip(&given) {
            if t.starts_with('{') {
                assert!(!g.is_empty() && *g != "." && *g != "..");
                let lower = g.to_ascii_lowercase();
                assert!(!HIDDEN.iter().any(|h| lower.contains(h)), "{path}");
            } else {
                assert_eq!(t, g);
            }
        }
    }
});
