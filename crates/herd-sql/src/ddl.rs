//! What a DDL or utility statement says beyond the tables it names, for planning it across
//! shard groups: the uniqueness it would enforce (a UNIQUE, PRIMARY KEY or EXCLUDE constraint,
//! a unique index) and on which columns, a column it renames, VACUUM/ANALYZE, CREATE TABLE …
//! PARTITION OF, and CREATE/DROP DATABASE.

use pg_query::protobuf::{self, node, Node};

/// A constraint or index the statement creates that rejects a row because of another row.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Uniqueness {
    /// What it is, as SQL names it: `PRIMARY KEY`, `UNIQUE`, `EXCLUDE`, `CREATE UNIQUE INDEX`.
    pub what: &'static str,
    /// Its name, if written.
    pub name: Option<String>,
    /// The plain columns it compares for equality (for EXCLUDE: those with the `=`
    /// operator); expressions and other operators are left out.
    pub equal_columns: Vec<String>,
    /// Built on an existing unique index (`… USING INDEX`): its columns are the index's.
    pub using_index: bool,
}

/// CREATE DATABASE or DROP DATABASE.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DatabaseStmt {
    /// `CREATE DATABASE name …`.
    Create {
        /// The database.
        name: String,
    },
    /// `DROP DATABASE [IF EXISTS] name [WITH (FORCE)]`.
    Drop {
        /// The database.
        name: String,
        /// `IF EXISTS`.
        if_exists: bool,
        /// `WITH (FORCE)`: other sessions are terminated.
        force: bool,
    },
    /// `ALTER DATABASE name …` (SET, RESET, RENAME TO, OWNER TO, options).
    Alter {
        /// The database.
        name: String,
        /// `RENAME TO`'s new name.
        new_name: Option<String>,
    },
}

/// DDL facts of one statement (see the module documentation).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DdlFacts {
    /// The table an `ALTER TABLE` or `CREATE INDEX` changes (`schema.name` as written): what
    /// its uniqueness and column changes are about (other tables it names, such as a foreign
    /// key's, are not).
    pub target: Option<String>,
    /// Constraints and indexes that enforce uniqueness, in the order written.
    pub uniqueness: Vec<Uniqueness>,
    /// `ALTER TABLE … RENAME [COLUMN] old TO new`: (old, new).
    pub rename_column: Option<(String, String)>,
    /// A `RenameStmt`'s object type (`OBJECT_TABLE`, `OBJECT_COLUMN`, `OBJECT_TABCONSTRAINT` …).
    pub rename_type: Option<String>,
    /// `VACUUM` (`Some(true)`, which cannot run in a transaction) or `ANALYZE` (`Some(false)`).
    pub vacuum: Option<bool>,
    /// `ALTER TABLE … ALTER COLUMN c TYPE …` and `… DROP COLUMN c`: the columns whose type
    /// changes or that go.
    pub retyped_or_dropped: Vec<String>,
    /// `CREATE TABLE … PARTITION OF parent` or `… INHERITS (parent)`.
    pub inherits: bool,
    /// CREATE or DROP DATABASE.
    pub database: Option<DatabaseStmt>,
    /// `CREATE COLLATION`.
    pub creates_collation: bool,
}

