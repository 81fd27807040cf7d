//! Shard moves across hosts, run by the cluster's coordinator: `herd shards move --dcs …` (and
//! each move of `herd shards rebalance --dcs …`) writes a request under `shard_moves/` in the
//! store and follows it; the agent holding the coordinator lease (`coordinator_tasks.rs`) runs
//! it (`shard_move::run_with`, the same steps as on one host) and writes each phase and the
//! outcome into the same record. A move is resumable at every step, so when the holder dies
//! (or loses its lease) the next holder takes the record, still `running`, and finishes it;
//! the command that asked may die too — run again, it follows the same move.
//!
//! One record per database and shard (`shard_moves/<database>/<shard>`), kept after the move
//! with its outcome (the store has no delete): a later request for that shard writes over a
//! finished one, never over one under way.

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use herd_agent::store::StoreClient;
use herd_cluster::{Layout, Progress};
use herd_dcs::{Dcs, SHARD_MOVES};
use serde::{Deserialize, Serialize};
use tokio::sync::watch;

use crate::move_places::Places;
use crate::shard_move::MoveArgs;

/// How often the command and the coordinator look at the records.
const POLL: Duration = Duration::from_millis(500);
/// How long a request may wait for a coordinator before the command says none takes it.
const UNTAKEN: Duration = Duration::from_secs(45);

/// Where a move stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum State {
    /// Written by the command; no coordinator took it yet.
    Requested,
    /// A coordinator runs it (or ran it and died: the next one resumes it).
    Running,
    /// Finished; `text` says what it did.
    Done,
    /// Stopped on an error; `text` says which. Not retried by itself.
    Failed,
}

impl State {
    fn active(self) -> bool {
        matches!(self, State::Requested | State::Running)
    }
}

/// One shard's move record.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct MoveRecord {
    /// The database.
    pub database: String,
    /// The shard.
    pub shard: u32,
    /// The group it goes to (ignored with `cancel`).
    pub to: u32,
    /// Take back a move that has not switched, instead of moving.
    pub cancel: bool,
    /// The `herd proxy` endpoint the command named (`HOST:PORT`).
    pub endpoint: String,
    /// How long the copy may take to copy and to catch up (seconds).
    pub wait_s: u64,
    /// Where it stands.
    pub state: State,
    /// The last phase, or the outcome.
    pub text: String,
    /// Tells one request from the next of the same shard.
    pub id: String,
}

/// What the command does with its request, given the shard's record.
#[derive(Debug, PartialEq, Eq)]
pub enum Decision {
    /// Write the request (no record, or a finished one).
    Write,
    /// The same move is under way: follow that record.
    Follow(String),
    /// Refused: another move or cancellation of the shard is under way.
    Refuse(String),
}

/// The command's decision for `wanted` over the shard's record `now` (pure).
pub fn decide(now: Option<&MoveRecord>, wanted: &MoveRecord) -> Decision {
    let Some(now) = now.filter(|r| r.state.active()) else {
        return Decision::Write;
    };
    if now.cancel == wanted.cancel && (wanted.cancel || now.to == wanted.to) {
        return Decision::Follow(now.id.clone());
    }
    let what = if now.cancel {
        "its cancellation".to_string()
    } else {
        format!("a move to group {}", now.to)
    };
    Decision::Refuse(format!(
        "shard {} of database {} has {what} under way in the cluster's coordinator ({}): wait \
         for it to end (run the same command again to follow it), then ask again",
        now.shard,
        now.database,
        if now.state == State::Running {
            format!("running: {}", now.text)
        } else {
            "not taken yet".to_string()
        }
    ))
}

/// The record a coordinator works on next (pure): one it was running (its holder died) before
/// a new one, in key order.
pub fn next(records: &[MoveRecord]) -> Option<&MoveRecord> {
    records
        .iter()
        .find(|r| r.state == State::Running)
        .or_else(|| records.iter().find(|r| r.state == State::Requested))
}

/// The endpoint a coordinator runs a move through (pure): the command's when that proxy is
/// registered (or none is), else a registered one — the command's proxy may have died since.
pub fn endpoint_for(requested: &str, registered: &[String]) -> String {
    if registered.is_empty() || registered.iter().any(|r| r == requested) {
        return requested.to_string();
    }
    registered[0].clone()
}

