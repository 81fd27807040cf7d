//! `herd group add --dcs URL --cluster NAME [--proxy-api HOST:PORT]`: a shard group added to a
//! multi-host cluster when its agents join. The command records the next group in the store
//! (`herd_agent::groups::begin_addition`: agents started with `--group G` before that refuse,
//! saying to run this first), prints the `herd agent` line the operator runs on the new group's
//! hosts, waits (bounded, with progress) until the group has a primary, then follows its
//! admission by the cluster's coordinator (`group_admission.rs`: the agent holding the
//! `coordinator` lease asks a registered `herd proxy` with an API) until the store records it.
//! With `--proxy-api HOST:PORT` the command asks that proxy itself (`POST /groups`,
//! `proxy_group_add.rs`), taking the same admission record first, so that two admissions
//! never run at once. Run again, it finishes an addition left unadmitted instead of recording
//! another group.

use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use herd_agent::store::StoreClient;
use herd_cluster::Layout;

/// How often the wait says what it sees.
const SAY_EVERY: Duration = Duration::from_secs(10);

/// What the operator asked for.
pub struct AddArgs<'a> {
    /// The store.
    pub store: &'a crate::hosts::StoreArgs,
    /// Where the proxy's API token may be (its secrets/).
    pub layout: Layout,
    /// The admitting proxy's HTTP API.
    pub proxy_api: Option<&'a str>,
    /// How long to wait for the group's primary.
    pub wait: Duration,
}

/// Records (or finds) the group, waits for its primary and has the proxy admit it.
pub async fn run(args: AddArgs<'_>) -> anyhow::Result<()> {
    let (Some(dcs), Some(cluster)) = (&args.store.dcs, &args.store.cluster) else {
        bail!("--dcs and --cluster name the multi-host cluster to add a shard group to");
    };
    let root = args.store.open().await?;
    let dcs_root = root.dcs();
    let g = tokio::task::spawn_blocking(move || herd_agent::groups::begin_addition(&dcs_root))
        .await
        .context("the store thread failed")?
        .map_err(anyhow::Error::msg)?;
    crate::output::emitln!(
        "shard group {g} is recorded in the store. On each of its hosts, start its agents \
         (the first creates the group, the others join it as standbys), with the options the \
         other groups' agents use (--config, timeouts, etcd TLS):\n  \
         herd agent --dcs {dcs} --cluster {cluster} --group {g} --name NAME --data-dir DIR \
         --pg-port PORT --api-listen HOST:PORT"
    );
    let store = StoreClient::new(herd_agent::groups::scoped(root.dcs(), g));
    let primary = wait_primary(&store, g, args.wait).await?;
    crate::output::emitln!("shard group {g} has a primary: {primary}");
    let answer = match args.proxy_api {
        None => {
            eprintln!(
                "the cluster's coordinator admits shard group {g} through a registered herd \
                 proxy with an HTTP API (--api-listen); following it"
            );
            crate::group_admission::follow(&root, g, args.wait).await?
        }
        Some(api) => {
            eprintln!("asking the herd proxy at {api} to admit shard group {g}");
            let dcs = root.dcs();
            let by = "herd group add";
            match crate::group_admission::admit(&dcs, &args.layout, g, by, api, None).await? {
                Some(answer) => answer,
                None => {
                    eprintln!("an admission of shard group {g} is under way; following it");
                    crate::group_admission::follow(&root, g, args.wait).await?
                }
            }
        }
    };
    crate::output::emitln!("{answer}");
    crate::output::emitln!(
        "Move shards there online: herd shards rebalance --dcs {dcs} --cluster {cluster} \
         --endpoint PROXY_HOST:PORT --data-dir DIR_WITH_SECRETS"
    );
    Ok(())
}

/// Waits (within `wait`) until group `g` has a primary; its name. Says every 10 s what it sees.
async fn wait_primary(store: &StoreClient, g: u32, wait: Duration) -> anyhow::Result<String> {
    let began = Instant::now();
    let mut said = began;
    loop {
        let seen = match store.read().await {
            Ok(read) => {
                let leader = read
                    .store
                    .leader
                    .as_deref()
                    .and_then(|l| read.store.members.iter().find(|m| m.name == l))
                    .filter(|m| m.role == "primary");
                if let Some(m) = leader {
                    return Ok(m.name.clone());
                }
                let names: Vec<&str> = read.store.members.iter().map(|m| m.name.as_str()).collect();
                if names.is_empty() {
                    "no agent of the group has joined".to_string()
                } else {
                    format!("members {} joined, no primary yet", names.join(", "))
                }
            }
            Err(e) => format!("cannot read the store: {e}"),
        };
        if began.elapsed() >= wait {
            bail!(
                "shard group {g} had no primary after {} s ({seen}); start its agents and run \
                 `herd group add --dcs ...` again: it goes on with group {g}",
                wait.as_secs()
            );
        }
        if said.elapsed() >= SAY_EVERY {
            eprintln!(
                "waiting for shard group {g}'s agents ({} s): {seen}",
                began.elapsed().as_secs()
            );
            said = Instant::now();
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}
