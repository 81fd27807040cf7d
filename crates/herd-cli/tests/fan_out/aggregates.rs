//! Aggregates and joins across groups, compared with the one-server copy.

use super::simple;

/// Aggregates, GROUP BY, HAVING and DISTINCT: partial rows per group, the answer computed from
/// them by PostgreSQL, compared with the one-server copy (types, scales, NULLs, empty inputs).
pub async fn aggregates(client: &tokio_postgres::Client) {
    let shapes: &[&str] = &[
        "select count(*) from T",
        "select count(*), count(name), count(balance), count(score) from T",
        "select sum(grp), sum(id), sum(balance), sum(score), sum(grp::int2) from T",
        "select sum(id + 9223372036854775000) from T",
        "select min(id), max(id), min(name), max(name), min(born), max(born), min(seen), max(seen) from T",
        "select min(balance), max(balance), max(balance) - min(balance), min(note), max(flag::int) from T",
        "select avg(grp), avg(id), avg(balance), avg(grp::int2), avg(score) from T",
        "select bool_and(flag), bool_or(flag), every(flag) from T",
        "select grp, count(*), sum(balance) from T group by grp order by grp",
        "select grp, avg(balance) from T group by grp having count(*) > 20 order by 2 desc nulls last, grp",
        "select flag, count(*) from T group by flag order by flag nulls first",
        "select distinct grp from T order by grp",
        "select distinct note, flag from T order by note, flag",
        "select count(*) from T where false",
        "select sum(balance), avg(balance), max(name), bool_and(flag) from T where false",
        "select grp, count(*) from T where false group by grp",
        "select grp % 2 as parity, count(*), max(balance) from T group by parity order by parity",
        "select upper(note) as n, count(*) from T group by upper(note) order by n nulls first",
        "select grp, count(*) filter (where flag), sum(balance) filter (where balance > 0) from T group by grp order by grp",
        "select grp, coalesce(sum(balance), 0) * 2 + count(*) as x from T group by grp order by x desc, grp limit 3",
        "select count(*) * 1.0 / 3 from T",
        "select grp, name, count(*) from T group by grp, name order by grp, name nulls last limit 10 offset 5",
        "select grp, max(seen) - min(seen) as span from T group by 1 order by 1",
        "select case when count(*) > 100 then 'many' else 'few' end as size, grp from T group by grp order by grp",
        "select note, count(*) from T where grp in (1, 2) group by note having max(id) > 50 order by note",
        "select count(distinct grp), count(distinct name), count(*) from T",
        "select grp, count(distinct note), sum(distinct grp), avg(distinct id) from T group by grp order by grp",
        "select count(distinct id), max(distinct balance) from T",
        "select count(*), count(distinct name) from T where false",
    ];
    for shape in shapes {
        let over = |t: &str| shape.replace(" T", &format!(" {t}"));
        let got = simple(client, &over("acct")).await;
        let want = simple(client, &over("acct_one")).await;
        assert_eq!(got, want, "{shape}");
    }
    // The column names and types are a single server's too.
    let described = client
        .prepare("select grp, count(*), sum(balance), avg(id) as mean from acct group by grp")
        .await
        .expect("prepare an aggregate");
    let names: Vec<(String, String)> = described
        .columns()
        .iter()
        .map(|c| (c.name().to_string(), c.type_().name().to_string()))
        .collect();
    let want: Vec<(String, String)> = [
        ("grp", "int4"),
        ("count", "int8"),
        ("sum", "numeric"),
        ("mean", "numeric"),
    ]
    .iter()
    .map(|(n, t)| (n.to_string(), t.to_string()))
    .collect();
    assert_eq!(names, want);
    // The extended protocol: parameters in WHERE, HAVING and LIMIT, binary results.
    let extended: &[(&str, &[&(dyn tokio_postgres::types::ToSql + Sync)])] = &[
        (
            "select count(*)::text, sum(balance)::text, avg(balance)::text from T where grp > $1",
            &[&3i32],
        ),
        (
            "select grp::text, count(*)::text from T where score > $1 group by grp order by grp",
            &[&0.5f64],
        ),
        (
            "select grp::text, count(*)::text from T group by grp having count(*) > $1 order by grp limit $2",
            &[&22i64, &3i64],
        ),
        ("select max(seen)::text, min(born)::text from T where id < $1", &[&100i64]),
    ];
    for (shape, params) in extended {
        let over = |t: &str| shape.replace(" T", &format!(" {t}"));
        let text = |rows: Vec<tokio_postgres::Row>| -> Vec<Vec<Option<String>>> {
            rows.iter()
                .map(|r| (0..r.len()).map(|i| r.get(i)).collect())
                .collect()
        };
        let got = client
            .query(&over("acct"), params)
            .await
            .unwrap_or_else(|e| panic!("{shape}: {e:?}"));
        let want = client
            .query(&over("acct_one"), params)
            .await
            .unwrap_or_else(|e| panic!("{shape}: {e:?}"));
        assert_eq!(text(got), text(want), "{shape}");
        // tokio-postgres closes the statement right away and the next query follows in the
        // same breath: the proxy must plan it afresh, not refuse it on the server the Close
        // went to.
        let next = client.simple_query("select count(*) from acct").await;
        assert!(next.is_ok(), "after {shape}: {next:?}");
    }
    let prepared = client
        .prepare("select count(*), sum(id)::text from acct where grp = $1")
        .await
        .expect("prepare");
    for g in [0i32, 5] {
        let row = client
            .query_one(&prepared, &[&g])
            .await
            .expect("run prepared");
        let want: Vec<i64> = (1..=160).filter(|i| i % 7 == i64::from(g)).collect();
        assert_eq!(row.get::<_, i64>(0), want.len() as i64);
        assert_eq!(
            row.get::<_, String>(1),
            want.iter().sum::<i64>().to_string()
        );
    }
}

