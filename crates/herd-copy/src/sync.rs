//! Keeping every replica's copy of the copy slots in line with the primary's, once a round
//! (see [`crate::slots`] for the method and its proof). The supervisor restarts a replica on
//! request (it owns restarts), so a freshly copied slot file gets loaded.

use std::collections::HashMap;
use std::future::Future;
use std::path::PathBuf;
use std::pin::Pin;
use std::sync::Arc;
use std::time::{Duration, Instant};

use herd_core::Lsn;
use herd_pg::{ConnSpec, Pg};
use tokio_postgres::Client;

use crate::slots::{plan, SlotPos, SlotStep};
use crate::CopyError;

/// How many standbys `synchronous_standby_names` asks to confirm: k of `ANY k (…)`, `FIRST k
/// (…)` or `k (…)`, 1 for a plain list, 0 when empty.
fn required_standbys(names: &str) -> i64 {
    let names = names.trim();
    if names.is_empty() {
        return 0;
    }
    let words: Vec<&str> = names.split_whitespace().collect();
    let number = match words.first().map(|w| w.to_ascii_lowercase()) {
        Some(w) if w == "any" || w == "first" => words.get(1),
        _ => words.first(),
    };
    number
        .map(|n| {
            n.chars()
                .take_while(char::is_ascii_digit)
                .collect::<String>()
        })
        .and_then(|n| n.parse().ok())
        .unwrap_or(1)
}

/// Asks the supervisor to restart a replica (by node name); answers what happened.
pub type RestartFn = Arc<
    dyn Fn(String) -> Pin<Box<dyn Future<Output = Result<String, String>> + Send>> + Send + Sync,
>;

/// A replica as the slot sync needs it.
#[derive(Clone, Debug)]
pub struct ReplicaRef {
    /// Its node name.
    pub name: String,
    /// How to reach it as the superuser (any database; the sync picks the slot's).
    pub conn: ConnSpec,
    /// Its data directory.
    pub datadir: PathBuf,
}

/// No second restart of a replica for its slots within this long (a slot file it refused
/// must not turn into a restart loop).
const REINSTALL_PAUSE: Duration = Duration::from_secs(30);

/// The slot sync of one shard group, with its connections kept between rounds.
#[derive(Default)]
pub struct SlotSync {
    clients: HashMap<String, Client>,
    installed_at: HashMap<String, Instant>,
    /// Replicas whose slot install waits because restarting them would stall commits (each
    /// reported once).
    held_back: std::collections::HashSet<String>,
}

/// A logical slot with its database.
struct Slot {
    pos: SlotPos,
    database: String,
}

impl SlotSync {
    /// Whether the primary still acknowledges commits while `replica` restarts: commits wait
    /// for no standby (`synchronous_commit` off or local, as in async mode), none is asked
    /// for, or enough others stream to make the quorum.
    async fn restart_keeps_commits(
        &mut self,
        primary: &ConnSpec,
        replica: &str,
    ) -> Result<bool, CopyError> {
        let client = self.client(primary, "postgres").await?;
        let row = client
            .query_one(
                "select current_setting('synchronous_standby_names'), \
                 current_setting('synchronous_commit') in ('off', 'local'), \
                 (select count(*) from pg_stat_replication where application_name <> $1 \
                  and state = 'streaming' and sync_state in ('sync', 'quorum', 'potential'))",
                &[&replica],
            )
            .await
            .map_err(|e| CopyError::sql("reading the primary's synchronous standbys", &e))?;
        let (names, waits_for_none, others): (String, bool, i64) =
            (row.get(0), row.get(1), row.get(2));
        Ok(waits_for_none || others >= required_standbys(&names))
    }

    async fn client(&mut self, spec: &ConnSpec, database: &str) -> Result<&Client, CopyError> {
        let key = format!("{}:{}/{database}", spec.host, spec.port);
        if self.clients.get(&key).is_none_or(Client::is_closed) {
            let mut spec = spec.clone();
            spec.dbname = database.to_string();
            let client = herd_pg::connect(&spec).await?;
            self.clients.insert(key.clone(), client);
        }
        self.clients
            .get(&key)
            .ok_or_else(|| CopyError::Invalid("connection cache".into()))
    }

    fn forget(&mut self, spec: &ConnSpec) {
        let prefix = format!("{}:{}/", spec.host, spec.port);
        self.clients.retain(|k, _| !k.starts_with(&prefix));
    }

    /// One round: reads the primary's copy slots and brings each streaming replica's in line.
    /// Errors of one replica are logged and do not stop the others.
    pub async fn round(
        &mut self,
        pg: &Pg,
        primary: &ConnSpec,
        replicas: &[ReplicaRef],
        restart: &RestartFn,
    ) -> Result<(), CopyError> {
        let on_primary = match self.slots(primary).await {
            // The roles come from the last observation, which can trail a switchover: only a
            // server that says it is not in recovery is taken for the primary.
            Ok((_, _, true)) => return Ok(()),
            Ok((slots, _, false)) => slots,
            Err(e) => {
                self.forget(primary);
                return Err(e);
            }
        };
        for replica in replicas {
            if let Err(e) = self
                .sync_replica(pg, primary, &on_primary, replica, restart)
                .await
            {
                self.forget(&replica.conn);
                tracing::warn!(replica = %replica.name, "keeping the copy slots in line: {e}");
            }
        }
        Ok(())
    }

