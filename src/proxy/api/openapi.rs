//! The gateway's OpenAPI 3.1 document, served at `GET /v1/openapi.json` without a key.
//!
//! Built at start from the route table, so it lists exactly what is served: the operations the
//! gateway answers itself (tokens, webhook endpoints, the event stream; their bodies described
//! below) and the configured routes, each with the scope it needs (`security`, and
//! `x-svcgate-scopes`) and, for a configured route, its price (`x-svcgate-credits`).

use pingora::proxy::Session;
use serde_json::json;
use utoipa::openapi::extensions::ExtensionsBuilder;
use utoipa::openapi::path::{HttpMethod, OperationBuilder, ParameterBuilder, ParameterIn};
use utoipa::openapi::security::SecurityRequirement;
use utoipa::openapi::{ContentBuilder, OpenApi as Document, PathItem, Required, ResponseBuilder};
use utoipa::{OpenApi, PartialSchema, ToSchema};

use crate::error::ApiError;
use crate::openapi::{bearer, with_error_answers, GATEWAY_PATH};
use crate::proxy::respond;
use crate::proxy::routes::{Handler, Route, RouteTable};
use crate::webhooks::endpoint::WebhookFormat;
use crate::webhooks::manage::{EndpointView, ReplayInput, RotateInput, TestInput};

/// The name of the keys' and tokens' security scheme.
const SCHEME: &str = "api_key";
/// Tag of the routes the configuration adds.
const CONFIGURED: &str = "routes";

/// The gateway's document for `routes`.
pub fn document(routes: &RouteTable) -> Document {
    let mut doc = BuiltIn::openapi();
    for route in routes.routes() {
        // OpenAPI has no other methods (a route table's are the usual ones).
        let Some(method) = http_method(&route.method) else {
            continue;
        };
        let path = openapi_path(&route.template);
        let item = doc.paths.paths.entry(path.clone()).or_default();
        if operation(item, &method).is_none() {
            let op = configured(route, &path);
            item.merge_operations(PathItem::new(method.clone(), op));
        }
        if let Some(op) = operation(item, &method) {
            op.security = Some(vec![SecurityRequirement::new(SCHEME, [&*route.scope])]);
            let mut extensions =
                ExtensionsBuilder::new().add("x-svcgate-scopes", json!([route.scope]));
            if route.handler == Handler::Forward {
                extensions = extensions.add("x-svcgate-credits", json!(route.price));
            }
            op.extensions
                .get_or_insert_with(Default::default)
                .merge(extensions.build());
        }
    }
    let components = doc.components.get_or_insert_with(Default::default);
    components.add_security_scheme(
        SCHEME,
        bearer(
            "An API key (`svc_live_…`, `svc_test_…`) or a scoped token minted from one \
             (`POST /v1/tokens`). An operation's scopes are those the key needs.",
        ),
    );
    with_error_answers(&mut doc);
    doc.extensions
        .get_or_insert_with(Default::default)
        .insert("webhooks".to_string(), webhooks());
    doc
}

