//! Herd's placement hash equals PostgreSQL's own hash partitioning: for every key, the virtual
//! shard Herd computes is the remainder for which the server's `satisfies_hash_partition()` is
//! true, for each supported key type (int2, int4, int8, text, uuid).

mod common;

use common::{cluster, connect};
use herd_shard::{partition_hash, shard_sql, virtual_shard, KeyType};

/// Keys of every type, chosen for edges: signs, widths, every tail length of the byte hash
/// (0–40 bytes), multibyte UTF-8, and uuids.
fn samples() -> Vec<(KeyType, &'static str, String)> {
    let mut out = Vec::new();
    for v in [
        i16::MIN as i64,
        -300,
        -1,
        0,
        1,
        7,
        255,
        256,
        i16::MAX as i64,
    ] {
        out.push((KeyType::Int2, "smallint", v.to_string()));
    }
    for v in [
        i32::MIN as i64,
        -65_536,
        -1,
        0,
        1,
        42,
        65_537,
        1 << 24,
        i32::MAX as i64,
    ] {
        out.push((KeyType::Int4, "integer", v.to_string()));
    }
    for v in [
        i64::MIN,
        -(1 << 40),
        -1,
        0,
        1,
        1 << 33,
        (1 << 40) + 5,
        i64::MAX,
    ] {
        out.push((KeyType::Int8, "bigint", v.to_string()));
    }
    for len in 0..=40 {
        let text: String = (0..len)
            .map(|i| (b'a' + (i * 7 % 26) as u8) as char)
            .collect();
        out.push((KeyType::Text, "text", text));
    }
    for text in ["é", "日本語のキー", "customer-12345", "🐘 postgres"] {
        out.push((KeyType::Text, "text", text.to_string()));
    }
    for u in [
        "00000000-0000-0000-0000-000000000000",
        "a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11",
        "ffffffff-ffff-ffff-ffff-ffffffffffff",
        "123e4567-e89b-12d3-a456-426614174000",
    ] {
        out.push((KeyType::Uuid, "uuid", u.to_string()));
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn placement_matches_postgresql_hash_partitioning() {
    let c = cluster();
    c.up(&["--replicas", "0"]);
    let client = connect(&c.url(&["--primary"])).await;
    for ty in ["smallint", "integer", "bigint", "text", "uuid"] {
        client
            .batch_execute(&format!(
                "create table \"p_{ty}\" (k {ty}) partition by hash (k)"
            ))
            .await
            .expect("creating a hash-partitioned table");
    }
    let mut checked = 0;
    for shards in [32u32, 7] {
        for (key_type, pg_type, text) in samples() {
            let key = key_type.parse(&text).expect("sample parses");
            let shard = virtual_shard(partition_hash(Some(&key)), shards);
            let row = client
                .query_one(
                    &format!(
                        "select satisfies_hash_partition('\"p_{pg_type}\"'::regclass, $1, $2, $3::text::{pg_type})"
                    ),
                    &[&(shards as i32), &(shard as i32), &text],
                )
                .await
                .expect("satisfies_hash_partition");
            assert!(
                row.get::<_, bool>(0),
                "{pg_type} key {text:?}: Herd says shard {shard} of {shards}, PostgreSQL disagrees"
            );
            // The SQL form `herd shards verify` runs agrees too.
            let expr = shard_sql(&format!("$1::text::{pg_type}"), key_type, shards);
            let row = client
                .query_one(&format!("select {expr}"), &[&text])
                .await
                .expect("shard_sql");
            assert_eq!(
                row.get::<_, i32>(0) as u32,
                shard,
                "{pg_type} {text:?} in SQL"
            );
            checked += 1;
        }
    }
    assert!(checked > 100);
    // A NULL key is in shard 0, as in hash partitioning.
    let null = client
        .query_one(
            &format!("select {}", shard_sql("null::bigint", KeyType::Int8, 32)),
            &[],
        )
        .await
        .expect("null");
    assert_eq!(null.get::<_, i32>(0), 0);
}
