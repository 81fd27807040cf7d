//! Tables whose initial copy lost its slot. PostgreSQL copies each table of a new subscription
//! with a worker of its own, through a slot of its own on the source
//! (`pg_<subscription>_sync_<table>_<system id>`): the rows first (state `d`), then, once they
//! are committed on the target (state `f`), the changes made meanwhile, streamed from that slot.
//! Unlike the copy's own slot, that short-lived slot is not carried to the source's replicas, so
//! a failover of the source in state `f` leaves the worker asking the new primary for a slot it
//! does not have, again and again. (In state `d` PostgreSQL starts the table over by itself.)
//!
//! The remedy is PostgreSQL's own way of copying one table again: the table leaves the
//! publication and the subscription (`REFRESH PUBLICATION` drops its worker's state), its rows
//! the copy brought are deleted on the target, and it comes back, copied afresh from a
//! snapshot of the new primary, then streamed. Only that table is copied again.

use tokio_postgres::Client;

use crate::{quote_ident, CopyError, CopySpec};

/// The tables of copy `spec` in state `f` whose table-copy slot is missing on the source
/// primary `source`.
pub async fn lost_syncs(
    spec: &CopySpec,
    source: &Client,
    target: &Client,
) -> Result<Vec<String>, CopyError> {
    let rows = target
        .query(
            "select n.nspname || '.' || c.relname, \
                    format('pg_%s_sync_%s_%s', s.oid, r.srrelid, (select system_identifier from pg_control_system())) \
             from pg_subscription_rel r \
             join pg_subscription s on s.oid = r.srsubid \
             join pg_class c on c.oid = r.srrelid \
             join pg_namespace n on n.oid = c.relnamespace \
             where s.subname = $1 and r.srsubstate = 'f'",
            &[&spec.object_name()],
        )
        .await
        .map_err(|e| CopyError::sql("reading the target's table states", &e))?;
    if rows.is_empty() {
        return Ok(Vec::new());
    }
    let slots: Vec<String> = rows.iter().map(|r| r.get(1)).collect();
    let present = source
        .query(
            "select slot_name::text from pg_replication_slots where slot_name = any($1)",
            &[&slots],
        )
        .await
        .map_err(|e| CopyError::sql("reading the source's slots", &e))?;
    let present: Vec<String> = present.iter().map(|r| r.get(0)).collect();
    Ok(rows
        .iter()
        .filter(|r| !present.contains(&r.get::<_, String>(1)))
        .map(|r| r.get(0))
        .collect())
}

/// Copies `table` of copy `spec` again (the module's remedy). A table published through its
/// schema cannot leave the publication alone: the error says to create the copy again.
pub async fn resync(
    spec: &CopySpec,
    source: &Client,
    target: &Client,
    table: &str,
) -> Result<(), CopyError> {
    let Some(t) = spec.tables.iter().find(|t| t.table == table) else {
        return Err(CopyError::Invalid(format!(
            "{table} lost its initial copy's slot in a failover and is copied through its schema: \
             drop the copy and create it again"
        )));
    };
    let name = quote_ident(&spec.object_name());
    let qualified = crate::quote_qualified(table);
    source
        .batch_execute(&format!("ALTER PUBLICATION {name} DROP TABLE {qualified}"))
        .await
        .map_err(|e| CopyError::sql(format!("taking {table} out of the publication"), &e))?;
    let refresh = format!("ALTER SUBSCRIPTION {name} REFRESH PUBLICATION");
    target
        .batch_execute(&refresh)
        .await
        .map_err(|e| CopyError::sql("refreshing the subscription on the target", &e))?;
    // The rows the copy brought (those of its row filter), not others the target may hold.
    let filter = t
        .row_filter
        .as_ref()
        .map_or(String::new(), |f| format!(" WHERE ({f})"));
    target
        .batch_execute(&format!("DELETE FROM {qualified}{filter}"))
        .await
        .map_err(|e| CopyError::sql(format!("deleting the partial copy of {table}"), &e))?;
    source
        .batch_execute(&format!(
            "ALTER PUBLICATION {name} ADD TABLE {}",
            t.publication_item()
        ))
        .await
        .map_err(|e| CopyError::sql(format!("putting {table} back in the publication"), &e))?;
    target
        .batch_execute(&refresh)
        .await
        .map_err(|e| CopyError::sql("refreshing the subscription on the target", &e))
}
