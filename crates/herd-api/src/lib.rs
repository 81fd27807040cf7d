//! Herd's HTTP API on 127.0.0.1 (or the configured listen address, then with a bearer token):
//!
//! | route | answer |
//! |---|---|
//! | `GET /` | the live dashboard (see [`dashboard`]) |
//! | `GET /events/stream` | the dashboard's server-sent events |
//! | `GET /dashboard/snapshot` | the dashboard's history, events and status as JSON |
//! | `GET /bench`, `GET /bench/file?path=…` | the latest `herd bench` reports of `dashboard.bench_results`, and their SVG charts |
//! | `GET /status` | the status document (`herd status --json`) |
//! | `GET /primary` | 200 when some node serves as primary, else 503 |
//! | `GET /primary/{node}` | 200 when `node` is the running primary, else 503 (404: no such node) |
//! | `GET /replica` | 200 when at least one replica streams, else 503 |
//! | `GET /replica/{node}` | 200 when `node` is a streaming replica, else 503 (404: no such node) |
//!
//! | `GET /metrics` | Prometheus text: the proxy's counters, and each group's WAL archiving when backups are on |
//! | `GET /cluster/metrics` | every agent's and proxy's `/metrics` in one page, `instance`-labelled, with `herd_scrape_up` (see [`cluster_metrics`]; 404 where not offered) |
//! | `POST /switchover?to=node` | planned change of primary; 200 with what happened, 409 when refused |
//! | `POST /failover?to=node&allow_data_loss=true` | immediate promotion; 200 / 409 |
//! | `POST /groups` | add a shard group while the cluster runs (`herd group add`); 200 / 409 |
//! | `POST /restart?group=G[&node=N]` | restart replica N, or every server of group G (the primary through a switchover); 200 / 409 |
//! | `POST /config?key=commit-mode&value=on[&group=G]` | `herd config set` (commit-mode, sync-standbys, wal-compression); 200 / 409 |
//! | `POST /restore-point?name=N` | `herd backup restore-point N` on every shard group, two-phase commits held meanwhile; 200 / 409 |
//!
//! The replica checks take `?max_lag_bytes=N`: a replica further behind than N bytes of replay
//! counts as unhealthy. Bodies are JSON: the node's status, or `{"reason": …}`.
//! The supervisor publishes a fresh status every probe interval; requests never probe servers.
//! When a token is configured, every route but the health checks and the page's static files
//! needs it ([`auth`]); cross-site actions and rebound host names are refused ([`origin`]).

mod archive_metrics;
pub mod auth;
pub mod cluster_metrics;
pub mod dashboard;
mod health;
pub mod origin;

use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};
use herd_core::ClusterStatus;
use tokio::sync::watch;

pub use archive_metrics::archive_metrics;
pub use cluster_metrics::ClusterMetricsSource;
pub use dashboard::Dashboard;
pub use health::{check, Check, Health};

/// Produces the Prometheus text of `/metrics`.
pub type MetricsSource = std::sync::Arc<dyn Fn() -> String + Send + Sync>;

/// An operator's request through the API.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum AdminAction {
    /// `POST /switchover`.
    Switchover {
        /// Target node, if given.
        to: Option<String>,
        /// The shard group, if given (else the target's group, else group 0).
        group: Option<u32>,
    },
    /// `POST /failover`.
    Failover {
        /// Target node, if given.
        to: Option<String>,
        /// Promote even if acknowledged commits may be lost.
        allow_data_loss: bool,
        /// The shard group, if given (else the target's group, else group 0).
        group: Option<u32>,
    },
    /// `POST /restart`.
    Restart {
        /// The replica to restart; none: every server of the group.
        node: Option<String>,
        /// The shard group, if given (else the node's group, else group 0).
        group: Option<u32>,
    },
    /// `POST /groups`: a new shard group, started and admitted to the endpoint.
    AddGroup,
    /// `POST /config`: what `herd config set` does.
    SetConfig {
        /// `commit-mode`, `sync-standbys` or `wal-compression`.
        key: String,
        /// The new value.
        value: String,
        /// Only this shard group, if given.
        group: Option<u32>,
    },
    /// `POST /restore-point`: a restore point on every shard group's primary, consistent
    /// with two-phase commits (`herd backup restore-point`).
    RestorePoint {
        /// Its name.
        name: String,
    },
}

/// Carries out admin actions (the supervisor), answering with what happened or why not.
pub type AdminSource = std::sync::Arc<
    dyn Fn(
            AdminAction,
        )
            -> std::pin::Pin<Box<dyn std::future::Future<Output = Result<String, String>> + Send>>
        + Send
        + Sync,
>;

#[derive(serde::Deserialize)]
struct AdminQuery {
    to: Option<String>,
    group: Option<u32>,
    #[serde(default)]
    allow_data_loss: bool,
    node: Option<String>,
}

#[derive(serde::Deserialize)]
struct PointQuery {
    name: String,
}

#[derive(serde::Deserialize)]
struct ConfigQuery {
    key: String,
    value: String,
    group: Option<u32>,
}

/// Everything the API serves from.
pub struct Api {
    /// The latest published status.
    pub status: watch::Receiver<ClusterStatus>,
    /// The `/metrics` text.
    pub metrics: MetricsSource,
    /// Carries out switchovers, failovers, restarts and configuration changes.
    pub admin: AdminSource,
    /// The page's history and events.
    pub dashboard: Dashboard,
    /// When set, the token every request but health checks and static files must carry.
    pub token: Option<std::sync::Arc<str>>,
    /// A `herd bench` results directory whose reports the page shows.
    pub bench_results: Option<std::path::PathBuf>,
    /// The scrapes of `/cluster/metrics`, where offered (processes following the store).
    pub cluster_metrics: Option<ClusterMetricsSource>,
}

