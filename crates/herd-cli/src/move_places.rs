//! Where a shard move finds what it works on: on one host, the shard groups recorded in the
//! data directory (`state.json`) and its `copies/`; on several, the agents' store (each group's
//! leader, copies under `copies/`), the cluster's `secrets/` in a directory given with
//! `--data-dir`, and a `herd proxy` endpoint named with `--endpoint`. The move itself
//! (crates/herd-cli/src/shard_move.rs) is the same for both.

use anyhow::Context;
use herd_agent::store::StoreClient;
use herd_cluster::Layout;
use herd_copy::{CopySpec, Store};
use tokio_postgres::Client;

use crate::copy::{endpoint_client, primary_client, source_group, SourceClients};
use crate::copy_hosts;
use herd_cluster::Progress;

/// The cluster a move runs on.
pub enum Places {
    /// `herd up` on this machine.
    Local {
        /// Its data directory.
        layout: Layout,
    },
    /// Agents over etcd.
    Hosts {
        /// The store's root.
        root: StoreClient,
        /// A directory holding the cluster's `secrets/`.
        layout: Layout,
        /// The `herd proxy` the move's statements and the copy's subscription go through.
        endpoint: (String, u16),
    },
}

impl Places {
    /// How many shard groups the cluster has.
    pub async fn groups(&self) -> anyhow::Result<u32> {
        match self {
            Places::Local { layout } => Ok(crate::status::open_all(layout)?.len() as u32),
            Places::Hosts { root, .. } => Ok(herd_agent::groups::count(root)
                .await
                .map_err(anyhow::Error::msg)?
                .unwrap_or(1)),
        }
    }

    /// A superuser connection to group `g`'s primary, in `database`.
    pub async fn primary(&self, g: u32, database: &str) -> anyhow::Result<Client> {
        match self {
            Places::Local { layout } => primary_client(&source_group(layout, g)?, database).await,
            Places::Hosts { root, layout, .. } => {
                copy_hosts::primary_client(root, layout, g, database).await
            }
        }
    }

    /// A superuser connection to the endpoint, in `database`.
    pub async fn endpoint(&self, database: &str) -> anyhow::Result<Client> {
        match self {
            Places::Local { layout } => endpoint_client(&source_group(layout, 0)?, database).await,
            Places::Hosts {
                root,
                layout,
                endpoint,
            } => {
                let leader = copy_hosts::leader_member(root, 0).await?;
                let mut spec = copy_hosts::superuser_spec(&leader, layout, database)?;
                (spec.host, spec.port) = endpoint.clone();
                // The endpoint is a `herd proxy`, not a server: it serves TLS only when given a
                // certificate (`--tls-cert`), and relays to the servers over TLS itself.
                spec.tls = None;
                herd_pg::connect(&spec).await.with_context(|| {
                    format!("connecting to the endpoint {}:{}", endpoint.0, endpoint.1)
                })
            }
        }
    }

    /// A connection string to group `g`'s primary as the superuser (a move's copy target).
    pub async fn target_conninfo(&self, g: u32, database: &str) -> anyhow::Result<String> {
        let spec = match self {
            Places::Local { layout } => {
                let target = source_group(layout, g)?;
                target.conn_spec(&target.state.primary)
            }
            Places::Hosts { root, layout, .. } => {
                let leader = copy_hosts::leader_member(root, g).await?;
                copy_hosts::superuser_spec(&leader, layout, database)?
            }
        };
        let mut pairs = vec![
            ("host", spec.host.clone()),
            ("port", spec.port.to_string()),
            ("user", spec.user.clone()),
            ("password", spec.password.clone()),
            ("dbname", database.to_string()),
        ];
        if let (Places::Hosts { layout, .. }, Some(_)) = (self, &spec.tls) {
            // With a CA the primary takes the superuser from other hosts over TLS only;
            // herd-copy's target connection does libpq's verify-full with this CA.
            pairs.push(("sslmode", "verify-full".into()));
            let ca = layout.secrets().join(herd_certs::CA_CERT);
            pairs.push(("sslrootcert", ca.display().to_string()));
        }
        Ok(herd_copy::conninfo(&pairs))
    }

    /// The copy named `name`, if it exists.
    pub async fn copy(&self, name: &str) -> anyhow::Result<Option<CopySpec>> {
        match self {
            Places::Local { layout } => Ok(Store::new(layout.copies()).load(name)?),
            Places::Hosts { root, .. } => Ok(copy_hosts::load(root, name).await?.0),
        }
    }

    /// Group `spec.group`'s primary must run with `wal_level = logical`.
    pub async fn ensure_logical(&self, g: u32, progress: &dyn Progress) -> anyhow::Result<()> {
        match self {
            Places::Local { layout } => crate::copy::ensure_logical(layout, g, progress).await,
            Places::Hosts { .. } => {
                let primary = self.primary(g, "postgres").await?;
                copy_hosts::require_logical(&primary, g).await
            }
        }
    }

