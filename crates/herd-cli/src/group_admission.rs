//! Admitting a shard group as the cluster's coordinator's work: `herd group add --dcs` records a
//! group (`shard_groups.count` raised, `admitted` below it); the agent holding the coordinator
//! lease (`coordinator_tasks.rs`) notices it, waits until the group has a primary, picks a
//! registered `herd proxy` that serves an HTTP API (its registration's `api`,
//! `proxy_registry.rs`) and asks it to admit the group (`POST /groups`,
//! `proxy_group_add.rs`), retrying with back-off (another registered proxy each time) until the
//! store records the admission. `herd group add --dcs` without `--proxy-api` follows that.
//!
//! One admission at a time: before it posts, the admitter (the coordinator, or `herd group add
//! --proxy-api`) takes the group's record `group_admissions/<g>` by compare-and-set, and
//! nobody else posts while that record says `admitting` (a claim older than the longest
//! admission, [`CLAIM_LIFE`], is taken over: its writer died). The outcome goes into the same
//! record, which is what the command shows.
//!
//! The API token: a proxy whose API listens beyond loopback asks for the token kept in its
//! data directory (`secrets/api_token`); the coordinator sends the one in its agent's data
//! directory, so that file is copied there (0600) as the other secrets are. Without it the
//! proxy refuses (401) and the record says so.

use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{bail, Context};
use herd_agent::store::StoreClient;
use herd_cluster::{Layout, Secrets};
use herd_dcs::{Dcs, GROUP_ADMISSIONS};
use serde::{Deserialize, Serialize};
use tokio::sync::watch;

/// How often the coordinator and the command look.
const POLL: Duration = Duration::from_secs(1);
/// The longest a proxy's admission may take (the request's timeout) plus a margin: an older
/// `admitting` claim was left by an admitter that died.
pub const CLAIM_LIFE: Duration = Duration::from_secs(330);
/// The request's timeout (the proxy waits for the group's primary, copies what every group
/// shares and holds the other proxies meanwhile).
const POST_TIMEOUT: Duration = Duration::from_secs(300);
/// The longest back-off between failed admissions.
const MAX_BACKOFF: Duration = Duration::from_secs(60);
/// How long the command waits for a coordinator before it says none runs.
const UNTAKEN: Duration = Duration::from_secs(45);
/// How long a coordinator's claim may name a proxy that is no longer registered before it is
/// taken over: the proxy died with the admission (its registration lives 5 s and is renewed
/// every second, so twice that is no passing renewal failure). Another proxy's admission is
/// then safe to start: the map change goes through the store's `map_change` lease, which the
/// dead proxy's expired with its registration.
pub const ABANDONED_AFTER: Duration = Duration::from_secs(10);

/// Where an admission stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum State {
    /// A proxy was asked and has not answered yet.
    Admitting,
    /// The proxy refused or could not be reached; `text` says why. Retried.
    Failed,
    /// The proxy admitted the group; `text` is its answer.
    Admitted,
}

/// One group's admission record (`group_admissions/<g>`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Claim {
    /// The group.
    pub group: u32,
    /// Who asks (`coordinator <agent>` or `herd group add`).
    pub by: String,
    /// The proxy API asked (`HOST:PORT`).
    pub api: String,
    /// Where it stands.
    pub state: State,
    /// What happened last.
    pub text: String,
    /// When written (seconds since the epoch).
    pub at_s: u64,
}

/// What the coordinator sees in one round.
#[derive(Debug)]
pub struct View<'a> {
    /// Groups recorded (`shard_groups.count`).
    pub recorded: u32,
    /// Groups admitted (served by the endpoint).
    pub served: u32,
    /// Whether the first group not admitted has a primary.
    pub primary_up: bool,
    /// The registered proxies' APIs.
    pub apis: &'a [String],
    /// That group's admission record.
    pub claim: Option<&'a Claim>,
    /// How long this coordinator has seen the claim's proxy missing from the registrations
    /// (zero while it is registered).
    pub asked_missing: Duration,
    /// Now (seconds since the epoch).
    pub now_s: u64,
    /// Failed attempts in a row (this coordinator's).
    pub failures: u32,
    /// Whether the back-off after the last failure still runs.
    pub backing_off: bool,
}

