//! A shard group added while the cluster runs (`herd group add`). The supervisor starts the
//! group's servers and the proxy follows them ([`ProxyContext::add_group`]); sessions do not
//! use the group until [`ProxyContext::admit_group`] gave it what every group shares:
//!
//! 1. group 0's roles and databases;
//! 2. statements every group must run (reference-table writes, DDL) wait at the proxy; on
//!    group 0 of each database with distributed tables, a trigger on each reference table and
//!    an event trigger refuse the same statements (40001, retry) from transactions already
//!    open — creating them waits for the transactions writing those tables, so once they exist
//!    nothing the new group could miss is under way;
//! 3. per database, Herd's schema, the mapped tables, the reference tables' rows and the map
//!    (`new_group::prepare`), and the distributed tables' sequences re-spaced;
//! 4. the proxy counts the group (every map is read again) — with several proxies, the gate
//!    records it and waits until the others count it too ([`super::MapGate::groups_admitted`])
//!    — the roles are copied once more, the triggers go and the waiting statements run — on
//!    every group, the new one included.
//!
//! The new group holds no shard until `herd shards rebalance` or `herd shards move` gives it
//! some. A step that fails undoes the triggers and leaves the group out of the endpoint (its
//! servers run; `herd group add` again admits it, and so does the next `herd up`).

use std::time::Duration;

use tokio_postgres::Client;

use super::moves::with_short_locks;
use super::{failed, literal, new_group, quote_qualified, read_map, refused};
use crate::monitor::ADMIN_APPLICATION;
use crate::roles::ident;
use crate::{ProxyContext, ProxyError};

/// How long the triggers may take to get their locks (transactions writing reference tables
/// must end first) before the addition gives up.
const GUARD_LIMIT: Duration = Duration::from_secs(15);

/// Between counting the group and dropping the triggers: a statement planned just before the
/// count (inside an open transaction) reaches group 0 while the triggers still refuse it.
const SETTLE: Duration = Duration::from_millis(500);

/// The name of the triggers (a plain identifier: no quoting needed).
const GUARD: &str = "herd_adding_group";

/// What an admission did.
#[derive(Debug, Default)]
pub struct Admitted {
    /// Databases created on the new group.
    pub databases_created: Vec<String>,
    /// Databases whose distributed and reference tables the new group received.
    pub databases_prepared: Vec<String>,
    /// How long statements every group runs were held at the endpoint.
    pub held: std::time::Duration,
}

impl std::fmt::Display for Admitted {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let list = |v: &[String]| {
            if v.is_empty() {
                "none".to_string()
            } else {
                v.join(", ")
            }
        };
        write!(
            f,
            "databases created: {}; tables and map received for: {}; reference-table writes and \
             DDL waited {} ms",
            list(&self.databases_created),
            list(&self.databases_prepared),
            self.held.as_millis()
        )
    }
}

impl ProxyContext {
    /// Whether statements every group runs are held for a group being added.
    pub(crate) fn adding_group(&self) -> bool {
        self.shard_maps
            .adding_group
            .load(std::sync::atomic::Ordering::Acquire)
    }

    fn set_adding_group(&self, on: bool) {
        self.shard_maps
            .adding_group
            .store(on, std::sync::atomic::Ordering::Release);
        self.shard_maps.changed.send_modify(|v| *v += 1);
    }

