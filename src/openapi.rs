//! What the two OpenAPI 3.1 documents share: the admin API's (`crate::admin::openapi`, from
//! the admin router's handlers and types) and the gateway's (`crate::proxy::api::openapi`, from the
//! route table, built-in and configured routes alike), so neither can drift from what is served.
//!
//! Both are public (no admin token, no key): they describe paths and shapes, never a secret.

use utoipa::openapi::schema::{ArrayBuilder, ObjectBuilder, Schema, Type};
use utoipa::openapi::security::{HttpAuthScheme, HttpBuilder, SecurityScheme};
use utoipa::openapi::{ContentBuilder, OpenApi, RefOr, ResponseBuilder};
use utoipa::{PartialSchema, ToSchema};

use crate::error::ApiError;
use crate::keys::Scopes;
use crate::metering::Credits;
use crate::webhooks::manage::{DeliveryView, EndpointView};

/// Where each document is served, on its own listener.
pub const ADMIN_PATH: &str = "/admin/v1/openapi.json";
/// See [`ADMIN_PATH`].
pub const GATEWAY_PATH: &str = "/v1/openapi.json";

/// Name of the error answer in `components.responses`.
const ERROR_RESPONSE: &str = "Error";

impl PartialSchema for Credits {
    fn schema() -> RefOr<Schema> {
        ObjectBuilder::new()
            .schema_type(Type::Number)
            .description(Some(
                "An amount of credits, exact to six decimal places, as a plain JSON number \
                 (`1.25`).",
            ))
            .minimum(Some(0))
            .into()
    }
}

impl ToSchema for Credits {}

impl PartialSchema for Scopes {
    fn schema() -> RefOr<Schema> {
        ArrayBuilder::new()
            .items(
                ObjectBuilder::new()
                    .schema_type(Type::String)
                    .pattern(Some("^[^:\\s]+:[^:\\s]+$"))
                    .examples(["models:read"]),
            )
            .description(Some(
                "Scopes like `resource:action`; `resource:*` allows every action.",
            ))
            .into()
    }
}

impl ToSchema for Scopes {}

/// The body of every error either API answers: `{"error": {"code", "message", "request_id"}}`.
pub struct ErrorBody;

impl PartialSchema for ErrorBody {
    fn schema() -> RefOr<Schema> {
        let detail = ObjectBuilder::new()
            .property(
                "code",
                ObjectBuilder::new()
                    .schema_type(Type::String)
                    .enum_values(Some(error_codes())),
            )
            .required("code")
            .property(
                "message",
                ObjectBuilder::new()
                    .schema_type(Type::String)
                    .description(Some("For people; never contains a secret.")),
            )
            .required("message")
            .property(
                "request_id",
                ObjectBuilder::new()
                    .schema_type(Type::String)
                    .description(Some("Also in the `Service-Request-Id` header.")),
            )
            .required("request_id");
        ObjectBuilder::new()
            .property("error", detail)
            .required("error")
            .into()
    }
}

impl ToSchema for ErrorBody {}

/// Every `error.code`, from the error type itself.
fn error_codes() -> Vec<&'static str> {
    let all = [
        ApiError::Authentication("".into()),
        ApiError::Permission("".into()),
        ApiError::InvalidRequest("".into()),
        ApiError::MethodNotAllowed("".into()),
        ApiError::HeadersTooLarge("".into()),
        ApiError::BudgetExceeded("".into()),
        ApiError::RateLimited {
            message: "".into(),
            retry_after_secs: 0,
        },
        ApiError::NotFound("".into()),
        ApiError::Upstream("".into()),
        ApiError::UpstreamUnavailable("".into()),
        ApiError::ServiceUnavailable("".into()),
    ];
    let mut codes: Vec<&'static str> = all.iter().map(ApiError::code).collect();
    codes.sort_unstable();
    codes.dedup();
    codes
}