/// Joins pushed down to every group: distributed tables co-located on their keys, and a
/// reference table; compared with the same joins of the one-server copies.
pub async fn joins(client: &tokio_postgres::Client) {
    client
        .batch_execute(
            "create table tx (id bigint, acct_id bigint, amount numeric, primary key (acct_id, id)); \
             create table tx_one (id bigint, acct_id bigint, amount numeric); \
             create table kinds (grp int primary key, label text)",
        )
        .await
        .expect("tables");
    for sql in [
        "select herd.create_distributed_table('tx', 'acct_id')",
        "select herd.create_reference_table('kinds')",
    ] {
        client.simple_query(sql).await.expect(sql);
    }
    let rows: Vec<String> = (1..=120i64)
        .map(|i| format!("({i}, {}, {}.5)", (i * 7) % 160 + 1, i))
        .collect();
    for t in ["tx", "tx_one"] {
        client
            .batch_execute(&format!(
                "insert into {t} (id, acct_id, amount) values {}",
                rows.join(", ")
            ))
            .await
            .expect("transactions");
    }
    client
        .batch_execute(
            "insert into kinds (grp, label) values (0, 'zero'), (1, 'one'), (2, 'two'), \
             (3, 'three'), (4, 'four'), (5, 'five')",
        )
        .await
        .expect("kinds");
    for shape in [
        "select a.id, t.id, t.amount from T a join X t on t.acct_id = a.id order by a.id, t.id",
        "select a.grp, count(*), sum(t.amount) from T a join X t on t.acct_id = a.id group by a.grp order by a.grp",
        "select a.id, k.label from T a join kinds k on k.grp = a.grp where a.balance > 0 order by a.id",
        "select k.label, count(*), max(a.name) from T a join kinds k on k.grp = a.grp group by k.label order by k.label",
        "select a.id from T a left join X t on t.acct_id = a.id where t.id is null order by a.id",
        "select a.id, sum(t.amount) as total from T a join X t on t.acct_id = a.id group by a.id order by total desc, a.id limit 5",
    ] {
        let over = |t: &str, x: &str| shape.replace(" T", &format!(" {t}")).replace(" X", &format!(" {x}"));
        let got = simple(client, &over("acct", "tx")).await;
        let want = simple(client, &over("acct_one", "tx_one")).await;
        assert!(!want.is_empty(), "{shape}");
        assert_eq!(got, want, "{shape}");
    }
}
