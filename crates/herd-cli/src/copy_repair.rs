//! Inside `herd up`: a copy whose table lost its initial-copy slot in a failover of the source
//! (`herd_copy::resync`) gets that table copied again. A table is taken for lost only when two
//! status rounds in a row found it so: PostgreSQL drops that slot itself a moment before the
//! table's state leaves `f`, and one look could fall in between.

use std::collections::HashMap;

use herd_cluster::Layout;
use herd_copy::Store;
use herd_core::{CopyState, CopyStatus};

/// (copy, table) → consecutive rounds it was found without its slot.
pub type Suspects = HashMap<(String, String), u32>;

/// Rounds in a row before a table is copied again.
const ROUNDS: u32 = 2;

/// Checks every copy still copying (from `statuses`) and copies again its tables that lost
/// their slot; problems are logged (the copy's status keeps saying it is copying).
pub async fn repair(layout: &Layout, statuses: &[CopyStatus], suspects: &mut Suspects) {
    let copying: Vec<&str> = statuses
        .iter()
        .filter(|s| s.state == CopyState::Copying)
        .map(|s| s.name.as_str())
        .collect();
    suspects.retain(|(copy, _), _| copying.contains(&copy.as_str()));
    if copying.is_empty() {
        return;
    }
    let specs = match Store::new(layout.copies()).list() {
        Ok(s) => s,
        Err(e) => {
            tracing::warn!("reading the copies: {e}");
            return;
        }
    };
    for spec in specs.iter().filter(|s| copying.contains(&s.name.as_str())) {
        if let Err(e) = repair_one(layout, spec, suspects).await {
            tracing::warn!(
                copy = spec.name,
                "checking the tables' initial copies: {e:#}"
            );
        }
    }
}

async fn repair_one(
    layout: &Layout,
    spec: &herd_copy::CopySpec,
    suspects: &mut Suspects,
) -> anyhow::Result<()> {
    let group = crate::copy::source_group(layout, spec.group)?;
    let source = crate::copy::primary_client(&group, &spec.database).await?;
    let target = herd_copy::target::connect(&spec.target).await?;
    let lost = herd_copy::resync::lost_syncs(spec, &source, &target).await?;
    suspects.retain(|(copy, table), _| copy != &spec.name || lost.contains(table));
    for table in lost {
        let rounds = suspects
            .entry((spec.name.clone(), table.clone()))
            .or_default();
        *rounds += 1;
        if *rounds < ROUNDS {
            continue;
        }
        suspects.remove(&(spec.name.clone(), table.clone()));
        tracing::warn!(
            copy = spec.name,
            table,
            "the table's initial copy lost its slot in a failover of the source: copying the table again"
        );
        herd_copy::resync::resync(spec, &source, &target, &table).await?;
    }
    Ok(())
}