/// DDL facts of a parsed statement (`None` for statements with none of them).
pub(crate) fn ddl_facts(stmt: &Node) -> Option<DdlFacts> {
    let mut f = DdlFacts::default();
    match stmt.node.as_ref()? {
        node::Node::IndexStmt(i) => f.target = i.relation.as_ref().map(relation_name),
        node::Node::AlterTableStmt(a) => f.target = a.relation.as_ref().map(relation_name),
        _ => {}
    }
    match stmt.node.as_ref()? {
        node::Node::IndexStmt(i) if i.unique || i.primary => f.uniqueness.push(Uniqueness {
            what: if i.primary {
                "PRIMARY KEY"
            } else {
                "CREATE UNIQUE INDEX"
            },
            name: Some(i.idxname.clone()).filter(|n| !n.is_empty()),
            equal_columns: i.index_params.iter().filter_map(index_column).collect(),
            using_index: false,
        }),
        node::Node::AlterTableStmt(a) => {
            for cmd in &a.cmds {
                let Some(node::Node::AlterTableCmd(c)) = cmd.node.as_ref() else {
                    continue;
                };
                if matches!(
                    protobuf::AlterTableType::try_from(c.subtype),
                    Ok(protobuf::AlterTableType::AtAlterColumnType
                        | protobuf::AlterTableType::AtDropColumn)
                ) {
                    f.retyped_or_dropped.push(c.name.clone());
                }
                match c.def.as_ref().and_then(|d| d.node.as_ref()) {
                    Some(node::Node::Constraint(k)) => f.uniqueness.extend(constraint(k, None)),
                    Some(node::Node::ColumnDef(col)) => column_def(col, &mut f.uniqueness),
                    Some(node::Node::IndexStmt(i)) if i.unique || i.primary => {
                        f.uniqueness.push(Uniqueness {
                            what: if i.primary { "PRIMARY KEY" } else { "UNIQUE" },
                            name: Some(i.idxname.clone()).filter(|n| !n.is_empty()),
                            equal_columns: i.index_params.iter().filter_map(index_column).collect(),
                            using_index: false,
                        })
                    }
                    _ => {}
                }
            }
        }
        node::Node::CreateStmt(c) => {
            f.inherits = !c.inh_relations.is_empty();
            for elt in &c.table_elts {
                match elt.node.as_ref() {
                    Some(node::Node::Constraint(k)) => f.uniqueness.extend(constraint(k, None)),
                    Some(node::Node::ColumnDef(col)) => column_def(col, &mut f.uniqueness),
                    _ => {}
                }
            }
        }
        node::Node::AlterDatabaseStmt(a) => f.database = Some(alter_database(&a.dbname, None)),
        node::Node::AlterDatabaseSetStmt(a) => f.database = Some(alter_database(&a.dbname, None)),
        node::Node::AlterOwnerStmt(o)
            if o.object_type == protobuf::ObjectType::ObjectDatabase as i32 =>
        {
            let name = o.object.as_deref().and_then(string)?;
            f.database = Some(alter_database(&name, None));
        }
        node::Node::RenameStmt(r)
            if r.rename_type == protobuf::ObjectType::ObjectDatabase as i32 =>
        {
            f.database = Some(alter_database(&r.subname, Some(&r.newname)));
        }
        node::Node::RenameStmt(r) => {
            let kind = protobuf::ObjectType::try_from(r.rename_type).ok()?;
            f.rename_type = Some(kind.as_str_name().to_string());
            if kind == protobuf::ObjectType::ObjectColumn {
                f.rename_column = Some((r.subname.clone(), r.newname.clone()));
            }
        }
        node::Node::IndexStmt(_) => {}
        node::Node::VacuumStmt(v) => f.vacuum = Some(v.is_vacuumcmd),
        node::Node::DefineStmt(d) => {
            f.creates_collation = d.kind == protobuf::ObjectType::ObjectCollation as i32
        }
        node::Node::CreatedbStmt(c) => {
            f.database = Some(DatabaseStmt::Create {
                name: c.dbname.clone(),
            })
        }
        node::Node::DropdbStmt(d) => f.database = Some(DatabaseStmt::Drop {
            name: d.dbname.clone(),
            if_exists: d.missing_ok,
            force: d.options.iter().any(
                |o| matches!(o.node.as_ref(), Some(node::Node::DefElem(e)) if e.defname == "force"),
            ),
        }),
        _ => return None,
    }
    Some(f)
}

fn alter_database(name: &str, new_name: Option<&str>) -> DatabaseStmt {
    DatabaseStmt::Alter {
        name: name.to_string(),
        new_name: new_name.map(str::to_string),
    }
}

/// `schema.name`, or `name`, as written.
fn relation_name(r: &protobuf::RangeVar) -> String {
    if r.schemaname.is_empty() {
        r.relname.clone()
    } else {
        format!("{}.{}", r.schemaname, r.relname)
    }
}

/// A column definition's own UNIQUE / PRIMARY KEY constraints (on that column).
fn column_def(col: &protobuf::ColumnDef, out: &mut Vec<Uniqueness>) {
    for k in &col.constraints {
        if let Some(node::Node::Constraint(k)) = k.node.as_ref() {
            out.extend(constraint(k, Some(&col.colname)));
        }
    }
}

/// A table or column constraint that enforces uniqueness (`column`: the column it is written
/// on, for a column constraint).
fn constraint(k: &protobuf::Constraint, column: Option<&str>) -> Option<Uniqueness> {
    let what = match protobuf::ConstrType::try_from(k.contype).ok()? {
        protobuf::ConstrType::ConstrPrimary => "PRIMARY KEY",
        protobuf::ConstrType::ConstrUnique => "UNIQUE",
        protobuf::ConstrType::ConstrExclusion => "EXCLUDE",
        _ => return None,
    };
    let mut equal_columns: Vec<String> = k.keys.iter().filter_map(string).collect();
    if what == "EXCLUDE" {
        // Each exclusion is a List of (IndexElem, operator name list).
        equal_columns = k
            .exclusions
            .iter()
            .filter_map(|e| match e.node.as_ref() {
                Some(node::Node::List(l)) => {
                    let [elem, op] = l.items.as_slice() else {
                        return None;
                    };
                    let op_name = match op.node.as_ref() {
                        Some(node::Node::List(o)) => o.items.last().and_then(string),
                        _ => None,
                    };
                    (op_name.as_deref() == Some("="))
                        .then(|| index_column(elem))
                        .flatten()
                }
                _ => None,
            })
            .collect();
    } else if equal_columns.is_empty() && k.indexname.is_empty() {
        equal_columns.extend(column.map(str::to_string));
    }
    Some(Uniqueness {
        what,
        name: Some(k.conname.clone()).filter(|n| !n.is_empty()),
        equal_columns,
        using_index: !k.indexname.is_empty(),
    })
}

