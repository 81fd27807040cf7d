//! Polls every node at ≤ 100 ms: the primary's WAL position and role, each replica's replay
//! position; publishes a `TopologyView` with lag, staleness and read-pool membership.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use herd_core::Lsn;
use tokio::sync::watch;
use tokio_postgres::{Client, Statement};

use crate::topology::{
    next_membership, Assignment, Endpoint, LagLimits, LsnHistory, ReplicaView, TopologyView,
};

/// Credentials of the proxy's own administrative connections.
#[derive(Clone)]
pub struct AdminLogin {
    /// Role name.
    pub user: String,
    /// Its password, shared by every copy of this login: `herd secrets rotate` replaces it in
    /// place (see [`SharedPassword`]).
    pub password: SharedPassword,
    /// TLS to the servers (`[proxy] server_tls`), for these connections and the pooled ones;
    /// `None`: plain.
    pub tls: Option<herd_pg::ClientTls>,
}

impl std::fmt::Debug for AdminLogin {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "AdminLogin({})", self.user)
    }
}

/// A password every clone of which sees a replacement: a rotation (`herd secrets rotate`)
/// reaches each holder of the proxy's login at once, and the connections those holders keep
/// stay up (already authenticated) while new ones log in with the new password. During a
/// rotation it also holds the next password, tried when the current one is refused (the
/// servers change before the files naming the new one are in place).
#[derive(Clone)]
pub struct SharedPassword(Arc<std::sync::RwLock<(String, Option<String>)>>);

impl SharedPassword {
    /// The password now.
    pub fn get(&self) -> String {
        self.0.read().unwrap_or_else(|e| e.into_inner()).0.clone()
    }

    /// The next password of a rotation under way, when it differs from the current one.
    pub fn next(&self) -> Option<String> {
        let kept = self.0.read().unwrap_or_else(|e| e.into_inner());
        kept.1.clone().filter(|n| *n != kept.0)
    }

    /// Replaces it for every holder; `true` when it changed.
    pub fn set(&self, password: &str) -> bool {
        let mut kept = self.0.write().unwrap_or_else(|e| e.into_inner());
        if kept.0 == password {
            return false;
        }
        kept.0 = password.to_string();
        true
    }

    /// Records the next password of a rotation under way (`None`: none).
    pub fn set_next(&self, next: Option<&str>) {
        self.0.write().unwrap_or_else(|e| e.into_inner()).1 = next.map(str::to_string);
    }
}

impl From<String> for SharedPassword {
    fn from(password: String) -> Self {
        SharedPassword(Arc::new(std::sync::RwLock::new((password, None))))
    }
}

impl From<&str> for SharedPassword {
    fn from(password: &str) -> Self {
        password.to_string().into()
    }
}

/// Opens an administrative connection to `ep`.
pub async fn admin_connect(ep: &Endpoint, login: &AdminLogin, timeout: Duration) -> Option<Client> {
    admin_connect_db(ep, login, "postgres", timeout).await
}

/// The `application_name` of the proxy's own connections (monitoring, shard map changes):
/// a group addition's event trigger lets their DDL (`CREATE TABLE IF NOT EXISTS` of Herd's
/// schema) through.
pub const ADMIN_APPLICATION: &str = "herd-proxy-monitor";

/// Like [`admin_connect`], to `database`.
pub async fn admin_connect_db(
    ep: &Endpoint,
    login: &AdminLogin,
    database: &str,
    timeout: Duration,
) -> Option<Client> {
    admin_connect_checked(ep, login, database, timeout)
        .await
        .ok()
}

/// Why an administrative connection failed.
#[derive(Debug)]
pub enum AdminConnectError {
    /// TLS to the server failed (the message names the node and the cause).
    Tls(String),
    /// Anything else (refused, timed out, login failed).
    Other,
}

/// [`admin_connect_db`], telling a TLS failure apart.
pub async fn admin_connect_checked(
    ep: &Endpoint,
    login: &AdminLogin,
    database: &str,
    timeout: Duration,
) -> Result<Client, AdminConnectError> {
    let current = login.password.get();
    match admin_attempt(ep, login, &current, database, timeout).await {
        // Refused during a rotation: the server may have the next password already.
        Err((AdminConnectError::Other, true)) => match login.password.next() {
            Some(next) => match admin_attempt(ep, login, &next, database, timeout).await {
                Ok(client) => {
                    login.password.set(&next);
                    Ok(client)
                }
                Err((e, _)) => Err(e),
            },
            None => Err(AdminConnectError::Other),
        },
        other => other.map_err(|(e, _)| e),
    }
}