/// The OpenAPI 3.1 `webhooks` section: one `POST` per event type, as svcgate delivers it, its
/// body's `data` described by the event catalog's schema.
fn webhooks() -> serde_json::Value {
    let mut section = serde_json::Map::new();
    for t in crate::webhooks::catalog::event_types() {
        let body = json!({
            "type": "object",
            "required": ["id", "type", "created", "workspace", "data"],
            "properties": {
                "id": {"type": "string", "description": "The event id (`evt_…`), the same on every retry and replay."},
                "type": {"const": t.event_type},
                "created": {"type": "integer", "description": "Unix seconds."},
                "workspace": {"type": "string", "description": "The workspace (`ws_…`)."},
                "data": t.schema,
            },
        });
        let header = |name: &str, description: &str| json!({"name": name, "in": "header", "required": false, "description": description, "schema": {"type": "string"}});
        let operation = json!({
            "operationId": format!("event_{}", t.event_type.replace('.', "_")),
            "tags": ["events"],
            "summary": t.event_type,
            "description": format!(
                "{} Signed in the endpoint's `format`: `Service-Signature`, `Service-Timestamp` \
                 and `Service-Event-Id`, or the Standard Webhooks headers.",
                t.description
            ),
            "parameters": [
                header("Service-Signature", "Hex HMAC-SHA256 of `<timestamp>.<body>`; two, comma-separated, during a secret rotation (service format)."),
                header("Service-Timestamp", "Unix seconds when the delivery was signed (service format)."),
                header("Service-Event-Id", "The event id, to deduplicate on (service format)."),
                header("webhook-id", "The event id (standard-webhooks format)."),
                header("webhook-timestamp", "Unix seconds (standard-webhooks format)."),
                header("webhook-signature", "`v1,<base64>`; two, space-separated, during a secret rotation (standard-webhooks format)."),
            ],
            "requestBody": {"required": true, "content": {"application/json": {"schema": body}}},
            "responses": {"2XX": {"description": "Received: any 2xx within the timeout (10 s) acknowledges the delivery. 410 disables the endpoint; 429 and 503 may send `Retry-After`."}},
        });
        section.insert(t.event_type.clone(), json!({ "post": operation }));
    }
    serde_json::Value::Object(section)
}

/// The document serialized, as the gateway serves it.
pub fn serialized(routes: &RouteTable) -> bytes::Bytes {
    bytes::Bytes::from(crate::openapi::to_json(&document(routes)))
}

/// A configured route: forwarded to the backend, which defines its bodies.
fn configured(route: &Route, path: &str) -> utoipa::openapi::path::Operation {
    let mut op = OperationBuilder::new()
        .tag(CONFIGURED)
        .operation_id(Some(operation_id(&route.method, path)))
        .summary(Some(format!("{} {}", route.method, route.template)))
        .description(Some(format!(
            "Forwarded to the backend. Needs the scope `{}`; a success the backend reports no \
             price for (`Service-Credits`) costs {} credits.",
            route.scope, route.price
        )))
        .parameter(
            ParameterBuilder::new()
                .name("Service-Project")
                .parameter_in(ParameterIn::Header)
                .required(Required::False)
                .description(Some(
                    "The project the request is charged to: 1-64 characters of A-Z, a-z, 0-9, \
                     `.`, `_` or `-`.",
                ))
                .schema(Some(String::schema())),
        );
    for name in params(path) {
        op = op.parameter(
            ParameterBuilder::new()
                .name(name)
                .parameter_in(ParameterIn::Path)
                .required(Required::True)
                .schema(Some(String::schema())),
        );
    }
    if !matches!(
        route.method,
        http::Method::GET | http::Method::HEAD | http::Method::DELETE
    ) {
        op = op.request_body(Some(
            utoipa::openapi::request_body::RequestBodyBuilder::new()
                .description(Some("Forwarded to the backend as it is."))
                .content("application/json", ContentBuilder::new().build())
                .build(),
        ));
    }
    op.response(
        "200",
        ResponseBuilder::new()
            .description("The backend's answer; `Service-Credits` says what it cost.")
            .content("application/json", ContentBuilder::new().build())
            .build(),
    )
    .build()
}

/// `{*rest}` (a catch-all, which spans segments) as `{rest}`: OpenAPI knows one parameter form.
fn openapi_path(template: &str) -> String {
    template.replace("{*", "{")
}

/// The names of a path's parameters.
fn params(path: &str) -> impl Iterator<Item = &str> {
    path.split('/')
        .filter_map(|s| s.strip_prefix('{').and_then(|s| s.strip_suffix('}')))
}

