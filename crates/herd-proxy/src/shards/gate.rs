//! Shard map changes when several proxies serve one cluster (multi-host `herd proxy`). Each
//! proxy keeps the maps it read; a change made through one of them (a table distributed, a
//! shard moved) would leave the others routing by the old map, sending rows to the wrong group
//! or reading a moved shard where it no longer is. The embedding provides a [`MapGate`]: a
//! change goes ahead only when the gate says no other proxy can be routing by a map read before
//! it (each has acknowledged a hold, during which it forgets its maps and waits), and a proxy
//! reads (and keeps using) maps only while the gate allows it. Without a gate (one `herd up`,
//! one proxy) nothing is checked.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use super::refused;
use crate::{ProxyContext, ProxyError};

/// A boxed future of the gate.
pub type GateFuture<'a, T> = Pin<Box<dyn Future<Output = Result<T, String>> + Send + 'a>>;

/// What a change holds until it is over (dropping it ends the change).
pub type ChangeToken = Box<dyn Send + Sync>;

/// What a change touches, and so what the other proxies must do meanwhile.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ChangeScope {
    /// A map (a table distributed, a shard moved): every other proxy holds its statements that
    /// need a map until the change ends, then reads the new map.
    Map,
    /// The groups themselves (a group admitted): as for a map, and before the change ends the
    /// other proxies serve the new group too ([`MapGate::groups_admitted`]).
    Groups,
}

/// The rules a multi-proxy embedding enforces around shard maps.
pub trait MapGate: Send + Sync {
    /// Before this proxy commits a change of `database`'s map: a token to hold until the
    /// change is committed or abandoned, or why it must be refused. `scope` says whether the
    /// other proxies may keep serving through it.
    fn begin_change<'a>(
        &'a self,
        database: &'a str,
        scope: ChangeScope,
    ) -> GateFuture<'a, ChangeToken>;
    /// Whether this proxy may route by the maps it holds now (cheap: checked per statement).
    fn may_use_maps(&self) -> Result<(), String>;
    /// Before this proxy reads `database`'s map: waits while another proxy changes a map.
    fn before_load<'a>(&'a self, database: &'a str) -> GateFuture<'a, ()>;
    /// Whether another proxy's map change holds this one now: the maps held are forgotten, and
    /// statements that need one wait in [`MapGate::before_load`] for the change to end.
    fn held(&self) -> bool {
        false
    }
    /// Changes whenever a hold begins or ends: a map read across one is used by the statement
    /// that read it, not kept.
    fn hold_generation(&self) -> u64 {
        0
    }
    /// Called by a [`ChangeScope::Groups`] change once this proxy serves `groups` groups (the
    /// last one just admitted), before the change ends: records the admission where the other
    /// proxies read it, and waits (bounded) until they serve the new group too, so none of them
    /// writes reference tables or runs DDL on the groups before it once the hold is over. An
    /// error means the record may be missing: the caller stops serving the group.
    fn groups_admitted(&self, groups: u32) -> GateFuture<'_, ()> {
        let _ = groups;
        Box::pin(async { Ok(()) })
    }
}

impl ProxyContext {
    /// Installs the gate every shard map change and read goes through from now on.
    pub fn set_map_gate(&self, gate: Arc<dyn MapGate>) {
        if let Ok(mut g) = self.shard_maps.gate.write() {
            *g = Some(gate);
        }
    }

    pub(super) fn map_gate(&self) -> Option<Arc<dyn MapGate>> {
        self.shard_maps.gate.read().ok().and_then(|g| g.clone())
    }

    /// One change of `database`'s map at a time in this proxy, and, with a gate, in the
    /// cluster; held until the returned guard is dropped.
    pub(super) async fn begin_map_change(
        &self,
        database: &str,
    ) -> Result<(tokio::sync::MutexGuard<'_, ()>, Option<ChangeToken>), ProxyError> {
        self.begin_change(database, ChangeScope::Map).await
    }

    /// [`ProxyContext::begin_map_change`] for a change of the groups themselves.
    pub(super) async fn begin_groups_change(
        &self,
    ) -> Result<(tokio::sync::MutexGuard<'_, ()>, Option<ChangeToken>), ProxyError> {
        self.begin_change("(every database)", ChangeScope::Groups)
            .await
    }

    async fn begin_change(
        &self,
        database: &str,
        scope: ChangeScope,
    ) -> Result<(tokio::sync::MutexGuard<'_, ()>, Option<ChangeToken>), ProxyError> {
        let lock = self.shard_maps.changing.lock().await;
        let token = match self.map_gate() {
            Some(gate) => Some(
                gate.begin_change(database, scope)
                    .await
                    .map_err(|why| refused("55000", why))?,
            ),
            None => None,
        };
        Ok((lock, token))
    }

    /// With a gate: whether the maps held may be used; when not, they are forgotten (read
    /// again through [`MapGate::before_load`] once allowed).
    pub(super) fn check_map_use(&self) -> Result<(), ProxyError> {
        let Some(gate) = self.map_gate() else {
            return Ok(());
        };
        let forget = || {
            if let Ok(mut m) = self.shard_maps.maps.lock() {
                m.clear();
            }
        };
        gate.may_use_maps().map_err(|why| {
            forget();
            if let Ok(mut kept) = self.shard_maps.before_hold.lock() {
                kept.clear();
            }
            ProxyError::Unavailable(why)
        })?;
        // Only at a hold's start or end (the generation moved since the last statement looked)
        // is there anything to do: the per-statement cost is two atomic reads.
        let generation = gate.hold_generation();
        let seen = &self.shard_maps.seen_generation;
        if seen.swap(generation, std::sync::atomic::Ordering::SeqCst) != generation {
            // A change through another proxy comes with DDL made through it: the names this
            // one read may predate it (an INSERT without a column list into the new table
            // would be refused until they are read again).
            self.forget_all_names();
            // The maps held are read again after the change, also when no statement looked
            // while it ran; those of the hold's start stay for transactions under way.
            let held: Vec<_> = match self.shard_maps.maps.lock() {
                Ok(mut m) => m.drain().collect(),
                Err(_) => Vec::new(),
            };
            if let Ok(mut kept) = self.shard_maps.before_hold.lock() {
                kept.clear();
                if gate.held() {
                    kept.extend(held);
                }
            }
        }
        Ok(())
    }

    /// With a gate: its hold generation now (see [`MapGate::hold_generation`]).
    pub(super) fn hold_generation(&self) -> u64 {
        self.map_gate().map_or(0, |g| g.hold_generation())
    }

    /// With a gate: waits (as it says) before a map is read.
    pub(super) async fn wait_to_load_map(&self, database: &str) -> Result<(), ProxyError> {
        match self.map_gate() {
            Some(gate) => gate
                .before_load(database)
                .await
                .map_err(ProxyError::Unavailable),
            None => Ok(()),
        }
    }
}
