//! The leader's upkeep each round: the recorded sync set, `synchronous_standby_names` and
//! replication slots for new members.

use super::*;

impl Agent {
    /// The primary's sync set: recorded before `synchronous_standby_names` grows, shrunk
    /// after the remaining standbys caught up (see [`crate::sync`]); slots for new members.
    pub(super) async fn keep_sync(
        &mut self,
        read: &Read,
        probe: &herd_pg::PrimaryProbe,
    ) -> Result<(), AgentError> {
        let me = self.node.cfg.name.clone();
        let heartbeat: Vec<String> = read
            .store
            .members
            .iter()
            .filter(|m| m.name != me)
            .map(|m| m.name.clone())
            .collect();
        // Every member gets its slot (it must have one before it can stream) …
        let missing: Vec<String> = heartbeat
            .iter()
            .filter(|m| !self.slotted.contains(*m))
            .cloned()
            .collect();
        if !missing.is_empty() {
            self.node.ensure_slots(&missing).await?;
            self.slotted.extend(missing);
        }
        // … but only members that replicate from this primary stand in the sync set.
        let present = crate::sync::candidates(&heartbeat, &|name: &str| {
            probe.replication.iter().any(|r| r.application_name == name)
        });
        let flushed = |name: &str| {
            probe
                .replication
                .iter()
                .find(|r| r.application_name == name)
                .and_then(|r| r.flush_lsn)
        };
        // The primary itself is no standby: every commit it acknowledged is on it, so it
        // leaves the record at once (a new leader finds itself in its predecessor's set).
        let mut recorded: Vec<String> = read
            .sync
            .members
            .iter()
            .filter(|m| **m != me)
            .cloned()
            .collect();
        // The previous leader takes this member's place: it comes back as a standby, and until
        // it or another one confirms, commits wait instead of being acknowledged by no standby.
        let previous = &read.sync.leader;
        if !read.sync.members.is_empty() && !previous.is_empty() && *previous != me {
            recorded.push(previous.clone());
            recorded.sort();
            recorded.dedup();
        }
        let plan = crate::sync::plan(&recorded, &present, self.applied.as_ref(), &flushed);
        let reported: Vec<String> = probe
            .replication
            .iter()
            .filter(|r| r.sync_state == Some(herd_core::SyncState::Sync))
            .map(|r| r.application_name.clone())
            .collect();
        let record = plan.record.clone().unwrap_or_else(|| recorded.clone());
        if record != read.sync.members
            || read.sync.leader != me
            || (!reported.is_empty() && reported != read.sync.reported)
        {
            let value = SyncRecord {
                members: record,
                reported,
                leader: me,
            };
            // Recorded first; the server's list changes only once the record is in.
            self.store
                .write(SYNC, read.sync_revision, encode(&value))
                .await
                .map_err(AgentError::Store)?;
        }
        let settings: &ClusterSettings = &read.store.settings;
        let names_nodes: Vec<herd_core::NodeName> = plan
            .names
            .iter()
            .map(|n| herd_core::NodeName::from_text(n))
            .collect();
        let names = settings.sync_standbys.standby_names(&names_nodes);
        self.node
            .apply_primary(names, settings.commit_mode.synchronous_commit())
            .await?;
        if self.applied.as_ref().is_none_or(|(n, _)| *n != plan.names) {
            self.applied = Some((plan.names, probe.current_lsn));
        }
        Ok(())
    }
}
