//! The backups of a stanza, from `pgbackrest info --output=json`.

use serde_json::Value;

use crate::BackupError;

/// One backup in the repository.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BackupInfo {
    /// pgBackRest's label, e.g. `20261128-134001F` (`--set` of a restore).
    pub label: String,
    /// `full`, `diff` or `incr`.
    pub kind: String,
    /// When it started, in seconds since the Unix epoch.
    pub start: i64,
    /// When it ended (the database is consistent from about then on), in seconds since the epoch.
    pub stop: i64,
    /// Size of the database it holds, in bytes.
    pub size: u64,
    /// What it takes in the repository (compressed, this backup's files only), in bytes.
    pub repo_size: u64,
    /// The WAL position from which it is consistent (`lsn.stop`), when pgBackRest reports it.
    pub stop_lsn: Option<herd_core::Lsn>,
    /// The system identifier of the PostgreSQL cluster it holds (the stanza's `db` entry its
    /// `database.id` names), when pgBackRest reports it.
    pub system_id: Option<u64>,
}

/// The backups of `stanza` in pgBackRest's JSON info, oldest first; an empty list when the
/// stanza has none (or does not exist yet).
pub fn parse_info(json: &str, stanza: &str) -> Result<Vec<BackupInfo>, BackupError> {
    let bad = |detail: String| BackupError::Output {
        what: "info",
        detail,
    };
    let doc: Value = serde_json::from_str(json).map_err(|e| bad(e.to_string()))?;
    let stanzas = doc.as_array().ok_or_else(|| bad("not a list".into()))?;
    let Some(entry) = stanzas.iter().find(|s| s["name"] == stanza) else {
        return Ok(Vec::new());
    };
    // The stanza's databases (one, or more after a `stanza-upgrade`), by id.
    let system_of =
        |id: &Value| entry["db"].as_array()?.iter().find(|d| &d["id"] == id)?["system-id"].as_u64();
    let mut out = Vec::new();
    for b in entry["backup"].as_array().map(Vec::as_slice).unwrap_or(&[]) {
        // A backup pgBackRest found damaged is no restore source.
        if b["error"].as_bool() == Some(true) {
            continue;
        }
        let label = b["label"]
            .as_str()
            .ok_or_else(|| bad("a backup without a label".into()))?;
        out.push(BackupInfo {
            label: label.to_string(),
            kind: b["type"].as_str().unwrap_or("?").to_string(),
            start: b["timestamp"]["start"].as_i64().unwrap_or(0),
            stop: b["timestamp"]["stop"].as_i64().unwrap_or(0),
            size: b["info"]["size"].as_u64().unwrap_or(0),
            repo_size: b["info"]["repository"]["delta"].as_u64().unwrap_or(0),
            stop_lsn: b["lsn"]["stop"].as_str().and_then(|l| l.parse().ok()),
            system_id: system_of(&b["database"]["id"]),
        });
    }
    out.sort_by_key(|b| b.stop);
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    const INFO: &str = r#"[{"archive":[{"database":{"id":1,"repo-key":1},"id":"15-1",
      "max":"000000010000000000000006","min":"000000010000000000000003"}],
      "backup":[
        {"label":"20261128-134501F_20261128-134601I","type":"incr","error":false,
         "database":{"id":1,"repo-key":1},
         "timestamp":{"start":1795873560,"stop":1795873562},
         "info":{"size":23000000,"delta":8192,"repository":{"size":3000000,"delta":2000}}},
        {"label":"20261128-134501F","type":"full","error":false,
         "timestamp":{"start":1795873501,"stop":1795873505},
         "lsn":{"start":"0/7000028","stop":"0/7000100"},
         "info":{"size":23000000,"delta":23000000,"repository":{"size":3000000,"delta":3000000}}}
      ],
      "db":[{"id":1,"repo-key":1,"system-id":7442418394873927193,"version":"15"}],
      "name":"herd-g0","status":{"code":0,"message":"ok"}}]"#;

    #[test]
    fn backups_oldest_first() {
        let list = parse_info(INFO, "herd-g0").expect("parse");
        assert_eq!(list.len(), 2);
        assert_eq!(list[0].label, "20261128-134501F");
        assert_eq!(list[0].kind, "full");
        assert_eq!(
            (list[0].start, list[0].stop),
            (1_795_873_501, 1_795_873_505)
        );
        assert_eq!(list[0].size, 23_000_000);
        assert_eq!(list[0].stop_lsn, Some(herd_core::Lsn(0x700_0100)));
        assert_eq!(list[1].stop_lsn, None);
        assert_eq!(list[1].kind, "incr");
        assert_eq!(list[1].repo_size, 2000);
        assert_eq!(list[0].system_id, None, "no database id");
        assert_eq!(list[1].system_id, Some(7_442_418_394_873_927_193));
    }

    #[test]
    fn other_or_empty_stanzas_have_no_backups() {
        assert!(parse_info(INFO, "herd-g1").expect("parse").is_empty());
        let empty =
            r#"[{"backup":[],"name":"herd-g0","status":{"code":2,"message":"no valid backups"}}]"#;
        assert!(parse_info(empty, "herd-g0").expect("parse").is_empty());
        assert!(parse_info("not json", "herd-g0").is_err());
    }
}
