//! Checks an operator's request must pass before it is written to the store, evaluated with
//! the same rules the agents apply (so a request they would never carry out is refused at once,
//! with the reason, instead of waiting for a timeout).

use herd_core::Lsn;

use crate::decide::{proven_candidate, Store};

/// A manual failover to `to`: refused when the quorum proof names another member and `to` is
/// behind it, since `to` may then lack commits that were acknowledged to clients (the one-host
/// supervisor's rule, in its words). `to` holding at least what the proven member holds is
/// accepted: WAL on one timeline is a single line, so it has every acknowledged commit too.
pub fn check_failover_target(store: &Store, to: &str, allow_data_loss: bool) -> Result<(), String> {
    if allow_data_loss {
        return Ok(());
    }
    let position = |name: &str| -> Option<Lsn> {
        store
            .members
            .iter()
            .find(|m| m.name == name)
            .and_then(|m| m.lsn)
    };
    let leader_lsn = store
        .leader
        .as_deref()
        .and_then(position)
        .unwrap_or_default();
    let safe = proven_candidate(store, None, leader_lsn)
        .map_err(|why| format!("not failing over: {why}"))?;
    if safe == to {
        return Ok(());
    }
    match (position(to), position(&safe)) {
        (Some(t), Some(s)) if t >= s => Ok(()),
        _ => Err(format!(
            "{to} may lack acknowledged commits; {safe} holds them all (or pass --allow-data-loss)"
        )),
    }
}

#[cfg(test)]
mod tests;