/// A bearer-token security scheme described by `what`.
pub(crate) fn bearer(what: &str) -> SecurityScheme {
    SecurityScheme::Http(
        HttpBuilder::new()
            .scheme(HttpAuthScheme::Bearer)
            .description(Some(what))
            .build(),
    )
}

/// Registers the error body and the `Error` answer, and gives every operation an error answer
/// (`default`) besides those it names.
pub(crate) fn with_error_answers(doc: &mut OpenApi) {
    let components = doc.components.get_or_insert_with(Default::default);
    components
        .schemas
        .insert(ErrorBody::name().into_owned(), ErrorBody::schema());
    components.responses.insert(
        ERROR_RESPONSE.to_string(),
        RefOr::T(
            ResponseBuilder::new()
                .description("An error; `error.code` tells which (see the status).")
                .content(
                    "application/json",
                    ContentBuilder::new()
                        .schema(Some(RefOr::Ref(utoipa::openapi::Ref::from_schema_name(
                            ErrorBody::name(),
                        ))))
                        .build(),
                )
                .build(),
        ),
    );
    for item in doc.paths.paths.values_mut() {
        for op in operations(item) {
            tidy_summary(op);
            op.responses
                .responses
                .entry("default".to_string())
                .or_insert_with(|| {
                    RefOr::Ref(utoipa::openapi::Ref::from_response_name(ERROR_RESPONSE))
                });
        }
    }
}

/// A handler's doc comment is the operation's summary: its first sentence stays that, on one
/// line, and the whole of it becomes the description.
fn tidy_summary(op: &mut utoipa::openapi::path::Operation) {
    let Some(text) = op.summary.take() else {
        return;
    };
    let text = text.split_whitespace().collect::<Vec<_>>().join(" ");
    let first = match text.find(". ") {
        Some(end) => &text[..=end],
        None => &text,
    };
    if first.len() < text.len() {
        let rest = op.description.take().unwrap_or_default();
        op.description = Some(format!("{text}\n\n{rest}").trim_end().to_string());
    }
    op.summary = Some(first.trim_end_matches('.').to_string());
}

/// The operations of a path item, whatever their methods.
pub(crate) fn operations(
    item: &mut utoipa::openapi::PathItem,
) -> impl Iterator<Item = &mut utoipa::openapi::path::Operation> {
    [
        &mut item.get,
        &mut item.put,
        &mut item.post,
        &mut item.delete,
        &mut item.options,
        &mut item.head,
        &mut item.patch,
        &mut item.trace,
    ]
    .into_iter()
    .filter_map(Option::as_mut)
}

/// The document as served: compact JSON.
pub(crate) fn to_json(doc: &OpenApi) -> Vec<u8> {
    serde_json::to_vec(doc).unwrap_or_default()
}

/// `{"data": [endpoints]}`: what listing webhook endpoints answers.
#[derive(ToSchema)]
#[allow(dead_code)]
pub struct EndpointList {
    data: Vec<EndpointView<'static>>,
}

/// `{"data": [deliveries]}`: what listing an endpoint's deliveries answers.
#[derive(ToSchema)]
#[allow(dead_code)]
pub struct DeliveryList {
    data: Vec<DeliveryView<'static>>,
}

/// What a replay queued. Cut short at the most events one replay sends: `truncated`, and
/// `next` is the body of the call that replays the rest.
#[derive(ToSchema)]
#[allow(dead_code)]
pub struct ReplayQueued {
    /// The endpoint's id.
    endpoint: String,
    /// How many deliveries were queued.
    replayed: u64,
    /// Their ids.
    delivery_ids: Vec<String>,
    /// Whether events are left to replay.
    truncated: bool,
    /// `{"since", "after"}` to send next, when `truncated`.
    next: Option<ReplayNext>,
}

/// Where a cut-short replay goes on.
#[derive(ToSchema)]
#[allow(dead_code)]
pub struct ReplayNext {
    since: u64,
    after: String,
}