    /// Makes group `group` (followed since [`ProxyContext::add_group`]) one the endpoint uses:
    /// the steps of this module's documentation. Groups are admitted in order.
    pub async fn admit_group(&self, group: u32) -> Result<Admitted, ProxyError> {
        if group < self.groups() {
            return Ok(Admitted::default());
        }
        if group != self.groups() || group >= self.known_groups() {
            return Err(refused(
                "55000",
                format!(
                    "shard group {group} cannot be admitted now: the endpoint serves {} groups",
                    self.groups()
                ),
            ));
        }
        // No map changes (moves, new distributed tables) and no other preparation meanwhile;
        // with several proxies (a `MapGate`), none other may be routing by the maps meanwhile.
        let _one_change = self.begin_groups_change().await?;
        let one_preparation = self.shard_maps.preparing.lock().await;
        self.sync_roles_upto("postgres", &[], group + 1).await?;
        let (databases, databases_created) = self.copy_databases(group).await?;
        let mut admitted = Admitted {
            databases_created,
            ..Admitted::default()
        };
        let hold_began = std::time::Instant::now();
        self.set_adding_group(true);
        let mut guarded = Vec::new();
        let mut prepared = self
            .prepare_databases(group, &databases, &mut guarded, &mut admitted)
            .await;
        // Released before the map is read again: a session that reloads it takes this lock
        // (`shards.rs`), possibly inside a transaction holding a lock on a guarded table, and
        // dropping the guards below waits for that table lock: holding both can deadlock (the
        // likely cause of one `herd group add` that timed out after 180 s under load). The new
        // group holds everything now; a session's own preparation finds nothing left to do.
        drop(one_preparation);
        if prepared.is_ok() {
            self.serve_admitted_groups(group + 1);
            // With other proxies (a gate): they serve the group too before the triggers go and
            // their hold ends, or none of them routes by a map until it does.
            if let Some(gate) = self.map_gate() {
                if let Err(why) = gate.groups_admitted(group + 1).await {
                    self.visible
                        .store(group, std::sync::atomic::Ordering::Release);
                    self.forget_maps();
                    prepared = Err(refused(
                        "55000",
                        format!(
                            "shard group {group} is ready but its admission could not be \
                             recorded for the other proxies ({why}); it is not served"
                        ),
                    ));
                }
            }
            if prepared.is_ok() {
                tokio::time::sleep(SETTLE).await;
            }
        }
        for (database, client) in &guarded {
            if let Err(e) = drop_guards(client).await {
                tracing::warn!(database, error = %e, "dropping the triggers of a group addition");
            }
        }
        self.set_adding_group(false);
        admitted.held = hold_began.elapsed();
        prepared?;
        if let Err(e) = self.sync_roles("postgres", &[]).await {
            tracing::warn!(error = %e, "copying roles to the new shard group");
        }
        tracing::warn!(group, %admitted, "a shard group was added to the endpoint");
        Ok(admitted)
    }

    /// Serves the groups up to `groups` (never fewer than now, never more than followed): a
    /// group admitted here, or, with several proxies, one another proxy admitted (it made the
    /// group hold what every group shares). The maps are read again with the new groups.
    pub fn serve_admitted_groups(&self, groups: u32) {
        let groups = groups.min(self.known_groups());
        let before = self
            .visible
            .fetch_max(groups, std::sync::atomic::Ordering::AcqRel);
        if before < groups {
            self.forget_maps();
        }
    }

    fn forget_maps(&self) {
        if let Ok(mut maps) = self.shard_maps.maps.lock() {
            maps.clear();
        }
    }

    /// Step 3 for every database with distributed tables: guards on group 0 (kept in
    /// `guarded` for the caller to drop), then the new group's tables, rows and map.
    async fn prepare_databases(
        &self,
        group: u32,
        databases: &[String],
        guarded: &mut Vec<(String, Client)>,
        admitted: &mut Admitted,
    ) -> Result<(), ProxyError> {
        for database in databases {
            let first = self
                .group_client(0, database, "to add a shard group")
                .await?;
            // Only databases with distributed tables exist on every group.
            if read_map(&first).await?.is_none_or(|m| m.tables.is_empty()) {
                continue;
            }
            let mut clients = vec![first];
            for g in 1..=group {
                clients.push(
                    self.group_client(g, database, "to add a shard group")
                        .await?,
                );
            }
            super::recover(self, &clients[..group as usize]).await?;
            let Some(map) = read_map(&clients[0]).await? else {
                continue;
            };
            if !map.moves.is_empty() {
                return Err(refused(
                    "55000",
                    format!(
                        "a shard move is under way in database {database}: let `herd shards move` \
                         finish (or cancel it) before adding a group"
                    ),
                ));
            }
            let guard = self
                .group_client(0, database, "to add a shard group")
                .await?;
            guard
                .batch_execute("SET session_replication_role = replica")
                .await
                .map_err(|e| failed("preparing the group addition's triggers", e))?;
            let references: Vec<String> = map
                .tables
                .iter()
                .filter(|(_, k)| **k == herd_shard::TableKind::Reference)
                .map(|(t, _)| t.clone())
                .collect();
            let all: Vec<String> = map.tables.keys().cloned().collect();
            let sql = guards_sql(group, &references, &all);
            let created = tokio::time::timeout(
                GUARD_LIMIT,
                with_short_locks(&guard, &sql, "holding writes for the new shard group"),
            )
            .await;
            guarded.push((database.clone(), guard));
            match created {
                Ok(r) => r?,
                Err(_) => {
                    return Err(refused(
                        "55P03",
                        format!(
                            "transactions kept writing reference tables or changing tables of \
                             database {database} for over {} s: retry `herd group add` when they \
                             have ended",
                            GUARD_LIMIT.as_secs()
                        ),
                    ))
                }
            }
            if !new_group::prepare(&clients, &map).await?.is_empty() {
                admitted.databases_prepared.push(database.clone());
            }
        }
        Ok(())
    }

