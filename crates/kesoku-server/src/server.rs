//! The server's state, the router, and serving with graceful shutdown.
//!
//! [`app`] builds the whole router from a [`ServerState`]: the documented API routes (their
//! OpenAPI document is generated from the same handlers), the open health routes, the console,
//! and the layers (Host guard, token, body limit, JSON errors, request tracing). [`serve`] runs
//! it on a listener until the shutdown token fires, ending open event streams so shutdown does
//! not wait for clients.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::extract::DefaultBodyLimit;
use axum::middleware;
use axum::response::IntoResponse;
use axum::routing::get;
use http::{Request, header};
use kesoku_broker::lease::SessionLeases;
use kesoku_core::MemoryReport;
use kesoku_gateway::Gateway;
use kesoku_store::Ledger;
use metrics_exporter_prometheus::PrometheusHandle;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tower_http::limit::RequestBodyLimitLayer;
use tower_http::trace::TraceLayer;
use tracing::Span;
use utoipa::OpenApi;
use utoipa_axum::router::OpenApiRouter;

use crate::auth::{Token, guard_host, require_token};
use crate::control::AgentControl;
use crate::error::{ErrorCode, ServerError, error_response, json_errors};
use crate::{console, openapi, routes};

/// Largest request body by default (attachments travel base64 inside JSON).
pub const DEFAULT_BODY_LIMIT: usize = 10 * 1024 * 1024;

/// Gathers the process's memory report when `/metrics` is scraped: the binary's wiring knows
/// the parts that own memory (its allocator, its store, its gateway) and asks each.
pub type MemoryProbe = Arc<dyn Fn() -> MemoryReport + Send + Sync>;

/// Everything the handlers need.
#[derive(Clone)]
pub struct ServerState {
    pub gateway: Gateway,
    pub ledger: Arc<dyn Ledger>,
    pub control: Arc<dyn AgentControl>,
    /// The workspace folder; attachments are staged under `sessions/<id>/attachments/`.
    pub workspace: PathBuf,
    /// When set, required on every route but `/healthz`, `/readyz` and the console files.
    pub token: Option<Token>,
    /// The Prometheus recorder's handle, rendered by `/metrics` (the agent's counters live there).
    pub metrics: Option<PrometheusHandle>,
    /// Largest request body in bytes.
    pub body_limit: usize,
    /// The memory report `/metrics` renders; without it, `/metrics` shows no memory gauges.
    pub memory: Option<MemoryProbe>,
    /// The session leases workers hold (shared by every process on Redis): `/metrics` shows how
    /// many are held. Without it, no lease gauge.
    pub leases: Option<Arc<dyn SessionLeases>>,
    /// Fires when the server shuts down: open event streams end.
    pub shutdown: CancellationToken,
    /// The configured model names (`[models.NAME]`): the models a direct trigger may name.
    pub models: Vec<String>,
    /// The chatbots running in this service (`api`, `cli`, each `[[chatbots.…]]` id): those a
    /// direct trigger may answer through. Empty: any id is taken.
    pub chatbots: Vec<String>,
}

impl std::fmt::Debug for ServerState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ServerState")
            .field("workspace", &self.workspace)
            .field("token", &self.token)
            .field("body_limit", &self.body_limit)
            .finish_non_exhaustive()
    }
}

impl ServerState {
    /// A state without token or metrics, with the default body limit.
    pub fn new(gateway: Gateway, ledger: Arc<dyn Ledger>, control: Arc<dyn AgentControl>, workspace: PathBuf) -> Self {
        ServerState {
            gateway,
            ledger,
            control,
            workspace,
            token: None,
            metrics: None,
            body_limit: DEFAULT_BODY_LIMIT,
            memory: None,
            leases: None,
            shutdown: CancellationToken::new(),
            models: Vec::new(),
            chatbots: Vec::new(),
        }
    }

    /// The chatbots a direct trigger may answer through.
    pub fn with_chatbots(mut self, ids: impl IntoIterator<Item = impl Into<String>>) -> Self {
        self.chatbots = ids.into_iter().map(Into::into).collect();
        self
    }

