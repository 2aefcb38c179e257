//! The OpenAPI documents as a client sees them: served by the zero-config gateway without
//! credentials, OpenAPI 3.1, and complete: every admin route, every route of the table with
//! its scope and price.

mod common;

use common::*;
use reqwest::Method;
use serde_json::{json, Value};
use std::collections::BTreeSet;
use svcgate::config::RouteConfig;
use svcgate::metering::Credits;

const METHODS: [&str; 5] = ["get", "post", "put", "patch", "delete"];

/// `(METHOD, path)` of every operation of `doc`.
fn operations(doc: &Value) -> BTreeSet<(String, String)> {
    let mut ops = BTreeSet::new();
    for (path, item) in doc["paths"].as_object().expect("paths") {
        for method in METHODS {
            if item.get(method).is_some() {
                ops.insert((method.to_ascii_uppercase(), path.clone()));
            }
        }
    }
    ops
}

async fn fetch(http: &reqwest::Client, url: String) -> Value {
    let resp = http.get(url).send().await.unwrap();
    assert_eq!(resp.status(), 200);
    assert_eq!(resp.headers()["content-type"], "application/json");
    assert!(resp.headers().contains_key("service-request-id"));
    let doc: Value = resp.json().await.unwrap();
    assert!(
        doc["openapi"].as_str().unwrap().starts_with("3.1"),
        "{}",
        doc["openapi"]
    );
    doc
}

/// The routes `src/admin/mod.rs`'s `router` declares, as `(METHOD, path)`: read from its source,
/// so a route added there without an operation in the document fails this test.
fn admin_router_routes() -> BTreeSet<(String, String)> {
    let source = include_str!("../src/admin/mod.rs");
    let start = source.find("pub fn router(").expect("the admin router");
    let body = &source[start..];
    let body = &body[..body.find("\n}\n").expect("the router's end")];
    // Routes before `.nest("/admin/v1", api)` are nested under it.
    let nest_at = body.find(".nest(\"/admin/v1\"").expect("the nested API");
    let mut routes = BTreeSet::new();
    let mut rest = body;
    let mut offset = 0;
    while let Some(at) = rest.find(".route(") {
        let call_start = at + ".route(".len();
        let call = &rest[call_start..];
        // The call's own parentheses, balanced.
        let mut depth = 1;
        let end = call
            .char_indices()
            .find(|&(_, c)| {
                depth += match c {
                    '(' => 1,
                    ')' => -1,
                    _ => 0,
                };
                depth == 0
            })
            .map(|(i, _)| i)
            .expect("a closed .route(");
        let call = &call[..end];
        let first = call.split(',').next().unwrap().trim();
        let path = match first.strip_prefix('"').and_then(|p| p.strip_suffix('"')) {
            Some(literal) => literal.to_string(),
            None if first == "openapi::PATH" => svcgate::openapi::ADMIN_PATH.to_string(),
            None => panic!("a route path the test cannot read: {first}"),
        };
        let path = match offset + at < nest_at {
            true => format!("/admin/v1{path}"),
            false => path,
        };
        let handlers = &call[first.len()..];
        for method in METHODS {
            let called = handlers.starts_with(&format!(", {method}("))
                || handlers.contains(&format!(" {method}("))
                || handlers.contains(&format!(".{method}("))
                || handlers.contains(&format!("\n{method}("));
            if called {
                routes.insert((method.to_ascii_uppercase(), path.clone()));
            }
        }
        offset += call_start + end;
        rest = &rest[call_start + end..];
    }
    routes
}

