//! Two-phase commit of work done on every shard group's primary (DDL, a split COPY): every
//! group PREPAREs it, group 0 commits first and the others follow — group 0's commit is the
//! decision, so a crash between the phases is resolved by `recover_ddl` when the shard map is
//! next read (committed where group 0 no longer holds it, else rolled back); on a failure
//! before the decision the prepared groups roll back, the others first and group 0 last.

use std::borrow::BorrowMut;

use crate::commit_gate::CommitGate;
use crate::pool::Lease;
use crate::ProxyError;

/// A fresh transaction name `herd_ddl_<kind>…` (the prefix `recover_ddl` looks for).
pub(super) fn ddl_gid(kind: &str) -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0);
    format!("herd_ddl_{kind}{}_{nanos}", std::process::id())
}

/// Runs `before` (empty, or e.g. `BEGIN; <statement>;`) and `PREPARE TRANSACTION gid` on every
/// lease, group 0 first; on the first failure rolls back what was prepared and returns it.
pub(super) async fn prepare_all<L: BorrowMut<Lease>>(
    leases: &mut [L],
    gid: &str,
    before: &str,
) -> Result<(), ProxyError> {
    prepare_each(leases, gid, &|_| before.to_string()).await
}

/// [`prepare_all`] with each lease's own work before the PREPARE (`before(i)` for lease i).
pub(super) async fn prepare_each<L: BorrowMut<Lease>>(
    leases: &mut [L],
    gid: &str,
    before: &(dyn Fn(usize) -> String + Sync),
) -> Result<(), ProxyError> {
    for i in 0..leases.len() {
        // Group 0's part carries the decision: committing it commits the whole.
        let decision = if i == 0 { decision(gid) } else { String::new() };
        let prepare = format!("{} {decision} PREPARE TRANSACTION '{gid}'", before(i));
        if let Err(e) = leases[i].borrow_mut().conn.internal_query(&prepare).await {
            abort(leases, i, gid).await;
            return Err(e);
        }
    }
    Ok(())
}

/// The statement that records, in group 0's part, that `gid` commits once that part does.
pub(super) fn decision(gid: &str) -> String {
    format!("INSERT INTO herd.txn_decisions (gid) VALUES ('{gid}');")
}

/// Undoes a two-phase commit that failed on lease `failed`: its open transaction (a failed
/// statement leaves it aborted) ends, and what the leases before it prepared is rolled back,
/// the last first (group 0 last: while it holds `gid`, recovery rolls back the others too).
pub(super) async fn abort<L: BorrowMut<Lease>>(leases: &mut [L], failed: usize, gid: &str) {
    if let Some(l) = leases.get_mut(failed) {
        let _ = l.borrow_mut().conn.internal_query("ROLLBACK").await;
    }
    let before = failed.min(leases.len());
    for l in leases[..before].iter_mut().rev() {
        let _ = l
            .borrow_mut()
            .conn
            .internal_query(&format!("ROLLBACK PREPARED '{gid}'"))
            .await;
    }
}

/// Commits `gid` on every lease, group 0 first. `what` names the work in the error of a group
/// that fails after the decision (its commit is completed when the map is next read). The
/// whole second phase holds `gate` shared, so that a restore point across groups never falls
/// between group 0's commit and another group's.
pub(super) async fn commit_all<L: BorrowMut<Lease>>(
    gate: &CommitGate,
    leases: &mut [L],
    gid: &str,
    what: &str,
) -> Result<(), ProxyError> {
    let _second_phase = gate.second_phase().await;
    for (g, lease) in leases.iter_mut().enumerate() {
        if let Err(e) = lease
            .borrow_mut()
            .conn
            .internal_query(&format!("COMMIT PREPARED '{gid}'"))
            .await
        {
            return Err(ProxyError::Server {
                code: "XX000".into(),
                message: format!(
                    "{what} is decided but committing it on shard group {g} failed ({e}); it is \
                     completed when the shard map is next read"
                ),
            });
        }
    }
    Ok(())
}