    /// Creates the copy `spec` and records it; across hosts with a CA, the sentence saying
    /// whether its subscription verifies the endpoint.
    pub async fn create_copy(
        &self,
        spec: &CopySpec,
        progress: &dyn Progress,
    ) -> anyhow::Result<Option<String>> {
        let phase = |text: &str| progress.phase(&format!("copy: {text}"));
        match self {
            Places::Local { layout } => {
                let source = source_group(layout, spec.group)?;
                let clients = SourceClients::open(layout, &source, &spec.database).await?;
                let host = source.host().to_string();
                let endpoint = (host.as_str(), source.config.network.port);
                herd_copy::manage::create(spec, &clients.source(), endpoint, false, &phase).await?;
                Store::new(layout.copies()).save(spec)?;
                Ok(None)
            }
            Places::Hosts {
                root,
                layout,
                endpoint,
            } => {
                let (_, revision) = copy_hosts::load(root, &spec.name).await?;
                let (primary, roles) = self.source_clients(spec, layout, root, endpoint).await?;
                let source = herd_copy::manage::Source {
                    primary: &primary,
                    roles: roles.as_ref().unwrap_or(&primary),
                };
                // The target is a group's primary of this cluster: its subscription verifies
                // the endpoint when the cluster has a CA and the endpoint serves a certificate
                // of it.
                let at = (endpoint.0.as_str(), endpoint.1);
                let (verify, said) =
                    copy_hosts::endpoint_verifies(layout, at, &spec.database).await?;
                if let Some(said) = &said {
                    progress.phase(said);
                }
                herd_copy::manage::create(spec, &source, at, verify, &phase).await?;
                copy_hosts::write(root, &spec.name, revision, serde_json::to_vec(spec)?).await?;
                Ok(said)
            }
        }
    }

    /// Drops the copy `spec` if it is still there: the target's subscription, the source's
    /// publication, slot and role, and its record.
    pub async fn drop_copy(&self, spec: &CopySpec) -> anyhow::Result<()> {
        if self.copy(&spec.name).await?.is_none() {
            return Ok(());
        }
        self.drop_copy_objects(spec).await?;
        match self {
            Places::Local { layout } => Store::new(layout.copies()).remove(&spec.name)?,
            Places::Hosts { root, .. } => {
                let (_, revision) = copy_hosts::load(root, &spec.name).await?;
                copy_hosts::write(root, &spec.name, revision, Vec::new()).await?;
            }
        }
        Ok(())
    }

    /// Whether the servers hold objects of the copy `spec` (its subscription on the target,
    /// its publication on the source): left by a run cut before it recorded the copy.
    pub async fn copy_left_behind(&self, spec: &CopySpec) -> anyhow::Result<bool> {
        let name = spec.object_name();
        let target = herd_copy::target::connect(&spec.target).await?;
        let subscribed = target
            .query_opt("select 1 from pg_subscription where subname = $1", &[&name])
            .await
            .context("looking for the copy's subscription on the target")?
            .is_some();
        if subscribed {
            return Ok(true);
        }
        Ok(self
            .primary(spec.group, &spec.database)
            .await?
            .query_opt("select 1 from pg_publication where pubname = $1", &[&name])
            .await
            .context("looking for the copy's publication on the source")?
            .is_some())
    }

    /// Drops whatever exists of the copy `spec` on the servers (its record aside): what a run
    /// cut between making the objects and recording the copy left, before it is made again.
    /// Each drop is a no-op for what does not exist.
    pub async fn drop_copy_objects(&self, spec: &CopySpec) -> anyhow::Result<()> {
        let target = herd_copy::target::connect(&spec.target).await?;
        herd_copy::manage::drop_target_side(spec, &target).await?;
        match self {
            Places::Local { layout } => {
                let source = source_group(layout, spec.group)?;
                let clients = SourceClients::open(layout, &source, &spec.database).await?;
                herd_copy::manage::drop_source_side(spec, &clients.source()).await?;
            }
            Places::Hosts {
                root,
                layout,
                endpoint,
            } => {
                let (primary, roles) = self.source_clients(spec, layout, root, endpoint).await?;
                let source = herd_copy::manage::Source {
                    primary: &primary,
                    roles: roles.as_ref().unwrap_or(&primary),
                };
                herd_copy::manage::drop_source_side(spec, &source).await?;
            }
        }
        Ok(())
    }

    /// Across hosts: the copy's source primary and, on a sharded cluster, the endpoint its
    /// role is made or dropped through.
    async fn source_clients(
        &self,
        spec: &CopySpec,
        layout: &Layout,
        root: &StoreClient,
        endpoint: &(String, u16),
    ) -> anyhow::Result<(Client, Option<Client>)> {
        let primary = self.primary(spec.group, &spec.database).await?;
        let roles =
            copy_hosts::roles_client(root, layout, &spec.database, (&endpoint.0, endpoint.1))
                .await?;
        Ok((primary, roles))
    }

    /// Retained WAL above which a copy's status warns.
    pub fn warn_bytes(&self) -> u64 {
        match self {
            Places::Local { layout } => crate::copy::warn_bytes(layout),
            Places::Hosts { .. } => copy_hosts::WARN_BYTES,
        }
    }
}