/// `post_v1_chat_completions` for `POST /v1/chat/completions`.
fn operation_id(method: &http::Method, path: &str) -> String {
    let mut id = method.as_str().to_ascii_lowercase();
    for part in path
        .split(|c: char| !c.is_ascii_alphanumeric())
        .filter(|p| !p.is_empty())
    {
        id.push('_');
        id.push_str(part);
    }
    id
}

fn http_method(method: &http::Method) -> Option<HttpMethod> {
    Some(match *method {
        http::Method::GET => HttpMethod::Get,
        http::Method::POST => HttpMethod::Post,
        http::Method::PUT => HttpMethod::Put,
        http::Method::PATCH => HttpMethod::Patch,
        http::Method::DELETE => HttpMethod::Delete,
        http::Method::HEAD => HttpMethod::Head,
        http::Method::OPTIONS => HttpMethod::Options,
        http::Method::TRACE => HttpMethod::Trace,
        _ => return None,
    })
}

fn operation<'a>(
    item: &'a mut PathItem,
    method: &HttpMethod,
) -> Option<&'a mut utoipa::openapi::path::Operation> {
    match method {
        HttpMethod::Get => item.get.as_mut(),
        HttpMethod::Post => item.post.as_mut(),
        HttpMethod::Put => item.put.as_mut(),
        HttpMethod::Patch => item.patch.as_mut(),
        HttpMethod::Delete => item.delete.as_mut(),
        HttpMethod::Head => item.head.as_mut(),
        HttpMethod::Options => item.options.as_mut(),
        HttpMethod::Trace => item.trace.as_mut(),
    }
}

#[derive(OpenApi)]
#[openapi(
    info(
        title = "svcgate gateway API",
        description = "The gateway's own /v1 operations (scoped tokens, webhook endpoints, the \
                       event stream of `svcgate listen`) and the routes it forwards, each with \
                       the scope a key needs (`x-svcgate-scopes`) and its price in credits \
                       (`x-svcgate-credits`)."
    ),
    paths(
        mint_token,
        list_webhooks,
        create_webhook,
        get_webhook,
        update_webhook,
        delete_webhook,
        resume_webhook,
        webhook_deliveries,
        replay_webhook,
        rotate_webhook_secret,
        retry_webhook_delivery,
        test_webhook,
        webhook_event_types,
        listen,
        github_alert,
        serve,
    ),
    tags(
        (name = "tokens", description = "Short-lived scoped tokens for browsers and apps"),
        (name = "webhooks", description = "The workspace's webhook endpoints, per environment"),
        (name = "listen", description = "Webhook events streamed to `svcgate listen`"),
        (name = "events", description = "The events svcgate delivers to webhook endpoints"),
        (name = CONFIGURED, description = "Routes forwarded to the backend"),
        (name = "secret-scanning", description = "Leaked keys reported by GitHub's secret scanning"),
        (name = "documents", description = "This document"),
    ),
)]
struct BuiltIn;

/// What `POST /v1/tokens` takes.
#[derive(ToSchema)]
#[allow(dead_code)]
struct TokenRequest {
    /// A subset of the key's scopes, never `tokens:create`.
    scopes: Vec<String>,
    /// Seconds, 1 to 900 (the default).
    #[schema(minimum = 1, maximum = 900)]
    expires_in: Option<i64>,
    /// Up to 4 KiB of JSON, kept with the token and in its requests' audit records.
    metadata: Option<serde_json::Map<String, serde_json::Value>>,
}

/// A scoped token, shown this once.
#[derive(ToSchema)]
#[allow(dead_code)]
struct TokenMinted {
    /// The token (`svc_scoped_…`): a bearer credential like a key.
    value: String,
    scopes: crate::keys::Scopes,
    /// Unix seconds.
    expires_at: u64,
    metadata: serde_json::Map<String, serde_json::Value>,
}