#[tokio::test]
async fn the_admin_document_lists_every_route_of_the_admin_router() {
    let gw = Gateway::builder().start().await;
    // No admin token: the document holds no secret.
    let doc = fetch(&gw.http, format!("{}/admin/v1/openapi.json", gw.admin)).await;
    let documented = operations(&doc);
    let routed = admin_router_routes();
    assert!(routed.len() >= 25, "{routed:?}");
    assert_eq!(
        routed.difference(&documented).collect::<Vec<_>>(),
        Vec::<&(String, String)>::new(),
        "routes without an operation"
    );
    assert_eq!(
        documented.difference(&routed).collect::<Vec<_>>(),
        Vec::<&(String, String)>::new(),
        "operations without a route"
    );
    assert!(documented.len() >= 8);

    // The admin token as the scheme of everything but the probes and the document.
    let scheme = &doc["components"]["securitySchemes"]["admin_token"];
    assert_eq!(scheme["type"], "http");
    assert_eq!(scheme["scheme"], "bearer");
    assert_eq!(doc["security"], json!([{"admin_token": []}]));
    for path in ["/healthz", "/readyz", "/admin/v1/openapi.json"] {
        assert_eq!(doc["paths"][path]["get"]["security"], json!([{}]), "{path}");
    }
    // Errors: the error body, on every operation.
    let error = &doc["components"]["schemas"]["ErrorBody"];
    assert_eq!(error["required"], json!(["error"]));
    let codes = &error["properties"]["error"]["properties"]["code"]["enum"];
    for code in ["authentication_error", "invalid_request_error", "not_found"] {
        assert!(codes.as_array().unwrap().contains(&json!(code)), "{code}");
    }
    for (method, path) in &documented {
        let op = &doc["paths"][path][method.to_ascii_lowercase()];
        assert_eq!(
            op["responses"]["default"]["$ref"], "#/components/responses/Error",
            "{method} {path}"
        );
    }

    // Every documented operation is served: none answered by the router's fallbacks.
    for (method, path) in &documented {
        let url = path.replace('{', "x_").replace('}', "");
        let method = Method::from_bytes(method.as_bytes()).unwrap();
        let resp = gw.admin_request(method.clone(), &url).send().await.unwrap();
        let status = resp.status().as_u16();
        let body = resp.text().await.unwrap();
        assert_ne!(status, 405, "{method} {url}: {body}");
        assert!(
            !body.contains("no such admin route"),
            "{method} {url}: {body}"
        );
    }
}

#[tokio::test]
async fn the_gateway_document_lists_its_own_operations_and_the_configured_routes() {
    let gw = Gateway::builder().start().await;
    // No key.
    let doc = fetch(&gw.http, format!("{}/v1/openapi.json", gw.base)).await;
    let documented = operations(&doc);
    assert!(documented.len() >= 8, "{documented:?}");
    for (method, path) in [
        ("POST", "/v1/tokens"),
        ("GET", "/v1/webhooks"),
        ("POST", "/v1/webhooks"),
        ("GET", "/v1/webhooks/{id}"),
        ("PATCH", "/v1/webhooks/{id}"),
        ("DELETE", "/v1/webhooks/{id}"),
        ("POST", "/v1/webhooks/{id}/resume"),
        ("GET", "/v1/webhooks/{id}/deliveries"),
        ("POST", "/v1/webhooks/{id}/replay"),
        ("GET", "/v1/webhooks/listen"),
        ("POST", "/v1/secret-scanning/github"),
        ("GET", "/v1/openapi.json"),
    ] {
        assert!(
            documented.contains(&(method.to_string(), path.to_string())),
            "{method} {path}"
        );
    }
    assert_eq!(
        doc["paths"]["/v1/tokens"]["post"]["security"],
        json!([{"api_key": ["tokens:create"]}])
    );
    for (method, path) in [
        ("get", "/v1/openapi.json"),
        ("post", "/v1/secret-scanning/github"),
    ] {
        assert_eq!(
            doc["paths"][path][method]["security"],
            json!([{}]),
            "{path}"
        );
    }
    let scheme = &doc["components"]["securitySchemes"]["api_key"];
    assert_eq!(scheme["scheme"], "bearer");

    // The embedded default's routes, with their scopes and prices.
    let defaults: toml::Table = include_str!("../config/svcgate.toml").parse().unwrap();
    let routes = defaults["routes"].as_array().unwrap();
    assert!(!routes.is_empty());
    for route in routes {
        let method = route["method"].as_str().unwrap().to_ascii_lowercase();
        let path = route["path"].as_str().unwrap();
        let scope = route["scope"].as_str().unwrap();
        let op = &doc["paths"][path][&method];
        assert_eq!(
            op["security"],
            json!([{"api_key": [scope]}]),
            "{method} {path}"
        );
        assert_eq!(op["x-svcgate-scopes"], json!([scope]), "{method} {path}");
        let price = route["price"]
            .as_integer()
            .map_or_else(|| route["price"].as_float().unwrap(), |p| p as f64);
        assert_eq!(
            op["x-svcgate-credits"].as_f64(),
            Some(price),
            "{method} {path}"
        );
    }

    // Only GET reads it.
    let resp = gw
        .request(Method::POST, "/v1/openapi.json")
        .send()
        .await
        .unwrap();
    assert_error(resp, 405, "invalid_request_error").await;
}

