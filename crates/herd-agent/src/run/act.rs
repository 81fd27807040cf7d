//! Carrying out the step a round decided: the one place where a [`Step`] becomes actions.

use herd_core::EventKind;

use super::*;

impl Agent {
    pub(super) async fn act(
        &mut self,
        step: Step,
        observed: &Observed,
        read: Option<Read>,
    ) -> Result<(), AgentError> {
        let member = |name: &str| {
            read.as_ref()
                .and_then(|r| r.store.members.iter().find(|m| m.name == name).cloned())
        };
        match step {
            // A standby that follows the leader carries the recorded commit mode too, as the
            // supervisor engine's replicas do: it is in force the moment it is promoted.
            Step::Wait(_) if matches!(observed.local, Local::Replica { .. }) => {
                let commit = read
                    .as_ref()
                    .map(|r| r.store.settings.commit_mode.synchronous_commit());
                let upstream = self.node.upstream.clone().and_then(|u| member(&u));
                match (commit, upstream) {
                    (Some(commit), Some(leader)) => {
                        self.node.apply_replica_commit(commit, &leader).await
                    }
                    _ => Ok(()),
                }
            }
            Step::Wait(_) => Ok(()),
            Step::Initialize => self.initialize(read.as_ref()).await,
            Step::Clone(leader) => match member(&leader) {
                Some(m) => self.start_job(JobKind::Clone, m),
                None => Ok(()),
            },
            Step::StartPrimary => self.node.start_primary().await,
            Step::StartReplica => {
                let leader = read
                    .as_ref()
                    .and_then(|r| r.store.leader.clone())
                    .filter(|l| *l != self.node.cfg.name)
                    .and_then(|l| member(&l));
                self.disarm();
                // A server that served before and stopped on its own (a crash): out of the
                // read pool first (its record says `restarting`), and the restart on the
                // timeline, as the one-host supervisor shows it.
                let crashed = self.served;
                if crashed {
                    let mut leaving = self.member(observed);
                    leaving.role = JobKind::Restart.role().into();
                    let _ = self.store.publish(&leaving, self.node.cfg.ttl).await;
                }
                let started = self.node.start_replica(leader.as_ref()).await;
                if crashed {
                    let (text, ok) = match &started {
                        Ok(()) => ("restarted its server after it stopped".to_string(), true),
                        Err(e) => (format!("restarting its server failed: {e}"), false),
                    };
                    self.note(EventKind::Restart, text, ok);
                }
                started
            }
            Step::Fence(why) => {
                tracing::error!("fencing: {why}");
                self.node.fence()?;
                self.disarm();
                self.note(EventKind::Fenced, format!("fenced: {why}"), true);
                Ok(())
            }
            Step::Abdicate(why) => {
                // The marker file stays: the node rejoins through pg_rewind as any former
                // primary. Fenced first, so nothing it might still do counts after the release.
                self.node.fence()?;
                self.note(EventKind::Fenced, format!("gave the lead up: {why}"), true);
                self.give_up_lease().await
            }
            Step::Restart(leader) => match member(&leader) {
                Some(m) => {
                    // Taken up first: a request is carried out once, even if this agent dies
                    // during the restart (the operator sees it done and the member back).
                    if !self
                        .store
                        .take_request(&self.node.cfg.name)
                        .await
                        .map_err(AgentError::Store)?
                    {
                        return Ok(());
                    }
                    tracing::warn!("restarting PostgreSQL as asked (out of the read pool first)");
                    // Out of the read pool now, not a round later.
                    let mut leaving = self.member(observed);
                    leaving.role = JobKind::Restart.role().into();
                    let _ = self.store.publish(&leaving, self.node.cfg.ttl).await;
                    self.start_job(JobKind::Restart, m)
                }
                None => Ok(()),
            },
            Step::Follow(leader) => match member(&leader) {
                Some(m) => {
                    // A new upstream gets its own time to start streaming.
                    self.book.streaming_restarts();
                    self.node.follow(&m).await
                }
                None => Ok(()),
            },
            Step::Rejoin(leader) => match member(&leader) {
                Some(m) => {
                    self.disarm();
                    self.start_job(JobKind::Rejoin, m)
                }
                None => Ok(()),
            },
            Step::Reclone(leader) => match member(&leader) {
                Some(m) => {
                    tracing::warn!(
                        "{leader} no longer has the WAL this standby needs; cloning it afresh"
                    );
                    self.book.streaming_restarts();
                    self.start_job(JobKind::Reclone, m)
                }
                None => Ok(()),
            },
            Step::StepDown { immediate } => {
                tracing::warn!(
                    "handing the lead over ({})",
                    if immediate {
                        "failover: fencing"
                    } else {
                        "switchover: clean stop"
                    }
                );
                let dir = self.node.cfg.pgdata();
                if !immediate {
                    // The proxies read the request within COALESCE of its write and hold new
                    // work; give them that long, then let what they had sent finish.
                    tokio::time::sleep(SWITCHOVER_SETTLE).await;
                    // Never so long that the watchdog's deadline could fall inside the stop.
                    let left = self.fence_at.map_or(Duration::ZERO, |t| {
                        t.saturating_duration_since(Instant::now())
                    });
                    let drain = SWITCHOVER_DRAIN.min(left.saturating_sub(STOP_ALLOWANCE));
                    self.node.quiesce(drain).await;
                }
                // A clean stop waits until the walsenders have sent everything: the standbys
                // then hold every commit and the target need not wait for WAL.
                if immediate
                    || self
                        .node
                        .pg
                        .stop(&dir, herd_pg::StopMode::Fast)
                        .await
                        .is_err()
                {
                    self.node.fence()?;
                }
                self.give_up_lease().await
            }
            Step::Take | Step::Renew | Step::Promote | Step::FinishHandover => {
                let finish = step == Step::FinishHandover;
                match self.hold_lease().await {
                    Ok(true) => {}
                    Ok(false) => {
                        if observed.local == Local::Primary {
                            tracing::error!("fencing: another member holds the leader lease");
                            self.node.fence()?;
                            self.disarm();
                            self.note(
                                EventKind::Fenced,
                                "fenced: another member holds the leader lease".into(),
                                true,
                            );
                        }
                        return Ok(());
                    }
                    // The store failed this call: the armed deadline still stands.
                    Err(e) => {
                        tracing::warn!("cannot renew the leader lease: {e}");
                        // The read reached the store but the renewal did not (etcd lost its
                        // quorum between the two): the other members are asked now, as after
                        // a failed read, not one loop later — on a loaded machine the deadline
                        // had passed by then and the watchdog fenced a primary the failsafe
                        // would have kept.
                        if self.fence_at.is_some() {
                            if let Some(q) = self.failsafe_question() {
                                let answer = q.await;
                                self.apply_failsafe(answer);
                            }
                        }
                        return Ok(());
                    }
                }
                if matches!(observed.local, Local::Replica { .. }) {
                    tracing::warn!("{} holds the leader lease; promoting", self.node.cfg.name);
                    if let Some(fence) = &self.peer_fence {
                        fence(&self.node.cfg.name);
                    }
                    // A switchover the operator asked for, else a failover.
                    let handover = read
                        .as_ref()
                        .and_then(|r| r.store.handover.as_ref())
                        .filter(|h| !h.immediate);
                    let kind = if handover.is_some() {
                        EventKind::Switchover
                    } else {
                        EventKind::Failover
                    };
                    // The one-host supervisor's words after the agent's: who led before, and
                    // how long this member saw the group without a primary.
                    let me = &self.node.cfg.name;
                    let why = match (handover, &self.vacant) {
                        (Some(h), _) => format!("; switched over to {me} from {}", h.from),
                        (None, Some((since, Some(last)))) => format!(
                            "; primary {last} lost for {:.1} s",
                            since.elapsed().as_secs_f64()
                        ),
                        (None, _) => String::new(),
                    };
                    let text = format!(
                        "promoted to primary of shard group {}{why}",
                        self.node.cfg.group
                    );
                    match self.node.promote().await {
                        Ok(()) => self.note(kind, text, true),
                        Err(e) => {
                            self.note(kind, format!("{text} failed: {e}"), false);
                            return Err(e);
                        }
                    }
                    self.applied = None;
                    return Ok(());
                }
                if let (Some(r), Some(p)) = (read, &observed.primary) {
                    if finish {
                        if let Some(h) = &r.store.handover {
                            let done = Handover {
                                done: true,
                                ..h.clone()
                            };
                            self.store
                                .write(HANDOVER, r.handover_revision, encode(&done))
                                .await
                                .map_err(AgentError::Store)?;
                        }
                    }
                    self.keep_sync(&r, p).await?;
                }
                Ok(())
            }
        }
    }

