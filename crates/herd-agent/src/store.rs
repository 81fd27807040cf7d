//! Reading the cluster's keys from the store, and writing this agent's records.

use std::sync::Arc;
use std::time::Duration;

use herd_dcs::{Dcs, DcsError};

use crate::decide::Store;
use crate::member::{
    decode, encode, member_key, request_key, ClusterSettings, Handover, Initialized, Member,
    Request, SyncRecord, CONFIG, HANDOVER, INITIALIZE, LEADER, MEMBERS, REQUESTS, SYNC,
};

/// The store as this agent uses it: every call runs off the async threads (the etcd backend
/// blocks for up to its timeout).
#[derive(Clone)]
pub struct StoreClient {
    dcs: Arc<dyn Dcs>,
}

/// The store's answer in a round, with the record revisions compare-and-set needs.
#[derive(Clone, Debug)]
pub struct Read {
    /// What the decision sees.
    pub store: Store,
    /// The `initialize` record and its revision.
    pub initialized: Option<(Initialized, u64)>,
    /// The sync record's revision (0: absent).
    pub sync_revision: u64,
    /// The sync record.
    pub sync: SyncRecord,
    /// The handover record's revision (0: absent).
    pub handover_revision: u64,
}

fn text(e: DcsError) -> String {
    e.to_string()
}

impl StoreClient {
    /// Wraps a store.
    pub fn new(dcs: Arc<dyn Dcs>) -> Self {
        StoreClient { dcs }
    }

    /// The shared store.
    pub fn dcs(&self) -> Arc<dyn Dcs> {
        self.dcs.clone()
    }

    async fn call<T: Send + 'static>(
        &self,
        f: impl FnOnce(&dyn Dcs) -> Result<T, DcsError> + Send + 'static,
    ) -> Result<T, DcsError> {
        let dcs = self.dcs.clone();
        tokio::task::spawn_blocking(move || f(dcs.as_ref()))
            .await
            .unwrap_or_else(|e| Err(DcsError::Unavailable(format!("store call failed: {e}"))))
    }

    /// Reads every key a round needs.
    pub async fn read(&self) -> Result<Read, String> {
        self.call(|dcs| {
            let initialized = match dcs.get(INITIALIZE)? {
                Some(v) => Some((
                    decode::<Initialized>(INITIALIZE, &v.value).map_err(DcsError::Unavailable)?,
                    v.revision,
                )),
                None => None,
            };
            let leader = dcs.lease_holder(LEADER)?;
            let mut members = Vec::new();
            for (key, v) in dcs.list(MEMBERS)? {
                match decode::<Member>(&key, &v.value) {
                    Ok(m) => members.push(m),
                    Err(e) => tracing::warn!("{e}"),
                }
            }
            let (sync, sync_revision) = match dcs.get(SYNC)? {
                Some(v) => (
                    decode::<SyncRecord>(SYNC, &v.value).map_err(DcsError::Unavailable)?,
                    v.revision,
                ),
                None => (SyncRecord::default(), 0),
            };
            let settings = match dcs.get(CONFIG)? {
                Some(v) => {
                    decode::<ClusterSettings>(CONFIG, &v.value).map_err(DcsError::Unavailable)?
                }
                None => ClusterSettings::default(),
            };
            let (handover, handover_revision) = match dcs.get(HANDOVER)? {
                Some(v) => (
                    decode::<Handover>(HANDOVER, &v.value).map_err(DcsError::Unavailable)?,
                    v.revision,
                ),
                None => (
                    Handover {
                        done: true,
                        ..Handover::default()
                    },
                    0,
                ),
            };
            let mut restarts = Vec::new();
            for (key, v) in dcs.list(REQUESTS)? {
                match decode::<Request>(&key, &v.value) {
                    Ok(r) if !r.done && r.kind == "restart" => {
                        restarts.push(key.trim_start_matches(REQUESTS).to_string());
                    }
                    Ok(_) => {}
                    Err(e) => tracing::warn!("{e}"),
                }
            }
            Ok(Read {
                handover_revision,
                store: Store {
                    handover: (!handover.done).then_some(handover),
                    restarts,
                    initialized: initialized.is_some(),
                    leader,
                    members,
                    sync_set: sync.members.clone(),
                    last_sync: sync.reported.clone(),
                    last_leader: Some(sync.leader.clone())
                        .filter(|l| !l.is_empty())
                        .or_else(|| initialized.as_ref().map(|(i, _)| i.by.clone())),
                    settings,
                },
                initialized,
                sync_revision,
                sync,
            })
        })
        .await
        .map_err(text)
    }

    /// One record, decoded: `None` when absent.
    pub async fn get<T: for<'de> serde::Deserialize<'de> + Send + 'static>(
        &self,
        key: &'static str,
    ) -> Result<Option<T>, String> {
        match self.call(move |dcs| dcs.get(key)).await.map_err(text)? {
            Some(v) => decode::<T>(key, &v.value).map(Some),
            None => Ok(None),
        }
    }

    /// Marks this member's pending request taken up (compare-and-set: a newer request written
    /// meanwhile stays pending). `false` when there was none to mark.
    pub async fn take_request(&self, me: &str) -> Result<bool, String> {
        let key = request_key(me);
        self.call(move |dcs| {
            let Some(v) = dcs.get(&key)? else {
                return Ok(false);
            };
            let Ok(mut r) = decode::<Request>(&key, &v.value) else {
                return Ok(false);
            };
            if r.done {
                return Ok(false);
            }
            r.done = true;
            dcs.compare_and_set(&key, v.revision, encode(&r))?;
            Ok(true)
        })
        .await
        .map_err(text)
    }

    /// Whether the store answers a read now.
    pub async fn reachable(&self) -> bool {
        self.call(|dcs| dcs.get(LEADER)).await.is_ok()
    }

    /// Publishes this member's heartbeat for `ttl`.
    pub async fn publish(&self, member: &Member, ttl: Duration) -> Result<(), String> {
        let (key, value) = (member_key(&member.name), encode(member));
        self.call(move |dcs| dcs.put_expiring(&key, value, ttl))
            .await
            .map_err(text)
    }

    /// Takes or renews the leader lease for `me`.
    pub async fn lease(&self, me: &str, ttl: Duration) -> Result<bool, String> {
        let me = me.to_string();
        self.call(move |dcs| dcs.acquire_lease(LEADER, &me, ttl))
            .await
            .map_err(text)
    }

    /// Gives the leader lease up (switchover, shutdown).
    pub async fn release(&self, me: &str) -> Result<(), String> {
        let me = me.to_string();
        self.call(move |dcs| dcs.release_lease(LEADER, &me))
            .await
            .map_err(text)
    }

    /// Writes `value` under `key` if it is still at `revision`.
    pub async fn write(
        &self,
        key: &'static str,
        revision: u64,
        value: Vec<u8>,
    ) -> Result<u64, String> {
        self.call(move |dcs| dcs.compare_and_set(key, revision, value))
            .await
            .map_err(text)
    }
}
