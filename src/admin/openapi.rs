//! The admin API's OpenAPI 3.1 document, generated from the handlers' `#[utoipa::path]`
//! attributes and the types they take and answer, and served at `GET /admin/v1/openapi.json`.
//!
//! Served without the admin token: it names paths and shapes, no secret, and tooling (client
//! generators, validators, API explorers) fetches it without credentials.

use axum::response::{IntoResponse, Response};
use std::sync::LazyLock;
use utoipa::openapi::OpenApi as Document;
use utoipa::{Modify, OpenApi};

use crate::openapi::{bearer, operations, with_error_answers, ADMIN_PATH};

/// The name of the admin token's security scheme; `security` below spells it out (the attribute
/// takes a literal).
const SCHEME: &str = "admin_token";

#[derive(OpenApi)]
#[openapi(
    info(
        title = "svcgate admin API",
        description = "The operators' API of svcgate, on the admin listener: workspaces, keys, \
                       leaked-key reports, events, audit, usage, project budgets and webhook \
                       endpoints. Everything under /admin/v1 takes the admin token, or an \
                       operator token its role allows, as a bearer token, except this \
                       document; /healthz and /readyz take none."
    ),
    paths(
        super::workspaces::create,
        super::workspaces::list,
        super::workspaces::show,
        super::workspaces::patch,
        super::keys::create,
        super::keys::list,
        super::keys::show,
        super::keys::patch,
        super::keys::revoke,
        super::keys::rotate,
        super::keys::end_grace,
        super::operators::create,
        super::operators::list,
        super::operators::delete,
        super::leaks::report,
        super::events::create,
        super::metering::audit,
        super::metering::usage,
        super::metering::project_budgets,
        super::metering::project_budget,
        super::metering::set_project_budget,
        super::webhooks::list,
        super::webhooks::show,
        super::webhooks::deliveries,
        super::webhooks::resume,
        super::webhooks::replay,
        super::healthz,
        super::readyz,
        serve,
    ),
    security(("admin_token" = [])),
    modifiers(&Finish),
    tags(
        (name = "workspaces", description = "Owners of keys, endpoints and budgets"),
        (name = "keys", description = "API keys: issue, change, rotate, revoke"),
        (name = "tokens", description = "Operator tokens: narrower admin credentials, each with a role"),
        (name = "leaks", description = "Secret-scanner reports: leaked live keys revoked at once"),
        (name = "events", description = "Events a backend announces, delivered as webhooks"),
        (name = "metering", description = "Audit records, usage and project budgets"),
        (name = "webhooks", description = "The operators' view of webhook endpoints"),
        (name = "probes", description = "Liveness and readiness"),
        (name = "documents", description = "This document"),
    ),
)]
struct AdminApi;

/// Adds the admin token's scheme and the error answer every operation can give, and names
/// each operation by its tag and handler (`keys_create`): handlers of different areas share
/// names, and operation ids must not.
struct Finish;

impl Modify for Finish {
    fn modify(&self, doc: &mut Document) {
        for item in doc.paths.paths.values_mut() {
            for op in operations(item) {
                if let (Some(tag), Some(id)) =
                    (op.tags.as_ref().and_then(|t| t.first()), &op.operation_id)
                {
                    op.operation_id = Some(format!("{tag}_{id}"));
                }
            }
        }
        let components = doc.components.get_or_insert_with(Default::default);
        components.add_security_scheme(SCHEME, bearer("The admin token (`server.admin_token`)."));
        with_error_answers(doc);
    }
}

/// The admin API's document.
pub fn document() -> Document {
    AdminApi::openapi()
}

/// The document as served, serialized once.
static SERVED: LazyLock<Vec<u8>> = LazyLock::new(|| crate::openapi::to_json(&document()));

/// `GET /admin/v1/openapi.json`
#[utoipa::path(
    get, path = "/admin/v1/openapi.json", tag = "documents",
    security(()),
    responses((status = 200, description = "This OpenAPI 3.1 document", content_type = "application/json", body = Object)),
)]
pub(super) async fn serve() -> Response {
    (
        [(http::header::CONTENT_TYPE, "application/json")],
        SERVED.as_slice(),
    )
        .into_response()
}

/// Where the document is served; kept beside the route so the two agree.
pub(super) const PATH: &str = ADMIN_PATH;