/// One administrative login with `password`; on failure, whether the password was refused.
async fn admin_attempt(
    ep: &Endpoint,
    login: &AdminLogin,
    password: &str,
    database: &str,
    timeout: Duration,
) -> Result<Client, (AdminConnectError, bool)> {
    let mut config = tokio_postgres::Config::new();
    config
        .host(&ep.host)
        .port(ep.port)
        .user(&login.user)
        .password(password)
        .dbname(database)
        .application_name(ADMIN_APPLICATION)
        .connect_timeout(timeout)
        // As the pooled connections (`server_stream.rs`): a host cut off sends no reset, and the
        // map loads, recoveries and role copies run statements here without a deadline of their
        // own: without these a statement sent just before a cut waits out TCP's back-off
        // (minutes), and every session needing that map with it.
        .keepalives(true)
        .keepalives_idle(Duration::from_secs(5))
        .keepalives_interval(Duration::from_secs(2))
        .keepalives_retries(3)
        .tcp_user_timeout(crate::server::SERVER_USER_TIMEOUT);
    let connecting = herd_pg::connect_config(&mut config, login.tls.as_ref());
    match tokio::time::timeout(timeout, connecting).await {
        Ok(Ok(client)) => Ok(client),
        Ok(Err(e)) if login.tls.is_some() && is_tls_failure(&e) => {
            Err((AdminConnectError::Tls(tls_failure(ep, &e)), false))
        }
        Ok(Err(e)) => {
            tracing::debug!(node = %ep.name, "administrative connection failed: {e}");
            let refused = e.code() == Some(&tokio_postgres::error::SqlState::INVALID_PASSWORD);
            Err((AdminConnectError::Other, refused))
        }
        Err(_) => Err((AdminConnectError::Other, false)),
    }
}

/// tokio-postgres reports a failed handshake (and a server declining TLS) as "error
/// performing TLS handshake"; its error kinds are not public.
fn is_tls_failure(e: &tokio_postgres::Error) -> bool {
    e.to_string().contains("TLS handshake")
}

/// The message clients get: the node, its address and the cause.
fn tls_failure(ep: &Endpoint, e: &tokio_postgres::Error) -> String {
    let cause = std::error::Error::source(e).map_or_else(|| e.to_string(), |s| s.to_string());
    crate::error::server_tls_failure(ep, &cause)
}

/// Poll results of one node: `(in_recovery, lsn)`.
type Poll = Option<(bool, Option<Lsn>)>;

/// The poll, prepared once per connection: as text it was prepared, run and closed on every
/// poll (three round trips each, ten times a second per node).
const POLL_SQL: &str = "select pg_is_in_recovery(), case when pg_is_in_recovery() \
     then pg_last_wal_replay_lsn() else pg_current_wal_lsn() end::text";

/// A monitoring connection with its prepared poll.
struct Polled {
    client: Client,
    poll: Statement,
}

/// Connects to `ep` and prepares the poll there; `Err(Some(reason))` when TLS failed.
async fn connect_polled(
    ep: &Endpoint,
    login: &AdminLogin,
    timeout: Duration,
) -> Result<Polled, Option<String>> {
    let client = match admin_connect_checked(ep, login, "postgres", timeout).await {
        Ok(c) => c,
        Err(AdminConnectError::Tls(why)) => return Err(Some(why)),
        Err(AdminConnectError::Other) => return Err(None),
    };
    let poll = tokio::time::timeout(timeout, client.prepare(POLL_SQL))
        .await
        .map_err(|_| None)?
        .map_err(|_| None)?;
    Ok(Polled { client, poll })
}

async fn poll(polled: &Polled, timeout: Duration) -> Poll {
    let q = polled.client.query_one(&polled.poll, &[]);
    let row = tokio::time::timeout(timeout, q).await.ok()?.ok()?;
    let lsn: Option<String> = row.get(1);
    Some((row.get(0), lsn.and_then(|l| l.parse().ok())))
}