    /// Herd's copy slots on a server, its replay position (a standby's; 0 on a primary), and
    /// whether it is in recovery.
    async fn slots(&mut self, spec: &ConnSpec) -> Result<(Vec<Slot>, Lsn, bool), CopyError> {
        let client = self.client(spec, "postgres").await?;
        let rows = client
            .query(
                "select slot_name::text, coalesce(confirmed_flush_lsn, '0/0')::text, \
                        coalesce(wal_status = 'lost', false), database::text \
                 from pg_replication_slots \
                 where slot_type = 'logical' and not temporary and slot_name like 'herd\\_copy\\_%'",
                &[],
            )
            .await
            .map_err(|e| CopyError::sql("listing the copy slots", &e))?;
        let (replay, in_recovery) = match client
            .query_one(
                "select coalesce(pg_last_wal_replay_lsn(), '0/0')::text, pg_is_in_recovery()",
                &[],
            )
            .await
        {
            Ok(r) => (
                r.get::<_, String>(0).parse().unwrap_or_default(),
                r.get::<_, bool>(1),
            ),
            Err(e) => return Err(CopyError::sql("reading the replay position", &e)),
        };
        let slots = rows
            .iter()
            .map(|r| Slot {
                pos: SlotPos {
                    name: r.get(0),
                    confirmed: r.get::<_, String>(1).parse().unwrap_or_default(),
                    lost: r.get(2),
                },
                database: r.get(3),
            })
            .collect();
        Ok((slots, replay, in_recovery))
    }

    async fn sync_replica(
        &mut self,
        pg: &Pg,
        primary: &ConnSpec,
        on_primary: &[Slot],
        replica: &ReplicaRef,
        restart: &RestartFn,
    ) -> Result<(), CopyError> {
        let (here, replayed, in_recovery) = self.slots(&replica.conn).await?;
        if !in_recovery {
            // Promoted since the last observation: never touch a primary's slots.
            return Ok(());
        }
        let primary_pos: Vec<SlotPos> = on_primary.iter().map(|s| s.pos.clone()).collect();
        let here_pos: Vec<SlotPos> = here.iter().map(|s| s.pos.clone()).collect();
        let database_of = |name: &str| {
            on_primary
                .iter()
                .chain(&here)
                .find(|s| s.pos.name == name)
                .map_or_else(|| "postgres".to_string(), |s| s.database.clone())
        };
        for step in plan(&primary_pos, &here_pos, replayed) {
            match step {
                SlotStep::Drop(name) => {
                    let db = database_of(&name);
                    let client = self.client(&replica.conn, &db).await?;
                    client
                        .execute("select pg_drop_replication_slot($1)", &[&name])
                        .await
                        .map_err(|e| CopyError::sql(format!("dropping slot {name}"), &e))?;
                    tracing::info!(replica = %replica.name, "dropped its copy of slot {name}");
                }
                SlotStep::Advance { slot, to } => {
                    let db = database_of(&slot);
                    let client = self.client(&replica.conn, &db).await?;
                    client
                        .execute(
                            "select pg_replication_slot_advance($1, $2::text::pg_lsn)",
                            &[&slot, &to.to_string()],
                        )
                        .await
                        .map_err(|e| CopyError::sql(format!("advancing slot {slot}"), &e))?;
                }
                SlotStep::Install(names) => {
                    let key = replica.name.clone();
                    if self
                        .installed_at
                        .get(&key)
                        .is_some_and(|t| t.elapsed() < REINSTALL_PAUSE)
                    {
                        continue;
                    }
                    if !self.restart_keeps_commits(primary, &replica.name).await? {
                        if self.held_back.insert(key) {
                            tracing::warn!(
                                replica = %replica.name,
                                "slot(s) {} not copied to it: restarting it to load them would stall commits (it is needed for the synchronous quorum); with one more replica the copy is failover-safe",
                                names.join(", ")
                            );
                        }
                        continue;
                    }
                    self.held_back.remove(&key);
                    for name in &names {
                        let client = self.client(primary, "postgres").await?;
                        let state: Vec<u8> = client
                            .query_one(
                                "select pg_read_binary_file('pg_replslot/' || $1 || '/state')",
                                &[name],
                            )
                            .await
                            .map_err(|e| {
                                CopyError::sql(
                                    format!("reading slot {name}'s state on the primary"),
                                    &e,
                                )
                            })?
                            .get(0);
                        pg.install_slot_state(&replica.datadir, name, &state)?;
                    }
                    self.installed_at.insert(key, Instant::now());
                    self.forget(&replica.conn);
                    let outcome = restart(replica.name.clone()).await;
                    match outcome {
                        Ok(_) => {
                            tracing::info!(replica = %replica.name, "copied slot(s) {} and restarted it to load them", names.join(", "))
                        }
                        Err(e) => {
                            tracing::warn!(replica = %replica.name, "copied slot(s) {}, but its restart failed: {e}", names.join(", "))
                        }
                    }
                    // Its connections are gone with the restart: the next round carries on.
                    return Ok(());
                }
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::required_standbys;

    #[test]
    fn quorum_sizes() {
        for (names, k) in [
            ("", 0),
            ("ANY 1 (\"node1\", \"node2\")", 1),
            ("any 2 (a, b, c)", 2),
            ("FIRST 2 (a, b)", 2),
            ("FIRST 3(a,b,c)", 3),
            ("2 (a, b)", 2),
            ("node1", 1),
            ("\"node1\", \"node2\"", 1),
        ] {
            assert_eq!(required_standbys(names), k, "{names}");
        }
    }
}
