//! `herd secrets rotate` (issue #42 part 4): replaces the cluster's passwords — the
//! superuser's (which is also the proxy's own login and the key of the agents' API) and the
//! replication role's — on every shard group of a running `herd up` cluster, without
//! stopping it or dropping its clients.
//!
//! Order, so that nothing breaks midway:
//! 1. the next passwords are written to `secrets/*.next` (0600) — a run cut after this point
//!    is finished by running the command again, with the same passwords (`Rotation`);
//! 2. on each group's primary (group 0 first: the endpoint checks logins against group 0's
//!    verifier), in one transaction, both roles get their new SCRAM-SHA-256 verifier — the
//!    same verifier, salt included, on every group, as the endpoint logs in to each group
//!    with the key one verifier gave it; the standbys receive it by replication. Connections
//!    already authenticated (clients' pooled server connections, streaming replication, the
//!    agents' and the proxy's kept connections) are not affected;
//! 3. the postgres_fdw user mappings Herd made for its global tables (`herd_group_N`, on group
//!    0's databases) get the new superuser password;
//! 4. the files are replaced (each atomically: written aside, renamed over, 0600): the
//!    replicas' walreceivers read the passfile at their next connection, the agents read the
//!    passwords every round, the endpoint within a second (`follow_rotations`);
//! 5. the command logs in through the endpoint with the new password, which also hands the
//!    endpoint's pools the new key at once.
//!
//! Multi-host clusters (`--dcs`): `secrets_hosts`, which shares this module's steps on the
//! servers ([`login_primary`], [`change_group`], [`update_mappings`]).

use std::time::{Duration, Instant};

use anyhow::{bail, Context as _};
use clap::Subcommand;
use herd_cluster::{
    read_supervisor, supervisor_running, Cluster, Layout, Rotation, REPLICATION_USER, SUPERUSER,
};
use tokio::sync::watch;
use tokio_postgres::Client;

use crate::cli::DataDirArg;

/// `herd secrets …`.
#[derive(Debug, Subcommand)]
pub enum SecretsCommand {
    /// Replace the superuser's and the replication role's passwords on every node of every
    /// shard group of the running cluster (clients stay connected; new logins need the new
    /// password, in DATA/secrets/superuser.password). Run it again to finish one cut short.
    Rotate {
        #[command(flatten)]
        dir: DataDirArg,
        /// A multi-host cluster (--dcs, --cluster): DATA/secrets is a copy of the cluster's
        /// secrets; the next passwords reach every agent and proxy through the store before
        /// any server changes.
        #[command(flatten)]
        store: crate::hosts::StoreArgs,
        /// With --dcs: how long to wait for every agent and proxy to take up the next
        /// passwords (and, after the change, to start using them).
        #[arg(long, default_value = "30", value_name = "SECONDS")]
        wait: u64,
    },
}

/// How long one group's change may take (its commit waits for its synchronous standbys).
const CHANGE_WITHIN: Duration = Duration::from_secs(60);

/// How long the endpoint is given to accept the new password.
const CONFIRM_WITHIN: Duration = Duration::from_secs(20);

/// Runs a `herd secrets` command.
pub async fn run(command: SecretsCommand) -> anyhow::Result<()> {
    match command {
        SecretsCommand::Rotate { dir, store, wait } if store.given() => {
            crate::secrets_hosts::rotate(&dir.layout()?, &store, Duration::from_secs(wait)).await
        }
        SecretsCommand::Rotate { dir, .. } => rotate(&dir.layout()?).await,
    }
}

