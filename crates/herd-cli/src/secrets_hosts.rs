//! `herd secrets rotate --dcs …` (issue #42 part 4, across hosts): replaces the superuser's and
//! the replication role's passwords of a multi-host cluster without dropping clients. Run with
//! a copy of the cluster's `secrets/` (as `herd status --dcs`); the copy ends with the new
//! passwords. Order (docs/multi-host.md, "Rotating the passwords"):
//!
//! 1. the next passwords go to the store's root ([`SECRETS_ROTATION`]), sealed under the current
//!    superuser password (`herd_apikey::seal`), and to this copy's `secrets/*.next`;
//! 2. every agent and `herd proxy` takes them up at its next round (its own `secrets/*.next`,
//!    0600; its API accepts either key, its logins try the next password when the current one
//!    is refused) and acknowledges in its member record or registration; the command waits for
//!    every live one (bounded) and, when one has not, names it and stops with no server changed;
//! 3. each group's primary (group 0 first) gets both roles' new verifiers and group 0 its user
//!    mappings, as on one host (`secrets_cmd`'s shared steps); the record is marked applied;
//! 4. every member renames its `.next` files over its current ones and acknowledges again; then
//!    the record loses its passwords and expires.
//!
//! A run cut at any point is finished by running the command again with the same copy.

use std::time::{Duration, Instant};

use anyhow::{bail, Context as _};
use herd_agent::member::{decode, encode};
use herd_agent::rotation::{follow, unacknowledged, RotationRecord, SECRETS_ROTATION};
use herd_agent::store::StoreClient;
use herd_cluster::{Layout, Rotation, Secrets};

use crate::hosts::StoreArgs;

/// How long the record's last form stays before the store deletes it.
const FINISHED_TTL: Duration = Duration::from_secs(2);

/// Runs `herd secrets rotate --dcs …` with the secrets copy in `layout`, waiting up to `wait`
/// for each round of acknowledgements.
pub async fn rotate(layout: &Layout, store: &StoreArgs, wait: Duration) -> anyhow::Result<()> {
    let current = Secrets::load(layout).with_context(|| {
        format!(
            "with --dcs, --data-dir names a directory holding the cluster's secrets/ (copied from \
             a host, as for `herd status --dcs`); none usable in {}",
            layout.root().display()
        )
    })?;
    let root = store.open().await?;
    let groups = store.groups().await?;
    let (mut record, revision) = match read(&root).await? {
        Some(found) => {
            eprintln!("Going on with the rotation under way ({})…", found.0.id);
            found
        }
        None => {
            let record = RotationRecord::new(&current, &Secrets::generate())
                .map_err(|e| anyhow::anyhow!("sealing the next passwords: {e}"))?;
            let revision = root
                .write(SECRETS_ROTATION, 0, encode(&record))
                .await
                .map_err(|e| {
                    anyhow::anyhow!("{e} (another rotation began meanwhile? run the command again)")
                })?;
            (record, revision)
        }
    };
    if record.finished() {
        eprintln!("The rotation {} has finished; nothing to do.", record.id);
        return Ok(());
    }
    // This copy takes part as a member would: it stages the next passwords (or, run again
    // after it renamed them, sees them current).
    follow(layout, &record).map_err(anyhow::Error::msg)?;
    let next = match Rotation::staged(layout) {
        Some(next) => next,
        None => Secrets::load(layout)?,
    };
    if !record.applied {
        let missing = wait_for(&root, groups, &record, false, wait).await?;
        if !missing.is_empty() {
            bail!(
                "{} did not take up the next passwords within {} s (down, cut off from the \
                 store, or given another secrets directory? their logs say); no server was \
                 changed. Run `herd secrets rotate --dcs …` again once they run: it goes on \
                 with the same passwords",
                missing.join(", "),
                wait.as_secs()
            );
        }
        eprintln!("Every member holds the next passwords; changing the servers…");
        change_servers(&root, layout, groups, &current, &next).await?;
        record.applied = true;
        root.write(SECRETS_ROTATION, revision, encode(&record))
            .await
            .map_err(|e| {
                anyhow::anyhow!("marking the rotation applied: {e}; run the command again")
            })?;
    }
    follow(layout, &record).map_err(anyhow::Error::msg)?;
    let missing = wait_for(&root, groups, &record, true, wait).await?;
    if !missing.is_empty() {
        bail!(
            "the servers have the new passwords, but {} did not take them up within {} s; run \
             `herd secrets rotate --dcs …` again to finish (their logs say why)",
            missing.join(", "),
            wait.as_secs()
        );
    }
    let last = record.finish();
    let dcs = root.dcs();
    tokio::task::spawn_blocking(move || {
        dcs.put_expiring(SECRETS_ROTATION, encode(&last), FINISHED_TTL)
    })
    .await?
    .context("removing the next passwords from the store")?;
    println!(
        "Rotated the passwords of {} and {} on {groups} shard group(s) and every member; the \
         new ones are in {}. Connected clients stay connected; new logins need the new password.",
        herd_cluster::SUPERUSER,
        herd_cluster::REPLICATION_USER,
        layout.secrets().display()
    );
    Ok(())
}

