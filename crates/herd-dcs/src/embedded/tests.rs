use std::sync::atomic::AtomicU64;
use std::sync::Arc;

use super::*;

/// A clock the test moves (milliseconds past a fixed start), shared by successive opens.
#[derive(Clone)]
struct Clock {
    start: Instant,
    offset: Arc<AtomicU64>,
}

impl Clock {
    fn new() -> Clock {
        Clock {
            start: Instant::now(),
            offset: Arc::new(AtomicU64::new(0)),
        }
    }

    fn boxed(&self) -> Box<dyn Fn() -> Instant + Send + Sync> {
        let c = self.clone();
        Box::new(move || c.start + Duration::from_millis(c.offset.load(Ordering::SeqCst)))
    }

    fn advance(&self, d: Duration) {
        self.offset
            .fetch_add(d.as_millis() as u64, Ordering::SeqCst);
    }
}

#[test]
fn embedded_backend_keeps_the_contract() {
    let dir = tempfile::tempdir().expect("tempdir");
    let clock = Clock::new();
    let dcs =
        EmbeddedDcs::open_with_clock(&dir.path().join("store.json"), clock.boxed()).expect("open");
    crate::contract::check(&dcs, &|d| clock.advance(d));
}

#[test]
fn a_reopened_store_keeps_keys_revisions_and_lease_holders() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("store.json");
    let clock = Clock::new();
    let ttl = Duration::from_secs(10);
    let (config, sync, binary) = {
        let dcs = EmbeddedDcs::open_with_clock(&path, clock.boxed()).expect("open");
        let r = dcs
            .compare_and_set("config", 0, b"one".to_vec())
            .expect("cas");
        let config = dcs
            .compare_and_set("config", r, b"two".to_vec())
            .expect("cas");
        let sync = dcs
            .compare_and_set("groups/1/sync", 0, b"{\"members\":[]}".to_vec())
            .expect("cas");
        let binary = dcs
            .compare_and_set("raw", 0, vec![0xff, 0, 1])
            .expect("cas");
        assert!(dcs.acquire_lease("leader", "n1", ttl).expect("take"));
        assert!(dcs
            .acquire_lease("groups/2/leader", "m1", ttl)
            .expect("take"));
        dcs.release_lease("groups/2/leader", "m1").expect("release");
        assert!(dcs
            .acquire_lease("short", "s", Duration::from_secs(1))
            .expect("take"));
        clock.advance(Duration::from_secs(2));
        assert_eq!(dcs.lease_holder("short").expect("expired"), None);

        // Heartbeats and renewals are not written: the file stays as it was.
        let before = std::fs::read(&path).expect("read");
        dcs.put_expiring("members/n1", b"hb".to_vec(), ttl)
            .expect("heartbeat");
        assert!(dcs.acquire_lease("leader", "n1", ttl * 2).expect("renew"));
        assert_eq!(std::fs::read(&path).expect("read"), before);
        (config, sync, binary)
    };

    // A restart, much later: the clock has moved on past every TTL of the first run.
    clock.advance(Duration::from_secs(600));
    let dcs = EmbeddedDcs::open_with_clock(&path, clock.boxed()).expect("reopen");
    let get = |k: &str| dcs.get(k).expect("get").map(|v| (v.value, v.revision));
    assert_eq!(get("config"), Some((b"two".to_vec(), config)));
    assert_eq!(
        get("groups/1/sync"),
        Some((b"{\"members\":[]}".to_vec(), sync))
    );
    assert_eq!(get("raw"), Some((vec![0xff, 0, 1], binary)));
    assert_eq!(
        get("members/n1"),
        None,
        "heartbeats do not survive a restart"
    );
    assert!(dcs.list("members/").expect("list").is_empty());
    // The last leader holds its lease again for one TTL (its last TTL written: the one it
    // took it with) from the open, and no longer.
    assert_eq!(
        dcs.lease_holder("leader").expect("holder").as_deref(),
        Some("n1")
    );
    assert!(!dcs.acquire_lease("leader", "n2", ttl).expect("contend"));
    assert_eq!(dcs.lease_holder("groups/2/leader").expect("released"), None);
    assert_eq!(dcs.lease_holder("short").expect("expired"), None);
    clock.advance(ttl - Duration::from_millis(1));
    assert_eq!(
        dcs.lease_holder("leader").expect("holder").as_deref(),
        Some("n1")
    );
    clock.advance(Duration::from_millis(1));
    assert_eq!(dcs.lease_holder("leader").expect("holder"), None);
    // New writes get revisions above every restored one.
    let next = dcs
        .compare_and_set("config", config, b"three".to_vec())
        .expect("cas after reopen");
    assert!(next > config.max(sync).max(binary));
}

