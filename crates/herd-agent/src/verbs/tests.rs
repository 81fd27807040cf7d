use herd_core::CommitMode;

use super::*;
use crate::decide::tests::member;
use crate::member::ClusterSettings;

/// Leader `a` at 100; replicas as given; sync set {b, c}; `ANY 1` unless `mode` says async.
fn store(mode: CommitMode, replicas: &[(&str, u64)]) -> Store {
    let mut members = vec![member("a", "primary", 100)];
    members.extend(replicas.iter().map(|(n, l)| member(n, "replica", *l)));
    Store {
        initialized: true,
        leader: Some("a".into()),
        members,
        sync_set: vec!["b".into(), "c".into()],
        last_sync: Vec::new(),
        last_leader: Some("a".into()),
        settings: ClusterSettings {
            commit_mode: mode,
            ..ClusterSettings::default()
        },
        handover: None,
        restarts: Vec::new(),
    }
}

/// (mode, replicas, to, allow_data_loss, accepted, words in the refusal)
type Case<'a> = (
    CommitMode,
    &'a [(&'a str, u64)],
    &'a str,
    bool,
    bool,
    &'a str,
);

#[test]
fn failover_targets_table() {
    use CommitMode::{Async, On};
    let cases: &[Case] = &[
        (On, &[("b", 100), ("c", 50)], "b", false, true, ""),
        (
            On,
            &[("b", 100), ("c", 50)],
            "c",
            false,
            false,
            "c may lack acknowledged commits; b holds them all",
        ),
        (On, &[("b", 100), ("c", 50)], "c", true, true, ""),
        // Both hold the same position: either has every acknowledged commit.
        (On, &[("b", 100), ("c", 100)], "c", false, true, ""),
        (On, &[("b", 100), ("c", 100)], "b", false, true, ""),
        // ANY 1 of {b, c} with b gone: c alone cannot prove it holds every commit.
        (On, &[("c", 100)], "c", false, false, "not failing over"),
        (
            Async,
            &[("b", 100), ("c", 10)],
            "c",
            false,
            false,
            "b holds them all",
        ),
        (Async, &[("b", 100), ("c", 10)], "b", false, true, ""),
    ];
    for (mode, replicas, to, allow, accepted, words) in cases {
        let got = check_failover_target(&store(*mode, replicas), to, *allow);
        assert_eq!(
            got.is_ok(),
            *accepted,
            "{mode:?} {replicas:?} --to {to} allow={allow}: {got:?}"
        );
        if let Err(why) = got {
            assert!(why.contains(words), "{why} lacks {words}");
        }
    }
}
