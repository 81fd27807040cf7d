//! A cluster's identity: where it lives, its configuration, topology and secrets.

use std::net::IpAddr;
use std::time::Duration;

use herd_config::Config;
use herd_core::{Assignment, Endpoint, NodeName, Role};
use herd_pg::{ConnSpec, ServerSettings, Upstream};

use crate::{ClusterError, ClusterState, Layout, Secrets};

/// The superuser created by initdb; its password is in `secrets/superuser.password`.
pub const SUPERUSER: &str = "postgres";
/// The role replicas stream WAL with.
pub const REPLICATION_USER: &str = "replicator";

/// An existing cluster as recorded in its data directory.
#[derive(Clone, Debug)]
pub struct Cluster {
    /// Its files.
    pub layout: Layout,
    /// Its configuration (herd.toml plus any overrides of this run).
    pub config: Config,
    /// Its topology.
    pub state: ClusterState,
    /// Its passwords.
    pub secrets: Secrets,
}

impl Cluster {
    /// Opens the cluster in `layout`; fails clearly when the directory holds no Herd cluster.
    pub fn open(layout: Layout, config: Config) -> Result<Cluster, ClusterError> {
        let state = ClusterState::load(&layout.state())?.ok_or_else(|| ClusterError::DataDir {
            path: layout.root().to_path_buf(),
            detail: "it holds no Herd cluster (state.json is missing); create one with `herd up`"
                .into(),
        })?;
        let secrets = Secrets::load(&layout)?;
        // The group's own commit settings (`[group.N]`) over the cluster's.
        let config = config.for_group(layout.group());
        Ok(Cluster {
            layout,
            config,
            state,
            secrets,
        })
    }

    /// The shard group this cluster object manages (0 when there is one group).
    pub fn group(&self) -> u32 {
        self.layout.group()
    }

    /// The address Herd connects to the servers on.
    pub fn host(&self) -> IpAddr {
        let listen = self.config.network.listen_address;
        if listen.is_unspecified() {
            IpAddr::from([127, 0, 0, 1])
        } else {
            listen
        }
    }

    /// The role Herd assigned to `node`.
    pub fn role(&self, node: &NodeName) -> Role {
        if *node == self.state.primary {
            Role::Primary
        } else {
            Role::Replica
        }
    }

    /// The TCP port of `node`.
    pub fn port(&self, node: &NodeName) -> u16 {
        self.config
            .group_node_port(self.group(), self.state.index(node).unwrap_or(0))
    }

    /// How Herd reaches `node` as the superuser.
    pub fn conn_spec(&self, node: &NodeName) -> ConnSpec {
        ConnSpec {
            host: self.host().to_string(),
            port: self.port(node),
            user: SUPERUSER.into(),
            password: self.secrets.superuser.clone(),
            dbname: "postgres".into(),
            timeout: Duration::from_secs(10),
            // `herd up`'s servers listen on loopback only and never serve TLS.
            tls: None,
        }
    }

    /// Where each node is, for the proxy.
    pub fn assignment(&self) -> Assignment {
        let sockets = self.socket_dir();
        let endpoint = |n: &NodeName| Endpoint {
            name: n.clone(),
            host: self.host().to_string(),
            port: self.port(n),
            socket: sockets
                .as_deref()
                .map(|dir| herd_pg::socket_path(dir, self.port(n))),
        };
        Assignment {
            primary: endpoint(&self.state.primary),
            replicas: self.state.replicas().iter().map(endpoint).collect(),
            primary_down: false,
            durable_replicas: match self.config.cluster.commit_mode {
                herd_core::CommitMode::Async => 0,
                _ => self.config.cluster.sync_standbys.count,
            },
        }
    }

    /// Like [`Cluster::conn_spec`], bounded for health probes: a server that does not answer
    /// within a second counts as not answering (failover needs that to last `failover_timeout`).
    pub fn probe_spec(&self, node: &NodeName) -> ConnSpec {
        ConnSpec {
            timeout: Duration::from_secs(1),
            ..self.conn_spec(node)
        }
    }

    /// A libpq URL for `node` as the superuser; the password is included only when asked for.
    pub fn url(&self, node: &NodeName, with_password: bool) -> String {
        self.url_at(self.port(node), with_password)
    }

    fn url_at(&self, port: u16, with_password: bool) -> String {
        let auth = if with_password {
            // Generated passwords are alphanumeric: no percent-encoding needed.
            format!("{SUPERUSER}:{}", self.secrets.superuser)
        } else {
            SUPERUSER.to_string()
        };
        format!("postgresql://{auth}@{}:{port}/postgres", self.host())
    }

    /// The cluster's endpoint: Herd's proxy on `network.port`.
    pub fn endpoint_url(&self, with_password: bool) -> String {
        let url = self.url_at(self.config.network.port, with_password);
        if self.config.proxy.tls_cert_file.is_empty() {
            url
        } else {
            // The endpoint speaks TLS: ask for it (verify-full needs the user's CA file).
            format!("{url}?sslmode=require")
        }
    }

    /// The `synchronous_standby_names` for the recorded sync set.
    pub fn synchronous_standby_names(&self) -> String {
        self.config
            .cluster
            .sync_standbys
            .standby_names(&self.state.sync_set)
    }

    /// Where the servers put their Unix-domain sockets; `None` (TCP only) when the data
    /// directory's path is too long for a socket path.
    pub fn socket_dir(&self) -> Option<std::path::PathBuf> {
        let dir = self.layout.sockets();
        herd_pg::socket_dir_fits(&dir).then_some(dir)
    }

    /// The server settings of `node` in its current role.
    pub fn server_settings(&self, node: &NodeName) -> ServerSettings {
        let pg = &self.config.postgres;
        let upstream = (self.role(node) == Role::Replica).then(|| Upstream {
            conninfo: herd_pg::replication_conninfo(
                &self.host().to_string(),
                self.port(&self.state.primary),
                REPLICATION_USER,
                &Secrets::pgpass(&self.layout),
                node.as_str(),
            ),
            slot: node.to_string(),
        });
        ServerSettings {
            listen_address: self.config.network.listen_address,
            port: self.port(node),
            socket_dir: self.socket_dir(),
            shared_buffers: pg.shared_buffers.clone(),
            max_connections: pg.max_connections,
            work_mem: pg.work_mem.clone(),
            max_slot_wal_keep_size: pg.max_slot_wal_keep_size.clone(),
            wal_keep_size: pg.wal_keep_size.clone(),
            wal_level: pg.wal_level.clone(),
            wal_compression: pg.wal_compression.clone(),
            synchronous_commit: self.config.cluster.commit_mode.synchronous_commit().into(),
            synchronous_standby_names: self.synchronous_standby_names(),
            upstream,
            archive_command: self.config.backup.is_enabled().then(|| {
                herd_backup::archive_command(
                    &herd_backup::Paths::new(self.layout.root()).config(),
                    self.group(),
                    &self.layout.node(node),
                )
            }),
        }
    }

    /// The group's nodes as pgBackRest reaches them (its stanza in pgbackrest.conf, the same
    /// whichever node is primary).
    pub fn backup_stanza(&self) -> herd_backup::Stanza {
        herd_backup::Stanza {
            group: self.group(),
            nodes: self
                .state
                .nodes
                .iter()
                .map(|n| herd_backup::PgNode {
                    path: self.layout.node(n),
                    port: self.port(n),
                })
                .collect(),
            socket_dir: self.socket_dir(),
        }
    }

    /// `pg_hba.conf` for every node.
    pub fn hba(&self) -> String {
        herd_pg::render_hba(self.config.network.listen_address, REPLICATION_USER)
    }
}
