//! Roles on every shard group. A client's SCRAM proof opens a server connection only where its
//! role has the same verifier (salt included), and a statement routed to group 2 runs there as
//! the client's role: so every group must hold group 0's roles, attributes, verifiers and
//! memberships. Herd copies them from group 0 (where role statements run) to the other groups:
//! after each role statement through the endpoint, and when a database's shard map is first
//! loaded (roles made directly on group 0 arrive then). Roles are dropped on the other groups
//! only when dropped through the endpoint: a role an operator made on one group is not Herd's.

use std::collections::{BTreeMap, BTreeSet};

use tokio_postgres::Client;

use crate::{ProxyContext, ProxyError};

/// Roles Herd manages itself on each group (the bootstrap superuser, oid 10, is left out by
/// oid): the replication role has a verifier of its own per group.
const OWN_ROLES: [&str; 1] = ["replicator"];

/// One role as `pg_authid` holds it: every attribute an `ALTER ROLE` can set.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Role {
    superuser: bool,
    inherit: bool,
    create_role: bool,
    create_db: bool,
    login: bool,
    replication: bool,
    bypass_rls: bool,
    connection_limit: i32,
    password: Option<String>,
    valid_until: Option<String>,
}

const ROLES_SQL: &str = "SELECT rolname::text, rolsuper, rolinherit, rolcreaterole, rolcreatedb, \
     rolcanlogin, rolreplication, rolbypassrls, rolconnlimit, rolpassword, rolvaliduntil::text \
     FROM pg_authid WHERE oid <> 10 AND rolname !~ '^pg_' AND rolname <> ALL($1)";

const MEMBERS_SQL: &str = "SELECT r.rolname::text, m.rolname::text, am.admin_option \
     FROM pg_auth_members am JOIN pg_roles r ON r.oid = am.roleid \
     JOIN pg_roles m ON m.oid = am.member WHERE m.oid <> 10";

fn failed(what: &str, e: impl std::fmt::Display) -> ProxyError {
    ProxyError::Server {
        code: "XX000".into(),
        message: format!("{what}: {e}"),
    }
}

async fn roles(client: &Client) -> Result<BTreeMap<String, Role>, ProxyError> {
    let own: Vec<&str> = OWN_ROLES.to_vec();
    let rows = client
        .query(ROLES_SQL, &[&own])
        .await
        .map_err(|e| failed("reading roles", e))?;
    Ok(rows
        .iter()
        .map(|r| {
            (
                r.get(0),
                Role {
                    superuser: r.get(1),
                    inherit: r.get(2),
                    create_role: r.get(3),
                    create_db: r.get(4),
                    login: r.get(5),
                    replication: r.get(6),
                    bypass_rls: r.get(7),
                    connection_limit: r.get(8),
                    password: r.get(9),
                    valid_until: r.get(10),
                },
            )
        })
        .collect())
}

async fn memberships(client: &Client) -> Result<BTreeSet<(String, String, bool)>, ProxyError> {
    let rows = client
        .query(MEMBERS_SQL, &[])
        .await
        .map_err(|e| failed("reading role memberships", e))?;
    Ok(rows
        .iter()
        .map(|r| (r.get(0), r.get(1), r.get(2)))
        .collect())
}

/// A quoted SQL identifier.
pub(crate) fn ident(name: &str) -> String {
    format!("\"{}\"", name.replace('"', "\"\""))
}

/// A quoted SQL string literal.
pub(crate) fn literal(text: &str) -> String {
    format!("'{}'", text.replace('\'', "''"))
}

/// `ALTER ROLE` setting every attribute of `role`.
fn alter_sql(name: &str, role: &Role) -> String {
    let flag = |on: bool, word: &str| {
        if on {
            word.to_string()
        } else {
            format!("NO{word}")
        }
    };
    format!(
        "ALTER ROLE {} WITH {} {} {} {} {} {} {} CONNECTION LIMIT {} PASSWORD {} VALID UNTIL {}",
        ident(name),
        flag(role.superuser, "SUPERUSER"),
        flag(role.inherit, "INHERIT"),
        flag(role.create_role, "CREATEROLE"),
        flag(role.create_db, "CREATEDB"),
        flag(role.login, "LOGIN"),
        flag(role.replication, "REPLICATION"),
        flag(role.bypass_rls, "BYPASSRLS"),
        role.connection_limit,
        role.password.as_deref().map_or("NULL".into(), literal),
        literal(role.valid_until.as_deref().unwrap_or("infinity")),
    )
}