/// The rotation record and its revision, if one is under way.
async fn read(root: &StoreClient) -> anyhow::Result<Option<(RotationRecord, u64)>> {
    let dcs = root.dcs();
    let found = tokio::task::spawn_blocking(move || dcs.get(SECRETS_ROTATION)).await??;
    match found {
        None => Ok(None),
        Some(v) => Ok(Some((
            decode::<RotationRecord>(SECRETS_ROTATION, &v.value).map_err(anyhow::Error::msg)?,
            v.revision,
        ))),
    }
}

/// Every live member of every group (`h1`, or `h1 (group 2)` with several groups) and every
/// registered proxy, with its acknowledgement.
async fn acknowledgements(
    root: &StoreClient,
    groups: u32,
) -> anyhow::Result<Vec<(String, Option<String>)>> {
    let mut out = Vec::new();
    for g in 0..groups {
        let store = StoreClient::new(herd_agent::groups::scoped(root.dcs(), g));
        let read = store.read().await.map_err(anyhow::Error::msg)?;
        for m in read.store.members {
            let name = if groups > 1 {
                format!("{} (group {g})", m.name)
            } else {
                m.name
            };
            out.push((name, m.secrets_rotation));
        }
    }
    out.extend(
        crate::proxy_registry::rotation_acks(&root.dcs())
            .await
            .map_err(anyhow::Error::msg)?,
    );
    Ok(out)
}

/// Waits (at most `wait`) until every live member acknowledged `record` as far as `applied`
/// asks; the ones that did not.
async fn wait_for(
    root: &StoreClient,
    groups: u32,
    record: &RotationRecord,
    applied: bool,
    wait: Duration,
) -> anyhow::Result<Vec<String>> {
    let deadline = Instant::now() + wait;
    loop {
        let missing = unacknowledged(&acknowledgements(root, groups).await?, &record.id, applied);
        if missing.is_empty() || Instant::now() >= deadline {
            return Ok(missing);
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// Each group's primary, group 0 first, gets the next passwords; then group 0's user mappings.
/// Every primary is logged in to before any changes (a group without one stops the run first).
async fn change_servers(
    root: &StoreClient,
    layout: &Layout,
    groups: u32,
    current: &Secrets,
    next: &Secrets,
) -> anyhow::Result<()> {
    let mut primaries = Vec::new();
    for g in 0..groups {
        let leader = crate::copy_hosts::leader_member(root, g).await?;
        let base = crate::copy_hosts::superuser_spec(&leader, layout, "postgres")?;
        let client = crate::secrets_cmd::login_primary(
            g,
            &leader.name,
            &base,
            &[&current.superuser, &next.superuser],
        )
        .await?;
        primaries.push((leader.name, base, client));
    }
    let superuser = herd_pg::scram_verifier(&next.superuser);
    let replication = herd_pg::scram_verifier(&next.replication);
    for (g, (node, _, client)) in primaries.iter().enumerate() {
        crate::secrets_cmd::change_group(g as u32, node, client, (&superuser, &replication))
            .await?;
    }
    let (_, base, client) = &primaries[0];
    let base = herd_pg::ConnSpec {
        password: next.superuser.clone(),
        ..base.clone()
    };
    crate::secrets_cmd::update_mappings(client, &base).await?;
    Ok(())
}
