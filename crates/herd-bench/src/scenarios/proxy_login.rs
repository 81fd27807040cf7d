//! The login role of the pooler shapes: connect per transaction (`pgbench -C`) and many
//! clients (whose 1,000 logins, at 4,096 iterations, filled pgbench's own CPU figure).
//!
//! With PostgreSQL's default verifier (4,096 PBKDF2 iterations) pgbench's own client-side
//! SCRAM computation sets the pace of `-C` on a small machine (every target ran at about the
//! direct rate), so the shape could not show what a pooler saves: a backend started per
//! connection. PostgreSQL 15 accepts a pre-hashed verifier with any iteration count, so `-C`
//! logs in as a role of its own whose verifier uses [`LOGIN_ITERATIONS`]; PostgreSQL, Herd's
//! proxy (it reads the verifier from `pg_authid`) and PgBouncer (the verifier in its
//! `auth_file`, server login by SCRAM pass-through) all authenticate it as any SCRAM role. The
//! server side of SCRAM never runs PBKDF2, so only the client's cost changes; the report
//! says so.

use std::hash::{BuildHasher, Hasher};

use crate::cluster::ScratchCluster;
use crate::BenchError;

/// The role `-C` and the many-clients shape log in as.
pub const LOGIN_ROLE: &str = "herd_bench_login";
/// PBKDF2 iterations of its verifier (PostgreSQL's default is 4,096).
pub const LOGIN_ITERATIONS: u32 = 16;

/// Creates [`LOGIN_ROLE`] on the primary at `primary_url` with `password` (stored as a
/// verifier of [`LOGIN_ITERATIONS`] iterations) and lets it read pgbench's tables; the
/// verifier, for PgBouncer's `auth_file`.
pub fn create(
    cluster: &ScratchCluster,
    primary_url: &str,
    password: &str,
) -> Result<String, BenchError> {
    let verifier = herd_scram::Verifier::from_password(password, &salt(), LOGIN_ITERATIONS);
    cluster.psql(
        primary_url,
        &[
            &format!("drop role if exists {LOGIN_ROLE}"),
            &format!("create role {LOGIN_ROLE} login password '{verifier}'"),
            &format!("grant select on all tables in schema public to {LOGIN_ROLE}"),
        ],
    )?;
    Ok(verifier.to_string())
}

/// `url` with its user replaced by `user` (the password stays).
pub fn url_as(url: &str, user: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.to_string();
    };
    let Some((userinfo, host)) = rest.split_once('@') else {
        return url.to_string();
    };
    match userinfo.split_once(':') {
        Some((_, password)) => format!("{scheme}://{user}:{password}@{host}"),
        None => format!("{scheme}://{user}@{host}"),
    }
}

/// 16 salt bytes. A scratch cluster's salt needs to differ between runs, not to be secret:
/// std's per-process random hasher keys are enough.
fn salt() -> [u8; 16] {
    let state = std::collections::hash_map::RandomState::new();
    let mut out = [0u8; 16];
    for (i, chunk) in out.chunks_mut(8).enumerate() {
        let mut h = state.build_hasher();
        h.write_usize(i);
        chunk.copy_from_slice(&h.finish().to_le_bytes());
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn url_as_replaces_the_user_only() {
        assert_eq!(
            url_as("postgresql://postgres:pw@127.0.0.1:5/db?options=x", "r"),
            "postgresql://r:pw@127.0.0.1:5/db?options=x"
        );
        assert_eq!(url_as("postgresql://u@h/db", "r"), "postgresql://r@h/db");
        assert_eq!(url_as("postgresql://h/db", "r"), "postgresql://h/db");
    }

    #[test]
    fn the_verifier_has_the_low_iteration_count() {
        let v = herd_scram::Verifier::from_password("pw", &salt(), LOGIN_ITERATIONS);
        assert!(v.to_string().starts_with("SCRAM-SHA-256$16:"), "{v}");
        assert_ne!(salt(), salt(), "two runs get different salts");
    }
}
