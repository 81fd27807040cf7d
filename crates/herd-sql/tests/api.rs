//! API behaviour beyond the routing table: spans, function lists, write
//! detection, pins, robustness, and the cache.

mod common;

use common::TestCatalog;
use herd_sql::{
    classify, ClassifierCache, PinReason, Reason, Route, SessionEffect, TxEffect, Volatility,
};
use std::collections::HashMap;
use std::sync::Arc;

#[test]
fn one_statement_per_statement_with_spans() {
    let sql = "select 1;  insert into t values (1) ; /* c */ set a.b = 2";
    let c = classify(sql);
    assert_eq!(c.statements.len(), 3);
    let texts: Vec<&str> = c.statements.iter().map(|s| &sql[s.span.clone()]).collect();
    assert_eq!(
        texts,
        vec!["select 1", "insert into t values (1)", "set a.b = 2"]
    );
    assert_eq!(c.statements[0].route_without_functions, Route::Replica);
    assert_eq!(c.statements[1].reason, Reason::Write);
    assert!(c.is_write());
}

#[test]
fn function_names_as_written() {
    let c = classify("select pg_catalog.now(), NOW(), nextval('s'), s.\"F\"(1), lower(x) from t");
    let f = &c.statements[0].functions;
    assert_eq!(f, &["pg_catalog.now", "now", "nextval", "s.F", "lower"]);
    // Grammar constructs are not function calls.
    let c =
        classify("select coalesce(a, 1), greatest(a, b), nullif(a, b), current_timestamp from t");
    assert!(c.statements[0].functions.is_empty());
}

#[test]
fn is_write_and_empty() {
    assert!(!classify("select * from t for update").is_write());
    assert!(!classify("select nextval('s')").is_write());
    assert!(classify("with x as (delete from t returning 1) select 1").is_write());
    assert!(classify("create table t (i int)").is_write());
    assert!(classify("call p()").is_write());
    assert!(classify("copy t from stdin").is_write());
    assert!(classify("not sql at all").is_write());
    assert!(!classify("explain delete from t").is_write());
    assert!(classify("explain analyze delete from t").is_write());
    assert!(classify("").is_empty());
    assert!(!classify("").is_write());
    assert!(classify("selec").error.is_some());
}

#[test]
fn pins_and_effects() {
    let c = classify("listen a; select pg_advisory_lock(1); create temp table x (i int)");
    assert_eq!(
        c.pins(),
        vec![
            PinReason::Listen,
            PinReason::AdvisoryLock,
            PinReason::TempTable
        ]
    );
    let c = classify("begin read only; set local x.y = 1; commit");
    assert_eq!(c.statements[0].tx, TxEffect::Begin { read_only: true });
    assert!(matches!(
        c.statements[1].session,
        SessionEffect::SetLocal { .. }
    ));
    assert_eq!(c.statements[2].tx, TxEffect::Commit);
    assert_eq!(
        c.route(&TestCatalog),
        (Route::Replica, Reason::TransactionControl)
    );
}

#[test]
fn catalog_decides_functions() {
    let sql = "select f(1)";
    let mut catalog: HashMap<String, Volatility> = HashMap::new();
    assert_eq!(
        classify(sql).route(&catalog),
        (Route::Primary, Reason::UnknownFunction("f".into()))
    );
    catalog.insert("f".into(), Volatility::Immutable);
    assert_eq!(
        classify(sql).route(&catalog),
        (Route::Replica, Reason::ReadOnly)
    );
    catalog.insert("f".into(), Volatility::Volatile);
    assert_eq!(classify(sql).route(&catalog).0, Route::Primary);
    assert_eq!(Volatility::from_provolatile('s'), Some(Volatility::Stable));
    assert_eq!(Volatility::from_provolatile('x'), None);
}

#[test]
fn too_deep_trees_go_to_primary() {
    let sql = "select 1".to_string() + &" + 1".repeat(100);
    let c = classify(&sql);
    assert!(c.error.as_ref().is_some_and(|e| e.too_complex));
    assert_eq!(c.route(&TestCatalog), (Route::Primary, Reason::TooComplex));
    let c = classify("select (1");
    assert!(c.error.as_ref().is_some_and(|e| !e.too_complex));
}

#[test]
fn never_panics() {
    let mut inputs: Vec<String> = vec![
        "\0".into(),
        "\u{feff}select 1".into(),
        "select 'é'; select 'ü' ; ".into(),
        "select ".to_string() + &"(".repeat(5000) + "1" + &")".repeat(5000),
        "select ".to_string() + &"(".repeat(200) + "1" + &")".repeat(200),
        "select 1".to_string() + &" + 1".repeat(20000),
        "select * from t where ".to_string() + &"a = 1 and ".repeat(5000) + "true",
        "select ".to_string() + &"(select ".repeat(80) + "1" + &")".repeat(80),
        "with ".to_string()
            + &(0..300)
                .map(|i| format!("c{i} as (select {i})"))
                .collect::<Vec<_>>()
                .join(", ")
            + " select 1",
        ";".repeat(1000),
        "$$".into(),
        "select $1 $2 $$ $x$".into(),
    ];
    let base = "select a, f(b) from t where x in (select 1 for update); \
                insert into t values ('a;b', $$c$$) returning *; set x.y = 'z'; begin read only";
    for end in 0..=base.len() {
        if base.is_char_boundary(end) {
            inputs.push(base[..end].to_string());
        }
    }
    for input in &inputs {
        let c = classify(input);
        let (route, _) = c.route(&TestCatalog);
        if c.error.is_some() || c.statements.is_empty() {
            assert_eq!(route, Route::Primary, "{input:?}");
        }
        for s in &c.statements {
            assert!(input.get(s.span.clone()).is_some());
        }
    }
}