/// A webhook endpoint to create (both fields required) or change (either).
#[derive(ToSchema)]
#[allow(dead_code)]
struct EndpointInput {
    /// Where deliveries go: `https://`, not an internal address.
    url: Option<String>,
    /// Event names and `resource.*` wildcards it subscribes to.
    events: Option<Vec<String>>,
    /// How deliveries are signed: `service` (the default) or `standard-webhooks`.
    format: Option<WebhookFormat>,
    /// Most deliveries per second, across workers (1-10000); `null` removes the limit.
    rate_limit_per_second: Option<u32>,
}

/// A delivery queued again, or a test event queued.
#[derive(ToSchema)]
#[allow(dead_code)]
struct DeliveryQueued {
    endpoint: String,
    /// The new delivery (`dlv_…`).
    delivery_id: String,
    /// The delivery retried (a retry).
    retry_of: Option<String>,
    /// The test event (a test).
    event_id: Option<String>,
}

/// The event types, each with a JSON Schema of its `data`.
#[derive(ToSchema)]
#[allow(dead_code)]
struct EventTypeList {
    data: Vec<EventTypeEntry>,
}

/// One event type.
#[derive(ToSchema)]
#[allow(dead_code)]
struct EventTypeEntry {
    #[schema(rename = "type")]
    event_type: String,
    description: String,
    /// A JSON Schema (draft 2020-12) of the event's `data`.
    schema: serde_json::Map<String, serde_json::Value>,
}

/// A deleted endpoint.
#[derive(ToSchema)]
#[allow(dead_code)]
struct EndpointDeleted {
    id: String,
    deleted: bool,
}

const ENDPOINT_ID: &str = "Webhook endpoint id (`we_…`)";

/// Mints a scoped token billed to the calling key.
#[utoipa::path(
    post, path = "/v1/tokens", tag = "tokens", operation_id = "mint_token",
    request_body = TokenRequest,
    responses((status = 201, description = "The token, shown this once", body = TokenMinted)),
)]
#[allow(dead_code)]
fn mint_token() {}

/// The endpoints of the key's workspace and environment.
#[utoipa::path(
    get, path = "/v1/webhooks", tag = "webhooks", operation_id = "list_webhooks",
    responses((status = 200, description = "The endpoints, without secrets", body = crate::openapi::EndpointList)),
)]
#[allow(dead_code)]
fn list_webhooks() {}

/// Creates an endpoint; its signing secret is in this answer only.
#[utoipa::path(
    post, path = "/v1/webhooks", tag = "webhooks", operation_id = "create_webhook",
    request_body = EndpointInput,
    responses((status = 201, description = "The endpoint, with its `secret`", body = EndpointView)),
)]
#[allow(dead_code)]
fn create_webhook() {}

/// One endpoint, with its retry while a failure holds it back.
#[utoipa::path(
    get, path = "/v1/webhooks/{id}", tag = "webhooks", operation_id = "get_webhook",
    params(("id" = String, Path, description = ENDPOINT_ID)),
    responses((status = 200, description = "The endpoint, without its secret", body = EndpointView)),
)]
#[allow(dead_code)]
fn get_webhook() {}

/// Changes an endpoint's URL or events.
#[utoipa::path(
    patch, path = "/v1/webhooks/{id}", tag = "webhooks", operation_id = "update_webhook",
    params(("id" = String, Path, description = ENDPOINT_ID)),
    request_body = EndpointInput,
    responses((status = 200, description = "The endpoint changed", body = EndpointView)),
)]
#[allow(dead_code)]
fn update_webhook() {}

/// Deletes an endpoint.
#[utoipa::path(
    delete, path = "/v1/webhooks/{id}", tag = "webhooks", operation_id = "delete_webhook",
    params(("id" = String, Path, description = ENDPOINT_ID)),
    responses((status = 200, description = "Deleted", body = EndpointDeleted)),
)]
#[allow(dead_code)]
fn delete_webhook() {}

