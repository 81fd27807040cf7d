//! The etcd v3 backend: the same contract as [`MemoryDcs`](crate::MemoryDcs), kept by an etcd
//! cluster so that the supervisors of several hosts share one truth.
//!
//! - Keys live under a cluster prefix (`/herd/<cluster>/`); a key's revision is etcd's
//!   `mod_revision`, and compare-and-set is one etcd transaction comparing it.
//! - A lease is a key holding the owner's name, attached to an etcd lease granted with the
//!   requested TTL: etcd deletes the key when the lease expires, renewal is a keep-alive, and
//!   taking a lease is a transaction that succeeds only while the key is absent, so two owners
//!   never hold it at once. A lease counts as held until etcd has revoked it (etcd checks for
//!   expired leases every 500 ms): later than its TTL, never earlier — the safe side for a
//!   leader lease, whose holder fences itself before its TTL runs out.
//!
//! The [`Dcs`] trait is synchronous (the HA logic calls it between awaits); this backend runs its
//! client on a small runtime of its own and waits for each call with a time limit, so a store
//! that does not answer becomes [`DcsError::Unavailable`], never a hang.

use std::future::Future;
use std::path::PathBuf;
use std::sync::mpsc;
use std::time::Duration;

use etcd_client::{
    Client, Compare, CompareOp, ConnectOptions, GetOptions, PutOptions, Txn, TxnOp, TxnOpResponse,
};

use crate::{Dcs, DcsError, Versioned, Watchers};

/// Where the etcd cluster is and how to authenticate to it.
#[derive(Clone, Debug, Default)]
pub struct EtcdConfig {
    /// Client URLs of the members, e.g. `http://10.0.0.1:2379`.
    pub endpoints: Vec<String>,
    /// The cluster's name: its keys live under `/herd/<cluster>/`.
    pub cluster: String,
    /// User name and password, when etcd's authentication is on.
    pub credentials: Option<(String, String)>,
    /// TLS: the CA certificate that signed the members' certificates (PEM file).
    pub ca_file: Option<PathBuf>,
    /// TLS client certificate and key (PEM files), when the members require them.
    pub client_cert: Option<(PathBuf, PathBuf)>,
    /// How long one operation may take before the store counts as unavailable.
    pub timeout: Duration,
}

impl EtcdConfig {
    /// The endpoints of a store URL: `etcd://h1:2379,h2:2379` (plain) or
    /// `etcds://h1:2379,…` (TLS), for the cluster named `cluster`.
    pub fn from_url(url: &str, cluster: &str) -> Result<EtcdConfig, DcsError> {
        let bad = |why: &str| {
            DcsError::Unavailable(format!(
                "invalid store URL {url:?}: {why} (expected etcd://host:port[,host:port…] or etcds://…)"
            ))
        };
        let (scheme, hosts) = if let Some(rest) = url.strip_prefix("etcd://") {
            ("http", rest)
        } else if let Some(rest) = url.strip_prefix("etcds://") {
            ("https", rest)
        } else {
            return Err(bad("unknown scheme"));
        };
        let endpoints: Vec<String> = hosts
            .trim_end_matches('/')
            .split(',')
            .filter(|h| !h.is_empty())
            .map(|h| format!("{scheme}://{h}"))
            .collect();
        if endpoints.is_empty() {
            return Err(bad("no host"));
        }
        if let Some(h) = hosts.split(',').find(|h| !h.contains(':')) {
            return Err(bad(&format!("{h} has no port")));
        }
        if cluster.is_empty()
            || !cluster
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
        {
            return Err(DcsError::Unavailable(format!(
                "invalid cluster name {cluster:?}: letters, digits, '-' and '_' only"
            )));
        }
        Ok(EtcdConfig {
            endpoints,
            cluster: cluster.into(),
            ..EtcdConfig::default()
        })
    }
}

impl EtcdConfig {
    /// How long one call may take (5 s when not set).
    pub(crate) fn call_timeout(&self) -> Duration {
        if self.timeout.is_zero() {
            Duration::from_secs(5)
        } else {
            self.timeout
        }
    }
}