async fn rotate(layout: &Layout) -> anyhow::Result<()> {
    let groups = crate::status::open_all(layout)?;
    if !supervisor_running(layout) {
        bail!(
            "the cluster in {} is not running: start it with `herd up` first (the passwords \
             are changed on its running servers)",
            layout.root().display()
        );
    }
    if read_supervisor(layout).is_none() {
        bail!(
            "the cluster in {} is still starting; run this again once `herd up` is ready",
            layout.root().display()
        );
    }
    refuse_during_copies(layout)?;
    // Found before anything changes: the password files are handed to the servers' OS user.
    let pg = herd_pg::Pg::new(
        herd_pg::PgBinaries::locate(groups[0].config.postgres.bindir.as_deref())?,
        herd_pg::OsUser::for_servers(&groups[0].config.postgres.os_user)?,
    );
    let rotation = Rotation::begin(layout).context("preparing the next passwords")?;
    if rotation.resumed {
        eprintln!("Finishing the rotation that was cut short (secrets/*.next)…");
    }
    // The running endpoint reads the next password before any server changes: its own new
    // logins then try it when the current one is refused (see `follow_rotations`).
    tokio::time::sleep(FOLLOW_EVERY * 2).await;
    let superuser = herd_pg::scram_verifier(&rotation.next.superuser);
    let replication = herd_pg::scram_verifier(&rotation.next.replication);
    let mut primaries = Vec::new();
    for cluster in &groups {
        primaries.push(primary(cluster, &rotation).await?);
    }
    for (cluster, (node, client)) in groups.iter().zip(&primaries) {
        change_group(cluster.group(), node, client, (&superuser, &replication)).await?;
    }
    let (_, group0) = &primaries[0];
    let base = herd_pg::ConnSpec {
        password: rotation.next.superuser.clone(),
        ..groups[0].conn_spec(&groups[0].state.primary)
    };
    let mappings = update_mappings(group0, &base).await?;
    rotation
        .finish(layout, REPLICATION_USER)
        .context("replacing the password files")?;
    // The walreceivers (the servers' OS user) read the passfile.
    pg.hand_over(&layout.secrets())?;
    confirm(&groups[0], &rotation.next.superuser).await?;
    println!(
        "Rotated the passwords of {SUPERUSER} and {REPLICATION_USER} on {} shard group(s){}; \
         the new ones are in {}. Connected clients stay connected; new logins need the new \
         password (`herd url` prints it).",
        groups.len(),
        if mappings > 0 {
            format!(" and {mappings} global-table user mapping(s)")
        } else {
            String::new()
        },
        layout.secrets().display()
    );
    Ok(())
}

/// Refuses while a copy's definition holds the cluster's superuser password (a shard move
/// under way keeps its target — a group's primary — as a URL with it, in `copies/`): the copy
/// would lose its target halfway. A move takes minutes; rotate once it has finished.
fn refuse_during_copies(layout: &Layout) -> anyhow::Result<()> {
    let current = herd_cluster::Secrets::load(layout).context("the cluster's passwords")?;
    let copies = herd_copy::Store::new(layout.copies())
        .list()
        .context("reading the copies' definitions")?;
    if let Some(copy) = copies
        .iter()
        .find(|c| holds_password(&c.target, &current.superuser))
    {
        bail!(
            "copy {} (a shard move under way?) reaches its target with the superuser's password; \
             run `herd secrets rotate` once it has finished (`herd copy list`)",
            copy.name
        );
    }
    Ok(())
}

/// Whether a libpq URL or key=value string holds `password` (Herd's passwords are
/// alphanumeric: it appears as is).
fn holds_password(target: &str, password: &str) -> bool {
    !password.is_empty() && target.contains(password)
}

/// Group `cluster`'s primary, logged in with the current password or, on a server a run cut
/// short already changed, the next one.
async fn primary(cluster: &Cluster, rotation: &Rotation) -> anyhow::Result<(String, Client)> {
    let node = cluster.state.primary.clone();
    let client = login_primary(
        cluster.group(),
        &node.to_string(),
        &cluster.conn_spec(&node),
        &rotation.logins(),
    )
    .await?;
    Ok((node.to_string(), client))
}