/// The record's key.
fn key(database: &str, shard: u32) -> String {
    format!(
        "{SHARD_MOVES}{}/{shard}",
        database.replace('%', "%25").replace('/', "%2F")
    )
}

async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, herd_dcs::DcsError> + Send + 'static,
) -> anyhow::Result<T> {
    Ok(tokio::task::spawn_blocking(f)
        .await
        .context("a store call")??)
}

/// The record at `key` and its revision.
async fn read(dcs: &Arc<dyn Dcs>, key: &str) -> anyhow::Result<Option<(MoveRecord, u64)>> {
    let (dcs, k) = (dcs.clone(), key.to_string());
    let Some(v) = blocking(move || dcs.get(&k)).await? else {
        return Ok(None);
    };
    let record = serde_json::from_slice(&v.value)
        .with_context(|| format!("the store's record {key} is not a shard move"))?;
    Ok(Some((record, v.revision)))
}

/// Writes `record` at `key` if it is still at `revision`.
async fn write(
    dcs: &Arc<dyn Dcs>,
    key: &str,
    revision: u64,
    record: &MoveRecord,
) -> anyhow::Result<()> {
    let (dcs, k, value) = (dcs.clone(), key.to_string(), serde_json::to_vec(record)?);
    blocking(move || dcs.compare_and_set(&k, revision, value)).await?;
    Ok(())
}

/// Changes the record `id` at `key` with `change`, whatever its revision now (`false`: the
/// record is another request's now).
async fn update(
    dcs: &Arc<dyn Dcs>,
    key: &str,
    id: &str,
    change: impl Fn(&mut MoveRecord),
) -> anyhow::Result<bool> {
    for _ in 0..5 {
        let Some((mut record, revision)) = read(dcs, key).await? else {
            return Ok(false);
        };
        if record.id != id {
            return Ok(false);
        }
        change(&mut record);
        match write(dcs, key, revision, &record).await {
            Ok(()) => return Ok(true),
            Err(e) => tracing::debug!("updating {key}: {e:#}; again"),
        }
    }
    bail!("the shard move record {key} kept changing under this writer")
}

/// `herd shards move --dcs …`: asks the coordinator for the move and follows it to its end.
pub async fn request_and_follow(
    root: &StoreClient,
    endpoint: &(String, u16),
    args: &MoveArgs<'_>,
) -> anyhow::Result<()> {
    let dcs = root.dcs();
    let key = key(args.database, args.shard);
    let wanted = MoveRecord {
        database: args.database.to_string(),
        shard: args.shard,
        to: args.to,
        cancel: args.cancel,
        endpoint: format!("{}:{}", endpoint.0, endpoint.1),
        wait_s: args.wait.as_secs(),
        state: State::Requested,
        text: "asked of the cluster's coordinator".into(),
        id: format!(
            "{}-{}",
            std::process::id(),
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_nanos())
        ),
    };
    let now = read(&dcs, &key).await?;
    let id = match decide(now.as_ref().map(|(r, _)| r), &wanted) {
        Decision::Refuse(why) => bail!(why),
        Decision::Follow(id) => {
            crate::output::emitln!("shard {}: following the move under way", args.shard);
            id
        }
        Decision::Write => {
            write(&dcs, &key, now.map_or(0, |(_, rev)| rev), &wanted)
                .await
                .context("another request for this shard was written at the same moment: run the command again")?;
            wanted.id.clone()
        }
    };
    follow(root, &key, &id, args).await
}

