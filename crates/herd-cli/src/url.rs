//! `herd url`: connection URLs that work as printed.

use anyhow::bail;
use herd_core::NodeName;

use crate::cli::UrlArgs;

pub fn run(args: &UrlArgs) -> anyhow::Result<()> {
    let layout = args.dir.layout()?;
    let groups = crate::status::open_all(&layout)?;
    let Some(cluster) = groups.get(args.group as usize) else {
        bail!(
            "there is no shard group {}: the cluster has {} (numbered from 0)",
            args.group,
            groups.len()
        );
    };
    let url = match (&args.replica, args.primary) {
        (Some(which), _) => {
            let replicas = cluster.state.replicas();
            let node = match which.parse::<usize>() {
                Ok(i) if (1..=replicas.len()).contains(&i) => replicas[i - 1].clone(),
                Ok(i) => bail!(
                    "there is no replica {i}: the cluster has {} (numbered from 1)",
                    replicas.len()
                ),
                Err(_) => match replicas.iter().find(|n| n.as_str() == which) {
                    Some(n) => n.clone(),
                    None => bail!("{which} is not a replica; replicas: {}", names(&replicas)),
                },
            };
            cluster.url(&node, true)
        }
        (None, true) => cluster.url(&cluster.state.primary, true),
        (None, false) => cluster.endpoint_url(true),
    };
    crate::output::emitln!("{url}");
    Ok(())
}

fn names(nodes: &[NodeName]) -> String {
    nodes
        .iter()
        .map(NodeName::as_str)
        .collect::<Vec<_>>()
        .join(", ")
}