/// The statements that make a group with `have` roles and memberships hold `want`'s. Roles
/// only the group holds are left alone (an operator may have made them there), except those in
/// `dropped`, which were just dropped on group 0 through the endpoint.
fn plan_sync(
    want: &BTreeMap<String, Role>,
    have: &BTreeMap<String, Role>,
    want_members: &BTreeSet<(String, String, bool)>,
    have_members: &BTreeSet<(String, String, bool)>,
    dropped: &[String],
) -> Vec<String> {
    let mut sql = Vec::new();
    for (name, role) in want {
        match have.get(name) {
            Some(h) if h == role => {}
            Some(_) => sql.push(alter_sql(name, role)),
            None => {
                sql.push(format!("CREATE ROLE {}", ident(name)));
                sql.push(alter_sql(name, role));
            }
        }
    }
    for m in want_members.difference(have_members) {
        let admin = if m.2 { " WITH ADMIN OPTION" } else { "" };
        sql.push(format!("GRANT {} TO {}{admin}", ident(&m.0), ident(&m.1)));
    }
    for m in have_members.difference(want_members) {
        // Only memberships of the roles Herd copies (or predefined ones) are Herd's to revoke.
        if !want.contains_key(&m.1) {
            continue;
        }
        if !want_members.iter().any(|w| w.0 == m.0 && w.1 == m.1) {
            sql.push(format!("REVOKE {} FROM {}", ident(&m.0), ident(&m.1)));
        }
    }
    for name in have
        .keys()
        .filter(|n| !want.contains_key(*n) && dropped.contains(n))
    {
        sql.push(format!("DROP ROLE IF EXISTS {}", ident(name)));
    }
    sql
}

impl ProxyContext {
    /// Copies group 0's roles (attributes, SCRAM verifiers, memberships) to every other group,
    /// and drops there the roles of `dropped` that group 0 no longer has; how many statements
    /// it ran. A statement a group refuses (a role that still owns objects there cannot be
    /// dropped) is logged and the rest go on.
    pub async fn sync_roles(
        &self,
        database: &str,
        dropped: &[String],
    ) -> Result<usize, ProxyError> {
        self.sync_roles_upto(database, dropped, self.groups()).await
    }

    /// [`ProxyContext::sync_roles`] to groups 1 to `groups` − 1 (a group being added counts).
    pub(crate) async fn sync_roles_upto(
        &self,
        database: &str,
        dropped: &[String],
        groups: u32,
    ) -> Result<usize, ProxyError> {
        if groups < 2 {
            return Ok(0);
        }
        let source = self
            .group_client(0, database, "to copy roles from it")
            .await?;
        let want = roles(&source).await?;
        let want_members = memberships(&source).await?;
        let mut ran = 0;
        for g in 1..groups {
            let target = self
                .group_client(g, database, "to copy roles to it")
                .await?;
            let have = roles(&target).await?;
            let have_members = memberships(&target).await?;
            for stmt in plan_sync(&want, &have, &want_members, &have_members, dropped) {
                match target.batch_execute(&stmt).await {
                    Ok(()) => ran += 1,
                    Err(e) => tracing::warn!(group = g, error = %e, "copying roles: {stmt}"),
                }
            }
        }
        Ok(ran)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn role(login: bool, password: &str) -> Role {
        Role {
            superuser: false,
            inherit: true,
            create_role: false,
            create_db: false,
            login,
            replication: false,
            bypass_rls: false,
            connection_limit: -1,
            password: Some(password.into()),
            valid_until: None,
        }
    }

    #[test]
    fn sync_plan() {
        let want: BTreeMap<String, Role> = [
            ("app".to_string(), role(true, "SCRAM-SHA-256$4096:a")),
            ("readers".to_string(), role(false, "x")),
            ("o'neil".to_string(), role(true, "b")),
        ]
        .into();
        let have: BTreeMap<String, Role> = [
            (
                "app".to_string(),
                role(true, "SCRAM-SHA-256$4096:other-salt"),
            ),
            ("readers".to_string(), role(false, "x")),
            ("gone".to_string(), role(true, "c")),
        ]
        .into();
        let want_m: BTreeSet<_> = [("readers".to_string(), "app".to_string(), false)].into();
        let have_m: BTreeSet<_> = [
            ("readers".to_string(), "gone".to_string(), false),
            ("pg_read_all_data".to_string(), "readers".to_string(), false),
        ]
        .into();
        let sql = plan_sync(&want, &have, &want_m, &have_m, &["gone".to_string()]);
        assert_eq!(
            sql,
            vec![
                "ALTER ROLE \"app\" WITH NOSUPERUSER INHERIT NOCREATEROLE NOCREATEDB LOGIN \
                 NOREPLICATION NOBYPASSRLS CONNECTION LIMIT -1 PASSWORD 'SCRAM-SHA-256$4096:a' \
                 VALID UNTIL 'infinity'"
                    .to_string(),
                "CREATE ROLE \"o'neil\"".to_string(),
                "ALTER ROLE \"o'neil\" WITH NOSUPERUSER INHERIT NOCREATEROLE NOCREATEDB LOGIN \
                 NOREPLICATION NOBYPASSRLS CONNECTION LIMIT -1 PASSWORD 'b' VALID UNTIL 'infinity'"
                    .to_string(),
                "GRANT \"readers\" TO \"app\"".to_string(),
                "REVOKE \"pg_read_all_data\" FROM \"readers\"".to_string(),
                "DROP ROLE IF EXISTS \"gone\"".to_string(),
            ]
        );
        assert!(plan_sync(&want, &want, &want_m, &want_m, &[]).is_empty());
        // A role only group g holds, not dropped through the endpoint, is left alone.
        assert!(!plan_sync(&want, &have, &want_m, &have_m, &[])
            .iter()
            .any(|s| s.starts_with("DROP")));
    }
}