/// Shows the record's phases until it ends (bounded: the copy's wait twice, plus margins).
async fn follow(
    root: &StoreClient,
    key: &str,
    id: &str,
    args: &MoveArgs<'_>,
) -> anyhow::Result<()> {
    let dcs = root.dcs();
    let progress = crate::progress::TermProgress::new();
    let started = Instant::now();
    let deadline = started + args.wait * 3 + Duration::from_secs(120);
    let mut shown = String::new();
    loop {
        let Some((record, _)) = read(&dcs, key).await? else {
            bail!("the shard move record {key} disappeared from the store");
        };
        if record.id != id {
            bail!("another request for shard {} replaced this one", args.shard);
        }
        if record.text != shown && record.state.active() {
            progress.phase(&record.text);
            shown = record.text.clone();
        }
        match record.state {
            State::Done => {
                progress.done(&format!("shard {}: done", args.shard));
                drop(progress);
                crate::output::emitln!("{}", record.text);
                return Ok(());
            }
            State::Failed => {
                drop(progress);
                bail!(
                    "{} (the coordinator stopped the move there; run the command again to \
                     resume it, or --cancel to take it back)",
                    record.text
                );
            }
            State::Requested if started.elapsed() > UNTAKEN => {
                let d = dcs.clone();
                let holder =
                    blocking(move || d.lease_holder(herd_agent::coordinator::COORDINATOR)).await?;
                if holder.is_none() {
                    bail!(
                        "no agent coordinates the cluster (the `coordinator` lease is free), so \
                         no one runs the move; it stays asked and starts once an agent runs"
                    );
                }
            }
            _ => {}
        }
        if Instant::now() > deadline {
            bail!(
                "shard {} is still moving after {} s ({}): the coordinator goes on; run the same \
                 command again to follow it",
                args.shard,
                started.elapsed().as_secs(),
                record.text
            );
        }
        tokio::time::sleep(POLL).await;
    }
}

/// Writes a move's phases into its record (the latest one, in the background: `Progress` is
/// not async).
struct StoreProgress {
    text: watch::Sender<String>,
}

