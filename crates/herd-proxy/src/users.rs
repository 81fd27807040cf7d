//! Herd's users are the cluster's login roles: their SCRAM verifiers are read from `pg_authid`
//! (the primary's, or a replica's while there is no primary; cached briefly), and the key each user proves at login is kept, in memory only,
//! so the pools can log in to the servers as that user.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use herd_scram::{ClientKey, Verifier};
use tokio_postgres::Client;

use crate::monitor::{admin_connect, AdminLogin};
use crate::pool::Credentials;
use crate::topology::Endpoint;

/// How long a verifier read from the primary is trusted (password changes apply after this).
const VERIFIER_TTL: Duration = Duration::from_secs(5);
/// Bound on asking the primary for a verifier (connecting included). A primary that died or
/// hangs must not hold logins up: a failover takes over within seconds.
const FETCH_TIMEOUT: Duration = Duration::from_secs(2);

/// No server could be asked for a role's verifier (down, hung, or failing over).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Unreachable;

/// Verifier cache and recovered keys.
pub struct Users {
    login: AdminLogin,
    admin: tokio::sync::Mutex<Option<(Endpoint, Client)>>,
    verifiers: Mutex<HashMap<String, (Instant, Option<Verifier>)>>,
    keys: Mutex<HashMap<String, std::sync::Arc<Credentials>>>,
}

impl Users {
    /// Reads verifiers with the proxy's administrative login.
    pub fn new(login: AdminLogin) -> Self {
        Users {
            login,
            admin: tokio::sync::Mutex::new(None),
            verifiers: Mutex::new(HashMap::new()),
            keys: Mutex::new(HashMap::new()),
        }
    }

    /// The verifier of a login role, `Ok(None)` when the role does not exist, cannot log in,
    /// has expired or has no SCRAM password. `servers` are asked in order, all within
    /// [`FETCH_TIMEOUT`]: the primary first, then replicas (a standby serves `pg_authid` too, so
    /// logins go on while no member leads; a password changed a moment ago may not have reached
    /// it yet). When none answers, the last verifier read (however old) is used: a failover must
    /// not lock out users who logged in before it; `Err` only when there is none.
    /// `fresh`: read it again even if a recent one is kept (a copy's role is made with a new
    /// password just before its subscription logs in).
    pub async fn verifier(
        &self,
        servers: &[Endpoint],
        user: &str,
        fresh: bool,
    ) -> Result<Option<Verifier>, Unreachable> {
        let cached = self
            .verifiers
            .lock()
            .ok()
            .and_then(|m| m.get(user).cloned());
        if let Some((at, v)) = &cached {
            if !fresh && at.elapsed() < VERIFIER_TTL {
                return Ok(v.clone());
            }
        }
        let deadline = Instant::now() + FETCH_TIMEOUT;
        let mut fetched = Err(Unreachable);
        for (i, server) in servers.iter().enumerate() {
            let left = deadline.saturating_duration_since(Instant::now());
            // A hung server (a frozen primary) must leave time for the next one.
            let bound = if i + 1 < servers.len() {
                left / 2
            } else {
                left
            };
            if bound.is_zero() {
                break;
            }
            fetched = tokio::time::timeout(bound, self.fetch(server, user))
                .await
                .unwrap_or(Err(Unreachable));
            if fetched.is_ok() {
                break;
            }
        }
        match fetched {
            Ok(v) => {
                if let Ok(mut m) = self.verifiers.lock() {
                    m.insert(user.to_string(), (Instant::now(), v.clone()));
                }
                Ok(v)
            }
            Err(Unreachable) => {
                tracing::debug!(user, "no server answered; using the last verifier read");
                cached.map(|(_, v)| v).ok_or(Unreachable)
            }
        }
    }

    async fn fetch(&self, server: &Endpoint, user: &str) -> Result<Option<Verifier>, Unreachable> {
        let mut admin = self.admin.lock().await;
        let stale = match admin.as_ref() {
            Some((ep, c)) => ep != server || c.is_closed(),
            None => true,
        };
        if stale {
            *admin = admin_connect(server, &self.login, FETCH_TIMEOUT)
                .await
                .map(|c| (server.clone(), c));
        }
        let Some((_, client)) = admin.as_ref() else {
            return Err(Unreachable);
        };
        let row = match client
            .query_opt(
                "select rolpassword from pg_authid where rolname = $1 and rolcanlogin \
                 and (rolvaliduntil is null or rolvaliduntil > now())",
                &[&user],
            )
            .await
        {
            Ok(row) => row,
            Err(_) => {
                // The next login reconnects (the primary may have changed meanwhile).
                *admin = None;
                return Err(Unreachable);
            }
        };
        let text: Option<String> = row.and_then(|r| r.get(0));
        Ok(text.and_then(|t| Verifier::parse(&t).ok()))
    }