/// Makes a paused endpoint active again, and retries a held-back one now.
#[utoipa::path(
    post, path = "/v1/webhooks/{id}/resume", tag = "webhooks", operation_id = "resume_webhook",
    params(("id" = String, Path, description = ENDPOINT_ID)),
    responses((status = 200, description = "The endpoint, active", body = EndpointView)),
)]
#[allow(dead_code)]
fn resume_webhook() {}

/// The endpoint's deliveries, newest first.
#[utoipa::path(
    get, path = "/v1/webhooks/{id}/deliveries", tag = "webhooks", operation_id = "webhook_deliveries",
    params(
        ("id" = String, Path, description = ENDPOINT_ID),
        ("limit" = Option<u32>, Query, description = "How many, 1 to the number kept (50 by default)"),
    ),
    responses((status = 200, description = "The deliveries", body = crate::openapi::DeliveryList)),
)]
#[allow(dead_code)]
fn webhook_deliveries() {}

/// Sends one event again, or every event since a time.
#[utoipa::path(
    post, path = "/v1/webhooks/{id}/replay", tag = "webhooks", operation_id = "replay_webhook",
    params(("id" = String, Path, description = ENDPOINT_ID)),
    request_body = ReplayInput,
    responses((status = 202, description = "What was queued", body = crate::openapi::ReplayQueued)),
)]
#[allow(dead_code)]
fn replay_webhook() {}

/// Gives the endpoint a new secret, shown this once; the old one signs beside it (two
/// signatures on every delivery) for the grace period.
#[utoipa::path(
    post, path = "/v1/webhooks/{id}/rotate-secret", tag = "webhooks", operation_id = "rotate_webhook_secret",
    params(("id" = String, Path, description = ENDPOINT_ID)),
    request_body = RotateInput,
    responses((status = 201, description = "The endpoint, with its new `secret`", body = EndpointView)),
)]
#[allow(dead_code)]
fn rotate_webhook_secret() {}

/// Sends one failed (or skipped) delivery's event again, as a new delivery.
#[utoipa::path(
    post, path = "/v1/webhooks/{id}/deliveries/{delivery_id}/retry", tag = "webhooks", operation_id = "retry_webhook_delivery",
    params(
        ("id" = String, Path, description = ENDPOINT_ID),
        ("delivery_id" = String, Path, description = "Delivery id (`dlv_…`)"),
    ),
    responses((status = 202, description = "The new delivery", body = DeliveryQueued)),
)]
#[allow(dead_code)]
fn retry_webhook_delivery() {}

/// Sends the endpoint alone a test event with a sample payload.
#[utoipa::path(
    post, path = "/v1/webhooks/{id}/test", tag = "webhooks", operation_id = "test_webhook",
    params(("id" = String, Path, description = ENDPOINT_ID)),
    request_body = TestInput,
    responses((status = 202, description = "The test event and its delivery", body = DeliveryQueued)),
)]
#[allow(dead_code)]
fn test_webhook() {}

/// The event types, each with a description and a JSON Schema of its `data`.
#[utoipa::path(
    get, path = "/v1/webhooks/event-types", tag = "webhooks", operation_id = "webhook_event_types",
    responses((status = 200, description = "The event catalog", body = EventTypeList)),
)]
#[allow(dead_code)]
fn webhook_event_types() {}

/// Server-Sent Events: `session` (with a secret for this stream), then a `delivery` for each
/// event of the key's workspace and environment, signed as the webhook worker signs them.
#[utoipa::path(
    get, path = "/v1/webhooks/listen", tag = "listen", operation_id = "listen",
    params(("events" = Option<String>, Query, description = "Event names and `resource.*` wildcards, comma-separated; none means all")),
    responses((status = 200, description = "The event stream", content_type = "text/event-stream", body = String)),
)]
#[allow(dead_code)]
fn listen() {}