/// The client options of `config`: timeouts, credentials, TLS.
pub(crate) fn connect_options(config: &EtcdConfig) -> Result<ConnectOptions, DcsError> {
    let timeout = config.call_timeout();
    // HTTP/2 keep-alive pings find a member behind a dead link (no reset ever comes) within
    // about a second, so requests stop being balanced onto it.
    let mut options = ConnectOptions::new()
        .with_connect_timeout(timeout)
        .with_timeout(timeout)
        .with_keep_alive(Duration::from_millis(300), Duration::from_millis(700))
        .with_keep_alive_while_idle(true);
    if let Some((user, password)) = &config.credentials {
        options = options.with_user(user.clone(), password.clone());
    }
    if let Some(tls) = tls_options(config)? {
        options = options.with_tls(tls);
    }
    Ok(options)
}

/// A [`Dcs`] kept by an etcd cluster.
pub struct EtcdDcs {
    /// Always `Some` until dropped (taken to shut it down without blocking).
    runtime: Option<tokio::runtime::Runtime>,
    /// The client in use; replaced by a fresh one after calls have failed for a while.
    client: Shared,
    /// How to connect again.
    endpoints: Vec<String>,
    options: ConnectOptions,
    /// Since when every call has failed.
    trouble_since: std::sync::Mutex<Option<std::time::Instant>>,
    prefix: String,
    timeout: Duration,
    changed: std::sync::Arc<Watchers>,
}

fn unavailable(e: impl std::fmt::Display) -> DcsError {
    DcsError::Unavailable(e.to_string())
}

/// Runs `f` on `runtime` and waits at most `timeout` for it, from any thread (also from inside
/// another tokio runtime, where `block_on` is not allowed).
pub(crate) fn run_on<T: Send + 'static>(
    runtime: &tokio::runtime::Runtime,
    timeout: Duration,
    f: impl Future<Output = Result<T, DcsError>> + Send + 'static,
) -> Result<T, DcsError> {
    let (tx, rx) = mpsc::channel();
    let task = runtime.spawn(async move {
        let _ = tx.send(f.await);
    });
    match rx.recv_timeout(timeout) {
        Ok(r) => r,
        Err(_) => {
            task.abort();
            Err(DcsError::Unavailable(format!(
                "etcd did not answer within {} ms",
                timeout.as_millis()
            )))
        }
    }
}

impl EtcdDcs {
    /// Connects to the etcd cluster of `config`.
    pub fn connect(config: &EtcdConfig) -> Result<EtcdDcs, DcsError> {
        if config.endpoints.is_empty() {
            return Err(DcsError::Unavailable(
                "no etcd endpoints given (e.g. etcd://10.0.0.1:2379,10.0.0.2:2379)".into(),
            ));
        }
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("herd-etcd")
            .enable_all()
            .build()
            .map_err(|e| unavailable(format!("cannot start the etcd client's runtime: {e}")))?;
        let timeout = config.call_timeout();
        let options = connect_options(config)?;
        let endpoints = config.endpoints.clone();
        let client = run_on(
            &runtime,
            timeout * 2,
            connect(endpoints.clone(), options.clone()),
        )?;
        let client: Shared = std::sync::Arc::new(std::sync::Mutex::new(client));
        let prefix = format!("/herd/{}/", config.cluster);
        let changed = std::sync::Arc::new(Watchers::default());
        runtime.spawn(watch_prefix(
            client.clone(),
            prefix.clone(),
            changed.clone(),
        ));
        Ok(EtcdDcs {
            runtime: Some(runtime),
            client,
            endpoints,
            options,
            trouble_since: std::sync::Mutex::new(None),
            prefix,
            timeout,
            changed,
        })
    }

    fn runtime(&self) -> &tokio::runtime::Runtime {
        // Set in `connect`, taken only in `drop`.
        self.runtime
            .as_ref()
            .unwrap_or_else(|| unreachable!("the runtime lives as long as the store"))
    }

    fn key(&self, key: &str) -> String {
        format!("{}{key}", self.prefix)
    }

