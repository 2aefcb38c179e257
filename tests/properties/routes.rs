//! Route matching: a path is one route or none, and a parameter never hides a path of its own.

use http::Method;
use proptest::prelude::*;
use svcgate::proxy::config::default_routes;
use svcgate::proxy::routes::RouteTable;

/// What a parameter never holds: a separator, or an encoded dot, slash, backslash, NUL or
/// overlong UTF-8 lead byte.
const HIDDEN: [&str; 8] = [";", "%2e", "%2f", "%5c", "%00", "%c0", "%c1", "%25"];

fn table() -> RouteTable {
    RouteTable::new(&default_routes()).expect("the default routes make a table")
}

fn method() -> impl Strategy<Value = Method> {
    prop::sample::select(vec![
        Method::GET,
        Method::POST,
        Method::PUT,
        Method::DELETE,
        Method::PATCH,
        Method::HEAD,
        Method::OPTIONS,
    ])
}

/// Segments that look like a path's, odd ones included.
fn segment() -> impl Strategy<Value = String> {
    prop_oneof![
        "[a-z_]{1,12}",
        Just("v1".to_string()),
        Just("..".to_string()),
        Just(".".to_string()),
        Just(String::new()),
        "%[0-9a-fA-F]{2}",
        "[a-z]{0,3}(%2e|%2f|%00|%c0%ae|;|%25)[a-z]{0,3}",
        "[ -~]{1,8}",
    ]
}

proptest! {
    #[test]
    fn a_path_matches_a_route_whose_fixed_segments_it_has(
        method in method(),
        segments in prop::collection::vec(segment(), 0..7),
    ) {
        let table = table();
        let path = format!("/{}", segments.join("/"));
        let Some(route) = table.find(&method, &path) else {
            return Ok(());
        };
        let template: Vec<&str> = route.template.split('/').collect();
        let given: Vec<&str> = path.split('/').collect();
        prop_assert_eq!(template.len(), given.len(), "{} for {}", route.template, path);
        for (t, g) in template.iter().zip(&given) {
            if t.starts_with('{') {
                // A parameter names something plain.
                prop_assert!(!g.is_empty() && *g != "." && *g != "..", "{}", path);
                let lower = g.to_ascii_lowercase();
                prop_assert!(!HIDDEN.iter().any(|h| lower.contains(h)), "{}", path);
            } else {
                prop_assert_eq!(t, g);
            }
        }
    }

    #[test]
    fn every_route_is_found_with_any_plain_id(id in "[A-Za-z0-9_-]{1,40}") {
        let table = table();
        for route in table.routes() {
            let path = route.template.replace("{id}", &id);
            let found = table.find(&route.method, &path).map(|r| &*r.template);
            // A fixed path wins over a parameter (`/v1/webhooks/listen`).
            prop_assert!(found.is_some(), "{} {}", route.method, path);
        }
    }
}