    /// A new cluster: the `initialize` key decides which agent runs initdb.
    async fn initialize(&mut self, read: Option<&Read>) -> Result<(), AgentError> {
        let me = self.node.cfg.name.clone();
        let own_claim = read
            .and_then(|r| r.initialized.as_ref())
            .filter(|(i, _)| i.by == me && i.system_identifier.is_empty())
            .map(|(_, revision)| *revision);
        let claim = Initialized {
            system_identifier: String::new(),
            by: me.clone(),
        };
        let revision = match own_claim {
            Some(revision) => revision,
            None => match self.store.write(INITIALIZE, 0, encode(&claim)).await {
                Ok(r) => r,
                Err(e) => {
                    tracing::info!("another member initialises the cluster ({e})");
                    return Ok(());
                }
            },
        };
        // The settings every member follows, unless an operator wrote them first.
        let _ = self
            .store
            .write(CONFIG, 0, encode(&self.node.cfg.bootstrap))
            .await;
        let group = self.node.cfg.group;
        if group == 0 {
            crate::groups::record_count(&self.root, self.node.cfg.shard_groups)
                .await
                .map_err(AgentError::Store)?;
            tracing::warn!("creating the cluster (initdb on {me})");
        } else {
            tracing::warn!("creating shard group {group} (initdb on {me})");
        }
        // Its passwords are now the cluster's.
        self.node.fresh_secrets = false;
        self.node.initialize().await?;
        if group > 0 {
            crate::groups::copy_superuser_verifier(
                &self.root,
                &self.node.secrets.superuser,
                &self.node.spec(),
                VERIFIER_WAIT,
            )
            .await?;
        }
        let done = Initialized {
            system_identifier: self.node.system_identifier().await?,
            by: me,
        };
        self.store
            .write(INITIALIZE, revision, encode(&done))
            .await
            .map_err(AgentError::Store)?;
        self.identity_checked = true;
        Ok(())
    }
}
