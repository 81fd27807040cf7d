//! `herd switchover`, `herd failover`, `herd restart`, `herd group add` (and a restore point
//! across groups): requests to the running `herd up` through its HTTP API (`proxy_api.rs`
//! carries them out through the store).

use anyhow::{bail, Context};
use herd_cluster::{read_supervisor, Layout};

/// POSTs `path` to the running `herd up` and prints its answer.
pub async fn request(layout: &Layout, path: String) -> anyhow::Result<()> {
    let response = request_text(layout, path).await?;
    crate::output::emitln!("{response}");
    Ok(())
}

/// POSTs `path` to the running `herd up` and returns its answer.
pub async fn request_text(layout: &Layout, path: String) -> anyhow::Result<String> {
    let Some(sup) = read_supervisor(layout) else {
        bail!(
            "no Herd cluster runs for {}; start it with `herd up`",
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
            Err(e) => Err(anyhow::anyhow!(
                "cannot reach the HTTP API of `herd up`: {e}"
            )),
        }
    })
    .await
    .context("the request thread failed")??;
    Ok(response)
}
