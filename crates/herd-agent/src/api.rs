//! The agent's HTTP API: its member record and health checks for load balancers, and the
//! failsafe confirmation other agents ask for while the store is unreachable.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::extract::State;
use axum::http::StatusCode;
use axum::routing::{get, post};
use axum::{Json, Router};

use crate::member::Member;

/// What the API serves, updated by the agent's loop every round.
#[derive(Debug, Default)]
pub struct Shared {
    /// The member record last published.
    pub member: Option<Member>,
    /// The last store read succeeded.
    pub store_reachable: bool,
    /// This agent promised a failsafe primary not to race for the lease before then.
    pub promised_until: Option<Instant>,
    /// The lease TTL (the length of a promise).
    pub ttl: Duration,
    /// Rounds the loop has run since the agent started.
    pub rounds: u64,
    /// The agent's shard group (the `group` label of its metrics).
    pub group: u32,
    /// Steps taken since the agent started, by kind (renewals and waits not counted).
    pub decisions: std::collections::BTreeMap<&'static str, u64>,
}

/// The state shared between the loop and the API.
pub type SharedState = Arc<Mutex<Shared>>;

/// Locks the shared state (a panicked holder leaves usable data behind).
pub fn lock(state: &SharedState) -> std::sync::MutexGuard<'_, Shared> {
    state.lock().unwrap_or_else(|p| p.into_inner())
}

/// What the handlers share: the loop's state and the store (failsafe checks it live).
#[derive(Clone)]
pub struct Api {
    /// Shared with the loop.
    pub state: SharedState,
    /// The cluster's store.
    pub store: crate::store::StoreClient,
}

/// The routes.
pub fn router(api: Api) -> Router {
    Router::new()
        .route("/member", get(member))
        .route("/primary", get(primary))
        .route("/replica", get(replica))
        .route("/failsafe", post(failsafe))
        .route("/metrics", get(metrics))
        .with_state(api)
}

async fn member(State(api): State<Api>) -> Result<Json<Member>, StatusCode> {
    lock(&api.state)
        .member
        .clone()
        .map(Json)
        .ok_or(StatusCode::SERVICE_UNAVAILABLE)
}

/// Prometheus text: how many rounds ran (about one per `--loop-wait-ms` in a steady cluster;
/// many more means something wakes the loop that should not).
/// Decisions as `herd_ha_decisions_total{group,action}`, the name and labels `herd up`'s
/// supervisor uses.
async fn metrics(State(api): State<Api>) -> String {
    let state = lock(&api.state);
    let mut out = format!(
        "# HELP herd_agent_rounds_total Rounds the agent's loop has run since it started.\n\
         # TYPE herd_agent_rounds_total counter\n\
         herd_agent_rounds_total {}\n\
         # HELP herd_ha_decisions_total Steps the agent took, by kind (renewals and waits are not counted).\n\
         # TYPE herd_ha_decisions_total counter\n",
        state.rounds
    );
    for (action, n) in &state.decisions {
        out.push_str(&format!(
            "herd_ha_decisions_total{{group=\"{}\",action=\"{action}\"}} {n}\n",
            state.group
        ));
    }
    out
}

fn role_is(state: &SharedState, role: &str) -> StatusCode {
    if lock(state).member.as_ref().is_some_and(|m| m.role == role) {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    }
}

async fn primary(State(api): State<Api>) -> StatusCode {
    role_is(&api.state, "primary")
}

async fn replica(State(api): State<Api>) -> StatusCode {
    role_is(&api.state, "replica")
}

/// A primary cut off from the store asks: "can you reach the store?" The member tries it now
/// (the last round's answer may be older than the outage): only if it cannot does it confirm,
/// and then it promises not to race for the lease for one TTL, so the primary may keep serving
/// that long.
async fn failsafe(State(api): State<Api>) -> StatusCode {
    let check = tokio::time::timeout(FAILSAFE_CHECK, api.store.reachable()).await;
    let mut s = lock(&api.state);
    if check.unwrap_or(false) {
        s.store_reachable = true;
        return StatusCode::CONFLICT;
    }
    s.store_reachable = false;
    s.promised_until = Some(Instant::now() + s.ttl);
    StatusCode::OK
}

/// How long a member tries the store when asked for a failsafe confirmation (the asking
/// primary waits one second for the answer).
const FAILSAFE_CHECK: Duration = Duration::from_millis(600);

/// An HTTP client whose every request, connecting included, ends within `timeout` (another
/// host behind a cut link never answers at all).
fn client(timeout: Duration) -> ureq::Agent {
    ureq::AgentBuilder::new()
        .timeout_connect(timeout)
        .timeout(timeout)
        .build()
}

/// Asks every API in `apis` for a failsafe confirmation, each within `timeout`; true only if
/// all confirm.
pub async fn confirm_failsafe(apis: Vec<String>, timeout: Duration) -> bool {
    let asks = apis.into_iter().map(|api| {
        tokio::task::spawn_blocking(move || {
            client(timeout)
                .post(&format!("http://{api}/failsafe"))
                .call()
                .is_ok_and(|r| r.status() == 200)
        })
    });
    for ask in asks.collect::<Vec<_>>() {
        if !ask.await.unwrap_or(false) {
            return false;
        }
    }
    true
}

/// Asks the API at `api` for its member record (to tell a live agent of the same name from a
/// stale record).
pub async fn fetch_member(api: String, timeout: Duration) -> Option<Member> {
    tokio::task::spawn_blocking(move || {
        client(timeout)
            .get(&format!("http://{api}/member"))
            .call()
            .ok()?
            .into_json()
            .ok()
    })
    .await
    .ok()
    .flatten()
}
