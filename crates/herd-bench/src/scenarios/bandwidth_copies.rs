//! The logical-copy part of `herd bench bandwidth`: the bytes a copy made with Herd's own
//! `herd copy` sends for one bulk insert — the whole table, a 10 % row filter, a column subset
//! — beside the physical stream to the standby during the same insert (reference 004's point:
//! only what is asked for travels).
//!
//! Three copies of one five-column table go to three databases of the subscriber cluster. They
//! are measured one at a time (the other two paused, so their connections are closed): the
//! figure is the TCP payload Herd's endpoint sent on its replication connections (the copies
//! reach the source through the endpoint, which relays them to the primary), read with `ss -ti`
//! before and after the insert, once the copy has confirmed the publisher's position.

use std::collections::BTreeMap;
use std::process::Command;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use crate::cluster::{ScratchCluster, UrlParts};
use crate::process::run_limited;
use crate::BenchError;

/// The copied table.
const TABLE: &str = "copy_orders";

/// One copy's bytes during one bulk insert.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct CopyBandwidthRow {
    /// What the copy sends: "whole table", "10 % of rows", "2 of 5 columns".
    pub copy: String,
    /// The `herd copy create` options that made it.
    pub options: String,
    /// Rows inserted at the source.
    pub rows: u64,
    /// TCP payload the endpoint sent to the copy's target during the insert.
    pub copy_bytes: u64,
    /// TCP payload the walsender sent to the standby during the same insert.
    pub physical_bytes: u64,
    /// `copy_bytes / physical_bytes`.
    pub ratio_to_physical: f64,
}

/// The three copies: name, what, the options after `--table copy_orders`.
const COPIES: [(&str, &str, &[&str]); 3] = [
    ("bw_whole", "whole table", &[]),
    (
        "bw_rows",
        "10 % of rows",
        &["--where", "copy_orders=id % 10 = 0"],
    ),
    (
        "bw_cols",
        "2 of 5 columns",
        &["--columns", "copy_orders=id,region"],
    ),
];

/// Creates the three copies, then measures each during an insert of `rows` rows.
pub fn run(
    publisher: &ScratchCluster,
    subscriber: &ScratchCluster,
    rows: u64,
    progress: &dyn Fn(&str),
) -> Result<Vec<CopyBandwidthRow>, BenchError> {
    let src = &publisher.primary_url;
    publisher.psql(
        src,
        &[&format!(
            "create table {TABLE} (id bigint primary key, region int not null, total numeric(12,2), \
             note text, created timestamptz not null default now())"
        )],
    )?;
    for (name, _, options) in COPIES {
        progress(&format!("herd copy create {name}"));
        subscriber.psql(
            &subscriber.primary_url,
            &[&format!("create database {name}")],
        )?;
        let target = with_database(&subscriber.primary_url, name)?;
        let mut args = vec!["copy", "create", name, "--to", &target, "--table", TABLE];
        args.extend_from_slice(options);
        publisher.herd_limited(&args, 300)?;
    }
    let endpoint = UrlParts::parse(&publisher.proxy_url)
        .map(|p| p.port)
        .ok_or_else(|| BenchError::Parse {
            what: "the publisher's endpoint URL".into(),
            output: publisher.proxy_url.clone(),
        })?;
    let mut out = Vec::new();
    let mut next_id = 0u64;
    for (name, what, options) in COPIES {
        progress(&format!("copy {what}: {rows} rows inserted"));
        for (other, _, _) in COPIES {
            let verb = if other == name { "resume" } else { "pause" };
            publisher.herd_limited(&["copy", verb, other], 60)?;
        }
        wait_active(publisher, name)?;
        wait_caught_up(publisher, name)?;
        let physical_before = physical_bytes(publisher)?;
        let relayed_before = relayed(endpoint)?;
        let sql = format!(
            "insert into {TABLE} (id, region, total, note) select g, g % 7, g * 1.5, repeat('n', 80) \
             from generate_series({}, {}) g",
            next_id + 1,
            next_id + rows
        );
        next_id += rows;
        publisher.psql(src, &[&sql])?;
        wait_caught_up(publisher, name)?;
        let physical_after = physical_bytes(publisher)?;
        let relayed_after = relayed(endpoint)?;
        if physical_after.0 != physical_before.0 {
            return Err(BenchError::Missing(format!(
                "the standby's walsender was replaced during the insert for copy {name}"
            )));
        }
        let copy_bytes = relayed_after
            .iter()
            .map(|(peer, after)| {
                let before = relayed_before.get(peer).copied().unwrap_or(0);
                after.saturating_sub(before)
            })
            .sum::<u64>();
        let physical = physical_after.1.saturating_sub(physical_before.1);
        out.push(CopyBandwidthRow {
            copy: what.into(),
            options: format!("--table {TABLE} {}", options.join(" "))
                .trim()
                .to_string(),
            rows,
            copy_bytes,
            physical_bytes: physical,
            ratio_to_physical: if physical > 0 {
                copy_bytes as f64 / physical as f64
            } else {
                0.0
            },
        });
    }
    for (name, _, _) in COPIES {
        publisher.herd_limited(&["copy", "drop", name], 120)?;
    }
    Ok(out)
}

