//! SQL probes and administration of running servers.

use std::time::Duration;

use herd_core::{Lsn, SyncState};
use tokio_postgres::{Client, Statement};

use crate::PgError;

/// How to reach one server as an administrative user.
#[derive(Clone)]
pub struct ConnSpec {
    /// Host address.
    pub host: String,
    /// TCP port.
    pub port: u16,
    /// Role name.
    pub user: String,
    /// Password (never printed).
    pub password: String,
    /// Database.
    pub dbname: String,
    /// Bound on connecting and on each probe.
    pub timeout: Duration,
    /// TLS to the server (`None`: plain TCP); with it a server that declines TLS or whose
    /// certificate does not verify is an error, never a plain connection.
    pub tls: Option<crate::ClientTls>,
}

impl std::fmt::Debug for ConnSpec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{}@{}:{}/{}",
            self.user, self.host, self.port, self.dbname
        )?;
        match &self.tls {
            Some(tls) => write!(f, " over TLS ({:?})", tls.mode()),
            None => Ok(()),
        }
    }
}

/// Opens a connection; the connection task runs on the current runtime until the client drops.
pub async fn connect(spec: &ConnSpec) -> Result<Client, PgError> {
    connect_as(spec, "herd").await
}

/// How long data sent to a server may stay unacknowledged before the connection is dropped.
const DEAD_LINK_TIMEOUT: Duration = Duration::from_secs(10);

/// [`connect`] with the `application_name` the server shows in `pg_stat_activity`.
async fn connect_as(spec: &ConnSpec, application_name: &str) -> Result<Client, PgError> {
    let mut config = tokio_postgres::Config::new();
    config
        .host(&spec.host)
        .port(spec.port)
        .user(&spec.user)
        .password(&spec.password)
        .dbname(&spec.dbname)
        .application_name(application_name)
        .connect_timeout(spec.timeout)
        // A host cut off sends no reset: a statement sent just before the cut would wait out
        // TCP's retransmission back-off (minutes) without these.
        .keepalives(true)
        .keepalives_idle(Duration::from_secs(5))
        .keepalives_interval(Duration::from_secs(2))
        .keepalives_retries(3)
        .tcp_user_timeout(DEAD_LINK_TIMEOUT);
    let connecting = crate::connect_config(&mut config, spec.tls.as_ref());
    tokio::time::timeout(spec.timeout, connecting)
        .await
        .map_err(|_| PgError::Timeout(format!("connecting to {spec:?} timed out")))?
        .map_err(|source| PgError::Sql {
            context: format!("connecting to {spec:?}"),
            source,
        })
}

/// What a server said about itself.
#[derive(Clone, Debug, PartialEq)]
pub enum Probe {
    /// Not in recovery: accepts writes.
    Primary(PrimaryProbe),
    /// In recovery (hot standby).
    Replica(ReplicaProbe),
}

/// A primary's WAL position, sync settings and its walsenders.
#[derive(Clone, Debug, PartialEq)]
pub struct PrimaryProbe {
    /// `pg_current_wal_lsn()`.
    pub current_lsn: Lsn,
    /// `synchronous_standby_names` in effect.
    pub synchronous_standby_names: String,
    /// `synchronous_commit` in effect (server default).
    pub synchronous_commit: String,
    /// One row per walsender (`pg_stat_replication`).
    pub replication: Vec<ReplicationRow>,
}

/// One row of `pg_stat_replication` (serialized: a primary's agent publishes its rows in its
/// member record, for the status built from the store).
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct ReplicationRow {
    /// The standby's `application_name` (Herd's node name).
    pub application_name: String,
    /// `startup`, `catchup`, `streaming`, …
    pub state: String,
    /// Last position written by the standby.
    pub write_lsn: Option<Lsn>,
    /// Last position flushed by the standby.
    pub flush_lsn: Option<Lsn>,
    /// Last position replayed by the standby.
    pub replay_lsn: Option<Lsn>,
    /// `write_lag` in seconds (NULL once an idle standby has caught up).
    pub write_lag: Option<f64>,
    /// `flush_lag` in seconds.
    pub flush_lag: Option<f64>,
    /// `replay_lag` in seconds.
    pub replay_lag: Option<f64>,
    /// `sync_state`.
    pub sync_state: Option<SyncState>,
}

