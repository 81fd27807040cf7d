//! The leader lease and the fencing deadline: taking and renewing the lease, arming and
//! disarming the watchdog, and the failsafe question while the store is unreachable.

use super::*;

impl Agent {
    /// With the store unreachable: the question to every known member whether it cannot reach
    /// the store either (`None` when failsafe is off or a standby cannot be asked). Owns what
    /// it needs, so it can run beside the round's probe and read.
    pub(super) fn failsafe_question(
        &self,
    ) -> Option<impl std::future::Future<Output = FailsafeAnswer>> {
        if !self.node.cfg.failsafe {
            return None;
        }
        let me = &self.node.cfg.name;
        if let Some(unknown) = self
            .last_sync
            .iter()
            .find(|s| *s != me && !self.known.contains_key(*s))
        {
            tracing::warn!("failsafe: standby {unknown} was never seen with an API address; cannot ask it, not serving on");
            return None;
        }
        let apis: Vec<String> = self
            .known
            .iter()
            .filter(|(name, _)| *name != me)
            .map(|(_, api)| api.clone())
            .collect();
        let key = std::sync::Arc::new(api::ApiKey::from_password(&self.node.secrets.superuser));
        Some(async move {
            let asked_at = Instant::now();
            let members = apis.len();
            let confirmed = api::confirm_failsafe(apis, Duration::from_secs(1), key).await;
            FailsafeAnswer {
                asked_at,
                members,
                confirmed,
            }
        })
    }

    /// If every member confirmed, the primary may serve one more TTL (less the margin) from
    /// before the question: each promised not to race for the lease for one TTL after it.
    pub(super) fn apply_failsafe(&mut self, answer: FailsafeAnswer) {
        if !answer.confirmed {
            return;
        }
        let at = answer.asked_at + self.node.cfg.ttl - self.node.cfg.safety_margin;
        if self.fence_at.is_none_or(|old| old < at) {
            self.arm(at);
            tracing::warn!(
                "failsafe: the store is unreachable; all {} other members confirmed, serving on",
                answer.members
            );
        }
    }

    pub(super) fn arm(&mut self, at: Instant) {
        self.fence_at = Some(at);
        api::lock(&self.shared).leading_until = Some(at);
        if let Err(e) = self.deadline.arm(at) {
            tracing::error!("cannot arm the fencing watchdog: {e}");
        }
    }

    pub(super) fn disarm(&mut self) {
        self.fence_at = None;
        api::lock(&self.shared).leading_until = None;
        if let Err(e) = self.deadline.disarm() {
            tracing::error!("cannot disarm the fencing watchdog: {e}");
        }
    }

    /// Takes or renews the lease; on success the fencing instant moves to one TTL (less the
    /// margin) after the request was sent — etcd starts the TTL when it receives it, later.
    pub(super) async fn hold_lease(&mut self) -> Result<bool, String> {
        let cfg = &self.node.cfg;
        let sent = Instant::now();
        let held = self.store.lease(&cfg.name, cfg.ttl).await?;
        if held {
            let at = sent + cfg.ttl - cfg.safety_margin;
            self.arm(at);
        }
        Ok(held)
    }
}