/// What the coordinator does this round.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Step {
    /// Every recorded group is admitted.
    Idle,
    /// Group `0` has no primary yet.
    WaitPrimary(u32),
    /// No registered proxy serves an API.
    NoProxy(u32),
    /// An admission of the group is under way (by the named admitter).
    Busy(u32, String),
    /// The last attempt failed; the next waits.
    BackOff(u32),
    /// Ask the proxy at `api` to admit `group`.
    Admit {
        /// The group.
        group: u32,
        /// The proxy's API.
        api: String,
    },
}

impl Step {
    /// One line for the coordinator's log (written when it changes).
    pub fn describe(&self) -> String {
        match self {
            Step::Idle => "every recorded shard group is admitted".into(),
            Step::WaitPrimary(g) => {
                format!("shard group {g} is recorded; waiting for its primary to admit it")
            }
            Step::NoProxy(g) => format!(
                "shard group {g} has a primary, but no registered herd proxy serves an HTTP API \
                 (--api-listen) to admit it"
            ),
            Step::Busy(g, by) => format!("shard group {g} is being admitted by {by}"),
            Step::BackOff(g) => format!("admitting shard group {g} failed; trying again soon"),
            Step::Admit { group, api } => {
                format!("asking the herd proxy at {api} to admit shard group {group}")
            }
        }
    }
}

/// Whether `claim` is an admission under way now (pure).
fn under_way(claim: &Claim, now_s: u64) -> bool {
    claim.state == State::Admitting && now_s.saturating_sub(claim.at_s) < CLAIM_LIFE.as_secs()
}

/// Whether `claim` is a coordinator's admission through a proxy that is not registered (pure).
/// Only coordinators' claims: their `api` was read from the registrations, so it names the
/// proxy exactly; a `herd group add --proxy-api` claim names the address the user typed, which
/// a registration may spell differently (its claim keeps [`CLAIM_LIFE`]).
pub fn asks_missing_proxy(claim: &Claim, apis: &[String]) -> bool {
    claim.state == State::Admitting
        && claim.by.starts_with(COORDINATOR_BY)
        && !apis.contains(&claim.api)
}

/// The coordinator's decision (pure).
pub fn decide(view: &View<'_>) -> Step {
    if view.served >= view.recorded {
        return Step::Idle;
    }
    let group = view.served;
    let abandoned =
        |c: &Claim| asks_missing_proxy(c, view.apis) && view.asked_missing >= ABANDONED_AFTER;
    if let Some(c) = view
        .claim
        .filter(|c| c.group == group && under_way(c, view.now_s) && !abandoned(c))
    {
        return Step::Busy(group, c.by.clone());
    }
    if !view.primary_up {
        return Step::WaitPrimary(group);
    }
    if view.apis.is_empty() {
        return Step::NoProxy(group);
    }
    if view.backing_off {
        return Step::BackOff(group);
    }
    // After a failure, the next registered proxy.
    let api = view.apis[view.failures as usize % view.apis.len()].clone();
    Step::Admit { group, api }
}

/// How long to wait after `failures` failed attempts in a row (pure): 2 s, doubling, at most
/// [`MAX_BACKOFF`].
pub fn backoff(failures: u32) -> Duration {
    if failures == 0 {
        return Duration::ZERO;
    }
    let s = 2u64.saturating_pow(failures.min(16));
    Duration::from_secs(s).min(MAX_BACKOFF)
}

/// How a coordinator's claim names its writer.
const COORDINATOR_BY: &str = "coordinator ";

fn now_s() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

fn key(group: u32) -> String {
    format!("{GROUP_ADMISSIONS}{group}")
}

async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, herd_dcs::DcsError> + Send + 'static,
) -> anyhow::Result<T> {
    Ok(tokio::task::spawn_blocking(f)
        .await
        .context("a store call")??)
}