/// A standby's receive and replay positions.
#[derive(Clone, Debug, PartialEq)]
pub struct ReplicaProbe {
    /// `pg_last_wal_receive_lsn()`.
    pub received_lsn: Option<Lsn>,
    /// `pg_last_wal_replay_lsn()`.
    pub replayed_lsn: Option<Lsn>,
    /// `pg_stat_wal_receiver.status` (`streaming` when connected), `None` without a receiver.
    pub receiver_status: Option<String>,
}

/// Asks a server for its role, positions and replication state, over a connection of its own.
pub async fn probe(spec: &ConnSpec) -> Result<Probe, PgError> {
    Prober::new(spec.clone()).probe().await
}

/// The `application_name` of probe connections, as `pg_stat_activity` shows them.
pub const PROBE_APPLICATION: &str = "herd-probe";

/// Probes one server again and again over one connection, opened when needed.
///
/// A probe per supervisor round over a fresh connection cost a SCRAM login each time: 4,096
/// PBKDF2 iterations on Herd's side (several milliseconds of CPU) and a backend started on the
/// server's, several times a second per node. The connection is dropped whenever a probe fails
/// or times out, so a server that stops answering is seen exactly as before; one that was
/// restarted (its old connection closed) is reconnected to within the same probe.
///
/// The probe's statements are prepared once per connection: a query given as text is
/// prepared, run and closed each time (three round trips and a plan per query), which at two
/// rounds a second per node was most of what an idle cluster's supervisor did.
pub struct Prober {
    spec: ConnSpec,
    client: Option<Kept>,
}

/// A probe connection and its prepared statements.
struct Kept {
    client: Client,
    statements: ProbeStatements,
}

/// The statements of one probe, prepared on the connection that runs them.
struct ProbeStatements {
    in_recovery: Statement,
    replica: Statement,
    primary: Statement,
    replication: Statement,
    /// Read only when backups are on (see `archiver.rs`); prepared with the others, once per
    /// connection.
    archiver: Statement,
}

const IN_RECOVERY_SQL: &str = "select pg_is_in_recovery()";
const REPLICA_SQL: &str =
    "select pg_last_wal_receive_lsn()::text, pg_last_wal_replay_lsn()::text, \
     (select status from pg_stat_wal_receiver)";
const PRIMARY_SQL: &str = "select pg_current_wal_lsn()::text, \
     current_setting('synchronous_standby_names'), current_setting('synchronous_commit')";
const REPLICATION_SQL: &str =
    "select application_name, state, write_lsn::text, flush_lsn::text, replay_lsn::text, \
     extract(epoch from write_lag)::float8, extract(epoch from flush_lag)::float8, \
     extract(epoch from replay_lag)::float8, sync_state \
     from pg_stat_replication order by application_name";

impl Kept {
    /// Prepares the probe's statements on `client`.
    async fn prepare(client: Client, spec: &ConnSpec) -> Result<Kept, PgError> {
        let sql = |source| PgError::Sql {
            context: format!("preparing the probe of {spec:?}"),
            source,
        };
        let statements = ProbeStatements {
            in_recovery: client.prepare(IN_RECOVERY_SQL).await.map_err(sql)?,
            replica: client.prepare(REPLICA_SQL).await.map_err(sql)?,
            primary: client.prepare(PRIMARY_SQL).await.map_err(sql)?,
            replication: client.prepare(REPLICATION_SQL).await.map_err(sql)?,
            archiver: client
                .prepare(crate::archiver::ARCHIVER_SQL)
                .await
                .map_err(sql)?,
        };
        Ok(Kept { client, statements })
    }
}

impl Prober {
    /// A prober of the server `spec` names; it connects on its first probe.
    pub fn new(spec: ConnSpec) -> Self {
        Prober { spec, client: None }
    }

    /// Probes over the kept connection when it is open, else over a new one (kept on success).
    pub async fn probe(&mut self) -> Result<Probe, PgError> {
        if let Some(kept) = self.client.take().filter(|k| !k.client.is_closed()) {
            match tokio::time::timeout(self.spec.timeout, probe_client(&kept, &self.spec)).await {
                Ok(Ok(probe)) => {
                    self.client = Some(kept);
                    return Ok(probe);
                }
                // Closed under us (the server restarted, or killed this backend): the server
                // itself may be fine, so it gets a fresh connection below.
                Ok(Err(_)) if kept.client.is_closed() => {}
                Ok(Err(e)) => return Err(e),
                Err(_) => return Err(self.timed_out()),
            }
        }
        let client = connect_as(&self.spec, PROBE_APPLICATION).await?;
        let probe = tokio::time::timeout(self.spec.timeout, async {
            let kept = Kept::prepare(client, &self.spec).await?;
            let probe = probe_client(&kept, &self.spec).await?;
            Ok::<_, PgError>((kept, probe))
        })
        .await
        .map_err(|_| self.timed_out())??;
        self.client = Some(probe.0);
        Ok(probe.1)
    }

