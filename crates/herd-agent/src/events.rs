//! The cluster's timeline in the store: what an agent did that an operator wants to see
//! (a promotion, a fence, a rejoin, a restart) is written once under `events/` of its group,
//! expiring after [`EVENT_TTL`], so every dashboard shows the same history, including what
//! happened before that dashboard's process started.

use std::time::Duration;

use herd_core::ClusterEvent;
use herd_dcs::Dcs;

use crate::member::EVENTS;
use crate::store::StoreClient;

/// How long an event stays in the store (the dashboard's timeline covers the last hour).
pub const EVENT_TTL: Duration = Duration::from_secs(3600);

/// The key of `event` written by `who`: the time first, zero-padded, so the keys sort in time
/// order, and the writer's name, so two members' events of the same millisecond both stay.
pub fn key(event: &ClusterEvent, who: &str) -> String {
    format!("{EVENTS}{:013}-{who}", event.unix_ms)
}

/// Writes `event` in the background: a slow or unreachable store must not delay the round
/// that produced it (the event is then only in this agent's log, which says so).
pub fn record(store: &StoreClient, who: &str, event: ClusterEvent) {
    let (dcs, key) = (store.dcs(), key(&event, who));
    tracing::info!("event: {}", event.text);
    let Ok(value) = serde_json::to_vec(&event) else {
        return;
    };
    tokio::task::spawn_blocking(move || {
        if let Err(e) = dcs.put_expiring(&key, value, EVENT_TTL) {
            tracing::warn!("the event {key} could not be written to the store: {e}");
        }
    });
}

/// The events of one group's store, oldest first, with their keys; entries that do not decode
/// are skipped (a newer Herd may write kinds this one does not know).
pub fn read(dcs: &dyn Dcs) -> Result<Vec<(String, ClusterEvent)>, String> {
    let mut events: Vec<(String, ClusterEvent)> = dcs
        .list(EVENTS)
        .map_err(|e| e.to_string())?
        .into_iter()
        .filter_map(|(k, v)| {
            let event = serde_json::from_slice(&v.value).ok()?;
            Some((k, event))
        })
        .collect();
    events.sort_by(|a, b| a.0.cmp(&b.0));
    Ok(events)
}

#[cfg(test)]
mod tests {
    use herd_core::EventKind;
    use herd_dcs::MemoryDcs;

    use super::*;

    #[test]
    fn keys_sort_in_time_order_and_read_returns_what_was_written() {
        let dcs = MemoryDcs::default();
        let at = |ms: u64, text: &str| ClusterEvent {
            unix_ms: ms,
            group: 1,
            kind: EventKind::Failover,
            node: Some("h1".into()),
            text: text.into(),
            ok: true,
        };
        for (ms, who, text) in [
            (9_000, "h2", "late"),
            (10_000, "h1", "later"),
            (999, "h1", "early"),
        ] {
            let e = at(ms, text);
            let value = serde_json::to_vec(&e).expect("json");
            dcs.put_expiring(&key(&e, who), value, EVENT_TTL)
                .expect("put");
        }
        dcs.put_expiring("events/0000000000500-x", b"not json".to_vec(), EVENT_TTL)
            .expect("put");
        let texts: Vec<String> = read(&dcs)
            .expect("read")
            .into_iter()
            .map(|(_, e)| e.text)
            .collect();
        assert_eq!(texts, ["early", "late", "later"]);
    }
}
