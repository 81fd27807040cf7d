//! The node's passwords: taking up rotated ones, and logging in with the next one during a
//! rotation across hosts (`crate::rotation`).

use herd_cluster::Secrets;
use herd_pg::ConnSpec;

use super::Node;

impl Node {
    /// Takes up the passwords of `secrets/` when they changed (`herd secrets rotate` replaced
    /// them, or an operator copied a rotated directory here): the connections this agent
    /// keeps stay up (already authenticated), the ones it opens next log in with the new
    /// password. Read every round — two small files — so a rotation reaches the agent within
    /// a loop wait. A file that cannot be read keeps the passwords in use.
    pub fn refresh_secrets(&mut self) {
        match Secrets::load(&self.layout) {
            Ok(now) if now != self.secrets => {
                tracing::info!(
                    "the cluster's passwords changed in {}: using the new ones",
                    self.layout.secrets().display()
                );
                self.secrets = now;
            }
            Ok(_) => {}
            Err(e) => tracing::debug!("reading the cluster's passwords: {e}"),
        }
    }

    /// A superuser connection to its own server, with the current password or, during a
    /// rotation across hosts, the next one when the current one is refused.
    pub async fn connect(&self) -> Result<tokio_postgres::Client, herd_pg::PgError> {
        match herd_pg::connect(&self.spec()).await {
            Err(e) => match self.next_spec() {
                Some(next) => herd_pg::connect(&next).await.map_err(|_| e),
                None => Err(e),
            },
            ok => ok,
        }
    }

    /// [`Node::spec`] with the next superuser password, while one is held.
    pub(super) fn next_spec(&self) -> Option<ConnSpec> {
        self.next_superuser.as_ref().map(|next| ConnSpec {
            password: next.clone(),
            ..self.spec()
        })
    }
}
