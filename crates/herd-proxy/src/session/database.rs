//! `CREATE`, `ALTER` and `DROP DATABASE` through the endpoint of a cluster with several shard
//! groups: every group must hold the same databases with the same settings (a session's
//! statements may run on any group, and distributing a table there needs every group), so all
//! three reach every group's primary, as the client's role. ALTER runs in the two-phase commit
//! of DDL. Neither can run inside a transaction, so they run group
//! after group: a CREATE that fails on one group is dropped again where it ran; a DROP is
//! checked on every group first (the database exists there, the role may drop it, nobody else
//! is connected, unless `WITH (FORCE)`), then dropped group after group. The residual window:
//! a session that connects between the check and the drop makes the drop fail on its group,
//! after the groups before it dropped theirs; `DROP DATABASE` again finishes it (groups
//! without the database are skipped).

use herd_sql::DatabaseStmt;

use super::shard::lone_query;
use super::Session;
use crate::pool::Lease;
use crate::roles::literal;
use crate::ProxyError;

/// What a group says about a database it is asked to drop.
struct DropCheck {
    exists: bool,
    may_drop: bool,
    others: i64,
}

impl Session {
    /// Runs the CREATE or DROP DATABASE of `unit` on every group (see the module
    /// documentation) and answers it.
    pub(super) async fn run_database_statement(
        &mut self,
        unit: &[u8],
        stmt: DatabaseStmt,
    ) -> Result<(), ProxyError> {
        let Some(sql) = lone_query(unit)? else {
            return Ok(());
        };
        let (tag, outcome) = match &stmt {
            DatabaseStmt::Create { name } => {
                ("CREATE DATABASE", self.create_database(&sql, name).await)
            }
            DatabaseStmt::Drop { name, force, .. } => {
                let outcome = self.drop_database(&sql, name, *force).await;
                self.ctx.forget_map(name);
                ("DROP DATABASE", outcome)
            }
            DatabaseStmt::Alter { name, new_name } => {
                // Settings (time zone, search_path …) and names must be the same on every
                // group, or each would answer its statements differently: all or none, in
                // the two-phase commit of DDL (SET TABLESPACE, which cannot run in a
                // transaction, fails there as it would in one).
                let outcome = self.ddl_two_phase(&sql).await;
                self.ctx.forget_map(name);
                if let Some(new_name) = new_name {
                    self.ctx.forget_map(new_name);
                }
                ("ALTER DATABASE", outcome)
            }
        };
        self.ddl_done(unit, tag, outcome).await
    }

    async fn create_database(&mut self, sql: &str, name: &str) -> Result<(), ProxyError> {
        let mut leases = self.primary_leases().await?;
        let mut failure = None;
        for (g, lease) in leases.iter_mut().enumerate() {
            if let Err(e) = lease.conn.internal_query(sql).await {
                failure = Some((g, e));
                break;
            }
        }
        let outcome = match failure {
            None => {
                // A database of this name dropped earlier may have left a map behind.
                self.ctx.forget_map(name);
                Ok(())
            }
            Some((g, e)) => {
                let left = take_back(&mut leases[..g], name).await;
                let what_else = if left.is_empty() {
                    "it was created on no group".to_string()
                } else {
                    format!(
                        "it could not be dropped again on group(s) {}: DROP DATABASE {name} \
                         through the endpoint",
                        left.join(", ")
                    )
                };
                Err(on_group(e, g, &what_else))
            }
        };
        release(leases);
        outcome
    }

    async fn drop_database(
        &mut self,
        sql: &str,
        name: &str,
        force: bool,
    ) -> Result<(), ProxyError> {
        // The proxy's own idle connections to it would count as other sessions.
        self.ctx.pools.clear_idle_of_database(name);
        let mut leases = self.primary_leases().await?;
        let outcome = drop_checked(&mut leases, sql, name, force).await;
        release(leases);
        outcome
    }
}

/// Drops database `name` again on the groups of `leases` (those where a CREATE ran, so no
/// group keeps a database the others lack); the groups where that failed.
async fn take_back(leases: &mut [Lease], name: &str) -> Vec<String> {
    let undo = format!("DROP DATABASE IF EXISTS {}", crate::roles::ident(name));
    let mut left = Vec::new();
    for (g, lease) in leases.iter_mut().enumerate() {
        if let Err(e) = lease.conn.internal_query(&undo).await {
            tracing::warn!(group = g, error = %e, database = name,
                "dropping a database created on some shard groups only failed");
            left.push(g.to_string());
        }
    }
    left
}

/// Checks every group, then drops the database on each that has it.
async fn drop_checked(
    leases: &mut [Lease],
    sql: &str,
    name: &str,
    force: bool,
) -> Result<(), ProxyError> {
    let mut holders = Vec::new();
    for (g, lease) in leases.iter_mut().enumerate() {
        let check = check_drop(lease, name).await?;
        if !check.exists {
            continue;
        }
        if !check.may_drop {
            return Err(ProxyError::Server {
                code: "42501".into(),
                message: format!(
                    "must be owner of database {name} (on shard group {g}; it was dropped on no group)"
                ),
            });
        }
        if check.others > 0 && !force {
            return Err(ProxyError::Server {
                code: "55006".into(),
                message: format!(
                    "database \"{name}\" is being accessed by {} other session(s) on shard group \
                     {g}; it was dropped on no group: close them, or DROP DATABASE … WITH (FORCE)",
                    check.others
                ),
            });
        }
        holders.push(g);
    }
    if holders.is_empty() {
        // Nowhere: PostgreSQL's own answer (an error, or IF EXISTS's notice).
        holders.push(0);
    }
    let total = holders.len();
    for (done, g) in holders.into_iter().enumerate() {
        if let Err(e) = leases[g].conn.internal_query(sql).await {
            let left = if done == 0 {
                "it was dropped on no group".to_string()
            } else {
                format!(
                    "it was dropped on {done} of the {total} groups that had it: DROP DATABASE \
                     again to finish"
                )
            };
            return Err(on_group(e, g, &left));
        }
    }
    Ok(())
}

async fn check_drop(lease: &mut Lease, name: &str) -> Result<DropCheck, ProxyError> {
    let lit = literal(name);
    let rows = lease
        .conn
        .internal_query(&format!(
            "SELECT EXISTS (SELECT 1 FROM pg_database WHERE datname = {lit}), \
                    coalesce((SELECT pg_has_role(current_user, datdba, 'MEMBER') FROM pg_database \
                              WHERE datname = {lit}), false) \
                    OR (SELECT rolsuper FROM pg_roles WHERE rolname = current_user), \
                    (SELECT count(*) FROM pg_stat_activity WHERE datname = {lit} \
                       AND pid <> pg_backend_pid())"
        ))
        .await?;
    let row = rows.first();
    let cell = |i: usize| row.and_then(|r| r.get(i)).cloned().flatten();
    Ok(DropCheck {
        exists: cell(0).as_deref() == Some("t"),
        may_drop: cell(1).as_deref() == Some("t"),
        others: cell(2).and_then(|n| n.parse().ok()).unwrap_or(0),
    })
}

/// A server's error on group `g` (past group 0), with what became of the other groups.
fn on_group(e: ProxyError, g: usize, what_else: &str) -> ProxyError {
    match e {
        ProxyError::Server { code, message } if g > 0 => ProxyError::Server {
            code,
            message: format!("{message} (on shard group {g}; {what_else})"),
        },
        other => other,
    }
}

fn release(leases: Vec<Lease>) {
    for lease in leases {
        lease.release();
    }
}
