//! `herd certs rotate --stage | --issue | --finish`: replacing the cluster's CA without
//! downtime (issue #42; docs/multi-host.md, "`herd certs rotate`"). Which step may run is
//! [`herd_certs::rotate::may_run`]'s decision, from the secrets directory and the member
//! records of every shard group; each step refuses out of order, saying which one comes first.

use anyhow::Context as _;
use clap::Args;
use herd_agent::member::{decode, encode, ClusterSettings, CONFIG};
use herd_agent::store::StoreClient;
use herd_certs::rotate::{self, Files, MemberIssuer, Step};

use crate::cli::DataDirArg;

/// Options of `herd certs rotate`.
#[derive(Debug, Args)]
#[command(group(clap::ArgGroup::new("step").required(true).args(["stage", "issue", "finish"])))]
pub struct RotateArgs {
    #[command(flatten)]
    dir: DataDirArg,
    /// The cluster's store (`--issue` and `--finish` need it; `--stage` only writes files).
    #[command(flatten)]
    store: crate::hosts::StoreArgs,
    /// Step 1: make the next CA (secrets/ca.next.crt, ca.next.key) and write ca.crt as the
    /// current CA then the next; then copy the secrets directory to every host.
    #[arg(long)]
    stage: bool,
    /// Step 2: ask every agent (through the store) to issue its certificate from the next CA.
    #[arg(long)]
    issue: bool,
    /// Step 3: once every member serves a certificate of the next CA, make it the only CA (the
    /// old pair kept as ca.old.crt, ca.old.key); then copy the secrets directory again.
    #[arg(long)]
    finish: bool,
}

/// Runs `herd certs rotate`.
pub async fn run(args: RotateArgs) -> anyhow::Result<()> {
    let secrets = args.dir.layout()?.secrets();
    let files = Files::read(&secrets)?;
    let step = if args.stage {
        Step::Stage
    } else if args.issue {
        Step::Issue
    } else {
        Step::Finish
    };
    if step == Step::Stage {
        rotate::may_run(step, &files, false, &[], None)?;
        let ca = herd_certs::ClusterCa::load(&secrets)?.context("no CA")?;
        let subject = herd_certs::info(&ca.cert_pem)?.subject;
        let fp = rotate::stage(&secrets, cluster_of(&subject))?;
        crate::output::emitln!(
            "staged the next CA ({fp}) in {}; ca.crt now trusts both. Copy this secrets \
             directory to every host (the agents reload their servers within a round, the \
             proxies read ca.crt again at their next connection), then run `herd certs rotate \
             --issue`",
            secrets.display()
        );
        return Ok(());
    }
    if !args.store.given() {
        anyhow::bail!(
            "`herd certs rotate --{}` acts through the cluster's store: give --dcs and --cluster",
            if step == Step::Issue {
                "issue"
            } else {
                "finish"
            }
        );
    }
    let groups = args.store.groups().await?;
    let mut stores = Vec::new();
    for g in 0..groups {
        stores.push(args.store.open_group(g).await?);
    }
    let mut members = Vec::new();
    let mut issuing = true;
    for (g, store) in stores.iter().enumerate() {
        let read = store.read().await.map_err(anyhow::Error::msg)?;
        issuing &= read.store.settings.issue_from_next_ca;
        for m in read.store.members {
            members.push(MemberIssuer {
                name: if groups > 1 {
                    format!("{} (group {g})", m.name)
                } else {
                    m.name
                },
                issuer: m.tls_issuer,
                trusts: m.tls_trusts,
            });
        }
    }
    let next_fp = rotate::next_fingerprint(&secrets)?;
    rotate::may_run(step, &files, issuing, &members, next_fp.as_deref())?;
    match step {
        Step::Issue => {
            for store in &stores {
                set_flag(store, true).await?;
            }
            crate::output::emitln!(
                "asked every agent to issue its certificate from the next CA ({}); `herd status \
                 --dcs` shows each one's issuer. Then run `herd certs rotate --finish`",
                next_fp.unwrap_or_default()
            );
        }
        _ => {
            rotate::finish(&secrets)?;
            for store in &stores {
                set_flag(store, false).await?;
            }
            crate::output::emitln!(
                "the next CA ({}) is now the only one in {} (the old kept as ca.old.crt, \
                 ca.old.key). Copy this secrets directory to every host",
                next_fp.unwrap_or_default(),
                secrets.display()
            );
        }
    }
    Ok(())
}

/// The cluster's name in a CA subject `Herd cluster CA (NAME)`, kept for the next CA.
fn cluster_of(subject: &str) -> &str {
    subject
        .strip_prefix("Herd cluster CA (")
        .and_then(|s| s.strip_suffix(')'))
        .unwrap_or("herd")
}

/// Sets the store's issue-from-next flag of one shard group (compare-and-set).
async fn set_flag(store: &StoreClient, on: bool) -> anyhow::Result<()> {
    let dcs = store.dcs();
    let current = tokio::task::spawn_blocking(move || dcs.get(CONFIG)).await??;
    let (mut settings, revision) = match current {
        Some(v) => (
            decode::<ClusterSettings>(CONFIG, &v.value).map_err(anyhow::Error::msg)?,
            v.revision,
        ),
        None => (ClusterSettings::default(), 0),
    };
    if settings.issue_from_next_ca == on {
        return Ok(());
    }
    settings.issue_from_next_ca = on;
    store
        .write(CONFIG, revision, encode(&settings))
        .await
        .map_err(|e| anyhow::anyhow!("{e} (changed concurrently? run the command again)"))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_next_ca_keeps_the_cluster_name() {
        assert_eq!(super::cluster_of("Herd cluster CA (prod)"), "prod");
        assert_eq!(super::cluster_of("Someone's CA"), "herd");
    }
}
