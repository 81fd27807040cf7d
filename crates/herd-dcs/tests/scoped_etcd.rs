//! Shard groups' views ([`Scoped`]) of a real etcd cluster (Debian's etcd-server): each keeps
//! the contract in its own keys, group 0 writes exactly the keys a one-group cluster writes
//! today (running clusters need no migration), group g's under `groups/<g>/`, its leases
//! included, and a group's watch is not woken by another group's writes.

use std::sync::Arc;
use std::time::Duration;

use herd_dcs::{Dcs, EtcdConfig, EtcdDcs, Scoped};
use herd_testkit::etcd::EtcdCluster;

fn connect(etcd: &EtcdCluster, cluster: &str) -> Arc<EtcdDcs> {
    let config = EtcdConfig {
        endpoints: etcd.endpoints(),
        cluster: cluster.into(),
        timeout: Duration::from_secs(3),
        ..Default::default()
    };
    Arc::new(EtcdDcs::connect(&config).expect("connect"))
}

#[test]
fn group_views_of_etcd_keep_the_contract() {
    let etcd = EtcdCluster::start(3);
    let store = connect(&etcd, "scoped");
    let root: Arc<dyn Dcs> = store.clone();
    herd_dcs::contract::check(&Scoped::group(root.clone(), 0), &std::thread::sleep);
    // Group 3 starts from nothing although group 0 has written the same names.
    herd_dcs::contract::check(&Scoped::group(root.clone(), 3), &std::thread::sleep);
    let keys = store.keys().expect("keys");
    for k in ["k", "membersx", "groups/3/k", "groups/3/membersx"] {
        assert!(keys.contains(&k.to_string()), "{k} in {keys:?}");
    }
}

/// What a group's agents write in a round or two: creation, settings, the leader lease, the
/// sync record, a handover, a heartbeat, a request.
fn write_a_group(dcs: &dyn Dcs) {
    for key in ["initialize", "config", "sync", "handover", "requests/n1"] {
        dcs.compare_and_set(key, 0, b"{}".to_vec()).expect(key);
    }
    assert!(dcs
        .acquire_lease("leader", "n1", Duration::from_secs(10))
        .expect("lease"));
    dcs.put_expiring("members/n1", b"{}".to_vec(), Duration::from_secs(10))
        .expect("heartbeat");
}

#[test]
fn group_keys_in_etcd() {
    let etcd = EtcdCluster::start(1);
    let store = connect(&etcd, "layout");
    let root: Arc<dyn Dcs> = store.clone();
    let (g0, g2) = (
        Scoped::group(root.clone(), 0),
        Scoped::group(root.clone(), 2),
    );

    // Group 0: today's keys, byte for byte (the leader lease at leases/leader).
    write_a_group(&g0);
    let today = [
        "config",
        "handover",
        "initialize",
        "leases/leader",
        "members/n1",
        "requests/n1",
        "sync",
    ];
    assert_eq!(store.keys().expect("keys"), today);

    // Group 2: the same under groups/2/, its leader lease at groups/2/leases/leader.
    write_a_group(&g2);
    let mut expected: Vec<String> = today.iter().map(|k| k.to_string()).collect();
    expected.extend(today.iter().map(|k| format!("groups/2/{k}")));
    expected.sort();
    assert_eq!(store.keys().expect("keys"), expected);
    assert!(expected.contains(&"groups/2/leases/leader".to_string()));
    assert_eq!(
        g2.lease_holder("leader").expect("holder").as_deref(),
        Some("n1")
    );
    assert!(
        !g2.acquire_lease("leader", "n2", Duration::from_secs(10))
            .expect("contend"),
        "group 2's lease is held"
    );

    // Leases are not listed at any depth; a view lists only its own keys, by its names.
    let names = |dcs: &dyn Dcs, prefix: &str| -> Vec<String> {
        dcs.list(prefix)
            .expect("list")
            .into_iter()
            .map(|(k, _)| k)
            .collect()
    };
    let values = [
        "config",
        "handover",
        "initialize",
        "members/n1",
        "requests/n1",
        "sync",
    ];
    assert_eq!(names(&g0, ""), values);
    assert_eq!(names(&g2, ""), values);
    assert_eq!(
        names(root.as_ref(), "groups/2/"),
        values.map(|k| format!("groups/2/{k}"))
    );

    // Group 1's writes do not wake group 0's readers. A reconnecting watch announces to
    // everyone (it may have missed changes), which may coincide with one try: one in three
    // must stay silent.
    let g1 = Scoped::group(root.clone(), 1);
    let mut heard = false;
    let mut silent = false;
    for attempt in 0..3u8 {
        let mut group0 = g0.changes();
        let mut group1 = g1.changes();
        group0.borrow_and_update();
        group1.borrow_and_update();
        g1.put_expiring("members/x", vec![attempt], Duration::from_secs(10))
            .expect("group 1 heartbeat");
        // Group 1's receiver hears it: the event has been delivered to every receiver.
        herd_testkit::wait_until(Duration::from_secs(5), "group 1's write announced", || {
            group1.has_changed().unwrap_or(false).then_some(())
        });
        if !group0.has_changed().unwrap_or(true) {
            silent = true;
        }
        // And group 0 does hear its own writes.
        g0.put_expiring("members/n1", vec![attempt], Duration::from_secs(10))
            .expect("group 0 heartbeat");
        herd_testkit::wait_until(Duration::from_secs(5), "group 0's write announced", || {
            group0.has_changed().unwrap_or(false).then_some(())
        });
        heard = true;
        if silent {
            break;
        }
    }
    assert!(heard);
    assert!(silent, "group 1's write woke a group 0 reader");
}
