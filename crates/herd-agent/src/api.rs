//! The agent's HTTP API: its member record and health checks for load balancers, and the
//! failsafe confirmation other agents ask for while the store is unreachable. The member
//! record and the failsafe question are for the cluster's own agents, proxies and operators
//! only (signed with the cluster's key, crate herd-apikey); health checks and metrics stay open.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::extract::{ConnectInfo, Path, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;

use crate::member::Member;
pub use herd_apikey::ApiKey;
use herd_apikey::{Nonces, Refusal, ANSWER, AUTHORIZATION};

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
    /// While this member holds its group's leader lease: the instant its watchdog fences it
    /// unless the lease is renewed first.
    pub leading_until: Option<Instant>,
    /// The keys requests may be signed with, when the loop set them (the current password's,
    /// and during a password rotation across hosts the next or the previous one's); empty:
    /// the key the API started with.
    pub keys: Vec<ApiKey>,
}

/// What a load balancer asks an agent about its node.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Asked {
    /// Is it the primary?
    Primary,
    /// Is it a replica that streams?
    Replica,
}

/// The health answer for this agent's node, with the meaning the cluster's HTTP API gives
/// `/primary/{node}` and `/replica/{node}`: the primary is the member whose record says
/// `primary` *and* that holds its group's leader lease now (a former primary that lost the
/// lease but has not been fenced yet is no longer one: writes sent there may be lost); a
/// replica is a member in recovery that streams from the primary. `node`, when named, must be
/// this agent's (404 otherwise: the agent answers for its own node only).
pub fn health(shared: &Shared, node: Option<&str>, asked: Asked, now: Instant) -> StatusCode {
    let Some(m) = shared.member.as_ref() else {
        return StatusCode::SERVICE_UNAVAILABLE;
    };
    if node.is_some_and(|n| n != m.name) {
        return StatusCode::NOT_FOUND;
    }
    let healthy = match asked {
        Asked::Primary => m.role == "primary" && shared.leading_until.is_some_and(|t| t > now),
        Asked::Replica => m.role == "replica" && m.streaming_from.is_some(),
    };
    if healthy {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    }
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
    /// The cluster's key: who may read the member record and ask the failsafe question.
    pub key: Arc<ApiKey>,
    /// Nonces of requests accepted lately (replays are refused).
    pub nonces: Arc<Mutex<Nonces>>,
}

impl Api {
    /// Checks a request for `path`; its nonce, or the refusal to answer (logged).
    fn admit(
        &self,
        method: &str,
        path: &str,
        headers: &HeaderMap,
        from: SocketAddr,
    ) -> Result<(String, ApiKey), Box<Response>> {
        let header = headers.get(AUTHORIZATION).and_then(|v| v.to_str().ok());
        let keys = {
            let keys = &lock(&self.state).keys;
            if keys.is_empty() {
                vec![(*self.key).clone()]
            } else {
                keys.clone()
            }
        };
        let mut nonces = self.nonces.lock().unwrap_or_else(|p| p.into_inner());
        // The first key that verifies it; a refusal other than a bad signature (no header, a
        // replay) is the same for every key.
        let mut refused = Refusal::Missing;
        for key in keys {
            match key.verify(method, path, header, &mut nonces) {
                Ok(nonce) => return Ok((nonce, key)),
                Err(r) => {
                    refused = r;
                    if r != Refusal::BadSignature {
                        break;
                    }
                }
            }
        }
        Err(refused).map_err(|refusal| {
            tracing::warn!("refused {method} {path} from {from}: {refusal}");
            let status = StatusCode::from_u16(refusal.status()).unwrap_or(StatusCode::FORBIDDEN);
            (
                status,
                format!(
                    "{refusal}: this API answers the cluster's agents, proxies and \
                         operators only (requests signed with the cluster's key)\n"
                ),
            )
                .into_response()
                .into()
        })
    }

