//! What the sharding tests ask of a proxy's shard map (`herd.shards`).

use tokio_postgres::Client;

/// Makes `table` (`id bigint primary key` and `columns`) and distributes it by `id`, through
/// the proxy.
pub async fn distributed_table(proxy: &Client, table: &str, columns: &str) {
    proxy
        .batch_execute(&format!(
            "create table {table} (id bigint primary key, {columns})"
        ))
        .await
        .expect("create through the proxy");
    proxy
        .simple_query(&format!(
            "select herd.create_distributed_table('{table}', 'id')"
        ))
        .await
        .expect("distribute");
}

/// The lowest shard group `group` holds, no move under way.
pub async fn first_shard_of(proxy: &Client, group: i32) -> i32 {
    proxy
        .query_one(
            "select shard from herd.shards where shard_group = $1 and moving_to is null \
             order by shard limit 1",
            &[&group],
        )
        .await
        .expect("a shard of the group")
        .get(0)
}

/// Where shard `shard` is: its group, and the group it moves to if a move is under way.
pub async fn placement(proxy: &Client, shard: i32) -> (i32, Option<i32>) {
    let row = proxy
        .query_one(
            "select shard_group, moving_to from herd.shards where shard = $1",
            &[&shard],
        )
        .await
        .expect("herd.shards");
    (row.get(0), row.get(1))
}