/// Logs in to `node`, group `group`'s primary, with the first of `passwords` it accepts (the
/// current one, then the next one: a server a run cut short already changed), and checks it
/// is the primary. Shared by one host and hosts.
pub(crate) async fn login_primary(
    group: u32,
    node: &str,
    base: &herd_pg::ConnSpec,
    passwords: &[&str],
) -> anyhow::Result<Client> {
    let mut failures = Vec::new();
    for password in passwords {
        let spec = herd_pg::ConnSpec {
            password: password.to_string(),
            ..base.clone()
        };
        match herd_pg::connect(&spec).await {
            Ok(client) => {
                let standby: bool = client
                    .query_one("select pg_is_in_recovery()", &[])
                    .await
                    .with_context(|| format!("asking {node} whether it is the primary"))?
                    .get(0);
                if standby {
                    bail!(
                        "shard group {group}: {node}, its recorded primary, is a standby now (a \
                         failover under way?); run `herd secrets rotate` again in a moment — \
                         it goes on with the same passwords"
                    );
                }
                return Ok(client);
            }
            Err(e) => failures.push(e.to_string()),
        }
    }
    bail!(
        "shard group {group}: cannot log in to its primary {node} with the current or the next \
         password: {}",
        failures.join("; ")
    )
}

/// Changes both roles' passwords on group `group`'s primary `node` to the next ones (their
/// SCRAM verifiers, computed once by the caller so every group gets the same), bounded by
/// [`CHANGE_WITHIN`]. Shared by one host and hosts.
pub(crate) async fn change_group(
    group: u32,
    node: &str,
    client: &Client,
    (superuser, replication): (&str, &str),
) -> anyhow::Result<()> {
    let change = set_passwords(client, superuser, replication);
    tokio::time::timeout(CHANGE_WITHIN, change)
        .await
        .map_err(|_| {
            anyhow::anyhow!(
                "shard group {group}: the change on {node} was not committed within {} s (its \
                 commit waits for a synchronous standby that does not answer? see `herd \
                 status`); run `herd secrets rotate` again once it does — it goes on with the \
                 same passwords",
                CHANGE_WITHIN.as_secs()
            )
        })?
        .with_context(|| format!("shard group {group}"))?;
    eprintln!("shard group {group}: passwords changed");
    Ok(())
}

/// Both roles' verifiers, in one transaction (both change or neither).
async fn set_passwords(client: &Client, superuser: &str, replication: &str) -> anyhow::Result<()> {
    client
        .batch_execute(&format!(
            "BEGIN; ALTER ROLE {} PASSWORD {}; ALTER ROLE {} PASSWORD {}; COMMIT;",
            ident(SUPERUSER),
            literal(superuser),
            ident(REPLICATION_USER),
            literal(replication),
        ))
        .await
        .context("changing the roles' passwords")
}

/// The user mappings Herd's global tables log in to the groups with (group 0's databases,
/// servers `herd_group_N`), given the new superuser password (`base`'s: group 0's primary,
/// logged in to with the new password); how many. Shared by one host and hosts.
pub(crate) async fn update_mappings(
    client: &Client,
    base: &herd_pg::ConnSpec,
) -> anyhow::Result<u64> {
    let databases: Vec<String> = client
        .query(
            "select datname from pg_database where datallowconn and not datistemplate",
            &[],
        )
        .await
        .context("listing group 0's databases")?
        .iter()
        .map(|r| r.get(0))
        .collect();
    let mut count = 0;
    for db in databases {
        let spec = herd_pg::ConnSpec {
            dbname: db.clone(),
            ..base.clone()
        };
        let conn = herd_pg::connect(&spec)
            .await
            .with_context(|| format!("connecting to database {db} of group 0"))?;
        let servers: Vec<String> = conn
            .query(
                "select srvname from pg_user_mappings where usename = $1 \
                 and srvname like 'herd\\_group\\_%' \
                 and exists (select 1 from unnest(umoptions) o where o like 'password=%')",
                &[&SUPERUSER],
            )
            .await
            .with_context(|| format!("listing the user mappings of database {db}"))?
            .iter()
            .map(|r| r.get(0))
            .collect();
        for server in servers {
            conn.batch_execute(&format!(
                "ALTER USER MAPPING FOR {} SERVER {} OPTIONS (SET password {})",
                ident(SUPERUSER),
                ident(&server),
                literal(&base.password),
            ))
            .await
            .with_context(|| format!("the user mapping of server {server} in database {db}"))?;
            count += 1;
        }
    }
    Ok(count)
}

