//! Herd's users are the cluster's login roles: their SCRAM verifiers are read from the primary's
//! `pg_authid` (cached briefly), and the key each user proves at login is kept, in memory only,
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

    /// The verifier of a login role, `None` when the role does not exist, cannot log in, has
    /// expired or has no SCRAM password.
    pub async fn verifier(&self, primary: &Endpoint, user: &str) -> Option<Verifier> {
        if let Some((at, v)) = self
            .verifiers
            .lock()
            .ok()
            .and_then(|m| m.get(user).cloned())
        {
            if at.elapsed() < VERIFIER_TTL {
                return v;
            }
        }
        let fetched = self.fetch(primary, user).await;
        if let Ok(mut m) = self.verifiers.lock() {
            m.insert(user.to_string(), (Instant::now(), fetched.clone()));
        }
        fetched
    }

    async fn fetch(&self, primary: &Endpoint, user: &str) -> Option<Verifier> {
        let mut admin = self.admin.lock().await;
        let stale = match admin.as_ref() {
            Some((ep, c)) => ep != primary || c.is_closed(),
            None => true,
        };
        if stale {
            *admin = admin_connect(primary, &self.login, Duration::from_secs(3))
                .await
                .map(|c| (primary.clone(), c));
        }
        let (_, client) = admin.as_ref()?;
        let row = client
            .query_opt(
                "select rolpassword from pg_authid where rolname = $1 and rolcanlogin \
                 and (rolvaliduntil is null or rolvaliduntil > now())",
                &[&user],
            )
            .await
            .ok()??;
        let text: Option<String> = row.get(0);
        Verifier::parse(&text?).ok()
    }

    /// Remembers the key `user` just proved, for the pools.
    pub fn remember(&self, user: &str, key: ClientKey, verifier: Verifier) {
        if let Ok(mut m) = self.keys.lock() {
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
