//! The parts of a statement with a data-modifying `WITH`, each planned as a statement of
//! its own.

use serde_json::Value;

use super::{facts_of, KeyFacts};

/// The parts of a statement with a data-modifying top-level `WITH` (see
/// [`KeyFacts::with_parts`]); empty when its `WITH` is not at the top level.
pub(super) fn with_parts(node: &Value, ctes: &[String]) -> Vec<KeyFacts> {
    let Some((kind, body)) = ["SelectStmt", "InsertStmt", "UpdateStmt", "DeleteStmt"]
        .iter()
        .find_map(|k| node.get(*k).map(|b| (*k, b)))
    else {
        return Vec::new();
    };
    let Some(list) = body["with_clause"]["ctes"].as_array() else {
        return Vec::new();
    };
    let mut parts: Vec<KeyFacts> = list
        .iter()
        .map(|c| facts_of(&c["node"]["CommonTableExpr"]["ctequery"]["node"]))
        .collect();
    let mut rest = body.clone();
    if let Some(m) = rest.as_object_mut() {
        m.remove("with_clause");
    }
    let mut main = facts_of(&serde_json::json!({ kind: rest }));
    main.ctes = ctes.to_vec();
    // A CTE's name read at the top level is not a table.
    main.tables.retain(|t| !ctes.contains(&t.name));
    main.inner_tables.retain(|t| !ctes.contains(&t.name));
    parts.push(main);
    parts
}
