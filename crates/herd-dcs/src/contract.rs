//! The behaviour every [`Dcs`](crate::Dcs) backend must show, as a reusable check.

use std::time::Duration;

use crate::{Dcs, DcsError};

/// Panics unless `dcs` keeps the contract. `advance` moves the backend's clock forward (a real
/// backend may simply sleep).
pub fn check(dcs: &dyn Dcs, advance: &dyn Fn(Duration)) {
    // Compare-and-set: create, update, conflict without writing.
    assert_eq!(dcs.get("k").ok(), Some(None));
    let r1 = dcs.compare_and_set("k", 0, b"a".to_vec()).expect("create");
    assert!(r1 > 0);
    assert!(
        matches!(dcs.compare_and_set("k", 0, b"b".to_vec()), Err(DcsError::Conflict { found, .. }) if found == r1)
    );
    let r2 = dcs.compare_and_set("k", r1, b"c".to_vec()).expect("update");
    assert!(r2 > r1);
    assert!(
        dcs.compare_and_set("k", r1, b"d".to_vec()).is_err(),
        "a stale revision never writes"
    );
    let v = dcs.get("k").expect("get").expect("present");
    assert_eq!((v.value.as_slice(), v.revision), (b"c".as_slice(), r2));

    // Leases: exclusive, renewable by the owner, free after expiry or release.
    let ttl = Duration::from_secs(2);
    assert!(dcs.acquire_lease("leader", "a", ttl).expect("acquire"));
    assert!(
        !dcs.acquire_lease("leader", "b", ttl).expect("contend"),
        "never two holders"
    );
    assert_eq!(
        dcs.lease_holder("leader").expect("holder").as_deref(),
        Some("a")
    );
    advance(Duration::from_secs(1));
    assert!(dcs.acquire_lease("leader", "a", ttl).expect("renew"));
    advance(Duration::from_millis(1500));
    assert!(!dcs
        .acquire_lease("leader", "b", ttl)
        .expect("still held after renewal"));
    advance(Duration::from_secs(1));
    // Expired: a store may notice a little after the TTL (etcd revokes expired leases every
    // 500 ms), never before.
    let mut waited = Duration::ZERO;
    while dcs.lease_holder("leader").expect("holder").is_some() {
        assert!(waited < Duration::from_secs(3), "the lease never expired");
        advance(Duration::from_millis(100));
        waited += Duration::from_millis(100);
    }
    assert!(dcs
        .acquire_lease("leader", "b", ttl)
        .expect("take over an expired lease"));
    dcs.release_lease("leader", "a")
        .expect("release by a non-holder is a no-op");
    assert_eq!(
        dcs.lease_holder("leader").expect("holder").as_deref(),
        Some("b")
    );
    dcs.release_lease("leader", "b").expect("release");
    assert_eq!(dcs.lease_holder("leader").expect("holder"), None);

    // Expiring values (members' heartbeats): listed by prefix while fresh, gone after the TTL
    // unless written again; writes are announced to watchers.
    let mut changes = dcs.changes();
    changes.borrow_and_update();
    dcs.put_expiring("members/a", b"1".to_vec(), ttl)
        .expect("put a");
    dcs.put_expiring("members/b", b"2".to_vec(), ttl)
        .expect("put b");
    dcs.compare_and_set("membersx", 0, b"not a member".to_vec())
        .expect("neighbour");
    let listed = |dcs: &dyn Dcs| -> Vec<(String, Vec<u8>)> {
        dcs.list("members/")
            .expect("list")
            .into_iter()
            .map(|(k, v)| (k, v.value))
            .collect()
    };
    assert_eq!(
        listed(dcs),
        vec![
            ("members/a".to_string(), b"1".to_vec()),
            ("members/b".to_string(), b"2".to_vec())
        ]
    );
    let mut waited = Duration::ZERO;
    while !changes.has_changed().unwrap_or(false) {
        assert!(waited < Duration::from_secs(3), "no change was announced");
        advance(Duration::from_millis(50));
        waited += Duration::from_millis(50);
    }
    advance(Duration::from_secs(1));
    dcs.put_expiring("members/b", b"3".to_vec(), ttl * 3)
        .expect("renew b");
    advance(Duration::from_millis(1500));
    let mut waited = Duration::ZERO;
    while listed(dcs).len() > 1 {
        assert!(waited < Duration::from_secs(3), "members/a never expired");
        advance(Duration::from_millis(100));
        waited += Duration::from_millis(100);
    }
    assert_eq!(
        listed(dcs),
        vec![("members/b".to_string(), b"3".to_vec())],
        "a renewed value outlives its first TTL, an unrenewed one does not"
    );

    // A reader may ignore keys under a prefix (here one key): its own heartbeat does not wake
    // it, anyone else's does.
    let wait_for = |rx: &mut tokio::sync::watch::Receiver<u64>, what: &str| {
        let mut waited = Duration::ZERO;
        while !rx.has_changed().unwrap_or(false) {
            assert!(waited < Duration::from_secs(3), "{what} was not announced");
            advance(Duration::from_millis(50));
            waited += Duration::from_millis(50);
        }
    };
    let mut all = dcs.changes();
    let mut others = dcs.changes_ignoring("members/b");
    // A watch reconnecting announces a change to everyone (it may have missed some), which
    // can coincide with a try; the ignored write must stay silent in one of three.
    let mut silent = false;
    for attempt in 0..3 {
        // Writes of other keys are announced to both; once this one is, every earlier event
        // has been delivered (a store announces in order), so what follows is only b's.
        dcs.put_expiring("members/c", format!("{attempt}").into_bytes(), ttl)
            .expect("put c");
        wait_for(&mut others, "another key's write");
        all.borrow_and_update();
        others.borrow_and_update();
        dcs.put_expiring("members/b", b"4".to_vec(), ttl)
            .expect("renew b");
        wait_for(&mut all, "a heartbeat");
        if !others.has_changed().unwrap_or(true) {
            silent = true;
            break;
        }
    }
    assert!(
        silent,
        "a write of the ignored key alone was announced to the reader ignoring it"
    );
}