    /// Group `g`'s databases that clients can connect to.
    async fn databases(&self, g: u32) -> Result<Vec<String>, ProxyError> {
        let client = self
            .group_client(g, "postgres", "to list its databases")
            .await?;
        let rows = client
            .query(
                "SELECT datname FROM pg_database WHERE datallowconn AND NOT datistemplate \
                 ORDER BY datname",
                &[],
            )
            .await
            .map_err(|e| failed("listing the databases", e))?;
        Ok(rows.iter().map(|r| r.get(0)).collect())
    }

    /// Creates on group `group` every database of group 0 it lacks (same owner, encoding and
    /// locale, ICU's included); group 0's databases, and those created.
    async fn copy_databases(&self, group: u32) -> Result<(Vec<String>, Vec<String>), ProxyError> {
        let source = self
            .group_client(0, "postgres", "to read its databases")
            .await?;
        let target = self
            .group_client(group, "postgres", "to create its databases")
            .await?;
        let have = self.databases(group).await?;
        let rows = source
            .query(
                "SELECT datname, pg_get_userbyid(datdba)::text, pg_encoding_to_char(encoding)::text, \
                 datcollate::text, datctype::text, datlocprovider::text, \
                 coalesce(to_jsonb(d)->>'daticulocale', to_jsonb(d)->>'datlocale', '') \
                 FROM pg_database d WHERE datallowconn AND NOT datistemplate ORDER BY datname",
                &[],
            )
            .await
            .map_err(|e| failed("reading the databases", e))?;
        let mut created = Vec::new();
        let all: Vec<String> = rows.iter().map(|r| r.get(0)).collect();
        for r in rows {
            let name: String = r.get(0);
            if have.contains(&name) {
                continue;
            }
            let (owner, encoding, collate, ctype): (String, String, String, String) =
                (r.get(1), r.get(2), r.get(3), r.get(4));
            let (provider, icu_locale): (String, String) = (r.get(5), r.get(6));
            // An ICU default collation too: text compares and sorts the same on every group.
            let icu = if provider == "i" {
                format!(" LOCALE_PROVIDER icu ICU_LOCALE {}", literal(&icu_locale))
            } else {
                String::new()
            };
            let sql = format!(
                "CREATE DATABASE {} OWNER {} TEMPLATE template0 ENCODING {} LC_COLLATE {} LC_CTYPE {}{icu}",
                ident(&name),
                ident(&owner),
                literal(&encoding),
                literal(&collate),
                literal(&ctype)
            );
            target
                .batch_execute(&sql)
                .await
                .map_err(|e| failed(&format!("creating database {name} on the new group"), e))?;
            created.push(name);
        }
        Ok((all, created))
    }
}

