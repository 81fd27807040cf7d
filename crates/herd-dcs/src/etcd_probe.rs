//! Asking each etcd endpoint on its own whether it answers and knows a leader: what an operator
//! needs to see when the store as a whole is unavailable (every member down, or a member up
//! whose cluster lost its quorum).

use etcd_client::Client;

use crate::etcd::{connect_options, run_on, EtcdConfig};
use crate::DcsError;

/// How one etcd endpoint answered a status request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum EndpointState {
    /// It answers and knows its cluster's leader.
    Leader(u64),
    /// It answers but knows no leader: its cluster lost its quorum (or is electing).
    NoLeader,
    /// It did not answer in time, or refused (why).
    Silent(String),
}

/// One endpoint of an [`EtcdConfig`] and how it answered.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EndpointProbe {
    /// As given in the configuration (`http://h1:2379`).
    pub endpoint: String,
    /// Its answer.
    pub state: EndpointState,
}

impl std::fmt::Display for EndpointProbe {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.state {
            EndpointState::Leader(id) => {
                write!(f, "{}: answers, leader {id:x}", self.endpoint)
            }
            EndpointState::NoLeader => write!(
                f,
                "{}: answers, but knows no leader (quorum lost?)",
                self.endpoint
            ),
            EndpointState::Silent(why) => write!(f, "{}: does not answer ({why})", self.endpoint),
        }
    }
}

/// An etcd client error in a few words (a gRPC status prints its metadata too).
fn short(e: etcd_client::Error) -> String {
    match e {
        etcd_client::Error::GRpcStatus(s) => s.message().to_string(),
        other => other.to_string(),
    }
}

/// Asks every endpoint of `config` for its status (the maintenance Status call, which a member
/// answers from its own state, quorum or not), all at once, each within the configured call
/// timeout. Blocking: call it off the async threads.
pub fn probe_endpoints(config: &EtcdConfig) -> Vec<EndpointProbe> {
    let silent = |endpoint: &String, why: String| EndpointProbe {
        endpoint: endpoint.clone(),
        state: EndpointState::Silent(why),
    };
    let options = match connect_options(config) {
        Ok(o) => o,
        Err(e) => {
            return config
                .endpoints
                .iter()
                .map(|ep| silent(ep, e.to_string()))
                .collect()
        }
    };
    // A worker of its own drives the asks ([`run_on`] waits on a channel, never `block_on`, so
    // this may be called from a thread that is inside another runtime).
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            return config
                .endpoints
                .iter()
                .map(|ep| silent(ep, format!("no runtime: {e}")))
                .collect()
        }
    };
    let timeout = config.call_timeout();
    let asks = config.endpoints.clone().into_iter().map(|endpoint| {
        let options = options.clone();
        async move {
            let ask = async {
                let mut client = Client::connect([endpoint.as_str()], Some(options))
                    .await
                    .map_err(short)?;
                client.status().await.map_err(short)
            };
            let state = match tokio::time::timeout(timeout, ask).await {
                Ok(Ok(status)) if status.leader() != 0 => EndpointState::Leader(status.leader()),
                Ok(Ok(_)) => EndpointState::NoLeader,
                Ok(Err(e)) => EndpointState::Silent(e),
                Err(_) => {
                    EndpointState::Silent(format!("no answer within {} ms", timeout.as_millis()))
                }
            };
            EndpointProbe { endpoint, state }
        }
    });
    let asks: Vec<_> = asks.collect();
    let all = async move {
        let handles: Vec<_> = asks.into_iter().map(tokio::spawn).collect();
        let mut out = Vec::with_capacity(handles.len());
        for h in handles {
            out.push(h.await.map_err(|e| DcsError::Unavailable(e.to_string()))?);
        }
        Ok(out)
    };
    // One bound for all: the asks run side by side, each within `timeout`.
    let probes = run_on(&runtime, timeout * 2, all).unwrap_or_else(|e| {
        config
            .endpoints
            .iter()
            .map(|ep| silent(ep, e.to_string()))
            .collect()
    });
    // Without waiting for connections still being torn down.
    runtime.shutdown_background();
    probes
}