    /// Forgets the verifier kept for `user` (a failed login: the password may have changed
    /// since it was read, and the next login reads it again).
    pub fn forget(&self, user: &str) {
        if let Ok(mut m) = self.verifiers.lock() {
            m.remove(user);
        }
    }

    /// Remembers the key `user` just proved, for the pools.
    pub fn remember(&self, user: &str, key: ClientKey, verifier: Verifier) {
        if let Ok(mut m) = self.keys.lock() {
            // A client that connects per transaction proves the same key at every login: the
            // entry stays as it is (no copies of the name and credentials each time).
            if m.get(user)
                .is_some_and(|c| c.key == key && c.verifier == verifier)
            {
                return;
            }
            m.insert(
                user.to_string(),
                std::sync::Arc::new(Credentials { key, verifier }),
            );
        }
    }

    /// The credentials pools use for `user`.
    pub fn credentials(&self, user: &str) -> Option<std::sync::Arc<Credentials>> {
        self.keys.lock().ok().and_then(|m| m.get(user).cloned())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A node that accepts TCP connections and never answers: what a frozen (SIGSTOPped)
    /// PostgreSQL looks like from outside.
    async fn hung_node() -> (tokio::net::TcpListener, Endpoint) {
        let l = tokio::net::TcpListener::bind(("127.0.0.1", 0))
            .await
            .expect("bind");
        let port = l.local_addr().expect("addr").port();
        let ep = Endpoint {
            name: herd_core::NodeName::numbered(0),
            host: "127.0.0.1".into(),
            port,
            socket: None,
        };
        (l, ep)
    }

    fn users() -> Users {
        Users::new(AdminLogin {
            user: "herd".into(),
            password: "secret".into(),
            tls: None,
        })
    }

    #[tokio::test]
    async fn hung_primary_without_cached_verifier_is_reported_within_the_bound() {
        let (_listener, ep) = hung_node().await;
        let started = Instant::now();
        assert_eq!(
            users().verifier(&[ep], "app", false).await,
            Err(Unreachable)
        );
        assert!(started.elapsed() < FETCH_TIMEOUT + Duration::from_secs(5));
    }

    #[tokio::test]
    async fn every_server_hung_is_reported_within_one_bound() {
        let (_primary, p) = hung_node().await;
        let (_replica, r) = hung_node().await;
        let started = Instant::now();
        assert_eq!(
            users().verifier(&[p, r], "app", false).await,
            Err(Unreachable)
        );
        assert!(started.elapsed() < FETCH_TIMEOUT + Duration::from_millis(500));
        // Nothing to ask at all: at once.
        let started = Instant::now();
        assert_eq!(users().verifier(&[], "app", false).await, Err(Unreachable));
        assert!(started.elapsed() < Duration::from_millis(100));
    }

    #[tokio::test]
    async fn hung_primary_serves_the_last_verifier_read() {
        let (_listener, ep) = hung_node().await;
        let u = users();
        let v = Verifier::generate("pw");
        let old = Instant::now()
            .checked_sub(VERIFIER_TTL * 2)
            .expect("clock far enough from its origin");
        u.verifiers
            .lock()
            .expect("lock")
            .insert("app".into(), (old, Some(v.clone())));
        assert_eq!(
            u.verifier(std::slice::from_ref(&ep), "app", false).await,
            Ok(Some(v))
        );
        // A role known not to exist stays unknown.
        u.verifiers
            .lock()
            .expect("lock")
            .insert("ghost".into(), (old, None));
        assert_eq!(u.verifier(&[ep], "ghost", false).await, Ok(None));
    }

    #[test]
    fn a_key_proved_again_keeps_its_entry_and_a_new_one_replaces_it() {
        let u = users();
        let v = Verifier::generate("pw");
        let key = |b: u8| ClientKey::from_bytes([b; 32]);
        u.remember("app", key(1), v.clone());
        let first = u.credentials("app").expect("remembered");
        u.remember("app", key(1), v.clone());
        let again = u.credentials("app").expect("remembered");
        assert!(
            std::sync::Arc::ptr_eq(&first, &again),
            "same key: entry kept"
        );
        u.remember("app", key(2), v.clone());
        let changed = u.credentials("app").expect("remembered");
        assert!(changed.key == key(2), "a new key replaces the old one");
        let v2 = Verifier::generate("pw2");
        u.remember("app", key(2), v2.clone());
        assert!(
            u.credentials("app").expect("remembered").verifier == v2,
            "a new verifier too"
        );
    }
}
