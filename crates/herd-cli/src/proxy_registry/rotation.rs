//! A `herd proxy`'s part in a password rotation across hosts (`herd secrets rotate --dcs`,
//! `herd_agent::rotation`): every second it reads the record at the store's root, takes it up
//! in its `secrets/` (the `.next` files, then the rename once the servers changed) and
//! acknowledges in its registration. Its logins already follow the files: `follow_rotations`
//! hands the endpoint the next superuser password (tried when the current one is refused)
//! and the new current one within 250 ms.

use std::sync::Arc;
use std::time::Duration;

use herd_agent::rotation::{follow, RotationRecord, SECRETS_ROTATION};
use herd_cluster::Layout;
use herd_dcs::Dcs;
use tokio::sync::watch;

use super::{registrations, Registry};

/// How often a proxy looks at the rotation record.
const LOOK_EVERY: Duration = Duration::from_secs(1);

impl Registry {
    /// Follows password rotations in `layout`'s secrets until `shutdown`.
    pub fn follow_rotations(self: &Arc<Self>, layout: Layout, mut shutdown: watch::Receiver<bool>) {
        let registry = self.clone();
        tokio::spawn(async move {
            let mut warned: Option<String> = None;
            loop {
                tokio::select! {
                    _ = tokio::time::sleep(LOOK_EVERY) => {}
                    _ = shutdown.changed() => return,
                }
                let ack = match registry.root.get::<RotationRecord>(SECRETS_ROTATION).await {
                    Ok(None) => None,
                    Ok(Some(record)) => match follow(&layout, &record) {
                        Ok(standing) => Some(standing.ack()),
                        Err(e) => {
                            // Said once per rotation, not every second.
                            if warned.as_deref() != Some(record.id.as_str()) {
                                tracing::warn!("password rotation {}: {e}", record.id);
                                warned = Some(record.id.clone());
                            }
                            continue;
                        }
                    },
                    Err(e) => {
                        tracing::debug!("reading the password rotation record: {e}");
                        continue;
                    }
                };
                let mut mine = registry
                    .secrets_rotation
                    .lock()
                    .unwrap_or_else(|e| e.into_inner());
                if *mine != ack {
                    tracing::info!("password rotation: acknowledging {ack:?}");
                    *mine = ack;
                }
            }
        });
    }
}

/// Every registered proxy (its id, as `proxy <id>`) and its acknowledgement of the password
/// rotation under way.
pub async fn rotation_acks(dcs: &Arc<dyn Dcs>) -> Result<Vec<(String, Option<String>)>, String> {
    Ok(registrations(dcs)
        .await?
        .into_iter()
        .map(|o| (format!("proxy {}", o.id), o.secrets_rotation))
        .collect())
}
