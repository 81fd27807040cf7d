//! The many-clients shape of `herd bench proxy` again with the load generator apart: pgbench on
//! some cores, the servers and the proxies on the others ([`crate::affinity`]), as if pgbench
//! ran on another machine. pgbench's own CPU per transaction doubles with a thousand
//! connections (each thread polls all of its connections at every wait); on shared cores that
//! alone lowers every target's many-client rate, which then says more about the generator than
//! about the pooler. Apart, the rate with many clients against the rate with 16 is the
//! pooler's own (and the servers').

use std::path::{Path, PathBuf};

/// 16 clients, the generator apart: the baseline of the ratio.
pub const APART_FEW: &str = "16 clients, generator apart";
/// Many clients, the generator apart.
pub const APART_MANY: &str = "many clients, generator apart";
/// Targets run apart: the two poolers.
pub const APART_TARGETS: [&str; 2] = ["herd-primary", "pgbouncer"];

/// Whether `mode` runs with the generator apart.
pub fn is_apart(mode: &str) -> bool {
    mode == APART_FEW || mode == APART_MANY
}

/// What to keep on the servers' cores: every node's postmaster under `data_dir` (each
/// `nodes/*/postmaster.pid`; their backends are their descendants) and `others` (the proxies).
pub fn server_roots(data_dir: &Path, others: &[u32]) -> Vec<u32> {
    let mut roots: Vec<u32> = others.to_vec();
    let nodes = std::fs::read_dir(data_dir.join("nodes"))
        .map(|d| d.flatten().map(|e| e.path()).collect::<Vec<PathBuf>>())
        .unwrap_or_default();
    for node in nodes {
        let pid = std::fs::read_to_string(node.join("postmaster.pid"))
            .ok()
            .and_then(|text| text.lines().next()?.trim().parse::<u32>().ok());
        roots.extend(pid);
    }
    roots
}

/// The note for one target: its many-client rate against its 16-client rate, both apart.
pub fn note(
    target: &str,
    few: f64,
    many: f64,
    clients: u32,
    (servers, generator): (&[usize], &[usize]),
) -> String {
    format!(
        "With the load generator apart — pgbench on core(s) {generator:?}, the servers and the \
         proxies on {servers:?}, as if pgbench ran on another machine (what is measured has \
         half the cores) — {target} ran {:.2}× its 16-client rate with {clients} clients \
         ({many:.0} against {few:.0} tps).",
        many / few
    )
}

/// Where pgbench ran against what it measured: on the same cores (the default), or apart for
/// every mode (`--generator-apart`, with the cores each side had).
pub fn placement_note(all_apart: Option<(&[usize], &[usize])>) -> String {
    match all_apart {
        Some((servers, generator)) => format!(
            "Every mode ran with the load generator apart (--generator-apart): pgbench on \
             core(s) {generator:?}, the servers, Herd, PgBouncer and the forwarder on \
             {servers:?}, as if pgbench ran on another machine. What is measured has half the \
             cores, so every rate is lower than with the cores shared, but no target's rate \
             depends on how pgbench's own work shares the cores with it."
        ),
        None => "pgbench, the proxies and every PostgreSQL server share this machine's cores \
                 (the shapes apart excepted), so the ratios understate what a separate client \
                 machine would see; `--generator-apart` runs every mode with pgbench on cores \
                 of its own."
            .into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_the_postmasters_and_keeps_the_proxies() {
        let dir = tempfile::tempdir().expect("tempdir");
        for (node, text) in [
            ("node0", "4242\n/data/node0\n1700000000\n"),
            ("node1", "4343\n"),
            // A node that is down has no postmaster.pid; a damaged one adds nothing.
            ("node2", "not a pid\n"),
        ] {
            let d = dir.path().join("nodes").join(node);
            std::fs::create_dir_all(&d).expect("node dir");
            std::fs::write(d.join("postmaster.pid"), text).expect("pid file");
        }
        std::fs::create_dir_all(dir.path().join("nodes/node3")).expect("node dir");
        let mut roots = server_roots(dir.path(), &[7, 8]);
        roots.sort_unstable();
        assert_eq!(roots, vec![7, 8, 4242, 4343]);
        // No nodes directory: the proxies alone.
        assert_eq!(server_roots(&dir.path().join("none"), &[7]), vec![7]);
    }

    #[test]
    fn the_placement_is_stated() {
        let apart = placement_note(Some((&[0], &[1])));
        assert!(apart.contains("pgbench on core(s) [1]"), "{apart}");
        assert!(apart.contains("forwarder on [0]"), "{apart}");
        let shared = placement_note(None);
        assert!(shared.contains("share this machine's cores"), "{shared}");
        assert!(shared.contains("--generator-apart"), "{shared}");
    }

    #[test]
    fn the_note_gives_the_ratio_and_the_cores() {
        let n = note("herd-primary", 20_000.0, 18_200.0, 1000, (&[0], &[1]));
        assert!(n.contains("pgbench on core(s) [1]"), "{n}");
        assert!(n.contains("on [0]"), "{n}");
        assert!(
            n.contains("0.91× its 16-client rate with 1000 clients (18200 against 20000 tps)"),
            "{n}"
        );
    }
}