/// Group `group`'s admission record and its revision.
pub async fn read(dcs: &Arc<dyn Dcs>, group: u32) -> anyhow::Result<Option<(Claim, u64)>> {
    let (d, k) = (dcs.clone(), key(group));
    let Some(v) = blocking(move || d.get(&k)).await? else {
        return Ok(None);
    };
    // An unreadable record is treated as none: the next claim writes over it.
    Ok(serde_json::from_slice(&v.value)
        .ok()
        .map(|c| (c, v.revision)))
}

/// Takes group `group`'s admission for `by` asking `api`: `Err` with the record when another
/// admission is under way, else the revision written. A claim equal to `abandoned` (one the
/// caller saw name a proxy gone for [`ABANDONED_AFTER`]) is taken over; the compare-and-set
/// keeps a claim written meanwhile.
pub async fn claim(
    dcs: &Arc<dyn Dcs>,
    group: u32,
    by: &str,
    api: &str,
    abandoned: Option<&Claim>,
) -> anyhow::Result<Result<u64, Claim>> {
    let now = read(dcs, group).await?;
    if let Some((c, _)) = now
        .as_ref()
        .filter(|(c, _)| under_way(c, now_s()) && Some(c) != abandoned)
    {
        return Ok(Err(c.clone()));
    }
    let record = Claim {
        group,
        by: by.to_string(),
        api: api.to_string(),
        state: State::Admitting,
        text: format!("asking the herd proxy at {api} to admit shard group {group}"),
        at_s: now_s(),
    };
    let (d, k, value) = (dcs.clone(), key(group), serde_json::to_vec(&record)?);
    let revision = now.map_or(0, |(_, r)| r);
    match blocking(move || d.compare_and_set(&k, revision, value)).await {
        Ok(written) => Ok(Ok(written)),
        // Another admitter wrote first: it runs.
        Err(_) => match read(dcs, group).await? {
            Some((c, _)) => Ok(Err(c)),
            None => bail!("the admission record of shard group {group} could not be written"),
        },
    }
}

/// Writes the outcome into `by`'s claim under way (not over another's claim).
pub async fn finish(dcs: &Arc<dyn Dcs>, group: u32, by: &str, state: State, text: &str) {
    let written = async {
        let Some((mut c, revision)) = read(dcs, group).await? else {
            return Ok(());
        };
        if c.by != by || c.state != State::Admitting {
            return Ok(());
        }
        c.state = state;
        c.text = text.to_string();
        c.at_s = now_s();
        let (d, k, value) = (dcs.clone(), key(group), serde_json::to_vec(&c)?);
        blocking(move || d.compare_and_set(&k, revision, value)).await?;
        anyhow::Ok(())
    }
    .await;
    if let Err(e) = written {
        tracing::warn!("recording the admission of shard group {group}: {e:#}");
    }
}

/// `POST /groups` on the proxy's API at `api` (with the API token when one is kept): the
/// proxy's answer.
pub async fn post_groups(api: &str, token: Option<String>) -> anyhow::Result<String> {
    let url = format!("http://{api}/groups");
    tokio::task::spawn_blocking(move || {
        let mut request = ureq::post(&url).timeout(POST_TIMEOUT);
        if let Some(t) = token {
            request = request.set("Authorization", &format!("Bearer {t}"));
        }
        match request.call() {
            Ok(r) => Ok(r.into_string().unwrap_or_default()),
            Err(ureq::Error::Status(401, _)) => Err(anyhow::anyhow!(
                "the herd proxy at {url} asks for its API token: copy its secrets/api_token \
                 (0600) into this data directory's secrets/"
            )),
            Err(ureq::Error::Status(_, r)) => Err(anyhow::anyhow!(
                "the herd proxy did not admit the group: {}",
                r.into_string().unwrap_or_default()
            )),
            Err(e) => Err(anyhow::anyhow!(
                "cannot reach the herd proxy's HTTP API at {url}: {e}"
            )),
        }
    })
    .await
    .context("the request thread failed")?
}

