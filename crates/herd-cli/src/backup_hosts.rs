//! `herd backup --dcs … [--group G]`: a backup of a multi-host cluster's shard groups, each
//! taken by the agent of the group's primary (its host has the primary's data directory, which
//! pgBackRest reads; see docs/backup-status.md for why not a standby's yet), asked through the
//! store.
//!
//! One backup at a time per group, whichever agent runs it: the agent holds the group's lease
//! `backup` in the store while pgBackRest runs (pgBackRest's own lock is a file on one host, and
//! after a failover another host's agent would take the next backup). The request itself is one
//! key per group, `backup/request`, written by compare-and-set, so two `herd backup` commands
//! never overwrite each other's request: the second is refused, naming the first.

use std::sync::Arc;
use std::time::{Duration, Instant};

use herd_agent::store::StoreClient;
use herd_backup::BackupKind;
use herd_dcs::Dcs;
use serde::{Deserialize, Serialize};

/// The group's backup request (one at a time), relative to the group's view of the store.
pub const REQUEST: &str = "backup/request";
/// The group's backup lease, held by the agent running pgBackRest.
pub const LOCK: &str = "backup";
/// How long an agent that stopped renewing keeps the lease (it renews every fifth of this).
pub const LOCK_TTL: Duration = Duration::from_secs(30);
/// How long a request may wait for its agent to take it up.
const TAKE_UP: Duration = Duration::from_secs(30);
/// The longest backup this command waits for.
const LONGEST: Duration = Duration::from_secs(6 * 3600);

/// Where a request stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum State {
    /// Written by `herd backup`, not taken up yet.
    Asked,
    /// The agent holds the lease and runs pgBackRest.
    Running,
    /// Done: `message` describes the backup.
    Done,
    /// Refused or failed: `message` says why.
    Failed,
}

/// A group's backup request (`backup/request`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Request {
    /// Unique per request (the asking command's clock and pid).
    pub id: String,
    /// `full`, `diff` or `incr`.
    pub kind: String,
    /// The member asked to run it (the group's primary then).
    pub member: String,
    /// Where it stands.
    pub state: State,
    /// The backup (done) or why not (failed).
    pub message: String,
    /// When it was asked (Unix milliseconds).
    pub asked_ms: u64,
}

/// Why a new backup of a group cannot start now, from the lease's holder and the request in
/// the store; `None`: it may. A request still `asked` after [`TAKE_UP`] was abandoned (its
/// command gave up), as is a `running` one whose agent no longer holds the lease.
pub fn refusal(
    group: u32,
    holder: Option<&str>,
    pending: Option<&Request>,
    now_ms: u64,
) -> Option<String> {
    if let Some(h) = holder {
        return Some(format!(
            "another backup of shard group {group} is running (on {h}): one backup at a time per \
             group; wait for it to end"
        ));
    }
    let p = pending?;
    let young = now_ms.saturating_sub(p.asked_ms) < TAKE_UP.as_millis() as u64;
    (p.state == State::Asked && young).then(|| {
        format!(
            "another backup of shard group {group} was just asked of {} (by another `herd \
             backup`): one backup at a time per group; wait for it to end",
            p.member
        )
    })
}

/// `herd backup --dcs … [--group G] [--type T]`: every group in turn (or `group`), each from
/// its primary's agent; then, of every group of several, a restore point across them named
/// `backup-<group 0's label>` (as `herd up`'s `herd backup` takes), through a registered proxy
/// ([`crate::restore_point_hosts::request`]). `layout`: where the proxy's API token may be.
pub async fn run(
    store: &crate::hosts::StoreArgs,
    layout: &herd_cluster::Layout,
    group: Option<u32>,
    kind: BackupKind,
) -> anyhow::Result<()> {
    let count = store.groups().await?;
    let groups: Vec<u32> = match group {
        Some(g) if g >= count => {
            anyhow::bail!("the cluster has {count} shard group(s): --group must be below {count}")
        }
        Some(g) => vec![g],
        None => (0..count).collect(),
    };
    let every = groups.len() as u32 == count;
    let mut first = None;
    for g in groups {
        let client = store.open_group(g).await?;
        let text = backup_group(&client, g, kind).await?;
        crate::output::emitln!("Shard group {g}: {text}");
        first = first.or(Some(text));
    }
    if count == 1 {
        crate::output::emitln!(
            "Restore with: herd restore --to latest --repository REPOSITORY --data-dir NEW-DIR \
             (REPOSITORY: [backup] repository of the agents' herd.toml)"
        );
        return Ok(());
    }
    // A point consistent across the groups right after the backups: a restore of the whole
    // cluster needs one (each group's WAL alone is not consistent with the others').
    let name = first.as_deref().and_then(point_name).filter(|_| every);
    let Some(name) = name else {
        crate::output::emitln!(
            "No restore point taken (one group backed up): a restore of the cluster needs one \
             taken across its groups after their backups: herd backup restore-point NAME --dcs …"
        );
        return Ok(());
    };
    eprintln!("backup: restore point {name} across the {count} shard groups …");
    let root = store.open().await?;
    match crate::restore_point_hosts::request(&root, layout, &name, None).await {
        Ok(text) => crate::output::emitln!(
            "{}\nRestore with: herd restore --to {name} --repository REPOSITORY --data-dir \
             NEW-DIR (REPOSITORY: [backup] repository of the agents' herd.toml)",
            text.trim_end()
        ),
        Err(e) => eprintln!(
            "warning: no restore point with the backups ({e:#}); take one with `herd backup \
             restore-point NAME --dcs …` before restoring to one"
        ),
    }
    Ok(())
}