/// Logs in through the endpoint with the new password (retried: the endpoint may hold the
/// old verifier for a moment and forgets it after a failed login). The login also gives the
/// endpoint's pools the new key for the superuser's new server connections.
async fn confirm(cluster: &Cluster, password: &str) -> anyhow::Result<()> {
    if !cluster.config.proxy.tls_cert_file.is_empty() {
        eprintln!("(the endpoint speaks TLS: log in through it with the new password to check)");
        return Ok(());
    }
    let spec = herd_pg::ConnSpec {
        password: password.to_string(),
        port: cluster.config.network.port,
        timeout: Duration::from_secs(5),
        ..cluster.conn_spec(&cluster.state.primary)
    };
    let began = Instant::now();
    loop {
        match herd_pg::connect(&spec).await {
            Ok(_) => return Ok(()),
            Err(e) if began.elapsed() > CONFIRM_WITHIN => {
                bail!(
                    "the servers have the new passwords, but the endpoint did not accept the \
                     new one within {} s: {e}",
                    CONFIRM_WITHIN.as_secs()
                )
            }
            Err(_) => tokio::time::sleep(Duration::from_millis(200)).await,
        }
    }
}

/// `s` as an SQL identifier.
fn ident(s: &str) -> String {
    format!("\"{}\"", s.replace('"', "\"\""))
}

/// `s` as an SQL string literal (standard_conforming_strings is on: only quotes double).
fn literal(s: &str) -> String {
    format!("'{}'", s.replace('\'', "''"))
}

/// How often the running cluster looks for rotated passwords.
const FOLLOW_EVERY: Duration = Duration::from_millis(250);

/// Hands the endpoint the superuser's password whenever `secrets/` holds a new one (`herd
/// secrets rotate` in another process, or a rotated directory copied here), and the next one
/// while a rotation is under way (`superuser.password.next`: its own logins try it when the
/// current one is refused, as the servers change before the files are replaced), until
/// shutdown.
pub fn follow_rotations(
    layout: Layout,
    ctx: std::sync::Arc<herd_proxy::ProxyContext>,
    mut shutdown: watch::Receiver<bool>,
) {
    let next_file = layout.secrets().join("superuser.password.next");
    tokio::spawn(async move {
        let mut seen = herd_cluster::Secrets::load(&layout)
            .ok()
            .map(|s| s.superuser);
        loop {
            tokio::select! {
                _ = tokio::time::sleep(FOLLOW_EVERY) => {}
                _ = shutdown.changed() => return,
            }
            if *shutdown.borrow() {
                return;
            }
            let next = std::fs::read_to_string(&next_file)
                .ok()
                .map(|s| s.trim().to_string())
                .filter(|s| !s.is_empty());
            ctx.next_admin_password(next.as_deref());
            if let Ok(secrets) = herd_cluster::Secrets::load(&layout) {
                if seen.as_deref() != Some(secrets.superuser.as_str()) {
                    ctx.rotate_admin_password(&secrets.superuser);
                    seen = Some(secrets.superuser);
                }
            }
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_copy_holding_the_password_is_found() {
        let pw = "Abc123";
        for (target, holds) in [
            ("postgresql://postgres:Abc123@127.0.0.1:5432/shop", true),
            (
                "host=127.0.0.1 user=postgres password=Abc123 dbname=shop",
                true,
            ),
            ("postgresql://app:other@10.0.0.1/shop", false),
            ("host=10.0.0.1 user=app", false),
        ] {
            assert_eq!(holds_password(target, pw), holds, "{target}");
        }
        assert!(!holds_password("anything", ""));
    }

    #[test]
    fn quoting() {
        for (raw, as_ident, as_literal) in [
            ("postgres", "\"postgres\"", "'postgres'"),
            ("herd_group_1", "\"herd_group_1\"", "'herd_group_1'"),
            ("a\"b'c", "\"a\"\"b'c\"", "'a\"b''c'"),
            (
                "SCRAM-SHA-256$4096:c2FsdA==$a/b+c=:d/e+f=",
                "\"SCRAM-SHA-256$4096:c2FsdA==$a/b+c=:d/e+f=\"",
                "'SCRAM-SHA-256$4096:c2FsdA==$a/b+c=:d/e+f='",
            ),
        ] {
            assert_eq!(ident(raw), as_ident);
            assert_eq!(literal(raw), as_literal);
        }
    }
}