    /// Where lease `key` lives: `leases/<name>` beside the other keys of its group (see
    /// [`crate::lease_path`]).
    fn lease_key(&self, key: &str) -> String {
        format!("{}{}", self.prefix, crate::lease_path(key))
    }

    /// Runs `f` with a client on the etcd runtime, again while the member it reached refuses
    /// connections (the client then picks another member), within the time limit.
    fn run<T, F, Fut>(&self, f: F) -> Result<T, DcsError>
    where
        T: Send + 'static,
        F: Fn(Client) -> Fut + Send + 'static,
        Fut: Future<Output = Result<T, DcsError>> + Send,
    {
        self.attempt(f, never_sent)
    }

    /// Like [`EtcdDcs::run`] for reads, which are retried after any failure of the member
    /// reached (a read changes nothing, so sending it again is always safe).
    fn read<T, F, Fut>(&self, f: F) -> Result<T, DcsError>
    where
        T: Send + 'static,
        F: Fn(Client) -> Fut + Send + 'static,
        Fut: Future<Output = Result<T, DcsError>> + Send,
    {
        self.attempt(f, |_| true)
    }

    fn attempt<T, F, Fut>(&self, f: F, retry: fn(&str) -> bool) -> Result<T, DcsError>
    where
        T: Send + 'static,
        F: Fn(Client) -> Fut + Send + 'static,
        Fut: Future<Output = Result<T, DcsError>> + Send,
    {
        let client = current(&self.client);
        let budget = self.timeout.mul_f64(0.8);
        // One try may land on a member that cannot answer (behind a cut link): a read gives it
        // part of the budget and then tries again, likely on another member.
        let per_try = if retry("timeout") {
            self.timeout.mul_f64(0.4)
        } else {
            self.timeout
        };
        let result = run_on(self.runtime(), self.timeout, async move {
            let started = tokio::time::Instant::now();
            loop {
                let outcome = tokio::time::timeout(per_try, f(client.clone()))
                    .await
                    .unwrap_or_else(|_| Err(DcsError::Unavailable("timeout".into())));
                match outcome {
                    Err(DcsError::Unavailable(m)) if retry(&m) && started.elapsed() < budget => {
                        tokio::time::sleep(Duration::from_millis(50)).await;
                    }
                    other => return other,
                }
            }
        });
        self.note_outcome(result.is_ok() || matches!(result, Err(DcsError::Conflict { .. })));
        result
    }

    /// Replaces the client with a fresh one once every call has failed for a few timeouts: a
    /// channel whose members all went away behind a cut link has been seen not to recover
    /// when the link came back, where new connections do.
    fn note_outcome(&self, answered: bool) {
        let mut since = self.trouble_since.lock().unwrap_or_else(|p| p.into_inner());
        if answered {
            *since = None;
            return;
        }
        let started = *since.get_or_insert_with(std::time::Instant::now);
        if started.elapsed() < (self.timeout * 3).max(Duration::from_secs(3)) {
            return;
        }
        *since = None;
        drop(since);
        // In the background: the call that noticed the trouble (an agent's round during an
        // etcd outage, say) must not also wait for the new connection.
        let (shared, endpoints, options) = (
            self.client.clone(),
            self.endpoints.clone(),
            self.options.clone(),
        );
        let timeout = self.timeout;
        self.runtime().spawn(async move {
            if let Ok(Ok(client)) = tokio::time::timeout(timeout, connect(endpoints, options)).await
            {
                *shared.lock().unwrap_or_else(|p| p.into_inner()) = client;
            }
        });
    }

    /// The lease key's (owner, etcd lease id, mod revision), when the key exists.
    fn lease_entry(&self, key: &str) -> Result<Option<(String, i64, i64)>, DcsError> {
        let k = self.lease_key(key);
        self.run(move |mut client| {
            let k = k.clone();
            async move {
                let r = client.get(k, None).await.map_err(unavailable)?;
                Ok(r.kvs().first().map(|kv| {
                    (
                        String::from_utf8_lossy(kv.value()).into_owned(),
                        kv.lease(),
                        kv.mod_revision(),
                    )
                }))
            }
        })
    }