impl StoreProgress {
    fn start(dcs: Arc<dyn Dcs>, key: String, id: String) -> StoreProgress {
        let (tx, mut rx) = watch::channel(String::new());
        tokio::spawn(async move {
            while rx.changed().await.is_ok() {
                let text = rx.borrow_and_update().clone();
                if let Err(e) = update(&dcs, &key, &id, |r| r.text = text.clone()).await {
                    tracing::debug!("writing a shard move's phase: {e:#}");
                }
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        });
        StoreProgress { text: tx }
    }
}

impl Progress for StoreProgress {
    fn phase(&self, text: &str) {
        self.text.send_replace(text.to_string());
    }
    fn done(&self, text: &str) {
        self.text.send_replace(text.to_string());
    }
}

/// The coordinator's side: while `held` says the lease is held, runs the requested moves one
/// at a time (one it was running first), looking for new ones every [`POLL`] (a rebalance
/// asks for its moves one after the other). Returns when the lease is lost.
pub async fn run_requests(root: StoreClient, layout: Layout, mut held: watch::Receiver<bool>) {
    let dcs = root.dcs();
    while *held.borrow() {
        let records = {
            let d = dcs.clone();
            match blocking(move || d.list(SHARD_MOVES)).await {
                Ok(list) => list
                    .into_iter()
                    .filter_map(|(_, v)| serde_json::from_slice::<MoveRecord>(&v.value).ok())
                    .collect::<Vec<_>>(),
                Err(e) => {
                    tracing::debug!("reading the shard moves asked: {e:#}");
                    Vec::new()
                }
            }
        };
        let Some(record) = next(&records).cloned() else {
            tokio::select! {
                _ = tokio::time::sleep(POLL) => {}
                _ = held.wait_for(|h| !*h) => return,
            }
            continue;
        };
        tokio::select! {
            _ = run_one(&root, &layout, &record) => {}
            // The lease is gone: the next holder resumes the move where it stands.
            _ = held.wait_for(|h| !*h) => {
                tracing::warn!(
                    "shard {} of {}: the coordinator lease was lost during the move; the next \
                     holder resumes it",
                    record.shard,
                    record.database
                );
                return;
            }
        }
    }
}

/// Runs one record to its end and writes the outcome.
async fn run_one(root: &StoreClient, layout: &Layout, record: &MoveRecord) {
    let dcs = root.dcs();
    let key = key(&record.database, record.shard);
    let resumed = record.state == State::Running;
    let taken = update(&dcs, &key, &record.id, |r| {
        r.state = State::Running;
        r.text = if resumed {
            "resumed by another coordinator".into()
        } else {
            "taken by the coordinator".into()
        };
    })
    .await;
    if !matches!(taken, Ok(true)) {
        return;
    }
    tracing::warn!(
        "shard {} of {}: {} (to group {}{})",
        record.shard,
        record.database,
        if resumed {
            "resuming the move"
        } else {
            "moving"
        },
        record.to,
        if record.cancel { ", cancelling" } else { "" }
    );
    let outcome = async {
        let registered = crate::proxy_registry::listens(&dcs)
            .await
            .unwrap_or_default();
        let endpoint =
            crate::copy_hosts::endpoint_of(Some(&endpoint_for(&record.endpoint, &registered)))?;
        let places = Places::Hosts {
            root: root.clone(),
            layout: layout.clone(),
            endpoint,
        };
        let progress = StoreProgress::start(dcs.clone(), key.clone(), record.id.clone());
        let args = MoveArgs {
            shard: record.shard,
            to: record.to,
            database: &record.database,
            cancel: record.cancel,
            wait: Duration::from_secs(record.wait_s),
        };
        crate::shard_move::run_with(&places, args, &progress).await
    }
    .await;
    // The phases' writer may still hold an older text: the outcome goes last.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let (state, text) = match outcome {
        Ok(summary) => (State::Done, summary),
        Err(e) => (State::Failed, format!("{e:#}")),
    };
    tracing::warn!("shard {} of {}: {text}", record.shard, record.database);
    if let Err(e) = update(&dcs, &key, &record.id, |r| {
        r.state = state;
        r.text = text.clone();
    })
    .await
    {
        tracing::warn!("recording a shard move's outcome: {e:#}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(to: u32, cancel: bool, state: State, id: &str) -> MoveRecord {
        MoveRecord {
            database: "shop".into(),
            shard: 7,
            to,
            cancel,
            endpoint: "10.0.0.9:6432".into(),
            wait_s: 600,
            state,
            text: "copying".into(),
            id: id.into(),
        }
    }

    #[test]
    fn the_command_writes_follows_or_refuses() {
        use State::*;
        let wanted = record(2, false, Requested, "new");
        let cases: Vec<(Option<MoveRecord>, &str)> = vec![
            (None, "write"),
            (Some(record(1, false, Done, "old")), "write"),
            (Some(record(1, false, Failed, "old")), "write"),
            (Some(record(2, false, Running, "old")), "follow old"),
            (Some(record(2, false, Requested, "old")), "follow old"),
            (
                Some(record(1, false, Running, "old")),
                "refuse a move to group 1",
            ),
            (
                Some(record(0, true, Running, "old")),
                "refuse its cancellation",
            ),
        ];
        for (now, want) in cases {
            let got = match decide(now.as_ref(), &wanted) {
                Decision::Write => "write".to_string(),
                Decision::Follow(id) => format!("follow {id}"),
                Decision::Refuse(why) => {
                    let what = if why.contains("a move to group 1") {
                        "a move to group 1"
                    } else {
                        "its cancellation"
                    };
                    format!("refuse {what}")
                }
            };
            assert_eq!(got, want, "{now:?}");
        }
        // A cancellation follows a cancellation under way, whatever the target.
        let cancel = record(0, true, Requested, "new");
        assert_eq!(
            decide(Some(&record(3, true, Running, "old")), &cancel),
            Decision::Follow("old".into())
        );
        assert!(matches!(
            decide(Some(&record(3, false, Running, "old")), &cancel),
            Decision::Refuse(_)
        ));
    }

    #[test]
    fn a_coordinator_resumes_before_it_starts_another() {
        use State::*;
        let records = vec![
            record(1, false, Done, "a"),
            record(1, false, Requested, "b"),
            record(2, false, Running, "c"),
        ];
        assert_eq!(next(&records).map(|r| r.id.as_str()), Some("c"));
        assert_eq!(next(&records[..2]).map(|r| r.id.as_str()), Some("b"));
        assert_eq!(next(&records[..1]), None);
    }

    #[test]
    fn the_move_goes_through_a_registered_proxy() {
        let registered = vec!["10.0.0.8:6432".to_string(), "10.0.0.9:6432".to_string()];
        assert_eq!(endpoint_for("10.0.0.9:6432", &registered), "10.0.0.9:6432");
        assert_eq!(endpoint_for("10.0.0.7:6432", &registered), "10.0.0.8:6432");
        assert_eq!(endpoint_for("10.0.0.7:6432", &[]), "10.0.0.7:6432");
    }

    #[test]
    fn keys_keep_database_names_apart() {
        assert_eq!(key("shop", 3), "shard_moves/shop/3");
        assert_eq!(key("a/b", 3), "shard_moves/a%2Fb/3");
        assert_ne!(key("a%2Fb", 3), key("a/b", 3));
    }
}