/// An index element that is a plain column: its name.
fn index_column(elem: &Node) -> Option<String> {
    match elem.node.as_ref() {
        Some(node::Node::IndexElem(e)) if e.expr.is_none() && !e.name.is_empty() => {
            Some(e.name.clone())
        }
        _ => None,
    }
}

fn string(n: &Node) -> Option<String> {
    match n.node.as_ref() {
        Some(node::Node::String(s)) => Some(s.sval.clone()),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn facts(sql: &str) -> DdlFacts {
        crate::key_facts(sql)
            .and_then(|f| f.ddl.map(|d| *d))
            .unwrap_or_default()
    }

    /// What a uniqueness is, its equality columns, and whether it takes an existing index.
    type Seen = (&'static str, Vec<String>, bool);

    fn uniq(sql: &str) -> Vec<Seen> {
        facts(sql)
            .uniqueness
            .into_iter()
            .map(|u| (u.what, u.equal_columns, u.using_index))
            .collect()
    }

    fn cols(c: &[&str]) -> Vec<String> {
        c.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn uniqueness_and_its_columns() {
        let cases: Vec<(&str, Vec<Seen>)> = vec![
            (
                "create unique index on users (email)",
                vec![("CREATE UNIQUE INDEX", cols(&["email"]), false)],
            ),
            (
                "create unique index u on users (lower(email), tenant)",
                vec![("CREATE UNIQUE INDEX", cols(&["tenant"]), false)],
            ),
            ("create index on users (email)", vec![]),
            (
                "alter table users add unique (email, tenant)",
                vec![("UNIQUE", cols(&["email", "tenant"]), false)],
            ),
            (
                "alter table users add constraint pk primary key (id)",
                vec![("PRIMARY KEY", cols(&["id"]), false)],
            ),
            (
                "alter table users add constraint pk primary key using index users_idx",
                vec![("PRIMARY KEY", vec![], true)],
            ),
            (
                "alter table users add column code text unique",
                vec![("UNIQUE", cols(&["code"]), false)],
            ),
            (
                "alter table r add exclude using gist (tenant with =, during with &&)",
                vec![("EXCLUDE", cols(&["tenant"]), false)],
            ),
            (
                "create table t (id int primary key, e text, unique (e, id))",
                vec![
                    ("PRIMARY KEY", cols(&["id"]), false),
                    ("UNIQUE", cols(&["e", "id"]), false),
                ],
            ),
            ("alter table users add check (id > 0)", vec![]),
        ];
        for (sql, want) in cases {
            assert_eq!(uniq(sql), want, "{sql}");
        }
    }

    #[test]
    fn renames_vacuum_partitions_and_databases() {
        assert_eq!(
            facts("alter table users rename column email to mail").rename_column,
            Some(("email".into(), "mail".into()))
        );
        assert_eq!(
            facts("alter table users rename to people")
                .rename_type
                .as_deref(),
            Some("OBJECT_TABLE")
        );
        assert_eq!(
            facts("alter table users alter column k type int8, drop column x, add column y int")
                .retyped_or_dropped,
            vec!["k".to_string(), "x".to_string()]
        );
        assert_eq!(
            facts("alter table s.t add foreign key (a) references orders (id)").target,
            Some("s.t".into())
        );
        assert_eq!(
            facts("create unique index on users (email)").target,
            Some("users".into())
        );
        assert_eq!(facts("create table t (a int)").target, None);
        assert_eq!(facts("vacuum users").vacuum, Some(true));
        assert_eq!(facts("vacuum (analyze) users").vacuum, Some(true));
        assert_eq!(facts("analyze users").vacuum, Some(false));
        assert!(facts("create table p1 partition of orders for values in (1)").inherits);
        assert!(!facts("create table p1 (a int)").inherits);
        assert_eq!(
            facts("create database shop owner bob").database,
            Some(DatabaseStmt::Create {
                name: "shop".into()
            })
        );
        assert_eq!(
            facts("drop database if exists \"Shop\" with (force)").database,
            Some(DatabaseStmt::Drop {
                name: "Shop".into(),
                if_exists: true,
                force: true
            })
        );
        assert!(facts("create collation ci (provider = icu, locale = 'und')").creates_collation);
        assert!(!facts("create aggregate a (int) (sfunc = int4pl, stype = int)").creates_collation);
        for (sql, name, new_name) in [
            ("alter database shop set timezone = 'UTC'", "shop", None),
            ("alter database shop reset all", "shop", None),
            ("alter database shop connection limit 5", "shop", None),
            ("alter database shop owner to bob", "shop", None),
            (
                "alter database shop rename to store",
                "shop",
                Some("store".to_string()),
            ),
        ] {
            assert_eq!(
                facts(sql).database,
                Some(DatabaseStmt::Alter {
                    name: name.into(),
                    new_name
                }),
                "{sql}"
            );
        }
        assert_eq!(facts("alter table t owner to bob").database, None);
        assert_eq!(facts("select 1"), DdlFacts::default());
    }
}
