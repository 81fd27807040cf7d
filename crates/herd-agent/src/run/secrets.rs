//! The agent's part in a password rotation across hosts (`herd secrets rotate --dcs`,
//! [`crate::rotation`]): every round it reads the record at the store's root, takes it up in
//! its `secrets/`, acknowledges in its member record and sets the keys its API accepts.

use herd_apikey::ApiKey;

use super::Agent;
use crate::api;
use crate::rotation::{follow, RotationRecord, Standing, SECRETS_ROTATION};

/// The acknowledgement of a member that cannot open the record (its secrets are not the
/// cluster's current ones): the command names it as not acknowledging.
const REFUSED: &str = crate::rotation::CANNOT_OPEN;

impl Agent {
    /// One round's look at the rotation record. A store that cannot be read keeps everything as
    /// it was (the next round looks again).
    pub(super) async fn follow_rotation(&mut self) {
        let record = match self.root.get::<RotationRecord>(SECRETS_ROTATION).await {
            Ok(r) => r,
            Err(e) => {
                tracing::debug!("reading the password rotation record: {e}");
                return;
            }
        };
        let mut accepted = Vec::new();
        let mut next_superuser = None;
        match record {
            None => {
                self.rotation_ack = None;
                self.rotation_previous = None;
            }
            Some(record) => match follow(&self.node.layout, &record) {
                Ok(standing) => {
                    let ack = standing.ack();
                    if self.rotation_ack.as_deref() != Some(ack.as_str()) {
                        tracing::info!(
                            "password rotation {}: {}",
                            record.id,
                            match &standing {
                                Standing::Holds { .. } => "holding the next passwords",
                                Standing::Renamed { .. } => "the next passwords are now current",
                            }
                        );
                    }
                    match standing {
                        Standing::Holds { next, .. } => {
                            accepted.push(ApiKey::from_password(&next.superuser));
                            next_superuser = Some(next.superuser);
                        }
                        Standing::Renamed { previous, .. } => {
                            if let Some(previous) = previous {
                                self.rotation_previous = Some(previous.superuser);
                                // Renamed this round: taken up now rather than next round.
                                self.node.refresh_secrets();
                                // The walreceiver (the servers' OS user) reads the passfile.
                                if let Err(e) = self.node.pg.hand_over(&self.node.layout.secrets())
                                {
                                    tracing::warn!(
                                        "handing the new passfile to the servers' OS user: {e}"
                                    );
                                }
                            }
                            if let Some(previous) = &self.rotation_previous {
                                accepted.push(ApiKey::from_password(previous));
                            }
                        }
                    }
                    self.rotation_ack = Some(ack);
                }
                Err(e) => {
                    // Said once per rotation, not every round.
                    if self.rotation_ack.as_deref() != Some(REFUSED) {
                        tracing::warn!("password rotation {}: {e}", record.id);
                        self.rotation_ack = Some(REFUSED.into());
                    }
                    // Unchanged: what this member held stays usable.
                    next_superuser = self.node.next_superuser.take();
                }
            },
        }
        self.node.next_superuser = next_superuser;
        accepted.insert(0, ApiKey::from_password(&self.node.secrets.superuser));
        api::lock(&self.shared).keys = accepted;
    }
}
