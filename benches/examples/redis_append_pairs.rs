//! The Redis store's append beside raw `XADD`, timed in interleaved rounds:
//! each round makes one append of each kind, one after the other, so every
//! kind sees the same machine. A lone append on Redis is a round trip of a
//! few tens of microseconds, and how long a parked thread takes to wake
//! moves it by as much again as the machine's load changes; the criterion
//! cases (`append/redis/*_1_writer`), run one after another, each see
//! whatever state the machine was in during theirs.
//!
//! Prints the median of each kind and three ratios: the store, on streams
//! below the count limit, against raw `XADD`; `EVALSHA` of a script that
//! only does the `XADD` (the floor of any script-based append) against raw
//! `XADD`; and the store on a stream at the default count limit (10,000),
//! where each append also removes the oldest event, against raw `XADD
//! MAXLEN = 10000` on a stream at that length. Then, over one run of each
//! of raw `XADD`, the `XADD`-only script and the store below the limit,
//! the process's own CPU per append (user and system time, from
//! `/proc/self/stat`; Linux only), what the client side costs, and the
//! server's own time per append (`INFO commandstats`, read before and
//! after the run), what the server side costs. Finds its server as the
//! tests do and works under a random key prefix that it removes at the
//! end.
//!
//! ```text
//! cargo run --release -p mcp-event-store-benches --example redis_append_pairs            # 20,000 rounds
//! cargo run --release -p mcp-event-store-benches --example redis_append_pairs -- 5000    # 5,000 rounds
//! ```

use std::time::{Duration, Instant};

use mcp_event_store::{EventStore, NewEvent, Retention};
use redis::aio::MultiplexedConnection;

/// Appends to one stream before the store's below-limit appends move to
/// the next: half the default count limit.
const STREAM_EVENTS: usize = 5_000;

async fn xadd(conn: &MultiplexedConnection, key: &str, maxlen: Option<u64>, data: &[u8]) {
    let mut cmd = redis::cmd("XADD");
    cmd.arg(key);
    if let Some(maxlen) = maxlen {
        cmd.arg("MAXLEN").arg("=").arg(maxlen);
    }
    let _: String = cmd
        .arg("*")
        .arg("d")
        .arg(data)
        .query_async(&mut conn.clone())
        .await
        .expect("raw XADD");
}

fn main() {
    let rounds = mcp_event_store_benches::rounds_arg(20_000);
    let rt = mcp_event_store_benches::runtime();
    rt.block_on(async {
        let (store, conn, prefix) = mcp_event_store_benches::redis::store_and_raw().await;
        let data = mcp_event_store_benches::payload();
        let (raw_key, maxlen_key) = (format!("{prefix}:raw"), format!("{prefix}:raw:maxlen"));
        let limit = Retention::default()
            .max_events_per_stream
            .expect("a default count limit");
        for _ in 0..limit {
            store
                .store_event("at-limit", NewEvent::new(&data))
                .await
                .expect("fill the stream at the limit");
            xadd(&conn, &maxlen_key, None, &data).await;
        }
        let script = redis::Script::new(mcp_event_store_benches::redis::XADD_SCRIPT);
        let script_key = format!("{prefix}:raw:script");
        let xadd_script = || async {
            let _: String = script
                .key(&script_key)
                .arg(&data[..])
                .invoke_async(&mut conn.clone())
                .await
                .expect("EVALSHA XADD");
        };
        let mut times: Vec<Vec<Duration>> = (0..5).map(|_| Vec::with_capacity(rounds)).collect();
        for round in 0..rounds {
            let start = Instant::now();
            xadd(&conn, &raw_key, None, &data).await;
            times[0].push(start.elapsed());
            let start = Instant::now();
            xadd_script().await;
            times[4].push(start.elapsed());
            let stream = format!("below-limit-{}", round / STREAM_EVENTS);
            let start = Instant::now();
            store
                .store_event(&stream, NewEvent::new(&data))
                .await
                .expect("append");
            times[1].push(start.elapsed());
            let start = Instant::now();
            store
                .store_event("at-limit", NewEvent::new(&data))
                .await
                .expect("append at the limit");
            times[2].push(start.elapsed());
            let start = Instant::now();
            xadd(&conn, &maxlen_key, Some(limit), &data).await;
            times[3].push(start.elapsed());
        }
        let [raw, below, at_limit, raw_maxlen, floor] =
            [0, 1, 2, 3, 4].map(|i| mcp_event_store_benches::median_us(&mut times[i]));
        println!(
            "{rounds} rounds, medians: raw XADD {raw:.1} us; store below the limit {below:.1} us \
             ({:.2}x of raw); XADD-only script {floor:.1} us ({:.2}x of raw); store at the limit \
             {at_limit:.1} us; raw XADD MAXLEN at the limit {raw_maxlen:.1} us ({:.2}x)",
            raw / below,
            raw / floor,
            raw_maxlen / at_limit
        );
        // Then one kind at a time, each run read twice: the process's own
        // CPU per append (the client side) and the server's own time per
        // append (apart from the network and the client).
        let (raw_cpu, raw_server) = one_kind(&conn, "xadd", rounds, async |_| {
            xadd(&conn, &raw_key, None, &data).await;
        })
        .await;
        let (floor_cpu, floor_server) =
            one_kind(&conn, "evalsha", rounds, async |_| xadd_script().await).await;
        let (store_cpu, store_server) = one_kind(&conn, "evalsha", rounds, async |round| {
            let stream = format!("one-kind-{}", round / STREAM_EVENTS);
            store
                .store_event(&stream, NewEvent::new(&data))
                .await
                .expect("append");
        })
        .await;
        if let (Some(raw_cpu), Some(floor_cpu), Some(store_cpu)) = (raw_cpu, floor_cpu, store_cpu) {
            println!(
                "this process's CPU per append: raw XADD {raw_cpu:.1} us; XADD-only script \
                 {floor_cpu:.1} us; store below the limit {store_cpu:.1} us"
            );
        }
        println!(
            "the server's time per append: raw XADD {raw_server:.1} us; XADD-only script \
             {floor_server:.1} us; store below the limit {store_server:.1} us"
        );
        store.destroy().await.expect("remove the key prefix");
    });
}

/// Makes `rounds` appends of one kind, `append(round)` each, and returns
/// the process's own CPU per append in microseconds (`None` off Linux) and
/// the server's time per append in microseconds, from its count for
/// `command` (the one each append calls) in `INFO commandstats`.
async fn one_kind(
    conn: &MultiplexedConnection,
    command: &str,
    rounds: usize,
    mut append: impl AsyncFnMut(usize),
) -> (Option<f64>, f64) {
    use mcp_event_store_benches::{process_cpu_ns, redis::command_time};
    let server_before = command_time(conn, command).await;
    let cpu_before = process_cpu_ns();
    for round in 0..rounds {
        append(round).await;
    }
    let cpu = process_cpu_ns()
        .zip(cpu_before)
        .map(|(after, before)| (after - before) as f64 / rounds as f64 / 1e3);
    let server_after = command_time(conn, command).await;
    let calls = (server_after.0 - server_before.0).max(1);
    (
        cpu,
        (server_after.1 - server_before.1) as f64 / calls as f64,
    )
}