/// Group `g`'s primary's name, if its leader is a primary now.
pub async fn primary_of(root: &StoreClient, g: u32) -> Result<Option<String>, String> {
    let store = StoreClient::new(herd_agent::groups::scoped(root.dcs(), g));
    let read = store.read().await?;
    Ok(read
        .store
        .leader
        .as_deref()
        .and_then(|l| read.store.members.iter().find(|m| m.name == l))
        .filter(|m| m.role == "primary")
        .map(|m| m.name.clone()))
}

/// The coordinator's side: while `held` says the lease is held, admits the groups recorded
/// but not admitted, one at a time. Logs each change of what it does, not each round.
/// Returns when the lease is lost (an admission asked of a proxy goes on there; its claim
/// keeps others from asking again meanwhile).
pub async fn run(root: StoreClient, layout: Layout, me: String, mut held: watch::Receiver<bool>) {
    let dcs = root.dcs();
    let by = format!("{COORDINATOR_BY}{me}");
    let mut failures = 0u32;
    let mut retry_at = Instant::now();
    let mut said = String::new();
    let mut missing = Missing::default();
    while *held.borrow() {
        let step = match round(&root, failures, Instant::now() < retry_at, &mut missing).await {
            Ok(step) => step,
            Err(e) => {
                tracing::debug!("group admission skipped this round: {e:#}");
                None
            }
        };
        if let Some(step) = step {
            let line = step.describe();
            if line != said {
                if step == Step::Idle {
                    tracing::info!("{line}");
                } else {
                    tracing::warn!("{line}");
                }
                said = line;
            }
            if let Step::Admit { group, api } = step {
                let abandoned = missing.abandoned().cloned();
                let (d, l, b, a) = (dcs.clone(), layout.clone(), by.clone(), api.clone());
                // Its own task: a lost lease does not cut the request, so its outcome is still
                // written into the claim (which would otherwise say `admitting` until it ages
                // out) while the next holder waits for it.
                let mut request =
                    tokio::spawn(
                        async move { admit(&d, &l, group, &b, &a, abandoned.as_ref()).await },
                    );
                let outcome = tokio::select! {
                    o = &mut request => o.unwrap_or_else(|e| Err(anyhow::anyhow!("{e}"))),
                    _ = held.wait_for(|h| !*h) => {
                        tracing::warn!(
                            "the coordinator lease was lost while shard group {group} was being \
                             admitted; the proxy goes on and its outcome is recorded, the next \
                             holder follows"
                        );
                        return;
                    }
                };
                match outcome {
                    Ok(Some(answer)) => {
                        failures = 0;
                        tracing::warn!("{}", answer.lines().next().unwrap_or_default());
                    }
                    Ok(None) => {}
                    Err(e) => {
                        failures += 1;
                        retry_at = Instant::now() + backoff(failures);
                        tracing::warn!(
                            "admitting shard group {group} through {api} failed (attempt \
                             {failures}, next in {} s): {e:#}",
                            backoff(failures).as_secs()
                        );
                    }
                }
                said.clear();
            }
        }
        tokio::select! {
            _ = tokio::time::sleep(POLL) => {}
            _ = held.wait_for(|h| !*h) => return,
        }
    }
}

/// Since when this coordinator has seen a claim name a proxy that is not registered.
#[derive(Default)]
struct Missing {
    seen: Option<(Claim, Instant)>,
}

impl Missing {
    /// Notes this round's claim; how long its proxy has been missing.
    fn note(&mut self, claim: Option<&Claim>, apis: &[String]) -> Duration {
        match claim.filter(|c| asks_missing_proxy(c, apis)) {
            Some(c) => {
                if self.seen.as_ref().is_none_or(|(s, _)| s != c) {
                    self.seen = Some((c.clone(), Instant::now()));
                }
                self.seen
                    .as_ref()
                    .map_or(Duration::ZERO, |(_, t)| t.elapsed())
            }
            None => {
                self.seen = None;
                Duration::ZERO
            }
        }
    }

    /// The claim seen missing its proxy for [`ABANDONED_AFTER`].
    fn abandoned(&self) -> Option<&Claim> {
        self.seen
            .as_ref()
            .filter(|(_, t)| t.elapsed() >= ABANDONED_AFTER)
            .map(|(c, _)| c)
    }
}