#[test]
fn readers_open_the_file_without_writing_it() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("store.json");
    let e = EmbeddedDcs::open_read_only(&path).err().expect("absent");
    assert!(matches!(e, EmbeddedError::Absent { .. }), "{e}");
    let writer = EmbeddedDcs::open(&path).expect("open");
    writer
        .compare_and_set("config", 0, b"x".to_vec())
        .expect("cas");
    assert!(writer
        .acquire_lease("leader", "n1", Duration::from_secs(10))
        .expect("take"));
    let before = std::fs::read(&path).expect("read");

    let reader = EmbeddedDcs::open_read_only(&path).expect("read-only");
    assert_eq!(
        reader.get("config").expect("get").map(|v| v.value),
        Some(b"x".to_vec())
    );
    assert_eq!(
        reader.lease_holder("leader").expect("holder").as_deref(),
        Some("n1")
    );
    let refused = reader.compare_and_set("config", 0, b"y".to_vec());
    assert!(
        matches!(&refused, Err(DcsError::Unavailable(m)) if m.contains("read-only")),
        "{refused:?}"
    );
    assert!(reader
        .put_expiring("members/a", b"1".to_vec(), Duration::from_secs(1))
        .is_err());
    assert!(reader
        .acquire_lease("leader", "n2", Duration::from_secs(1))
        .is_err());
    assert_eq!(std::fs::read(&path).expect("read"), before);
}

#[test]
fn a_damaged_or_unwritable_file_is_a_named_error() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("store.json");
    let damaged = [
        "{".to_string(),
        "[]".to_string(),
        r#"{"format":2,"revision":1,"keys":{},"leases":{}}"#.to_string(),
        r#"{"format":1,"revision":1,"keys":{"a":{"revision":5,"text":"x"}},"leases":{}}"#
            .to_string(),
        r#"{"format":1,"revision":1,"keys":{"a":{"revision":1}},"leases":{}}"#.to_string(),
    ];
    for text in damaged {
        std::fs::write(&path, &text).expect("write");
        for e in [
            EmbeddedDcs::open(&path).err().expect("damaged"),
            EmbeddedDcs::open_read_only(&path).err().expect("damaged"),
        ] {
            assert!(matches!(e, EmbeddedError::Damaged { .. }), "{text}: {e:?}");
            let message = e.to_string();
            assert!(message.contains(&path.display().to_string()), "{message}");
            assert!(message.contains("move it aside"), "{message}");
        }
        assert_eq!(
            std::fs::read_to_string(&path).expect("read"),
            text,
            "left as found"
        );
    }
    std::fs::write(&path, [0xff, 0xfe]).expect("write");
    let e = EmbeddedDcs::open(&path).err().expect("not text");
    assert!(matches!(e, EmbeddedError::Damaged { .. }), "{e:?}");

    let nowhere = dir.path().join("missing").join("store.json");
    let e = EmbeddedDcs::open(&nowhere).err().expect("no directory");
    assert!(matches!(e, EmbeddedError::Unwritable { .. }), "{e:?}");
    assert!(e.to_string().contains("missing/store.json"), "{e}");
}