/// `url` with its database replaced.
fn with_database(url: &str, db: &str) -> Result<String, BenchError> {
    let parts = UrlParts::parse(url).ok_or_else(|| BenchError::Parse {
        what: "the subscriber's URL".into(),
        output: url.into(),
    })?;
    Ok(format!(
        "postgresql://{}:{}@{}:{}/{db}",
        parts.user, parts.password, parts.host, parts.port
    ))
}

/// Waits until copy `name`'s slot is in use and the others' are not.
fn wait_active(publisher: &ScratchCluster, name: &str) -> Result<(), BenchError> {
    let q = format!(
        "select count(*) filter (where active and slot_name = 'herd_copy_{name}') = 1 \
         and count(*) filter (where active and slot_name <> 'herd_copy_{name}' and slot_name like 'herd_copy_%') = 0 \
         from pg_replication_slots"
    );
    wait(publisher, &q, &format!("copy {name} streaming alone"))
}

/// Waits until copy `name` has confirmed, and the standby replayed, the publisher's position.
fn wait_caught_up(publisher: &ScratchCluster, name: &str) -> Result<(), BenchError> {
    let url = &publisher.primary_url;
    let target = publisher.psql(url, &["select pg_current_wal_lsn()"])?;
    let target = target.trim();
    let q = format!(
        "select (select confirmed_flush_lsn >= '{target}' from pg_replication_slots where slot_name = 'herd_copy_{name}') \
         and (select bool_and(replay_lsn >= '{target}') from pg_stat_replication where application_name like 'node%')"
    );
    wait(
        publisher,
        &q,
        &format!("copy {name} caught up with {target}"),
    )
}

fn wait(publisher: &ScratchCluster, q: &str, what: &str) -> Result<(), BenchError> {
    let deadline = Instant::now() + Duration::from_secs(300);
    while publisher.psql(&publisher.primary_url, &[q])?.trim() != "t" {
        if Instant::now() > deadline {
            return Err(BenchError::Missing(format!("waited 5 minutes for {what}")));
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    Ok(())
}

/// The standby walsender's (pid, bytes sent on its socket).
fn physical_bytes(publisher: &ScratchCluster) -> Result<(u32, u64), BenchError> {
    let url = &publisher.primary_url;
    let out = publisher.psql(
        url,
        &["select pid, client_port from pg_stat_replication where application_name like 'node%' limit 1"],
    )?;
    let port = UrlParts::parse(url).map(|p| p.port).unwrap_or(0);
    let (pid, client) = out
        .trim()
        .split_once('|')
        .and_then(|(p, c)| Some((p.parse::<u32>().ok()?, c.parse::<u16>().ok()?)))
        .ok_or_else(|| BenchError::Parse {
            what: "the standby's walsender".into(),
            output: out.clone(),
        })?;
    Ok((pid, super::bandwidth::socket_bytes_sent(port, client)?))
}

/// Bytes sent on each established connection of the endpoint, by the client's port.
fn relayed(endpoint: u16) -> Result<BTreeMap<u16, u64>, BenchError> {
    let mut cmd = Command::new("ss");
    cmd.args(["-t", "-i", "-n", "-H", "state", "established", "("])
        .args(["sport", "=", &format!(":{endpoint}"), ")"]);
    let out = run_limited("ss -ti (iproute2)", cmd, 30)?;
    Ok(parse_sockets(&out))
}

/// `ss -ti` output: a line with the two addresses, then (indented) one with `bytes_sent:N`.
fn parse_sockets(ss: &str) -> BTreeMap<u16, u64> {
    let mut out = BTreeMap::new();
    let mut peer: Option<u16> = None;
    for line in ss.lines() {
        let words: Vec<&str> = line.split_whitespace().collect();
        if let Some(sent) = words.iter().find_map(|w| w.strip_prefix("bytes_sent:")) {
            if let (Some(p), Ok(n)) = (peer.take(), sent.parse::<u64>()) {
                out.insert(p, n);
            }
            continue;
        }
        // "0 0 127.0.0.1:7432 127.0.0.1:41234": the last address is the peer.
        peer = words
            .last()
            .and_then(|a| a.rsplit_once(':'))
            .and_then(|(_, p)| p.parse().ok());
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sockets_by_peer() {
        let ss = "0 0 127.0.0.1:7432 127.0.0.1:41234\n\t cubic bytes_sent:100 bytes_acked:1\n\
                  0 0 127.0.0.1:7432 127.0.0.1:41240\n\t cubic wscale:7,7\n\
                  0 0 127.0.0.1:7432 127.0.0.1:41250\n\t cubic bytes_sent:7 x\n";
        let m = parse_sockets(ss);
        assert_eq!(m.get(&41234), Some(&100));
        assert_eq!(m.get(&41240), None);
        assert_eq!(m.get(&41250), Some(&7));
        assert_eq!(
            with_database("postgresql://u:p@127.0.0.1:5/postgres", "x").expect("url"),
            "postgresql://u:p@127.0.0.1:5/x"
        );
    }
}
