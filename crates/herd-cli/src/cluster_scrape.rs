//! `/cluster/metrics` of a process that follows the store (`herd proxy --api-listen`, `herd
//! agent --dashboard-listen`): the `/metrics` of every agent (the `api` of each member record,
//! every group) and of every proxy with an API (its registration), fetched concurrently with a
//! bound of [`BOUND`] each, merged by `herd_api::cluster_metrics`. A process that stops
//! answering is reported `herd_scrape_up 0`; one whose record expired from the store is still
//! reported so for [`FORGET_AFTER`], so a dead agent shows as down rather than vanishing.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use herd_agent::store::StoreClient;
use herd_api::cluster_metrics::Scrape;
use herd_api::{ClusterMetricsSource, MetricsSource};

/// How long each process has to answer.
pub const BOUND: Duration = Duration::from_secs(1);
/// How long a process no longer listed in the store is still reported (as down).
pub const FORGET_AFTER: Duration = Duration::from_secs(600);
/// How long the store's lists may take (a store cut off must not hold the page).
const LIST_BOUND: Duration = Duration::from_secs(2);

/// One process to scrape.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Target {
    /// Its API's `host:port`.
    pub instance: String,
    /// `agent` or `proxy`.
    pub process: &'static str,
}

/// Processes seen lately: instance → (kind, last listed).
type Known = BTreeMap<String, (&'static str, Instant)>;

/// What to scrape at `now`: `listed` (the store's list now) and what was listed within
/// [`FORGET_AFTER`]; `known` remembers them. Sorted by kind, then address.
pub fn remember(known: &mut Known, listed: Vec<Target>, now: Instant) -> Vec<Target> {
    for t in listed {
        known.insert(t.instance, (t.process, now));
    }
    known.retain(|_, (_, seen)| now.saturating_duration_since(*seen) < FORGET_AFTER);
    let mut targets: Vec<Target> = known
        .iter()
        .map(|(instance, (process, _))| Target {
            instance: instance.clone(),
            process,
        })
        .collect();
    targets.sort_by(|a, b| (a.process, &a.instance).cmp(&(b.process, &b.instance)));
    targets
}

/// Every member's and registered proxy's API in the store now (empty when it does not answer
/// within [`LIST_BOUND`]: those remembered are still scraped).
async fn listed(root: &StoreClient) -> Vec<Target> {
    let read = async {
        let mut targets = Vec::new();
        if let Ok(reads) = crate::store_view::read_groups(root).await {
            for r in reads {
                targets.extend(r.store.members.into_iter().map(|m| Target {
                    instance: m.api,
                    process: "agent",
                }));
            }
        }
        if let Ok(apis) = crate::proxy_registry::apis(&root.dcs()).await {
            targets.extend(apis.into_iter().map(|instance| Target {
                instance,
                process: "proxy",
            }));
        }
        targets
    };
    tokio::time::timeout(LIST_BOUND, read)
        .await
        .unwrap_or_default()
}

/// `GET http://instance/metrics` within [`BOUND`]; its text when it answered 200.
async fn fetch(instance: String, token: Option<Arc<str>>) -> Option<String> {
    let url = format!("http://{instance}/metrics");
    let get = tokio::task::spawn_blocking(move || {
        let agent = ureq::AgentBuilder::new()
            .timeout_connect(BOUND)
            .timeout(BOUND)
            .build();
        let mut request = agent.get(&url);
        if let Some(token) = &token {
            request = request.set("Authorization", &format!("Bearer {token}"));
        }
        request.call().ok()?.into_string().ok()
    });
    // The blocking call ends by its own bound; this one is for a pool that is slow to start it.
    tokio::time::timeout(BOUND + Duration::from_millis(500), get)
        .await
        .ok()?
        .ok()?
}

/// The source of `/cluster/metrics`: `own` (this process's address and its `/metrics`) is
/// rendered here rather than fetched; `token` is sent to the others (proxies' APIs beyond
/// 127.0.0.1 want one: the cluster's secrets directory copied to each proxy holds the same).
pub fn source(
    root: StoreClient,
    own: Option<(String, MetricsSource)>,
    token: Option<Arc<str>>,
) -> ClusterMetricsSource {
    let known: Arc<Mutex<Known>> = Arc::default();
    Arc::new(move || {
        let (root, own, token, known) = (root.clone(), own.clone(), token.clone(), known.clone());
        Box::pin(async move {
            let mut now = listed(&root).await;
            if let Some((instance, _)) = &own {
                now.push(Target {
                    instance: instance.clone(),
                    process: "proxy",
                });
            }
            let targets = {
                let mut known = known.lock().unwrap_or_else(|p| p.into_inner());
                remember(&mut known, now, Instant::now())
            };
            let mut fetches = tokio::task::JoinSet::new();
            for (i, t) in targets.iter().enumerate() {
                match &own {
                    Some((instance, render)) if *instance == t.instance => {
                        let text = render();
                        fetches.spawn(async move { (i, Some(text)) });
                    }
                    _ => {
                        let fetch = fetch(t.instance.clone(), token.clone());
                        fetches.spawn(async move { (i, fetch.await) });
                    }
                }
            }
            let mut texts = vec![None; targets.len()];
            while let Some(done) = fetches.join_next().await {
                if let Ok((i, text)) = done {
                    texts[i] = text;
                }
            }
            targets
                .into_iter()
                .zip(texts)
                .map(|(t, text)| Scrape {
                    instance: t.instance,
                    process: t.process,
                    text,
                })
                .collect()
        })
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(instance: &str, process: &'static str) -> Target {
        Target {
            instance: instance.into(),
            process,
        }
    }

    #[test]
    fn a_process_gone_from_the_store_is_reported_until_forgotten() {
        let mut known = Known::new();
        let start = Instant::now();
        let first = remember(
            &mut known,
            vec![t("h:2", "agent"), t("h:9", "proxy"), t("h:1", "agent")],
            start,
        );
        assert_eq!(
            first,
            [t("h:1", "agent"), t("h:2", "agent"), t("h:9", "proxy")]
        );
        // h:2's record expired: still scraped (and reported down when it does not answer).
        let later = start + Duration::from_secs(60);
        let next = remember(
            &mut known,
            vec![t("h:1", "agent"), t("h:9", "proxy")],
            later,
        );
        assert_eq!(next.len(), 3);
        // Long gone: forgotten; a process listed again is back.
        let much_later = start + FORGET_AFTER + Duration::from_secs(1);
        let last = remember(&mut known, vec![t("h:1", "agent")], much_later);
        assert_eq!(last, [t("h:1", "agent"), t("h:9", "proxy")]);
        let back = remember(&mut known, vec![t("h:2", "agent")], much_later);
        assert_eq!(back.len(), 3);
    }
}
