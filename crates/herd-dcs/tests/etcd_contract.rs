//! The etcd backend against a real 3-member etcd cluster (Debian's etcd-server): the same
//! contract as the in-memory backend, a cluster prefix per Herd cluster, a lost member
//! tolerated, and a store that cannot be reached reported as unavailable within the timeout.

use std::time::{Duration, Instant};

use herd_dcs::{Dcs, DcsError, EtcdConfig, EtcdDcs};
use herd_testkit::etcd::EtcdCluster;

fn config(etcd: &EtcdCluster, cluster: &str) -> EtcdConfig {
    EtcdConfig {
        endpoints: etcd.endpoints(),
        cluster: cluster.into(),
        timeout: Duration::from_secs(3),
        ..Default::default()
    }
}

#[test]
fn etcd_backend_keeps_the_contract() {
    let mut etcd = EtcdCluster::start(3);
    let dcs = EtcdDcs::connect(&config(&etcd, "one")).expect("connect");
    herd_dcs::contract::check(&dcs, &std::thread::sleep);

    // Another cluster's keys are its own.
    let other = EtcdDcs::connect(&config(&etcd, "two")).expect("connect");
    assert_eq!(other.get("k").expect("get"), None);
    assert!(dcs.keys().expect("keys").contains(&"k".to_string()));

    // One member of three lost: the quorum still answers, writes included.
    etcd.kill(0);
    let v = dcs.get("k").expect("get").expect("k");
    let r = dcs
        .compare_and_set("k", v.revision, b"after".to_vec())
        .expect("write with a member down");
    assert!(r > v.revision);
    assert!(dcs
        .acquire_lease("leader", "a", Duration::from_secs(5))
        .expect("lease with a member down"));

    // Quorum lost: every call fails as unavailable within the timeout, none hangs or claims
    // success.
    etcd.kill(1);
    let started = Instant::now();
    let e = dcs.compare_and_set("k", r, b"lost".to_vec());
    assert!(matches!(e, Err(DcsError::Unavailable(_))), "{e:?}");
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "{:?}",
        started.elapsed()
    );
    let e = dcs.get("k");
    assert!(matches!(e, Err(DcsError::Unavailable(_))), "{e:?}");

    // Back to a quorum. An unavailable write's outcome is unknown (etcd may still commit a
    // proposal queued before the quorum went away), which is why the HA logic re-reads after
    // one: the value is one of the two, and later writes compare against what is there.
    etcd.restart(1);
    let mut value = None;
    herd_testkit::wait_until(Duration::from_secs(20), "etcd to answer again", || {
        value = dcs.get("k").ok().flatten();
        value.is_some().then_some(())
    });
    let now = value.expect("k");
    assert!(
        now.value == b"after" || now.value == b"lost",
        "{:?}",
        String::from_utf8_lossy(&now.value)
    );
    assert!(dcs
        .compare_and_set("k", now.revision, b"next".to_vec())
        .is_ok());
}

#[test]
fn no_endpoints_or_no_etcd_is_a_clear_error() {
    let none = EtcdDcs::connect(&EtcdConfig::default());
    assert!(matches!(none, Err(DcsError::Unavailable(m)) if m.contains("no etcd endpoints")));
    let port = herd_testkit::free_port_block(1);
    let absent = EtcdDcs::connect(&EtcdConfig {
        endpoints: vec![format!("http://127.0.0.1:{port}")],
        cluster: "x".into(),
        timeout: Duration::from_secs(1),
        ..Default::default()
    });
    // tonic connects lazily or eagerly depending on the version: either the connection or the
    // first call fails, as unavailable.
    match absent {
        Err(DcsError::Unavailable(_)) => {}
        Err(e) => panic!("{e:?}"),
        Ok(dcs) => assert!(matches!(dcs.get("k"), Err(DcsError::Unavailable(_)))),
    }
}