#[test]
fn cache_counts_hits_and_misses() {
    let cache = ClassifierCache::new(10);
    let a = cache.get_or_classify("select 1");
    let b = cache.get_or_classify("select 1");
    assert!(Arc::ptr_eq(&a, &b));
    cache.get_or_classify("select x2");
    let stats = cache.stats();
    assert_eq!(
        (stats.hits, stats.misses, stats.len, stats.capacity),
        (1, 2, 2, 10)
    );
    cache.clear();
    assert!(cache.is_empty());
    assert_eq!(cache.stats().hits, 1);
}

#[test]
fn cache_is_bounded_and_lru() {
    let cache = ClassifierCache::new(3);
    for i in 0..3 {
        cache.get_or_classify(&format!("select c{i}"));
    }
    cache.get_or_classify("select c0"); // refresh 0; 1 is now least recently used
    cache.get_or_classify("select c3"); // evicts 1
    assert_eq!(cache.len(), 3);
    let misses = cache.stats().misses;
    cache.get_or_classify("select c0");
    cache.get_or_classify("select c2");
    cache.get_or_classify("select c3");
    assert_eq!(cache.stats().misses, misses, "0, 2 and 3 are still cached");
    cache.get_or_classify("select c1");
    assert_eq!(cache.stats().misses, misses + 1, "1 was evicted");
    for i in 0..100 {
        cache.get_or_classify(&format!("select c{i} + 1"));
    }
    assert_eq!(cache.len(), 3);
}

#[test]
fn full_cache_drops_its_least_recently_used_eighth() {
    let cache = ClassifierCache::new(16);
    for i in 0..16 {
        cache.get_or_classify(&format!("select c{i}"));
    }
    for i in 2..16 {
        cache.get_or_classify(&format!("select c{i}")); // c0 and c1 are now the oldest
    }
    cache.get_or_classify("select c16"); // full: drops 16 / 8 = 2 entries
    assert_eq!(cache.len(), 15);
    let misses = cache.stats().misses;
    for i in 2..17 {
        cache.get_or_classify(&format!("select c{i}"));
    }
    assert_eq!(cache.stats().misses, misses, "c2..c16 are still cached");
    cache.get_or_classify("select c0");
    cache.get_or_classify("select c1");
    assert_eq!(cache.stats().misses, misses + 2, "c0 and c1 were dropped");
}

#[test]
fn cache_skips_zero_capacity_and_long_text() {
    let none = ClassifierCache::new(0);
    none.get_or_classify("select 1");
    none.get_or_classify("select 1");
    assert_eq!((none.stats().misses, none.len()), (2, 0));
    let short = ClassifierCache::with_max_sql_len(10, 12);
    short.get_or_classify("select 1 + 1 + 1");
    assert_eq!(short.len(), 0);
    short.get_or_classify("select 1");
    assert_eq!(short.len(), 1);
    assert_eq!(short.max_sql_len(), 12);
}

#[test]
fn cache_is_shareable_across_threads() {
    let cache = Arc::new(ClassifierCache::new(100));
    let handles: Vec<_> = (0..4)
        .map(|t| {
            let cache = Arc::clone(&cache);
            std::thread::spawn(move || {
                for i in 0..50 {
                    let c = cache.get_or_classify(&format!("select c{}", i % 10));
                    assert_eq!(c.route(&TestCatalog).0, Route::Replica, "thread {t}");
                }
            })
        })
        .collect();
    for h in handles {
        h.join().expect("thread");
    }
    let stats = cache.stats();
    assert_eq!(stats.hits + stats.misses, 200);
    assert_eq!(stats.len, 10);
}

#[test]
fn texts_differing_only_in_literals_share_an_entry() {
    let cache = ClassifierCache::new(10);
    let a = cache.get_or_classify("select v from t where id = 1");
    let b = cache.get_or_classify("select v from t where id = 2");
    assert!(Arc::ptr_eq(&a, &b));
    // Settings carry their value: never shared.
    let s1 = cache.get_or_classify("set work_mem = '1MB'");
    let s2 = cache.get_or_classify("set work_mem = '2MB'");
    assert!(!Arc::ptr_eq(&s1, &s2));
    assert_ne!(s1.statements[0].session, s2.statements[0].session);
}