    /// An answer to the request with `nonce`, signed as `what`.
    /// The answer is signed with the key that verified the request, which the asker holds.
    fn signed(
        &self,
        (nonce, key): &(String, ApiKey),
        what: &str,
        status: StatusCode,
        body: Vec<u8>,
    ) -> Response {
        let tag = key.answer(what, nonce, &body);
        let mut response = (status, body).into_response();
        if let Ok(value) = HeaderValue::from_str(&tag) {
            response.headers_mut().insert(ANSWER, value);
        }
        response
    }
}

/// The routes.
pub fn router(api: Api) -> Router {
    Router::new()
        .route("/member", get(member))
        .route("/primary", get(primary))
        .route("/replica", get(replica))
        .route("/primary/{node}", get(primary_named))
        .route("/replica/{node}", get(replica_named))
        .route("/failsafe", post(failsafe))
        .route("/metrics", get(metrics))
        .with_state(api)
}

async fn member(
    State(api): State<Api>,
    ConnectInfo(from): ConnectInfo<SocketAddr>,
    headers: HeaderMap,
) -> Response {
    let nonce = match api.admit("GET", "/member", &headers, from) {
        Ok(n) => n,
        Err(refused) => return *refused,
    };
    let member = lock(&api.state).member.clone();
    match member.map(|m| serde_json::to_vec(&m)) {
        Some(Ok(body)) => {
            let mut r = api.signed(&nonce, "member", StatusCode::OK, body);
            r.headers_mut().insert(
                axum::http::header::CONTENT_TYPE,
                HeaderValue::from_static("application/json"),
            );
            r
        }
        _ => StatusCode::SERVICE_UNAVAILABLE.into_response(),
    }
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

fn answer(api: &Api, node: Option<&str>, asked: Asked) -> StatusCode {
    health(&lock(&api.state), node, asked, Instant::now())
}

async fn primary(State(api): State<Api>) -> StatusCode {
    answer(&api, None, Asked::Primary)
}

async fn replica(State(api): State<Api>) -> StatusCode {
    answer(&api, None, Asked::Replica)
}

async fn primary_named(State(api): State<Api>, Path(node): Path<String>) -> StatusCode {
    answer(&api, Some(&node), Asked::Primary)
}

async fn replica_named(State(api): State<Api>, Path(node): Path<String>) -> StatusCode {
    answer(&api, Some(&node), Asked::Replica)
}

/// A primary cut off from the store asks: "can you reach the store?" The member tries it now
/// (the last round's answer may be older than the outage): only if it cannot does it confirm,
/// and then it promises not to race for the lease for one TTL, so the primary may keep serving
/// that long.
async fn failsafe(
    State(api): State<Api>,
    ConnectInfo(from): ConnectInfo<SocketAddr>,
    headers: HeaderMap,
) -> Response {
    let nonce = match api.admit("POST", "/failsafe", &headers, from) {
        Ok(n) => n,
        Err(refused) => return *refused,
    };
    let check = tokio::time::timeout(FAILSAFE_CHECK, api.store.reachable()).await;
    {
        let mut s = lock(&api.state);
        if check.unwrap_or(false) {
            s.store_reachable = true;
            return api.signed(&nonce, "failsafe-refused", StatusCode::CONFLICT, Vec::new());
        }
        s.store_reachable = false;
        s.promised_until = Some(Instant::now() + s.ttl);
    }
    api.signed(&nonce, "failsafe-confirmed", StatusCode::OK, Vec::new())
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
/// all confirm, each answer signed with the cluster's `key` for this very question (an answer
/// from anything else counts as no confirmation).
pub async fn confirm_failsafe(apis: Vec<String>, timeout: Duration, key: Arc<ApiKey>) -> bool {
    let asks = apis.into_iter().map(|api| {
        let key = key.clone();
        tokio::task::spawn_blocking(move || {
            let (nonce, header) = key.sign("POST", "/failsafe");
            match client(timeout)
                .post(&format!("http://{api}/failsafe"))
                .set(AUTHORIZATION, &header)
                .call()
            {
                Ok(r) if r.status() == 200 => {
                    let genuine = key.answered("failsafe-confirmed", &nonce, b"", r.header(ANSWER));
                    if !genuine {
                        tracing::warn!(
                            "failsafe: {api} confirmed without the cluster's signature; not counted"
                        );
                    }
                    genuine
                }
                _ => false,
            }
        })
    });
    for ask in asks.collect::<Vec<_>>() {
        if !ask.await.unwrap_or(false) {
            return false;
        }
    }
    true
}

/// What asking an agent for its member record gave.
#[derive(Debug)]
pub enum Fetched {
    /// Its record, signed with the cluster's key.
    Member(Box<Member>),
    /// It refused the request (HTTP 401/403: another cluster, or no key given).
    Refused(u16),
    /// No answer, or one not signed with the cluster's key.
    Nothing,
}

/// Asks the API at `api` for its member record (to tell a live agent of the same name from a
/// stale record; `herd status` while the store is down), signed with `key`.
pub async fn fetch_member(api: String, timeout: Duration, key: Arc<ApiKey>) -> Fetched {
    tokio::task::spawn_blocking(move || {
        let (nonce, header) = key.sign("GET", "/member");
        let response = match client(timeout)
            .get(&format!("http://{api}/member"))
            .set(AUTHORIZATION, &header)
            .call()
        {
            Ok(r) => r,
            Err(ureq::Error::Status(code @ (401 | 403), _)) => return Fetched::Refused(code),
            Err(_) => return Fetched::Nothing,
        };
        let tag = response.header(ANSWER).map(str::to_string);
        let mut body = Vec::new();
        if std::io::Read::read_to_end(&mut response.into_reader(), &mut body).is_err()
            || !key.answered("member", &nonce, &body, tag.as_deref())
        {
            return Fetched::Nothing;
        }
        serde_json::from_slice(&body)
            .map(|m| Fetched::Member(Box::new(m)))
            .unwrap_or(Fetched::Nothing)
    })
    .await
    .unwrap_or(Fetched::Nothing)
}

#[cfg(test)]
mod tests {
    use super::*;
    use herd_dcs::{Dcs, DcsError, Versioned};

    fn member(role: &str, streaming: bool) -> Member {
        Member {
            name: "h1".into(),
            instance: "i".into(),
            role: role.into(),
            pg_host: "10.0.0.1".into(),
            pg_port: 5432,
            api: String::new(),
            lsn: None,
            replayed: None,
            streaming_from: streaming.then(|| "h0".to_string()),
            socket: None,
            tls_not_after: None,
            tls_issuer: None,
            tls_trusts: Vec::new(),
            archiving: None,
            secrets_rotation: None,
            walsenders: Vec::new(),
        }
    }

    #[test]
    fn health_means_what_the_clusters_api_means() {
        let now = Instant::now();
        let later = Some(now + Duration::from_secs(3));
        let past = Some(now - Duration::from_millis(1));
        let (ok, down, none) = (
            StatusCode::OK,
            StatusCode::SERVICE_UNAVAILABLE,
            StatusCode::NOT_FOUND,
        );
        // (record's role, streams, lease held until, node asked, question) → answer
        let table = [
            ("primary", false, later, None, Asked::Primary, ok),
            ("primary", false, later, Some("h1"), Asked::Primary, ok),
            // A primary whose lease ran out (not fenced yet) is no primary to write to.
            ("primary", false, past, None, Asked::Primary, down),
            ("primary", false, None, None, Asked::Primary, down),
            ("primary", false, later, None, Asked::Replica, down),
            ("replica", true, None, None, Asked::Replica, ok),
            ("replica", true, None, Some("h1"), Asked::Replica, ok),
            // In recovery but not streaming (a broken link, a clone under way).
            ("replica", false, None, None, Asked::Replica, down),
            ("replica", true, None, None, Asked::Primary, down),
            // Another node's name: ask that node's agent or the cluster's API.
            ("primary", false, later, Some("h2"), Asked::Primary, none),
        ];
        for (role, streaming, until, node, asked, want) in table {
            let shared = Shared {
                member: Some(member(role, streaming)),
                leading_until: until,
                ..Shared::default()
            };
            assert_eq!(
                health(&shared, node, asked, now),
                want,
                "{role} streaming={streaming} until={until:?} {node:?} {asked:?}"
            );
        }
        assert_eq!(health(&Shared::default(), None, Asked::Primary, now), down);
    }

    /// A store cut off: every call fails, as etcd does from an isolated host.
    struct Unreachable(tokio::sync::watch::Sender<u64>);

    impl Dcs for Unreachable {
        fn get(&self, _: &str) -> Result<Option<Versioned>, DcsError> {
            Err(DcsError::Unavailable("cut off".into()))
        }
        fn compare_and_set(&self, _: &str, _: u64, _: Vec<u8>) -> Result<u64, DcsError> {
            Err(DcsError::Unavailable("cut off".into()))
        }
        fn acquire_lease(&self, _: &str, _: &str, _: Duration) -> Result<bool, DcsError> {
            Err(DcsError::Unavailable("cut off".into()))
        }
        fn release_lease(&self, _: &str, _: &str) -> Result<(), DcsError> {
            Err(DcsError::Unavailable("cut off".into()))
        }
        fn lease_holder(&self, _: &str) -> Result<Option<String>, DcsError> {
            Err(DcsError::Unavailable("cut off".into()))
        }
        fn put_expiring(&self, _: &str, _: Vec<u8>, _: Duration) -> Result<(), DcsError> {
            Err(DcsError::Unavailable("cut off".into()))
        }
        fn list(&self, _: &str) -> Result<Vec<(String, Versioned)>, DcsError> {
            Err(DcsError::Unavailable("cut off".into()))
        }
        fn changes(&self) -> tokio::sync::watch::Receiver<u64> {
            self.0.subscribe()
        }
        fn changes_ignoring(&self, _: &str) -> tokio::sync::watch::Receiver<u64> {
            self.0.subscribe()
        }
    }

    /// Serves `router` on a free loopback port; its address.
    async fn serve(router: Router) -> String {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("a free port");
        let addr = listener.local_addr().expect("address");
        tokio::spawn(async move {
            let service = router.into_make_service_with_connect_info::<SocketAddr>();
            let _ = axum::serve(listener, service).await;
        });
        addr.to_string()
    }

    fn agent_api(password: &str) -> Api {
        let (tx, _) = tokio::sync::watch::channel(0);
        Api {
            state: Arc::new(Mutex::new(Shared {
                ttl: Duration::from_secs(6),
                ..Shared::default()
            })),
            store: crate::store::StoreClient::new(Arc::new(Unreachable(tx))),
            key: Arc::new(ApiKey::from_password(password)),
            nonces: Arc::default(),
        }
    }

    /// Over real HTTP: a member of the cluster that cannot reach the store confirms, and
    /// promises; a member of another cluster and a forged "200 OK" from anything else do not
    /// count, so an isolated primary asking them fences at its lease's end.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn only_the_clusters_members_confirm_failsafe() {
        let key = Arc::new(ApiKey::from_password("the cluster's password"));
        let timeout = Duration::from_secs(2);
        let member = agent_api("the cluster's password");
        let promised = member.state.clone();
        let genuine = serve(router(member)).await;
        assert!(confirm_failsafe(vec![genuine.clone()], timeout, key.clone()).await);
        assert!(lock(&promised).promised_until.is_some());

        let foreign = serve(router(agent_api("another cluster's password"))).await;
        assert!(!confirm_failsafe(vec![foreign], timeout, key.clone()).await);

        let forged = serve(Router::new().route(
            "/failsafe",
            post(|| async { (StatusCode::OK, [(ANSWER, "00")]) }),
        ))
        .await;
        assert!(!confirm_failsafe(vec![forged.clone()], timeout, key.clone()).await);
        // One forged answer among genuine ones spoils the confirmation.
        assert!(!confirm_failsafe(vec![genuine.clone(), forged], timeout, key.clone()).await);

        // The member record: signed for the key holder, refused to anyone else.
        lock(&promised).member = None;
        assert!(matches!(
            fetch_member(genuine.clone(), timeout, key).await,
            Fetched::Nothing
        ));
        let other = Arc::new(ApiKey::from_password("a guess"));
        assert!(matches!(
            fetch_member(genuine, timeout, other).await,
            Fetched::Refused(403)
        ));
    }
}
