//! The PostgreSQL store's append beside a raw insert, timed in interleaved
//! rounds: each round makes 50 appends of each kind, one kind after the
//! other, so both see the same machine (one of each, alternated, would
//! charge the raw insert with the store's `NOTIFY`, which runs after the
//! append returns). A durable commit waits for a WAL flush,
//! whose time on a shared machine moves by more than the store's own work;
//! the criterion cases (`append/postgres/*_1_writer`), run one after
//! another, each see whatever state the disk was in during theirs.
//!
//! Prints the median of each kind and their ratio, then the process's own
//! CPU per append of each kind (user and system time, from
//! `/proc/self/stat`; Linux only), over runs of one kind at a
//! time: what the client side costs, apart from the server and the disk.
//! The store appends to one
//! stream at the default limits; the raw insert is the criterion case's
//! (`INSERT` of the stream and payload into a table with a `BIGSERIAL` key,
//! through a sqlx pool). Finds its server as the tests do and works in a
//! random schema that it drops at the end.
//!
//! ```text
//! cargo run --release -p mcp-event-store-benches --example postgres_append_pairs            # 5,000 rounds
//! cargo run --release -p mcp-event-store-benches --example postgres_append_pairs -- 2000    # 2,000 rounds
//! ```

use std::time::{Duration, Instant};

use mcp_event_store::{EventStore, NewEvent};
use mcp_event_store_postgres::testing;
use sqlx::AssertSqlSafe;

/// Appends of one kind in a row, before the other kind's: the store
/// announces each append with a `NOTIFY` that runs after it returns, so an
/// insert timed right after an append would pay for part of that
/// announcement. In blocks, only the first insert of each block can.
const BLOCK: usize = 50;

fn main() {
    let rounds = mcp_event_store_benches::rounds_arg(5_000);
    let rt = mcp_event_store_benches::runtime();
    rt.block_on(async {
        let mcp_event_store_benches::postgres::AppendSetup {
            url,
            schema,
            store,
            pool,
            insert,
        } = mcp_event_store_benches::postgres::append_setup(1).await;
        let data = mcp_event_store_benches::payload();
        let raw_insert = || async {
            sqlx::query(AssertSqlSafe(insert.clone()))
                .bind(&b"writer-0"[..])
                .bind(&data[..])
                .execute(&pool)
                .await
                .expect("raw insert");
        };
        let append = || async {
            store
                .store_event("writer-0", NewEvent::new(&data))
                .await
                .expect("append");
        };
        let mut times: Vec<Vec<Duration>> = (0..2).map(|_| Vec::with_capacity(rounds)).collect();
        for block in 0..rounds.div_ceil(BLOCK) {
            let size = BLOCK.min(rounds - block * BLOCK);
            for _ in 0..size {
                let start = Instant::now();
                raw_insert().await;
                times[0].push(start.elapsed());
            }
            for _ in 0..size {
                let start = Instant::now();
                append().await;
                times[1].push(start.elapsed());
            }
        }
        let [raw, appended] = [0, 1].map(|i| mcp_event_store_benches::median_us(&mut times[i]));
        println!(
            "{rounds} rounds, medians: raw insert {raw:.1} us; store {appended:.1} us ({:.2}x of raw)",
            raw / appended
        );
        let per_op = |before: Option<u64>| {
            mcp_event_store_benches::process_cpu_ns().zip(before).map(|(after, before)| (after - before) as f64 / rounds as f64 / 1e3)
        };
        let before = mcp_event_store_benches::process_cpu_ns();
        for _ in 0..rounds {
            raw_insert().await;
        }
        let raw_cpu = per_op(before);
        let before = mcp_event_store_benches::process_cpu_ns();
        for _ in 0..rounds {
            append().await;
        }
        if let (Some(raw_cpu), Some(store_cpu)) = (raw_cpu, per_op(before)) {
            println!(
                "this process's CPU per append: raw insert {raw_cpu:.1} us; store {store_cpu:.1} us"
            );
        }
        store.close().await;
        pool.close().await;
        testing::drop_schema(&url, &schema)
            .await
            .expect("drop the schema");
    });
}
