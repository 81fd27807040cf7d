//! Reaching a copy's target: a libpq URL (or key=value string) of any PostgreSQL 15 server,
//! another Herd cluster's endpoint included. A key=value string may ask for verified TLS with
//! libpq's `sslmode=verify-full sslrootcert=FILE` (what Herd writes for a shard move's target
//! in a cluster with a CA); tokio-postgres knows neither, so they are taken out here and done
//! with [`herd_pg::ClientTls`].

use std::path::PathBuf;
use std::str::FromStr;
use std::time::Duration;

use tokio_postgres::{Client, Config};

use crate::CopyError;

/// The oldest target Herd creates subscriptions on: row filters and column lists need 15.
const MIN_TARGET_VERSION: i32 = 150_000;

/// Parses a target URL; the error says what is wrong without repeating a password.
pub fn parse(url: &str) -> Result<Config, CopyError> {
    Ok(parse_tls(url)?.0)
}

/// [`parse`], and the CA file when the string asks for `sslmode=verify-full`.
fn parse_tls(url: &str) -> Result<(Config, Option<PathBuf>), CopyError> {
    let (rest, ca) = split_tls(url)?;
    let mut config = Config::from_str(&rest).map_err(|e| {
        CopyError::Invalid(format!(
            "the target {} is not a valid PostgreSQL URL: {e}",
            redacted(url)
        ))
    })?;
    if config.get_connect_timeout().is_none() {
        config.connect_timeout(Duration::from_secs(10));
    }
    config.application_name("herd copy");
    Ok((config, ca))
}

/// Takes `sslmode=verify-full` and `sslrootcert=FILE` out of a key=value `conninfo` (URLs are
/// left as they are): the rest, and the CA file when verify-full was asked for.
fn split_tls(conninfo: &str) -> Result<(String, Option<PathBuf>), CopyError> {
    if conninfo.starts_with("postgres://") || conninfo.starts_with("postgresql://") {
        return Ok((conninfo.to_string(), None));
    }
    let mut kept = Vec::new();
    let (mut verify_full, mut root) = (false, None);
    for (key, raw, value) in pairs(conninfo) {
        match (key.as_str(), value.as_str()) {
            ("sslmode", "verify-full") => verify_full = true,
            ("sslrootcert", _) => root = Some(PathBuf::from(value)),
            _ => kept.push(raw),
        }
    }
    match (verify_full, root) {
        (true, Some(root)) => Ok((kept.join(" "), Some(root))),
        (true, None) => Err(CopyError::Invalid(
            "the target asks for sslmode=verify-full without sslrootcert=FILE (the CA that \
             signed its certificate)"
                .into(),
        )),
        (false, Some(_)) => Err(CopyError::Invalid(
            "the target names sslrootcert but not sslmode=verify-full: Herd verifies a \
             target's certificate with verify-full only"
                .into(),
        )),
        (false, None) => Ok((conninfo.to_string(), None)),
    }
}

/// libpq's key=value pairs: (key, the pair as written, the value unquoted). Values are bare
/// words or single-quoted with `\` escapes; what does not parse is kept for tokio-postgres to
/// refuse.
fn pairs(conninfo: &str) -> Vec<(String, String, String)> {
    let chars: Vec<char> = conninfo.chars().collect();
    let mut out = Vec::new();
    let mut i = 0;
    while i < chars.len() {
        while i < chars.len() && chars[i].is_whitespace() {
            i += 1;
        }
        if i == chars.len() {
            break;
        }
        let start = i;
        while i < chars.len() && chars[i] != '=' && !chars[i].is_whitespace() {
            i += 1;
        }
        let key: String = chars[start..i].iter().collect();
        while i < chars.len() && chars[i].is_whitespace() {
            i += 1;
        }
        let mut value = String::new();
        if i < chars.len() && chars[i] == '=' {
            i += 1;
            while i < chars.len() && chars[i].is_whitespace() {
                i += 1;
            }
            let quoted = i < chars.len() && chars[i] == '\'';
            if quoted {
                i += 1;
            }
            while i < chars.len() {
                let c = chars[i];
                if c == '\\' && i + 1 < chars.len() {
                    value.push(chars[i + 1]);
                    i += 2;
                    continue;
                }
                if (quoted && c == '\'') || (!quoted && c.is_whitespace()) {
                    i += usize::from(quoted);
                    break;
                }
                value.push(c);
                i += 1;
            }
        }
        out.push((key, chars[start..i].iter().collect(), value));
    }
    out
}

/// The target for people to read: `user@host:port/database`, never the password.
pub fn redacted(url: &str) -> String {
    let Ok(config) = split_tls(url).and_then(|(rest, _)| {
        Config::from_str(&rest).map_err(|e| CopyError::Invalid(e.to_string()))
    }) else {
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

/// Connects to the target (plain TCP or socket; verified TLS when the key=value string says
/// `sslmode=verify-full sslrootcert=FILE`, never plain then) and checks its version.
pub async fn connect(url: &str) -> Result<Client, CopyError> {
    let (mut config, ca) = parse_tls(url)?;
    let tls = match ca {
        Some(ca) => herd_pg::ClientTls::new(herd_pg::TlsMode::VerifyFull, &ca)?,
        None => None,
    };
    // The connection runs on its own task until the client drops or the server goes away.
    let client = herd_pg::connect_config(&mut config, tls.as_ref())
        .await
        .map_err(|e| CopyError::sql(format!("connecting to the target {}", redacted(url)), &e))?;
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

    #[test]
    fn verify_full_is_taken_out_of_the_string_and_kept_apart() {
        let ca = |text: &str| {
            split_tls(text).map(|(rest, ca)| (rest, ca.map(|p| p.display().to_string())))
        };
        // (the string, what is left of it and the CA file; None: refused)
        type Split<'a> = Option<(&'a str, Option<&'a str>)>;
        let cases: [(&str, Split); 7] = [
            ("host=h port=5", Some(("host=h port=5", None))),
            (
                "host=h sslmode=require",
                Some(("host=h sslmode=require", None)),
            ),
            (
                "host='h' password='it\\'s' sslmode='verify-full' sslrootcert='/d/ca.crt'",
                Some(("host='h' password='it\\'s'", Some("/d/ca.crt"))),
            ),
            (
                "sslrootcert = '/a b/c\\'a.crt' sslmode=verify-full dbname=x",
                Some(("dbname=x", Some("/a b/c'a.crt"))),
            ),
            (
                "postgresql://u@h/d?sslmode=require",
                Some(("postgresql://u@h/d?sslmode=require", None)),
            ),
            ("host=h sslmode=verify-full", None),
            ("host=h sslrootcert=/x", None),
        ];
        for (text, want) in cases {
            let got = ca(text);
            match want {
                Some((rest, file)) => {
                    let (r, f) = got.expect(text);
                    assert_eq!((r.as_str(), f.as_deref()), (rest, file), "{text}");
                }
                None => assert!(got.is_err(), "{text}: {got:?}"),
            }
        }
        assert_eq!(
            redacted(
                "host=h port=5 user=u password=s3cret dbname=d sslmode=verify-full sslrootcert=/c"
            ),
            "u@h:5/d"
        );
    }
}