/// Reads what [`decide`] needs and decides (`None`: the store has no groups yet).
async fn round(
    root: &StoreClient,
    failures: u32,
    backing_off: bool,
    missing: &mut Missing,
) -> anyhow::Result<Option<Step>> {
    let recorded = herd_agent::groups::count(root)
        .await
        .map_err(anyhow::Error::msg)?;
    let served = herd_agent::groups::served(root)
        .await
        .map_err(anyhow::Error::msg)?;
    let (Some(recorded), Some(served)) = (recorded, served) else {
        return Ok(None);
    };
    if served >= recorded {
        return Ok(Some(Step::Idle));
    }
    let dcs = root.dcs();
    let primary_up = primary_of(root, served)
        .await
        .map_err(anyhow::Error::msg)?
        .is_some();
    let apis = crate::proxy_registry::apis(&dcs)
        .await
        .map_err(anyhow::Error::msg)?;
    let claim = read(&dcs, served).await?.map(|(c, _)| c);
    let asked_missing = missing.note(claim.as_ref(), &apis);
    Ok(Some(decide(&View {
        recorded,
        served,
        primary_up,
        apis: &apis,
        claim: claim.as_ref(),
        asked_missing,
        now_s: now_s(),
        failures,
        backing_off,
    })))
}

/// Claims group `group`'s admission (taking over `abandoned`, see [`claim`]) and asks the
/// proxy at `api`; the proxy's answer (`Ok(None)`: another admission was under way).
pub async fn admit(
    dcs: &Arc<dyn Dcs>,
    layout: &Layout,
    group: u32,
    by: &str,
    api: &str,
    abandoned: Option<&Claim>,
) -> anyhow::Result<Option<String>> {
    if claim(dcs, group, by, api, abandoned).await?.is_err() {
        return Ok(None);
    }
    match post_groups(api, Secrets::read_api_token(layout)).await {
        Ok(answer) => {
            finish(dcs, group, by, State::Admitted, &answer).await;
            Ok(Some(answer))
        }
        Err(e) => {
            finish(dcs, group, by, State::Failed, &format!("{e:#}")).await;
            Err(e)
        }
    }
}

/// `herd group add --dcs` without `--proxy-api`: follows group `g`'s admission by the
/// coordinator (within `wait`, saying what the record says as it changes); the proxy's answer.
pub async fn follow(root: &StoreClient, g: u32, wait: Duration) -> anyhow::Result<String> {
    let dcs = root.dcs();
    let began = Instant::now();
    let mut shown = String::new();
    loop {
        let served = herd_agent::groups::served(root)
            .await
            .map_err(anyhow::Error::msg)?
            .unwrap_or(1);
        let claim = read(&dcs, g).await?.map(|(c, _)| c);
        if served > g {
            return Ok(claim
                .filter(|c| c.state == State::Admitted)
                .map_or_else(|| format!("shard group {g} added"), |c| c.text));
        }
        let text = claim.map_or_else(
            || "waiting for the cluster's coordinator to admit it".to_string(),
            |c| c.text,
        );
        if text != shown {
            eprintln!("shard group {g}: {text}");
            shown = text.clone();
        }
        if began.elapsed() > UNTAKEN && shown.starts_with("waiting for the cluster's") {
            let d = dcs.clone();
            let holder =
                blocking(move || d.lease_holder(herd_agent::coordinator::COORDINATOR)).await?;
            if holder.is_none() {
                bail!(
                    "no agent coordinates the cluster (the `coordinator` lease is free), so no \
                     one admits shard group {g}; it is admitted once an agent runs, or run this \
                     command again with --proxy-api HOST:PORT"
                );
            }
        }
        if began.elapsed() >= wait {
            bail!(
                "shard group {g} was not admitted within {} s ({text}); the coordinator goes \
                 on: run the same command again to follow it, or add --proxy-api HOST:PORT",
                wait.as_secs()
            );
        }
        tokio::time::sleep(POLL).await;
    }
}

#[cfg(test)]
mod tests;