#[tokio::test]
async fn the_gateway_document_follows_the_configured_route_table() {
    let gw = Gateway::builder()
        .config(|c| {
            c.routes = vec![RouteConfig {
                method: "POST".to_string(),
                path: "/v1/embeddings/{model}".to_string(),
                scope: "embeddings:create".to_string(),
                price: Credits::from_micros(250_000),
                upgrade: false,
                reserve: None,
            }]
        })
        .start()
        .await;
    let doc = fetch(&gw.http, format!("{}/v1/openapi.json", gw.base)).await;
    let op = &doc["paths"]["/v1/embeddings/{model}"]["post"];
    assert_eq!(op["security"], json!([{"api_key": ["embeddings:create"]}]));
    assert_eq!(op["x-svcgate-credits"], json!(0.25));
    assert_eq!(op["parameters"][1]["name"], "model");
    assert_eq!(op["parameters"][1]["in"], "path");
    // Giving routes replaces the default table; the gateway's own operations stay.
    assert!(doc["paths"].get("/v1/chat/completions").is_none());
    assert!(doc["paths"]["/v1/tokens"].get("post").is_some());

    // The command line prints what is served, from the same configuration.
    let printed = svcgate_command()
        .args(["openapi", "gateway", "--config"])
        .arg(gw.config_path())
        .output()
        .unwrap();
    assert!(printed.status.success(), "{printed:?}");
    let printed: Value = serde_json::from_slice(&printed.stdout).unwrap();
    assert_eq!(printed, doc);
}

#[tokio::test]
async fn answers_fit_the_documented_schemas() {
    let gw = Gateway::builder().start().await;
    let admin = fetch(&gw.http, format!("{}/admin/v1/openapi.json", gw.admin)).await;
    let gateway = fetch(&gw.http, format!("{}/v1/openapi.json", gw.base)).await;

    let printed = svcgate_command()
        .args(["openapi", "admin"])
        .output()
        .unwrap();
    assert!(printed.status.success(), "{printed:?}");
    assert_eq!(
        serde_json::from_slice::<Value>(&printed.stdout).unwrap(),
        admin
    );

    // Every member an answer has is documented, and every required one is there.
    let fits = |doc: &Value, name: &str, value: &Value| {
        let schema = &doc["components"]["schemas"][name];
        let properties = schema["properties"]
            .as_object()
            .unwrap_or_else(|| panic!("{name}: no properties"));
        for member in value.as_object().unwrap().keys() {
            assert!(properties.contains_key(member), "{member} not in {schema}");
        }
        for required in schema["required"].as_array().into_iter().flatten() {
            assert!(
                value.get(required.as_str().unwrap()).is_some(),
                "{required}"
            );
        }
    };
    let resp = gw
        .admin_request(Method::POST, "/admin/v1/keys")
        .json(&json!({"workspace": DEMO_WS, "environment": "live",
                      "scopes": ["tokens:create", "models:read"]}))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 201);
    let key: Value = resp.json().await.unwrap();
    fits(&admin, "KeyView", &key);
    fits(
        &admin,
        "Workspace",
        &gw.admin_get(&format!("/admin/v1/workspaces/{DEMO_WS}"))
            .await,
    );

    let resp = gw
        .request(Method::POST, "/v1/tokens")
        .bearer_auth(key["key"].as_str().unwrap())
        .json(&json!({"scopes": ["models:read"], "metadata": {"user": "u1"}}))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 201);
    fits(&gateway, "TokenMinted", &resp.json().await.unwrap());

    let resp = gw
        .request(Method::GET, "/v1/nothing")
        .bearer_auth(key["key"].as_str().unwrap())
        .send()
        .await
        .unwrap();
    fits(
        &gateway,
        "ErrorBody",
        &assert_error(resp, 404, "not_found").await,
    );
}
