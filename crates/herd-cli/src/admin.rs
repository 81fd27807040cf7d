//! `herd switchover`, `herd failover` (and a restore point across groups): requests to the running supervisor through its API,
//! and the supervisor side that turns API requests into commands.

use anyhow::{bail, Context};
use herd_api::AdminAction;
use herd_cluster::{read_supervisor, Command, Layout};
use herd_core::NodeName;
use tokio::sync::oneshot;

/// Supervisor side: forwards an API request to the supervisor loop of its shard group (given, or
/// the target node's, or group 0) and waits for the outcome.
pub async fn dispatch(
    set: &std::sync::Arc<crate::groups::GroupSet>,
    layout: &Layout,
    action: AdminAction,
) -> Result<String, String> {
    if let AdminAction::AddGroup = action {
        return crate::group_add::add(set, layout)
            .await
            .map_err(|e| format!("{e:#}"));
    }
    if let AdminAction::RestorePoint { name } = &action {
        let Some(runtime) = set.runtime() else {
            return Err("the cluster is still starting: retry in a moment".into());
        };
        return crate::restore_point::take(&runtime.proxy, layout, name)
            .await
            .map_err(|e| format!("{e:#}"));
    }
    let groups = set.commands();
    if let AdminAction::SetConfig { key, value, group } = &action {
        // As `herd config set` does from outside; each supervisor re-reads herd.toml.
        return crate::config_cmd::apply(layout, *group, key, value)
            .await
            .map_err(|e| format!("{e:#}"));
    }
    let (reply, answer) = oneshot::channel();
    let name = |n: Option<String>| n.map(|n| NodeName::from_text(&n));
    let (group, command) = match action {
        AdminAction::Switchover { to, group } => {
            let to = name(to);
            let command = Command::Switchover {
                to: to.clone(),
                reply,
            };
            (target_group(group, to.as_ref())?, command)
        }
        AdminAction::Failover {
            to,
            allow_data_loss,
            group,
        } => {
            let to = name(to);
            let command = Command::Failover {
                to: to.clone(),
                allow_data_loss,
                reply,
            };
            (target_group(group, to.as_ref())?, command)
        }
        AdminAction::Restart { node, group } => {
            let node = name(node);
            let command = Command::Restart {
                node: node.clone(),
                reply,
            };
            (target_group(group, node.as_ref())?, command)
        }
        AdminAction::SetConfig { .. }
        | AdminAction::AddGroup
        | AdminAction::RestorePoint { .. } => return Err("handled above".into()),
    };
    let tx = groups.get(group as usize).ok_or_else(|| {
        format!(
            "there is no shard group {group}: the cluster has {} (numbered from 0)",
            groups.len()
        )
    })?;
    tx.send(command)
        .await
        .map_err(|_| "the supervisor is shutting down".to_string())?;
    answer
        .await
        .map_err(|_| "the supervisor dropped the request".to_string())?
}

/// The group a request is for: as given, which must agree with the target node's.
fn target_group(given: Option<u32>, to: Option<&NodeName>) -> Result<u32, String> {
    match (given, to.map(NodeName::group)) {
        (Some(g), Some(t)) if g != t => Err(format!(
            "{} is a node of shard group {t}, not of group {g}",
            to.map(NodeName::as_str).unwrap_or_default()
        )),
        (Some(g), _) => Ok(g),
        (None, t) => Ok(t.unwrap_or(0)),
    }
}

/// Client side: POSTs `path` to the running supervisor and prints its answer.
pub async fn request(layout: &Layout, path: String) -> anyhow::Result<()> {
    let response = request_text(layout, path).await?;
    crate::output::emitln!("{response}");
    Ok(())
}

/// Client side: POSTs `path` to the running supervisor and returns its answer.
pub async fn request_text(layout: &Layout, path: String) -> anyhow::Result<String> {
    let Some(sup) = read_supervisor(layout) else {
        bail!(
            "no Herd supervisor runs for {}; start it with `herd up`",
            layout.root().display()
        );
    };
    let cluster = crate::status::open(layout)?;
    let url = format!("http://{}:{}{path}", cluster.host(), sup.api_port);
    let token = herd_cluster::Secrets::read_api_token(layout);
    let response = tokio::task::spawn_blocking(move || {
        let mut request = ureq::post(&url).timeout(std::time::Duration::from_secs(180));
        if let Some(t) = token {
            request = request.set("Authorization", &format!("Bearer {t}"));
        }
        match request.call() {
            Ok(r) => Ok(r.into_string().unwrap_or_default()),
            Err(ureq::Error::Status(_, r)) => {
                Err(anyhow::anyhow!(r.into_string().unwrap_or_default()))
            }
            Err(e) => Err(anyhow::anyhow!("cannot reach the supervisor's API: {e}")),
        }
    })
    .await
    .context("the request thread failed")??;
    Ok(response)
}
