//! The OpenAPI document's frame: title, security schemes, tags, shared components and the
//! error responses most routes share. The paths themselves come from the handlers'
//! `#[utoipa::path]` annotations, collected by the router.

use utoipa::openapi::security::{ApiKey, ApiKeyValue, HttpAuthScheme, HttpBuilder, SecurityScheme};
use utoipa::{IntoResponses, Modify, OpenApi};

use crate::error::ErrorBody;

/// Name of the bearer security scheme.
pub const BEARER: &str = "bearer";
/// Name of the query-token security scheme (event stream only).
pub const QUERY_TOKEN: &str = "access_token";

#[derive(OpenApi)]
#[openapi(
    info(
        title = "Kesoku HTTP API",
        description = "Post messages to the Kesoku agent, read sessions and their trajectories, follow every \
                       message change live (Server-Sent Events), inspect the execution ledger and the runtime. \
                       When the server has a token, every route except /healthz and /readyz needs \
                       `Authorization: Bearer <token>`.",
        license(name = "Apache-2.0", identifier = "Apache-2.0")
    ),
    modifiers(&SecuritySchemes),
    security(("bearer" = [])),
    components(schemas(ErrorBody)),
    tags(
        (name = "messages", description = "Posting messages"),
        (name = "sessions", description = "Sessions, their history and their control"),
        (name = "events", description = "Live message events"),
        (name = "activations", description = "The execution ledger and the runtime"),
        (name = "operations", description = "Health, readiness, metrics")
    )
)]
pub struct ApiDoc;

struct SecuritySchemes;

impl Modify for SecuritySchemes {
    fn modify(&self, openapi: &mut utoipa::openapi::OpenApi) {
        let components = openapi.components.get_or_insert_with(Default::default);
        components.add_security_scheme(
            BEARER,
            SecurityScheme::Http(
                HttpBuilder::new()
                    .scheme(HttpAuthScheme::Bearer)
                    .description(Some("The token named by [http] token_env in kesoku.toml."))
                    .build(),
            ),
        );
        components.add_security_scheme(
            QUERY_TOKEN,
            SecurityScheme::ApiKey(ApiKey::Query(ApiKeyValue::with_description(
                QUERY_TOKEN,
                "The same token as a query parameter; accepted on /v1/events only (for EventSource).",
            ))),
        );
    }
}

/// Errors every protected route can answer with.
#[derive(IntoResponses)]
#[allow(dead_code)] // Documentation only: the bodies are built by `AppError`.
pub(crate) enum CommonErrors {
    /// The bearer token is missing or wrong.
    #[response(status = 401)]
    Unauthorized(ErrorBody),
    /// The server runs without a token and the `Host` is not local.
    #[response(status = 403)]
    ForbiddenHost(ErrorBody),
    /// Something failed on the server; details are in its log.
    #[response(status = 500)]
    Internal(ErrorBody),
}

/// Errors of routes taking a session id in the path.
#[derive(IntoResponses)]
#[allow(dead_code)] // Documentation only.
pub(crate) enum SessionErrors {
    /// Malformed path.
    #[response(status = 400)]
    BadPath(ErrorBody),
    /// No session with this id.
    #[response(status = 404)]
    NotFound(ErrorBody),
}

/// Errors of routes taking query parameters.
#[derive(IntoResponses)]
#[allow(dead_code)] // Documentation only.
pub(crate) enum QueryErrors {
    /// A query parameter is malformed or out of range.
    #[response(status = 400)]
    BadQuery(ErrorBody),
}

/// Errors of routes taking a JSON body.
#[derive(IntoResponses)]
#[allow(dead_code)] // Documentation only.
pub(crate) enum BodyErrors {
    /// Not JSON, or not UTF-8.
    #[response(status = 400)]
    BadJson(ErrorBody),
    /// Larger than the body limit.
    #[response(status = 413)]
    TooLarge(ErrorBody),
    /// Not `application/json`.
    #[response(status = 415)]
    UnsupportedMediaType(ErrorBody),
    /// JSON of the wrong shape, or a value that is not allowed.
    #[response(status = 422)]
    Invalid(ErrorBody),
}