    fn revoke(&self, id: i64) -> Result<(), DcsError> {
        self.run(move |mut client| async move {
            match client.lease_revoke(id).await {
                Ok(_) => Ok(()),
                // Revoked meanwhile (expired, or by another owner's takeover).
                Err(etcd_client::Error::GRpcStatus(s))
                    if s.message().contains("lease not found") =>
                {
                    Ok(())
                }
                Err(e) => Err(unavailable(e)),
            }
        })
    }
}

/// The client shared by the calls and the watch.
type Shared = std::sync::Arc<std::sync::Mutex<Client>>;

fn current(client: &Shared) -> Client {
    client.lock().unwrap_or_else(|p| p.into_inner()).clone()
}

async fn connect(endpoints: Vec<String>, options: ConnectOptions) -> Result<Client, DcsError> {
    Client::connect(endpoints, Some(options))
        .await
        .map_err(|e| unavailable(format!("cannot connect to etcd: {e}")))
}

/// Follows every change under `prefix` with an etcd watch and announces each on `changed`,
/// naming the keys written (without the prefix, as callers name them); reconnects (announcing
/// once to everyone, as changes may have been missed) after the stream breaks. Runs until the
/// store (and its runtime) is dropped.
async fn watch_prefix(client: Shared, prefix: String, changed: std::sync::Arc<Watchers>) {
    loop {
        let mut watcher = current(&client).watch_client();
        if let Ok((_handle, mut stream)) = watcher
            .watch(
                prefix.clone(),
                Some(etcd_client::WatchOptions::new().with_prefix()),
            )
            .await
        {
            changed.notify(&[]);
            while let Ok(Some(event)) = stream.message().await {
                let keys: Vec<String> = event
                    .events()
                    .iter()
                    .filter_map(|e| e.kv())
                    .map(|kv| {
                        String::from_utf8_lossy(kv.key())
                            .trim_start_matches(prefix.as_str())
                            .to_string()
                    })
                    .collect();
                if keys.len() < event.events().len() {
                    // An event without its key: whom it concerns is unknown.
                    changed.notify(&[]);
                } else if !keys.is_empty() {
                    let keys: Vec<&str> = keys.iter().map(String::as_str).collect();
                    changed.notify(&keys);
                }
            }
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// An error of a request that never reached a member (its connection was refused), which is
/// safe to send again.
fn never_sent(message: &str) -> bool {
    message.contains("tcp connect error") || message.contains("Connection refused")
}

fn tls_options(config: &EtcdConfig) -> Result<Option<etcd_client::TlsOptions>, DcsError> {
    if config.ca_file.is_none() && config.client_cert.is_none() {
        return Ok(None);
    }
    let read = |p: &PathBuf| {
        std::fs::read(p).map_err(|e| unavailable(format!("cannot read {}: {e}", p.display())))
    };
    let mut tls = etcd_client::TlsOptions::new();
    if let Some(ca) = &config.ca_file {
        tls = tls.ca_certificate(etcd_client::Certificate::from_pem(read(ca)?));
    }
    if let Some((cert, key)) = &config.client_cert {
        tls = tls.identity(etcd_client::Identity::from_pem(read(cert)?, read(key)?));
    }
    Ok(Some(tls))
}

impl Dcs for EtcdDcs {
    fn get(&self, key: &str) -> Result<Option<Versioned>, DcsError> {
        let k = self.key(key);
        self.read(move |mut client| {
            let k = k.clone();
            async move {
                let r = client.get(k, None).await.map_err(unavailable)?;
                Ok(r.kvs().first().map(|kv| Versioned {
                    value: kv.value().to_vec(),
                    revision: u64::try_from(kv.mod_revision()).unwrap_or(0),
                }))
            }
        })
    }

    fn compare_and_set(&self, key: &str, expected: u64, value: Vec<u8>) -> Result<u64, DcsError> {
        let k = self.key(key);
        let name = key.to_string();
        self.run(move |mut client| {
            let (k, name, value) = (k.clone(), name.clone(), value.clone());
            async move {
                let expected_i = i64::try_from(expected).map_err(unavailable)?;
                let txn = Txn::new()
                    .when([Compare::mod_revision(
                        k.clone(),
                        CompareOp::Equal,
                        expected_i,
                    )])
                    .and_then([TxnOp::put(k.clone(), value, None)])
                    .or_else([TxnOp::get(k, None)]);
                let r = client.txn(txn).await.map_err(unavailable)?;
                let revision = r.header().map_or(0, |h| h.revision());
                if r.succeeded() {
                    return Ok(u64::try_from(revision).unwrap_or(0));
                }
                let found = r
                    .op_responses()
                    .into_iter()
                    .find_map(|op| match op {
                        TxnOpResponse::Get(g) => {
                            Some(g.kvs().first().map_or(0, |kv| kv.mod_revision()))
                        }
                        _ => None,
                    })
                    .unwrap_or(0);
                Err(DcsError::Conflict {
                    key: name,
                    expected,
                    found: u64::try_from(found).unwrap_or(0),
                })
            }
        })
    }

    fn acquire_lease(&self, key: &str, owner: &str, ttl: Duration) -> Result<bool, DcsError> {
        let seconds = i64::try_from(ttl.as_millis().div_ceil(1000))
            .unwrap_or(i64::MAX)
            .max(1);
        let mut observed = 0;
        if let Some((holder, id, revision)) = self.lease_entry(key)? {
            if holder != owner {
                // Held until etcd revokes it, which is when its TTL has run out.
                return Ok(false);
            }
            // Renewal: the keep-alive restarts the lease's full TTL.
            let renewed = self.run(move |mut client| async move {
                let (mut keeper, mut stream) =
                    client.lease_keep_alive(id).await.map_err(unavailable)?;
                keeper.keep_alive().await.map_err(unavailable)?;
                let answer = stream.message().await.map_err(unavailable)?;
                Ok(answer.is_some_and(|a| a.ttl() > 0))
            })?;
            if renewed {
                return Ok(true);
            }
            // Our lease ran out but its key is still there: replaced below, only if nobody
            // wrote it meanwhile.
            observed = revision;
        }
        let k = self.lease_key(key);
        let owner = owner.to_string();
        let (granted, won) = self.run(move |mut client| {
            let (k, owner) = (k.clone(), owner.clone());
            async move {
                let lease = client
                    .lease_grant(seconds, None)
                    .await
                    .map_err(unavailable)?;
                // Absent now (create revision 0), or still our expired entry seen above.
                let guard = if observed == 0 {
                    Compare::create_revision(k.clone(), CompareOp::Equal, 0)
                } else {
                    Compare::mod_revision(k.clone(), CompareOp::Equal, observed)
                };
                let txn = Txn::new().when([guard]).and_then([TxnOp::put(
                    k,
                    owner,
                    Some(PutOptions::new().with_lease(lease.id())),
                )]);
                let r = client.txn(txn).await.map_err(unavailable)?;
                Ok((lease.id(), r.succeeded()))
            }
        })?;
        if !won {
            self.revoke(granted)?;
        }
        Ok(won)
    }

    fn release_lease(&self, key: &str, owner: &str) -> Result<(), DcsError> {
        match self.lease_entry(key)? {
            Some((holder, id, _)) if holder == owner => self.revoke(id),
            _ => Ok(()),
        }
    }

    fn lease_holder(&self, key: &str) -> Result<Option<String>, DcsError> {
        Ok(self.lease_entry(key)?.map(|(holder, _, _)| holder))
    }

    fn put_expiring(&self, key: &str, value: Vec<u8>, ttl: Duration) -> Result<(), DcsError> {
        let seconds = i64::try_from(ttl.as_millis().div_ceil(1000))
            .unwrap_or(i64::MAX)
            .max(1);
        let k = self.key(key);
        let replaced = self.run(move |mut client| {
            let (k, value) = (k.clone(), value.clone());
            async move {
                let lease = client
                    .lease_grant(seconds, None)
                    .await
                    .map_err(unavailable)?;
                let r = client
                    .put(
                        k,
                        value,
                        Some(PutOptions::new().with_lease(lease.id()).with_prev_key()),
                    )
                    .await
                    .map_err(unavailable)?;
                Ok(r.prev_key().map_or(0, |kv| kv.lease()))
            }
        })?;
        // The previous heartbeat's lease holds nothing now: free it instead of letting it
        // linger until its TTL.
        if replaced != 0 {
            let _ = self.revoke(replaced);
        }
        Ok(())
    }

    fn list(&self, prefix: &str) -> Result<Vec<(String, Versioned)>, DcsError> {
        let base = self.prefix.clone();
        let wanted = self.key(prefix);
        self.read(move |mut client| {
            let (base, wanted) = (base.clone(), wanted.clone());
            async move {
                let r = client
                    .get(wanted, Some(GetOptions::new().with_prefix()))
                    .await
                    .map_err(unavailable)?;
                // Leases are kept as keys, beside their group's values (`groups/2/leases/…`),
                // not only at the top: skipped at any depth.
                let mut out: Vec<(String, Versioned)> = r
                    .kvs()
                    .iter()
                    .map(|kv| {
                        let key = String::from_utf8_lossy(kv.key());
                        (
                            key.trim_start_matches(base.as_str()).to_string(),
                            Versioned {
                                value: kv.value().to_vec(),
                                revision: u64::try_from(kv.mod_revision()).unwrap_or(0),
                            },
                        )
                    })
                    .filter(|(key, _)| !crate::is_lease_path(key))
                    .collect();
                out.sort_by(|a, b| a.0.cmp(&b.0));
                Ok(out)
            }
        })
    }

    fn changes(&self) -> tokio::sync::watch::Receiver<u64> {
        self.changed.subscribe()
    }

    fn changes_ignoring(&self, prefix: &str) -> tokio::sync::watch::Receiver<u64> {
        self.changed.subscribe_ignoring(prefix)
    }

    fn changes_under(&self, within: &str, ignoring: &[&str]) -> tokio::sync::watch::Receiver<u64> {
        self.changed.subscribe_under(within, ignoring)
    }
}

/// Dropping the store from async code (an agent that stops) must not block on its runtime's
/// shutdown: the runtime is shut down in the background.
impl Drop for EtcdDcs {
    fn drop(&mut self) {
        if let Some(runtime) = self.runtime.take() {
            runtime.shutdown_background();
        }
    }
}

/// Every key of the cluster, for tests and `herd status` (sorted).
impl EtcdDcs {
    /// The names of the keys stored for this cluster (without the prefix).
    pub fn keys(&self) -> Result<Vec<String>, DcsError> {
        let prefix = self.prefix.clone();
        self.read(move |mut client| {
            let prefix = prefix.clone();
            async move {
                let r = client
                    .get(
                        prefix.clone(),
                        Some(GetOptions::new().with_prefix().with_keys_only()),
                    )
                    .await
                    .map_err(unavailable)?;
                let mut keys: Vec<String> = r
                    .kvs()
                    .iter()
                    .map(|kv| {
                        String::from_utf8_lossy(kv.key())
                            .trim_start_matches(prefix.as_str())
                            .to_string()
                    })
                    .collect();
                keys.sort();
                Ok(keys)
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn store_urls() {
        let c = EtcdConfig::from_url("etcd://10.0.0.1:2379,10.0.0.2:2379", "main").expect("url");
        assert_eq!(
            c.endpoints,
            vec!["http://10.0.0.1:2379", "http://10.0.0.2:2379"]
        );
        assert_eq!(c.cluster, "main");
        let tls = EtcdConfig::from_url("etcds://h1:2379/", "a").expect("tls");
        assert_eq!(tls.endpoints, vec!["https://h1:2379"]);
        for bad in ["http://h:1", "etcd://", "etcd://host", "h1:2379"] {
            assert!(EtcdConfig::from_url(bad, "a").is_err(), "{bad}");
        }
        assert!(EtcdConfig::from_url("etcd://h:1", "a/b").is_err());
    }
}