/// The restore point taken with a backup whose agent said `text` ("backup LABEL (…) done …"):
/// `backup-LABEL`, when that is a valid point name.
fn point_name(text: &str) -> Option<String> {
    let label = text.strip_prefix("backup ")?.split_whitespace().next()?;
    let name = format!("backup-{label}");
    herd_backup::valid_point_name(&name).then_some(name)
}

/// Asks the primary's agent of `group` for a backup and waits for its end.
async fn backup_group(store: &StoreClient, group: u32, kind: BackupKind) -> anyhow::Result<String> {
    let read = store.read().await.map_err(anyhow::Error::msg)?;
    let Some(primary) = read.store.leader.clone().filter(|l| {
        read.store
            .members
            .iter()
            .any(|m| &m.name == l && m.role == "primary")
    }) else {
        anyhow::bail!(
            "shard group {group} has no primary now; a backup is taken on its primary's host \
             (see `herd status --dcs …`)"
        );
    };
    let dcs = store.dcs();
    let request = Request {
        id: format!("{}-{}", herd_core::unix_ms(), std::process::id()),
        kind: kind.as_str().into(),
        member: primary.clone(),
        state: State::Asked,
        message: String::new(),
        asked_ms: herd_core::unix_ms(),
    };
    let asked = request.clone();
    blocking(&dcs, move |dcs| {
        let holder = dcs.lease_holder(LOCK)?;
        let current = dcs.get(REQUEST)?;
        let pending = current
            .as_ref()
            .and_then(|v| serde_json::from_slice::<Request>(&v.value).ok());
        if let Some(why) = refusal(group, holder.as_deref(), pending.as_ref(), asked.asked_ms) {
            return Ok(Err(why));
        }
        let revision = current.map_or(0, |v| v.revision);
        Ok(
            match dcs.compare_and_set(REQUEST, revision, encode(&asked)) {
                Ok(_) => Ok(()),
                Err(herd_dcs::DcsError::Conflict { .. }) => Err(format!(
                    "another backup of shard group {group} was asked at the same moment: one \
                     backup at a time per group"
                )),
                Err(e) => return Err(e),
            },
        )
    })
    .await?
    .map_err(anyhow::Error::msg)?;
    eprintln!(
        "backup: asked {primary} for a {} backup of shard group {group} …",
        kind.as_str()
    );
    wait(store, group, &request).await
}

