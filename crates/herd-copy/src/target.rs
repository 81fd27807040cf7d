//! Reaching a copy's target: a libpq URL (or key=value string) of any PostgreSQL 15 server,
//! another Herd cluster's endpoint included.

use std::str::FromStr;
use std::time::Duration;

use tokio_postgres::{Client, Config, NoTls};

use crate::CopyError;

/// The oldest target Herd creates subscriptions on: row filters and column lists need 15.
const MIN_TARGET_VERSION: i32 = 150_000;

/// Parses a target URL; the error says what is wrong without repeating a password.
pub fn parse(url: &str) -> Result<Config, CopyError> {
    let mut config = Config::from_str(url).map_err(|e| {
        CopyError::Invalid(format!(
            "the target {} is not a valid PostgreSQL URL: {e}",
            redacted(url)
        ))
    })?;
    if config.get_connect_timeout().is_none() {
        config.connect_timeout(Duration::from_secs(10));
    }
    config.application_name("herd copy");
    Ok(config)
}

/// The target for people to read: `user@host:port/database`, never the password.
pub fn redacted(url: &str) -> String {
    let Ok(config) = Config::from_str(url) else {
        return "(unparsable URL)".into();
    };
    let host = match config.get_hosts().first() {
        Some(tokio_postgres::config::Host::Tcp(h)) => h.clone(),
        Some(tokio_postgres::config::Host::Unix(p)) => p.display().to_string(),
        None => "localhost".into(),
    };
    let port = config.get_ports().first().copied().unwrap_or(5432);
    let user = config.get_user().unwrap_or("?");
    let db = config.get_dbname().unwrap_or(user);
    format!("{user}@{host}:{port}/{db}")
}

/// Connects to the target (plain TCP or socket, no TLS) and checks its version.
pub async fn connect(url: &str) -> Result<Client, CopyError> {
    let config = parse(url)?;
    let (client, connection) = config
        .connect(NoTls)
        .await
        .map_err(|e| CopyError::sql(format!("connecting to the target {}", redacted(url)), &e))?;
    tokio::spawn(async move {
        // Ends when the client drops or the server goes away; either is reported by the calls.
        let _ = connection.await;
    });
    let version: i32 = client
        .query_one("select current_setting('server_version_num')::int", &[])
        .await
        .map_err(|e| CopyError::sql("reading the target's version", &e))?
        .get(0);
    if version < MIN_TARGET_VERSION {
        return Err(CopyError::Invalid(format!(
            "the target {} runs PostgreSQL {}; copies need 15 or later (row filters and column lists)",
            redacted(url),
            version / 10_000
        )));
    }
    Ok(client)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn redacted_never_shows_the_password() {
        assert_eq!(
            redacted("postgresql://app:s3cret@10.0.0.5:6432/shop"),
            "app@10.0.0.5:6432/shop"
        );
        assert_eq!(
            redacted("host=h port=5 user=u password=s3cret dbname=d"),
            "u@h:5/d"
        );
        assert!(!redacted("postgresql://a:s3cret@").contains("s3cret"));
        assert!(parse("postgresql://a:s3cret@h:notaport/db")
            .expect_err("bad port")
            .to_string()
            .contains("not a valid"));
    }
}