    /// The configured model names a direct trigger may ask for.
    pub fn with_models(mut self, names: impl IntoIterator<Item = impl Into<String>>) -> Self {
        self.models = names.into_iter().map(Into::into).collect();
        self
    }

    pub fn with_token(mut self, token: Token) -> Self {
        self.token = Some(token);
        self
    }

    pub fn with_metrics(mut self, handle: PrometheusHandle) -> Self {
        self.metrics = Some(handle);
        self
    }

    pub fn with_memory(mut self, probe: impl Fn() -> MemoryReport + Send + Sync + 'static) -> Self {
        self.memory = Some(Arc::new(probe));
        self
    }

    /// Show the held session leases on `/metrics`.
    pub fn with_leases(mut self, leases: Arc<dyn SessionLeases>) -> Self {
        self.leases = Some(leases);
        self
    }

    pub fn with_body_limit(mut self, bytes: usize) -> Self {
        self.body_limit = bytes;
        self
    }
}

/// Shared by every handler.
pub(crate) type AppState = Arc<ServerState>;

/// The documented API routes (their OpenAPI document comes from the same handlers).
fn documented() -> OpenApiRouter<AppState> {
    OpenApiRouter::with_openapi(openapi::ApiDoc::openapi()).merge(routes::api())
}

/// The OpenAPI 3.1 document of the API, generated from the handlers.
pub fn openapi_document() -> utoipa::openapi::OpenApi {
    let (_, document) = documented().merge(routes::open()).split_for_parts();
    document
}

/// The whole HTTP application.
pub fn app(state: ServerState) -> Router {
    let state: AppState = Arc::new(state);
    let (api, document) = documented().split_for_parts();
    let (open, open_document) = OpenApiRouter::<AppState>::new().merge(routes::open()).split_for_parts();
    let mut document = document;
    document.merge(open_document);
    let document = Arc::new(document.to_json().unwrap_or_else(|error| {
        tracing::error!(%error, "the openapi document does not serialize");
        "{}".to_owned()
    }));
    let openapi_json = get(move || {
        let document = Arc::clone(&document);
        async move { ([(header::CONTENT_TYPE, "application/json")], document.as_str().to_owned()).into_response() }
    });

    let protected = api
        .route("/openapi.json", openapi_json)
        .route_layer(middleware::from_fn_with_state(Arc::clone(&state), require_token));
    let public = open.merge(console::routes());

    protected
        .merge(public)
        .fallback(|method: http::Method, uri: http::Uri| async move {
            error_response(ErrorCode::NotFound, format!("no route for {method} {}", crate::error::shorten(uri.path(), 200)))
        })
        .method_not_allowed_fallback(|method: http::Method, uri: http::Uri| async move {
            error_response(
                ErrorCode::MethodNotAllowed,
                format!("{method} is not allowed on {}", crate::error::shorten(uri.path(), 200)),
            )
        })
        .layer(DefaultBodyLimit::disable())
        .layer(RequestBodyLimitLayer::new(state.body_limit))
        .layer(middleware::from_fn_with_state(Arc::clone(&state), guard_host))
        .layer(middleware::from_fn(json_errors))
        .layer(
            TraceLayer::new_for_http()
                // The path only: the query may carry the token (`access_token`).
                .make_span_with(|request: &Request<_>| {
                    tracing::info_span!("http", method = %request.method(), path = %request.uri().path())
                })
                .on_failure(|_error, _latency: Duration, _span: &Span| {}),
        )
        .with_state(state)
}

/// Serve `state` on `listener` until `shutdown` fires, then finish in-flight requests and end
/// open event streams.
pub async fn serve(listener: TcpListener, state: ServerState, shutdown: CancellationToken) -> Result<(), ServerError> {
    let local = listener.local_addr()?;
    crate::auth::check_bind(local, state.token.as_ref())?;
    let streams = shutdown.child_token();
    let state = ServerState { shutdown: streams.clone(), ..state };
    tracing::info!(addr = %local, "http server listening");
    let result = axum::serve(listener, app(state))
        .with_graceful_shutdown(async move {
            shutdown.cancelled().await;
            streams.cancel();
        })
        .await;
    tracing::info!("http server stopped");
    result.map_err(ServerError::Io)
}