    /// The kept connection and its prepared archiver statement, when the last probe left one
    /// open.
    pub(crate) fn kept_archiver(&self) -> Option<(&Client, &Statement)> {
        self.client
            .as_ref()
            .filter(|k| !k.client.is_closed())
            .map(|k| (&k.client, &k.statements.archiver))
    }

    /// The probe's time bound.
    pub(crate) fn timeout(&self) -> std::time::Duration {
        self.spec.timeout
    }

    fn timed_out(&self) -> PgError {
        PgError::Timeout(format!("probing {:?} timed out", self.spec))
    }

    /// Drops the kept connection (its server's postmaster is gone: whatever still answers on
    /// it is an orphaned backend, not a server).
    pub fn disconnect(&mut self) {
        self.client = None;
    }

    /// Points the prober at `spec`; a kept connection is dropped when the server or the login
    /// changed (a node's port or password can change between rounds).
    pub fn retarget(&mut self, spec: ConnSpec) {
        let same = self.spec.host == spec.host
            && self.spec.port == spec.port
            && self.spec.user == spec.user
            && self.spec.password == spec.password
            && self.spec.dbname == spec.dbname
            && self.spec.tls.as_ref().map(|t| t.mode()) == spec.tls.as_ref().map(|t| t.mode());
        if !same {
            self.client = None;
        }
        self.spec = spec;
    }
}

async fn probe_client(kept: &Kept, spec: &ConnSpec) -> Result<Probe, PgError> {
    let sql = |source| PgError::Sql {
        context: format!("probing {spec:?}"),
        source,
    };
    let (client, statements) = (&kept.client, &kept.statements);
    let row = client
        .query_one(&statements.in_recovery, &[])
        .await
        .map_err(sql)?;
    let in_recovery: bool = row.get(0);
    if in_recovery {
        let row = client
            .query_one(&statements.replica, &[])
            .await
            .map_err(sql)?;
        return Ok(Probe::Replica(ReplicaProbe {
            received_lsn: lsn(row.get(0), spec)?,
            replayed_lsn: lsn(row.get(1), spec)?,
            receiver_status: row.get(2),
        }));
    }
    let row = client
        .query_one(&statements.primary, &[])
        .await
        .map_err(sql)?;
    let current_lsn = lsn(row.get(0), spec)?.unwrap_or_default();
    let rows = client
        .query(&statements.replication, &[])
        .await
        .map_err(sql)?;
    let mut replication = Vec::with_capacity(rows.len());
    for r in rows {
        replication.push(ReplicationRow {
            application_name: r.get::<_, Option<String>>(0).unwrap_or_default(),
            state: r.get::<_, Option<String>>(1).unwrap_or_default(),
            write_lsn: lsn(r.get(2), spec)?,
            flush_lsn: lsn(r.get(3), spec)?,
            replay_lsn: lsn(r.get(4), spec)?,
            write_lag: r.get(5),
            flush_lag: r.get(6),
            replay_lag: r.get(7),
            sync_state: r
                .get::<_, Option<String>>(8)
                .as_deref()
                .and_then(SyncState::from_pg),
        });
    }
    Ok(Probe::Primary(PrimaryProbe {
        current_lsn,
        synchronous_standby_names: row.get(1),
        synchronous_commit: row.get(2),
        replication,
    }))
}

fn lsn(text: Option<String>, spec: &ConnSpec) -> Result<Option<Lsn>, PgError> {
    text.map(|t| {
        t.parse()
            .map_err(|e: herd_core::ParseError| PgError::Protocol {
                context: format!("{spec:?}"),
                detail: e.to_string(),
            })
    })
    .transpose()
}

/// Creates or updates a login role with `password` stored as a SCRAM-SHA-256 verifier computed
/// here, so the plaintext never appears in SQL or server logs.
pub async fn ensure_role(
    client: &Client,
    name: &str,
    password: &str,
    replication: bool,
) -> Result<(), PgError> {
    let verifier = scram_verifier(password);
    ensure_role_verifier(client, name, &verifier, replication).await
}