/// Waits until the agent reports the end of `request`.
async fn wait(store: &StoreClient, group: u32, request: &Request) -> anyhow::Result<String> {
    let started = Instant::now();
    let dcs = store.dcs();
    let mut running_seen = false;
    let mut lease_gone = 0;
    loop {
        let id = request.id.clone();
        let (current, holder) = blocking(&dcs, move |dcs| {
            let current = dcs
                .get(REQUEST)?
                .and_then(|v| {
                    serde_json::from_slice::<Request>(&v.value)
                        .ok()
                        .map(|r| (r, v.revision))
                })
                .filter(|(r, _)| r.id == id);
            Ok((current, dcs.lease_holder(LOCK)?))
        })
        .await?;
        let Some((current, revision)) = current else {
            anyhow::bail!("the backup request of shard group {group} was replaced in the store");
        };
        match current.state {
            State::Done => {
                return Ok(format!(
                    "{} (on {}, {:.1} s)",
                    current.message,
                    current.member,
                    started.elapsed().as_secs_f64()
                ))
            }
            State::Failed => anyhow::bail!(
                "the backup of shard group {group} on {} failed: {}",
                current.member,
                current.message
            ),
            State::Running => {
                if !running_seen {
                    running_seen = true;
                    eprintln!("backup: running on {} …", current.member);
                }
                // Its agent died (kill -9, host lost): the lease expires and no end comes.
                lease_gone = if holder.is_none() { lease_gone + 1 } else { 0 };
                if lease_gone >= 3 {
                    anyhow::bail!(
                        "the backup of shard group {group} on {} ended without a result (its agent \
                         stopped holding the backup lease); run `herd backup` again",
                        current.member
                    );
                }
            }
            State::Asked if started.elapsed() > TAKE_UP => {
                let mut gave_up = current.clone();
                gave_up.state = State::Failed;
                gave_up.message = "not taken up".into();
                let _ = blocking(&dcs, move |dcs| {
                    dcs.compare_and_set(REQUEST, revision, encode(&gave_up))
                })
                .await;
                anyhow::bail!(
                    "{} did not take the backup request of shard group {group} up within {} s: is \
                     its agent running with [backup] in its --config herd.toml?",
                    current.member,
                    TAKE_UP.as_secs()
                );
            }
            State::Asked => {}
        }
        if started.elapsed() > LONGEST {
            anyhow::bail!("the backup of shard group {group} did not end within {LONGEST:?}");
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
}

/// JSON of a request.
pub fn encode(r: &Request) -> Vec<u8> {
    serde_json::to_vec(r).unwrap_or_default()
}

/// Runs `f` against the store off the async threads.
pub async fn blocking<T: Send + 'static>(
    dcs: &Arc<dyn Dcs>,
    f: impl FnOnce(&dyn Dcs) -> Result<T, herd_dcs::DcsError> + Send + 'static,
) -> anyhow::Result<T> {
    let dcs = dcs.clone();
    Ok(tokio::task::spawn_blocking(move || f(dcs.as_ref())).await??)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn asked(state: State, asked_ms: u64) -> Request {
        Request {
            id: "1".into(),
            kind: "full".into(),
            member: "h1".into(),
            state,
            message: String::new(),
            asked_ms,
        }
    }

    #[test]
    fn one_backup_at_a_time_per_group() {
        let now = 100_000;
        let cases: Vec<(Option<&str>, Option<Request>, Option<&str>)> = vec![
            (None, None, None),
            (Some("h2"), None, Some("is running (on h2)")),
            (Some("h2"), Some(asked(State::Done, now)), Some("(on h2)")),
            (
                None,
                Some(asked(State::Asked, now - 1_000)),
                Some("just asked of h1"),
            ),
            // Abandoned: its command gave up long ago.
            (None, Some(asked(State::Asked, now - 60_000)), None),
            // Running, but nobody holds the lease: its agent died.
            (None, Some(asked(State::Running, now - 1_000)), None),
            (None, Some(asked(State::Done, now - 1_000)), None),
            (None, Some(asked(State::Failed, now - 1_000)), None),
        ];
        for (holder, pending, says) in cases {
            let got = refusal(3, holder, pending.as_ref(), now);
            match says {
                None => assert_eq!(got, None, "{holder:?} {pending:?}"),
                Some(text) => {
                    let got = got.unwrap_or_else(|| panic!("refused: {holder:?} {pending:?}"));
                    assert!(got.contains(text) && got.contains("shard group 3"), "{got}");
                }
            }
        }
    }

    #[test]
    fn the_point_with_a_backup_is_named_after_group_0s_label() {
        let cases = [
            (
                "backup 20261129-113000F (full) done in 2.1 s, 22 MB of database (on a0, 3.0 s)",
                Some("backup-20261129-113000F"),
            ),
            (
                "backup 20261129-113000F_20261129-114000I (incr) done in 1.0 s",
                Some("backup-20261129-113000F_20261129-114000I"),
            ),
            ("pgbackrest reported something else", None),
            ("backup ", None),
            ("backup a/b (full)", None),
        ];
        for (text, want) in cases {
            assert_eq!(point_name(text).as_deref(), want, "{text}");
        }
    }

    #[test]
    fn requests_round_trip() {
        let r = asked(State::Running, 5);
        let text = String::from_utf8(encode(&r)).expect("utf-8");
        assert!(text.contains("\"state\":\"running\""), "{text}");
        assert_eq!(serde_json::from_str::<Request>(&text).expect("parse"), r);
    }
}