/// On group 0: the function the triggers call, a statement trigger refusing writes on each
/// reference table, a lock on every mapped table (waits for DDL under way), and, last (it
/// would refuse the statements before it), an event trigger refusing DDL.
fn guards_sql(group: u32, references: &[String], all: &[String]) -> String {
    let mut sql = format!(
        "CREATE SCHEMA IF NOT EXISTS herd; \
         CREATE OR REPLACE FUNCTION herd.group_adding() RETURNS trigger LANGUAGE plpgsql AS $f$ \
         BEGIN RAISE EXCEPTION 'shard group {group} is being added to the cluster: retry the transaction' \
         USING ERRCODE = '40001'; END $f$; \
         CREATE OR REPLACE FUNCTION herd.group_adding_ddl() RETURNS event_trigger LANGUAGE plpgsql AS $f$ \
         BEGIN IF current_setting('application_name') <> '{ADMIN_APPLICATION}' THEN \
         RAISE EXCEPTION 'shard group {group} is being added to the cluster: retry the transaction' \
         USING ERRCODE = '40001'; END IF; END $f$; "
    );
    for table in references {
        let t = quote_qualified(table);
        sql.push_str(&format!(
            "DROP TRIGGER IF EXISTS {GUARD} ON {t}; \
             CREATE TRIGGER {GUARD} BEFORE INSERT OR UPDATE OR DELETE OR TRUNCATE ON {t} \
             FOR EACH STATEMENT EXECUTE FUNCTION herd.group_adding(); "
        ));
    }
    if !all.is_empty() {
        let tables: Vec<String> = all.iter().map(|t| quote_qualified(t)).collect();
        sql.push_str(&format!(
            "LOCK TABLE {} IN ACCESS SHARE MODE; ",
            tables.join(", ")
        ));
    }
    sql.push_str(&format!(
        "DROP EVENT TRIGGER IF EXISTS {GUARD}; \
         CREATE EVENT TRIGGER {GUARD} ON ddl_command_start EXECUTE FUNCTION herd.group_adding_ddl();"
    ));
    sql
}

/// Drops a group addition's triggers on group 0 (those present; the event trigger first, as
/// dropping a trigger is DDL it would refuse).
pub(super) async fn drop_guards(client: &Client) -> Result<(), ProxyError> {
    client
        .batch_execute(&format!("DROP EVENT TRIGGER IF EXISTS {GUARD}"))
        .await
        .map_err(|e| failed("dropping the group addition's event trigger", e))?;
    let rows = client
        .query(
            "SELECT tgrelid::regclass::text FROM pg_trigger WHERE tgname = $1",
            &[&GUARD],
        )
        .await
        .map_err(|e| failed("finding the group addition's triggers", e))?;
    if rows.is_empty() {
        return Ok(());
    }
    let mut sql = String::new();
    for r in rows {
        let table: String = r.get(0);
        sql.push_str(&format!("DROP TRIGGER IF EXISTS {GUARD} ON {table}; "));
    }
    with_short_locks(client, &sql, "dropping the group addition's triggers").await
}

/// Whether group 0 still has triggers of a group addition that did not finish (its
/// supervisor stopped in the middle).
pub(super) async fn guards_left(client: &Client) -> bool {
    client
        .query_one(
            "SELECT EXISTS (SELECT 1 FROM pg_event_trigger WHERE evtname = $1) \
             OR EXISTS (SELECT 1 FROM pg_trigger WHERE tgname = $1)",
            &[&GUARD],
        )
        .await
        .map(|r| r.get(0))
        .unwrap_or(false)
}

#[cfg(test)]
mod tests {
    use super::guards_sql;

    #[test]
    fn guards_refuse_reference_writes_and_ddl_last() {
        let sql = guards_sql(
            2,
            &["public.countries".into()],
            &["public.countries".into(), "public.orders".into()],
        );
        let trigger = sql
            .find("CREATE TRIGGER herd_adding_group")
            .expect("trigger");
        let lock = sql
            .find("LOCK TABLE \"public\".\"countries\", \"public\".\"orders\"")
            .expect("lock");
        let event = sql.find("CREATE EVENT TRIGGER").expect("event trigger");
        // The event trigger would refuse the CREATE TRIGGER after it in the same transaction.
        assert!(trigger < lock && lock < event, "{sql}");
        assert!(sql.contains("ON \"public\".\"countries\""), "{sql}");
        assert!(!sql.contains("ON \"public\".\"orders\""), "{sql}");
        assert!(sql.contains("shard group 2 is being added"), "{sql}");
        // No reference tables: no trigger, the lock and event trigger still.
        let sql = guards_sql(1, &[], &["public.orders".into()]);
        assert!(!sql.contains("CREATE TRIGGER"));
        assert!(sql.contains("CREATE EVENT TRIGGER"));
    }
}