/// Runs until `shutdown` turns true, publishing a new view on `views` after every poll.
///
/// `assignment` holds the group's roles: an [`Assignment`] (a supervisor always has one) or an
/// `Option<Assignment>`, `None` while no member has ever led (a `herd proxy` started before its
/// agents elected one): nothing is polled then and the view says [`TopologyView::electing`].
pub async fn run<A>(
    mut assignment: watch::Receiver<A>,
    login: AdminLogin,
    interval: Duration,
    limits: LagLimits,
    views: watch::Sender<Arc<TopologyView>>,
    mut shutdown: watch::Receiver<bool>,
) where
    A: Clone + Into<Option<Assignment>>,
{
    let timeout = (interval * 5).max(Duration::from_millis(500));
    let mut clients: HashMap<Endpoint, Polled> = HashMap::new();
    let mut history = LsnHistory::default();
    let mut membership: HashMap<Endpoint, bool> = HashMap::new();
    let mut ticker = tokio::time::interval(interval);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = ticker.tick() => {}
            _ = shutdown.changed() => {}
        }
        if *shutdown.borrow() {
            return;
        }
        let assign: Option<Assignment> = assignment.borrow_and_update().clone().into();
        let Some(assign) = assign else {
            clients.clear();
            views.send_if_modified(|v| {
                let electing = TopologyView {
                    electing: true,
                    ..TopologyView::default()
                };
                let changed = **v != electing;
                if changed {
                    *v = Arc::new(electing);
                }
                changed
            });
            continue;
        };
        let mut nodes = vec![assign.primary.clone()];
        nodes.extend(assign.replicas.iter().cloned());
        clients.retain(|ep, c| nodes.contains(ep) && !c.client.is_closed());
        // Connect missing clients and poll all nodes concurrently.
        let polls = nodes.iter().cloned().map(|ep| {
            let existing = clients.remove(&ep);
            let login = login.clone();
            async move {
                let (client, tls_error) = match existing {
                    Some(c) => (Some(c), None),
                    None => match connect_polled(&ep, &login, timeout).await {
                        Ok(c) => (Some(c), None),
                        Err(why) => (None, why),
                    },
                };
                let result = match &client {
                    Some(c) => poll(c, timeout).await,
                    None => None,
                };
                (ep, client, result, tls_error)
            }
        });
        let results = futures_join(polls).await;
        let now = Instant::now();
        let mut by_node: HashMap<Endpoint, Poll> = HashMap::new();
        let mut tls_error: Option<String> = None;
        for (ep, client, result, why) in results {
            if let Some(c) = client {
                clients.insert(ep.clone(), c);
            }
            // The primary's reason first: it is the one writes wait for.
            if why.is_some() && (tls_error.is_none() || ep == assign.primary) {
                tls_error = why;
            }
            by_node.insert(ep, result);
        }
        if tls_error.is_some() && tls_error != views.borrow().tls_error {
            tracing::warn!("{}", tls_error.as_deref().unwrap_or_default());
        }
        let primary_poll = by_node.get(&assign.primary).cloned().flatten();
        let (primary, primary_lsn) = match primary_poll {
            // Never route writes to a node in recovery.
            Some((false, Some(lsn))) if !assign.primary_down => (Some(assign.primary.clone()), lsn),
            _ => (None, views.borrow().primary_lsn),
        };
        if primary.is_some() {
            history.record(now, primary_lsn);
        }
        let replicas = assign
            .replicas
            .iter()
            .map(|ep| {
                let (healthy, replay) = match by_node.get(ep).cloned().flatten() {
                    Some((true, Some(lsn))) => (true, lsn),
                    _ => (false, Lsn(0)),
                };
                let lag_bytes = primary_lsn.bytes_after(replay);
                let staleness = if healthy { history.staleness(replay, now) } else { None };
                let was = membership.get(ep).copied().unwrap_or(false);
                let in_pool = healthy && next_membership(was, lag_bytes, staleness, &limits);
                if was != in_pool {
                    tracing::info!(node = %ep.name, lag_bytes, ?staleness, "replica {} the read pool", if in_pool { "joins" } else { "leaves" });
                }
                membership.insert(ep.clone(), in_pool);
                ReplicaView { endpoint: ep.clone(), healthy, replay_lsn: replay, lag_bytes, staleness, in_read_pool: in_pool }
            })
            .collect();
        let _ = views.send(Arc::new(TopologyView {
            primary,
            primary_lsn,
            replicas,
            durable_replicas: assign.durable_replicas,
            electing: false,
            tls_error,
        }));
    }
}

/// Awaits every future concurrently (a few nodes; no extra dependency needed).
async fn futures_join<F>(futures: impl Iterator<Item = F>) -> Vec<F::Output>
where
    F: std::future::Future + Send + 'static,
    F::Output: Send + 'static,
{
    let handles: Vec<_> = futures.map(tokio::spawn).collect();
    let mut out = Vec::with_capacity(handles.len());
    for h in handles {
        if let Ok(v) = h.await {
            out.push(v);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_rotated_password_reaches_every_copy() {
        let login = AdminLogin {
            user: "postgres".into(),
            password: "old".into(),
            tls: None,
        };
        let copy = login.clone();
        assert_eq!(copy.password.next(), None);
        login.password.set_next(Some("old"));
        assert_eq!(
            copy.password.next(),
            None,
            "the next one equal to the current is none"
        );
        login.password.set_next(Some("new"));
        assert_eq!(copy.password.next().as_deref(), Some("new"));
        assert!(copy.password.set("new"));
        assert!(!login.password.set("new"), "unchanged");
        assert_eq!(login.password.get(), "new");
        assert_eq!(login.password.next(), None, "taken up: nothing next");
        login.password.set_next(None);
        assert_eq!(
            format!("{copy:?}"),
            "AdminLogin(postgres)",
            "no password printed"
        );
    }
}
