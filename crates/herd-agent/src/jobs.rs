//! Long actions off the round: a clone, a rejoin (pg_rewind, else a fresh clone) and a re-clone
//! run as a task while the rounds go on. The rounds keep publishing the member's heartbeat (role
//! `cloning` or `rewinding`) and take no new step until the job ends; its result is an input of
//! the next round. One job at a time per agent.
//!
//! A job never runs while this member holds the lease (each follows another leader), so no
//! renewal waits for it.

use std::future::Future;

use tokio::task::JoinHandle;

use crate::AgentError;

/// What a job does.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum JobKind {
    /// Clone the leader into an empty data directory.
    Clone,
    /// pg_rewind onto the leader (a fresh clone if that fails), then follow it.
    Rejoin,
    /// Clone the leader afresh, the old data directory kept aside.
    Reclone,
    /// An operator's restart: out of the read pool first, then a stop and a start.
    Restart,
}

impl JobKind {
    /// The role the member's heartbeat shows meanwhile.
    pub fn role(self) -> &'static str {
        match self {
            JobKind::Clone | JobKind::Reclone => "cloning",
            JobKind::Rejoin => "rewinding",
            // Not `replica`: the proxies take it out of the read pool while it restarts.
            JobKind::Restart => "restarting",
        }
    }
}

/// A job's end.
#[derive(Debug)]
pub struct Done {
    /// What ran.
    pub kind: JobKind,
    /// The member it cloned or rewound from.
    pub leader: String,
    /// The upstream the server was configured with by the job (the agent's node takes it over).
    pub upstream: Option<String>,
    /// How it ended.
    pub result: Result<(), AgentError>,
}

/// The agent's one job slot.
#[derive(Debug, Default)]
pub struct Jobs {
    /// The job under way: its kind, its source and its task.
    running: Option<(JobKind, String, JoinHandle<Done>)>,
    /// The job that ended and was not yet taken by a round.
    done: Option<Done>,
}

impl Jobs {
    /// The kind of the job under way, if any.
    pub fn busy(&self) -> Option<JobKind> {
        self.running.as_ref().map(|(kind, _, _)| *kind)
    }

    /// Starts `work` as a task. `work` yields the upstream the server ended configured with and
    /// the result. Refused (an error, nothing started) while another job runs.
    pub fn start<F>(&mut self, kind: JobKind, leader: String, work: F) -> Result<(), AgentError>
    where
        F: Future<Output = (Option<String>, Result<(), AgentError>)> + Send + 'static,
    {
        if let Some((running, _, _)) = &self.running {
            return Err(AgentError::Setup(format!(
                "a {running:?} job already runs; not starting a {kind:?}"
            )));
        }
        let from = leader.clone();
        let handle = tokio::spawn(async move {
            let (upstream, result) = work.await;
            Done {
                kind,
                leader: from,
                upstream,
                result,
            }
        });
        self.running = Some((kind, leader, handle));
        Ok(())
    }

    /// Waits until the running job ends and keeps its result for [`Jobs::take_done`]; never
    /// returns while no job runs (so it can sit in a `select!`). Cancel-safe: the result is
    /// kept in the same poll that sees the task end.
    pub async fn finished(&mut self) {
        let Some((_, _, handle)) = self.running.as_mut() else {
            return std::future::pending().await;
        };
        let joined = handle.await;
        if let Some((kind, leader, _)) = self.running.take() {
            self.done = Some(joined.unwrap_or_else(|e| Done {
                kind,
                leader,
                upstream: None,
                result: Err(AgentError::Setup(format!(
                    "the {kind:?} job ended abnormally: {e}"
                ))),
            }));
        }
    }

    /// The result of a job that ended, once.
    pub async fn take_done(&mut self) -> Option<Done> {
        if self
            .running
            .as_ref()
            .is_some_and(|(_, _, handle)| handle.is_finished())
        {
            // Finished: this returns at once.
            self.finished().await;
        }
        self.done.take()
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[tokio::test]
    async fn one_job_at_a_time_and_its_result_once() {
        let mut jobs = Jobs::default();
        assert_eq!(jobs.busy(), None);
        assert!(jobs.take_done().await.is_none());
        let (go, wait) = tokio::sync::oneshot::channel::<()>();
        jobs.start(JobKind::Rejoin, "h1".into(), async move {
            let _ = wait.await;
            (Some("h1".to_string()), Ok(()))
        })
        .expect("start");
        assert_eq!(jobs.busy(), Some(JobKind::Rejoin));
        assert_eq!(JobKind::Rejoin.role(), "rewinding");
        // A second job is refused while the first runs.
        assert!(jobs
            .start(JobKind::Clone, "h1".into(), async { (None, Ok(())) })
            .is_err());
        // Still running: nothing to take, and waiting for it does not end.
        assert!(jobs.take_done().await.is_none());
        assert!(
            tokio::time::timeout(Duration::from_millis(50), jobs.finished())
                .await
                .is_err()
        );
        assert_eq!(
            jobs.busy(),
            Some(JobKind::Rejoin),
            "a cancelled wait loses nothing"
        );
        go.send(()).expect("job waiting");
        jobs.finished().await;
        assert_eq!(jobs.busy(), None);
        let done = jobs.take_done().await.expect("the result");
        assert_eq!((done.kind, done.leader.as_str()), (JobKind::Rejoin, "h1"));
        assert_eq!(done.upstream.as_deref(), Some("h1"));
        assert!(done.result.is_ok());
        assert!(jobs.take_done().await.is_none(), "taken once");
    }

    #[tokio::test]
    async fn a_failed_or_panicked_job_is_a_result_too() {
        let mut jobs = Jobs::default();
        jobs.start(JobKind::Clone, "h0".into(), async {
            (None, Err(AgentError::Io("disk full".into())))
        })
        .expect("start");
        jobs.finished().await;
        let done = jobs.take_done().await.expect("the result");
        assert!(done.result.is_err());
        jobs.start(JobKind::Reclone, "h0".into(), async {
            panic!("boom");
        })
        .expect("start");
        jobs.finished().await;
        let done = jobs.take_done().await.expect("the result");
        assert_eq!(done.kind, JobKind::Reclone);
        assert!(done.result.is_err());
    }
}
