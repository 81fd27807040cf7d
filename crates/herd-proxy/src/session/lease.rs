//! Choosing and leasing a server connection for a unit: the primary, or the least busy replica
//! its consistency level allows (waiting for a read-your-writes token where it must), with the
//! connection brought to the session's settings and the routing counted.

use std::sync::Arc;
use std::time::{Duration, Instant};

use herd_core::Lsn;

use super::Session;
use crate::pool::{Lease, Pool};
use crate::router::choose::PrimaryReason;
use crate::server::PASSWORD_CHANGED;
use crate::topology::{Endpoint, TopologyView};
use crate::ProxyError;

/// How long opening a server connection may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// How long a session whose user's password changed waits for a login with the new one before
/// a new server connection is refused: `herd secrets rotate` logs in through the endpoint
/// within a fraction of a second of changing the servers.
const NEWER_CREDENTIALS_WAIT: Duration = Duration::from_secs(3);

impl Session {
    pub(super) async fn lease_primary(
        &mut self,
        view: &TopologyView,
        reason: &'static str,
    ) -> Result<(Lease, Option<usize>), ProxyError> {
        // The view's own endpoint is borrowed: no copy of its strings per unit.
        let waited;
        let primary = match &view.primary {
            Some(p) => p,
            None => {
                waited = self.ctx.current_primary_of(self.group).await?;
                &waited
            }
        };
        let lease = self.lease(primary).await?;
        self.routed(primary, reason);
        Ok((lease, None))
    }

    /// Counts a unit routed to `ep` for `reason` (`herd_routed_total`), through a counter the
    /// session keeps: the registry is looked up once per node and reason, not per unit.
    pub(super) fn routed(&mut self, ep: &Endpoint, reason: &'static str) {
        let known = self
            .routed
            .iter()
            .find(|(name, r, _)| *r == reason && *name == ep.name);
        if let Some((_, _, counter)) = known {
            counter.inc();
            return;
        }
        let counter = self.ctx.metrics.counter(
            "herd_routed_total",
            &[("node", ep.name.as_str()), ("reason", reason)],
        );
        counter.inc();
        self.routed.push((ep.name.clone(), reason, counter));
    }

    pub(super) async fn lease_replica(
        &mut self,
        view: &TopologyView,
        candidates: &[usize],
        confirm: Option<Lsn>,
        reason: &'static str,
    ) -> Result<(Lease, Option<usize>), ProxyError> {
        // Least outstanding requests first.
        let mut order: Vec<(usize, usize)> = Vec::with_capacity(candidates.len());
        for &i in candidates {
            order.push((self.pool(&view.replicas[i].endpoint).outstanding(), i));
        }
        order.sort_unstable();
        if self.ctx.config.read_from_primary {
            if let Some(primary) = &view.primary {
                // The primary has replayed everything: any consistency level is met there.
                let busy = self.pool(primary).outstanding();
                if order.first().is_none_or(|&(least, _)| busy < least) {
                    return self
                        .lease_primary(view, PrimaryReason::ReadBalanced.as_str())
                        .await;
                }
            }
        }
        for (_, i) in order {
            let ep = &view.replicas[i].endpoint;
            let Ok(mut lease) = self.lease(ep).await else {
                continue;
            };
            if let Some(token) = confirm {
                self.ctx.metrics.inc("herd_ryw_waits_total", "");
                if !self.wait_replayed(&mut lease, token).await {
                    lease.release();
                    self.ctx.metrics.inc("herd_ryw_fallbacks_total", "");
                    return self
                        .lease_primary(view, PrimaryReason::NotCaughtUp.as_str())
                        .await;
                }
            }
            self.routed(ep, reason);
            return Ok((lease, Some(i)));
        }
        self.lease_primary(view, PrimaryReason::NoReplica.as_str())
            .await
    }