async fn admin_reply(admin: AdminSource, action: AdminAction) -> Response {
    match admin(action).await {
        Ok(text) => (StatusCode::OK, text).into_response(),
        Err(text) => (StatusCode::CONFLICT, text).into_response(),
    }
}

/// The routes, answering from the latest published status.
pub fn router(api: Api) -> Router {
    let Api {
        status,
        metrics,
        admin,
        dashboard,
        token,
        bench_results,
        cluster_metrics,
    } = api;
    let (a1, a2, a3, a4, a5, a6) = (
        admin.clone(),
        admin.clone(),
        admin.clone(),
        admin.clone(),
        admin.clone(),
        admin,
    );
    let switchover = axum::routing::post(move |Query(q): Query<AdminQuery>| {
        admin_reply(
            a1.clone(),
            AdminAction::Switchover {
                to: q.to,
                group: q.group,
            },
        )
    });
    let failover = axum::routing::post(move |Query(q): Query<AdminQuery>| {
        admin_reply(
            a2.clone(),
            AdminAction::Failover {
                to: q.to,
                allow_data_loss: q.allow_data_loss,
                group: q.group,
            },
        )
    });
    let restart = axum::routing::post(move |Query(q): Query<AdminQuery>| {
        admin_reply(
            a3.clone(),
            AdminAction::Restart {
                node: q.node,
                group: q.group,
            },
        )
    });
    let config = axum::routing::post(move |Query(q): Query<ConfigQuery>| {
        admin_reply(
            a4.clone(),
            AdminAction::SetConfig {
                key: q.key,
                value: q.value,
                group: q.group,
            },
        )
    });
    let add_group = axum::routing::post(move || admin_reply(a5.clone(), AdminAction::AddGroup));
    let restore_point = axum::routing::post(move |Query(q): Query<PointQuery>| {
        admin_reply(a6.clone(), AdminAction::RestorePoint { name: q.name })
    });
    let metrics_route = get(move || {
        let text = metrics();
        async move {
            (
                [(
                    axum::http::header::CONTENT_TYPE,
                    "text/plain; version=0.0.4",
                )],
                text,
            )
        }
    });
    let (stream, snapshot) = dashboard::stream_route(dashboard, status.clone());
    let (bench_list, bench_file) = dashboard::bench::routes(bench_results);
    let mut routes = Router::new()
        .route("/bench", bench_list)
        .route("/bench/file", bench_file)
        .route("/events/stream", stream)
        .route("/dashboard/snapshot", snapshot)
        .route("/config", config)
        .route("/status", get(status_doc))
        .route("/metrics", metrics_route)
        .route("/switchover", switchover)
        .route("/failover", failover)
        .route("/restart", restart)
        .route("/groups", add_group)
        .route("/restore-point", restore_point)
        .route("/primary", get(|s, q| health_route(s, None, q, true)))
        .route(
            "/primary/{node}",
            get(|s, Path(n): Path<String>, q| health_route(s, Some(n), q, true)),
        )
        .route("/replica", get(|s, q| health_route(s, None, q, false)))
        .route(
            "/replica/{node}",
            get(|s, Path(n): Path<String>, q| health_route(s, Some(n), q, false)),
        );
    if let Some(source) = cluster_metrics {
        let route = get(move || {
            let scrapes = source();
            async move {
                (
                    [(
                        axum::http::header::CONTENT_TYPE,
                        "text/plain; version=0.0.4",
                    )],
                    cluster_metrics::merge(&scrapes.await),
                )
            }
        });
        routes = routes.route("/cluster/metrics", route);
    }
    for (path, route) in dashboard::asset_routes() {
        routes = routes.route(path, route);
    }
    let routes = routes.with_state(status);
    let names_allowed = token.is_some();
    let routes = match token {
        Some(token) => routes.layer(axum::middleware::from_fn_with_state(token, auth::require)),
        None => routes,
    };
    // Outermost: a cross-site request is refused before anything else looks at it.
    routes.layer(axum::middleware::from_fn_with_state(
        names_allowed,
        origin::check,
    ))
}

/// Serves the API on `listener` until `shutdown` completes.
pub async fn serve(
    listener: tokio::net::TcpListener,
    api: Api,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    axum::serve(listener, router(api))
        .with_graceful_shutdown(shutdown)
        .await
}

async fn status_doc(State(status): State<watch::Receiver<ClusterStatus>>) -> Json<ClusterStatus> {
    Json(status.borrow().clone())
}

#[derive(serde::Deserialize)]
struct LagQuery {
    max_lag_bytes: Option<u64>,
}

async fn health_route(
    State(status): State<watch::Receiver<ClusterStatus>>,
    node: Option<String>,
    Query(q): Query<LagQuery>,
    primary: bool,
) -> Response {
    let what = match (primary, node) {
        (true, node) => Check::Primary { node },
        (false, node) => Check::Replica {
            node,
            max_lag_bytes: q.max_lag_bytes,
        },
    };
    let snapshot = status.borrow().clone();
    match check(&snapshot, &what) {
        Health::Healthy(node) => (StatusCode::OK, Json(serde_json::json!(node))).into_response(),
        Health::Unhealthy(reason) => (
            StatusCode::SERVICE_UNAVAILABLE,
            Json(serde_json::json!({ "reason": reason })),
        )
            .into_response(),
        Health::NoSuchNode(name) => (
            StatusCode::NOT_FOUND,
            Json(serde_json::json!({ "reason": format!("no node named {name}") })),
        )
            .into_response(),
    }
}