/// One token of a GitHub secret-scanning alert.
#[derive(ToSchema)]
#[allow(dead_code)]
struct AlertToken {
    /// The token found.
    token: String,
    /// GitHub's name of the pattern that matched.
    #[schema(rename = "type")]
    token_type: Option<String>,
    /// Where it was found.
    url: Option<String>,
    /// What GitHub scanned (`content`, `commit`, …).
    source: Option<String>,
}

/// What was made of one token, in GitHub's format.
#[derive(ToSchema)]
#[allow(dead_code)]
struct AlertAnswer {
    /// The token, as sent.
    token_raw: String,
    /// The type, as sent.
    token_type: String,
    /// `true_positive` (a key of this deployment: a live one is now revoked) or
    /// `false_positive`.
    label: String,
}

/// GitHub's secret-scanning partner alert: no key; GitHub's ECDSA P-256 signature of the raw
/// body (`Github-Public-Key-Signature`, base64 DER) by the key `Github-Public-Key-Identifier`
/// names. Live keys found are revoked (`key.auto_revoked`).
#[utoipa::path(
    post, path = "/v1/secret-scanning/github", tag = "secret-scanning", operation_id = "github_secret_scanning_alert",
    security(()),
    params(
        ("Github-Public-Key-Identifier" = String, Header, description = "The id of the GitHub key that signed the alert"),
        ("Github-Public-Key-Signature" = String, Header, description = "Base64 of the DER ECDSA signature of the raw body"),
    ),
    request_body = Vec<AlertToken>,
    responses((status = 200, description = "One answer per token, in order", body = Vec<AlertAnswer>)),
)]
#[allow(dead_code)]
fn github_alert() {}

/// This document.
#[utoipa::path(
    get, path = "/v1/openapi.json", tag = "documents", operation_id = "openapi",
    security(()),
    responses((status = 200, description = "This OpenAPI 3.1 document", content_type = "application/json", body = Object)),
)]
#[allow(dead_code)]
fn serve() {}

/// Whether `path` asks for the document.
pub fn is_document(path: &str) -> bool {
    path == GATEWAY_PATH
}

/// Answers `GET` (and `HEAD`) of the document, without a key: it describes no secret, and
/// tooling fetches it without one.
pub(crate) async fn answer(
    session: &mut Session,
    document: &bytes::Bytes,
    ctx: &crate::proxy::RequestCtx,
) -> Result<(), ApiError> {
    let method = &session.req_header().method;
    if method != http::Method::GET && method != http::Method::HEAD {
        return Err(ApiError::MethodNotAllowed(
            format!("{GATEWAY_PATH} is read with GET").into(),
        ));
    }
    let headers = ctx.answer_headers();
    respond::json(session, 200, document.to_vec(), &ctx.request_id, &headers)
        .await
        .map_err(|_| ApiError::Upstream("could not write the response".into()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::default_routes;
    use crate::openapi::operations;

    #[test]
    fn every_route_has_its_operation_and_every_operation_its_route() {
        let table = RouteTable::new(&default_routes()).unwrap();
        let mut doc = document(&table);
        let mut documented = 0;
        for item in doc.paths.paths.values_mut() {
            documented += operations(item).count();
        }
        // The document's own operation and GitHub's alerts are the ones not in the table.
        assert_eq!(documented, table.routes().len() + 2);
        for route in table.routes() {
            let item = &doc.paths.paths[&openapi_path(&route.template)];
            let method = http_method(&route.method).unwrap();
            let mut item = item.clone();
            let op = operation(&mut item, &method).unwrap();
            assert!(op.security.is_some(), "{} {}", route.method, route.template);
        }
    }

    #[test]
    fn operation_ids_name_method_and_path() {
        assert_eq!(
            operation_id(&http::Method::POST, "/v1/chat/completions"),
            "post_v1_chat_completions"
        );
        assert_eq!(
            operation_id(&http::Method::GET, "/v1/agents/runs/{id}"),
            "get_v1_agents_runs_id"
        );
    }
}