    /// Waits (at most `max_wait_ms`) until the leased replica has replayed `token`.
    async fn wait_replayed(&self, lease: &mut Lease, token: Lsn) -> bool {
        let deadline = Instant::now() + Duration::from_millis(self.ctx.config.max_wait_ms);
        let sql = format!("select pg_last_wal_replay_lsn() >= '{token}'::pg_lsn");
        loop {
            match lease.conn.internal_query(&sql).await {
                Ok(rows)
                    if rows
                        .first()
                        .and_then(|r| r.first())
                        .cloned()
                        .flatten()
                        .as_deref()
                        == Some("t") =>
                {
                    return true
                }
                Ok(_) => {}
                Err(_) => return false,
            }
            if Instant::now() >= deadline {
                return false;
            }
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    }

    /// The pool for `ep` (remembered per session: no key is built per unit; a session uses a
    /// few nodes, so a scan beats hashing the endpoint's strings).
    pub(super) fn pool(&mut self, ep: &Endpoint) -> Arc<Pool> {
        if let Some(p) = self.pools.iter().find(|p| p.endpoint() == ep) {
            return p.clone();
        }
        let pool = self.ctx.pools.get_by(ep, &self.user, &self.database);
        self.pools.push(pool.clone());
        pool
    }

    /// How long a unit waits for a pooled connection (`proxy.pool_wait_ms`).
    pub(super) fn pool_wait(&self) -> Duration {
        Duration::from_millis(self.ctx.config.pool_wait_ms)
    }

    /// The credentials the session's pooled connections log in with (fetched once).
    pub(super) fn credentials(&mut self) -> Option<Arc<crate::pool::Credentials>> {
        if self.creds.is_none() {
            self.creds = self.ctx.users.credentials(&self.user);
        }
        self.creds.clone()
    }

    /// The credentials of a later login of the session's user than `creds`, waited for at
    /// most [`NEWER_CREDENTIALS_WAIT`].
    async fn newer_credentials(
        &self,
        creds: &Arc<crate::pool::Credentials>,
    ) -> Option<Arc<crate::pool::Credentials>> {
        let deadline = Instant::now() + NEWER_CREDENTIALS_WAIT;
        loop {
            match self.ctx.users.credentials(&self.user) {
                Some(latest) if !Arc::ptr_eq(&latest, creds) => return Some(latest),
                _ if Instant::now() >= deadline => return None,
                _ => tokio::time::sleep(Duration::from_millis(50)).await,
            }
        }
    }

    pub(super) async fn lease(&mut self, ep: &Endpoint) -> Result<Lease, ProxyError> {
        let creds = self.credentials().ok_or_else(|| {
            ProxyError::Unavailable("no credentials for this user; reconnect".into())
        })?;
        let pool = self.pool(ep);
        let wait = self.pool_wait();
        let mut lease = match pool.acquire(&creds, wait, CONNECT_TIMEOUT).await {
            Ok(lease) => lease,
            // The user's password changed since this session logged in (`herd secrets rotate`,
            // ALTER ROLE): a new server connection logs in with the key of the user's latest
            // login to the proxy — waited for a moment, as a rotation logs in with the new
            // password right after changing it.
            Err(ProxyError::Server { code, message }) if code == PASSWORD_CHANGED => {
                let latest =
                    self.newer_credentials(&creds)
                        .await
                        .ok_or_else(|| ProxyError::Server {
                            code,
                            message: format!("{message}; reconnect with the new password"),
                        })?;
                self.creds = Some(latest.clone());
                pool.acquire(&latest, wait, CONNECT_TIMEOUT).await?
            }
            Err(e) => return Err(e),
        };
        lease.conn.reported.clear();
        if lease.conn.state_hash != self.state.hash {
            // Bring the server to the session's settings (one round trip, only when they differ).
            lease.conn.internal_query(&self.state.replay_sql()).await?;
            lease.conn.state_hash = self.state.hash;
        }
        Ok(lease)
    }
}
