//! Shard groups in `herd status`: a group's nodes, roles and health.

use std::time::Duration;

use herd_testkit::{wait_until, TestCluster};

/// Group `g`'s status object (group 0 is the top level).
pub fn group(status: &serde_json::Value, g: u64) -> serde_json::Value {
    if g == 0 {
        return status.clone();
    }
    status["groups"]
        .as_array()
        .expect("groups")
        .iter()
        .find(|x| x["group"] == g)
        .expect("group present")
        .clone()
}

/// Names of group `g`'s nodes with `role`, and whether every node is serving in its role.
pub fn roles(c: &TestCluster, g: u64) -> (Vec<String>, bool) {
    let s = group(&c.status(), g);
    let nodes = s["nodes"].as_array().expect("nodes").clone();
    let primaries = nodes
        .iter()
        .filter(|n| n["role"] == "primary")
        .map(|n| n["name"].as_str().expect("name").to_string())
        .collect();
    let healthy = nodes.iter().all(|n| {
        (n["role"] == "primary" && n["state"] == "running")
            || (n["role"] == "replica" && n["state"] == "streaming")
    });
    (primaries, healthy)
}

/// Waits (up to 120 s) until group `g` has one primary, other than `not_primary`, and every
/// node serves in its role; returns that primary's name.
pub fn wait_healthy(c: &TestCluster, g: u64, not_primary: Option<&str>) -> String {
    wait_until(
        Duration::from_secs(120),
        "group back to full strength",
        || {
            let (primaries, healthy) = roles(c, g);
            (healthy && primaries.len() == 1 && Some(primaries[0].as_str()) != not_primary)
                .then(|| primaries[0].clone())
        },
    )
}