/// The SCRAM-SHA-256 verifier of `password` with a fresh salt (what `pg_authid.rolpassword`
/// holds), for [`ensure_role_verifier`] on several servers that must accept one proof.
pub fn scram_verifier(password: &str) -> String {
    postgres_protocol::password::scram_sha_256(password.as_bytes())
}

/// [`ensure_role`] with the stored verifier given (the same salt on every server it is set on:
/// shard groups are separate PostgreSQL clusters, and Herd's proxy logs into every group with
/// the key a client proved).
pub async fn ensure_role_verifier(
    client: &Client,
    name: &str,
    verifier: &str,
    replication: bool,
) -> Result<(), PgError> {
    let ident = postgres_protocol::escape::escape_identifier(name);
    let literal = postgres_protocol::escape::escape_literal(verifier);
    let attrs = if replication {
        "LOGIN REPLICATION"
    } else {
        "LOGIN"
    };
    let exists = client
        .query_opt("select 1 from pg_roles where rolname = $1", &[&name])
        .await
        .map_err(|source| PgError::Sql {
            context: format!("looking up role {name}"),
            source,
        })?
        .is_some();
    let verb = if exists { "ALTER" } else { "CREATE" };
    client
        .batch_execute(&format!(
            "{verb} ROLE {ident} WITH {attrs} PASSWORD {literal}"
        ))
        .await
        .map_err(|source| PgError::Sql {
            context: format!("{verb} ROLE {name}"),
            source,
        })
}

/// Creates a physical replication slot unless it exists; `immediately_reserve` so WAL is kept
/// from now on, before the replica first connects.
pub async fn create_physical_slot(client: &Client, name: &str) -> Result<(), PgError> {
    client
        .execute(
            "select pg_create_physical_replication_slot($1, true) \
             where not exists (select 1 from pg_replication_slots where slot_name = $1)",
            &[&name],
        )
        .await
        .map(drop)
        .map_err(|source| PgError::Sql {
            context: format!("creating replication slot {name}"),
            source,
        })
}

/// Runs `CHECKPOINT` (after a promotion, so the new timeline is in pg_control).
pub async fn checkpoint(client: &Client) -> Result<(), PgError> {
    client
        .batch_execute("CHECKPOINT")
        .await
        .map_err(|source| PgError::Sql {
            context: "CHECKPOINT".into(),
            source,
        })
}

/// Gives role `name` on `to` the same stored password verifier it has on `from` (same salt
/// and keys), so one SCRAM proof is valid on both servers: shard groups are separate
/// PostgreSQL clusters, and Herd's proxy logs into every group with the key a client proved.
pub async fn copy_verifier(from: &Client, to: &Client, name: &str) -> Result<(), PgError> {
    let sql = |context: String| move |source| PgError::Sql { context, source };
    let row = from
        .query_one(
            "select rolpassword from pg_authid where rolname = $1",
            &[&name],
        )
        .await
        .map_err(sql(format!("reading the verifier of role {name}")))?;
    let verifier: Option<String> = row.get(0);
    let Some(verifier) = verifier else {
        return Ok(());
    };
    let ident = postgres_protocol::escape::escape_identifier(name);
    let literal = postgres_protocol::escape::escape_literal(&verifier);
    to.batch_execute(&format!("ALTER ROLE {ident} PASSWORD {literal}"))
        .await
        .map_err(sql(format!("copying the verifier of role {name}")))
}

/// One node's prober shared by every task that probes that node in one process (on `herd up`,
/// its agent and the HTTP API's status), so the node holds one monitoring session, not one per
/// task. Probes through it are serialised; each takes milliseconds.
pub type SharedProber = std::sync::Arc<tokio::sync::Mutex<Option<Prober>>>;

/// Probes through `shared` (created on first use, pointed at `spec` when the server or the
/// login changed: the time bound of whoever created it stays).
pub async fn probe_shared(shared: &SharedProber, spec: ConnSpec) -> Result<Probe, PgError> {
    let mut kept = shared.lock().await;
    let prober = match kept.as_mut() {
        Some(p) => {
            p.retarget(ConnSpec {
                timeout: p.spec.timeout,
                ..spec
            });
            p
        }
        None => kept.insert(Prober::new(spec)),
    };
    prober.probe().await
}
