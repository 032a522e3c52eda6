//! Redemptions (C21), per backend at the default durability: the store's
//! `RedeemStore::redeem` beside the database's own insert-if-absent done by
//! hand with the raw driver.
//!
//! ```text
//! cargo bench -p mcp-event-store-benches --bench redeem              # every backend
//! cargo bench -p mcp-event-store-benches --bench redeem -- sqlite/   # one backend
//! ```
//!
//! The store is a handle on its test harness's storage (a fresh file,
//! directory, schema, key prefix or bucket set, removed at the end),
//! reached as an application reaches it (`EventStore::redeemer`). Nonces
//! are 24 bytes, fresh for every call; the raw baselines hash them to the
//! store's key (SHA-256 of the principal's digest and the nonce) first, so
//! both pay for it.
//!
//! Benchmark ids (`redeem/<backend>/...`), throughput in redemptions:
//!
//! | id | what |
//! |---|---|
//! | `store` | `redeem` of a fresh nonce: the checks, the digest, the insert-if-absent, durable on return (`Redeemed`) |
//! | `raw` | the database's own insert-if-absent of a fresh key: SQLite, PostgreSQL: the store's `INSERT … ON CONFLICT (key) DO NOTHING` into its own table (SQLite: rusqlite behind one thread hop, `synchronous=NORMAL`, as the store's writer; PostgreSQL: a pool of its own); Redis: `SET key v NX PXAT` on a multiplexed connection; sled: `compare_and_swap(None → v)` then `flush()` on the blocking pool; NATS: the key-value bucket's `create`; memory: a `HashMap` insert-if-absent behind a mutex |
//! | `store_replayed` | `redeem` of a nonce redeemed before (`AlreadyRedeemed`) |
//! | `raw_replayed` | the raw insert-if-absent of a key stored before |
//!
//! The store's own extra work is what `store` costs beyond `raw`: sled
//! also writes the record's expiry entry the purge walks; the others write
//! what the raw case writes.

use mcp_event_store_benches as common;

use std::time::Duration;

use criterion::measurement::WallTime;
use criterion::{BenchmarkGroup, Criterion, Throughput, criterion_group, criterion_main};
use mcp_event_store::{EventStore, RedeemStore, Redemption, StoreOptions};
use mcp_event_store_conformance::bench::redeem::{
    Nonces, RawRedeem, expires_at, forget_at, key, principal,
};
use mcp_event_store_conformance::bench::{Kit, Visitor};
use mcp_event_store_conformance::events::Harness;
use tokio::runtime::Runtime;

fn group<'a>(c: &'a mut Criterion, backend: &str) -> BenchmarkGroup<'a, WallTime> {
    let mut group = c.benchmark_group(format!("redeem/{backend}"));
    group.warm_up_time(Duration::from_secs(1));
    group.measurement_time(Duration::from_secs(3));
    group.sample_size(20);
    group.throughput(Throughput::Elements(1));
    group
}

struct Redeem<'a> {
    c: &'a mut Criterion,
    rt: &'a Runtime,
}

impl Visitor for Redeem<'_> {
    type Output = ();

    fn visit<K: Kit>(self) {
        let Redeem { c, rt } = self;
        let harness = rt.block_on(K::harness());
        let store = rt.block_on(harness.open(StoreOptions::default()));
        let raw = rt.block_on(K::raw_redeem(&harness));
        let redeemer: &dyn RedeemStore = store.redeemer().expect("the store redeems");
        let (nonces, who) = (Nonces::new(), principal());
        let mut group = group(c, K::BACKEND.name);
        group.bench_function("store", |b| {
            b.to_async(rt).iter(|| async {
                let nonce = nonces.next();
                let answer = redeemer
                    .redeem(&nonce, expires_at(), &who)
                    .await
                    .expect("redeem");
                assert_eq!(answer, Redemption::Redeemed);
            })
        });
        group.bench_function("raw", |b| {
            b.to_async(rt).iter(|| async {
                let nonce = nonces.next();
                assert!(raw.redeem(&key(&nonce, &who), forget_at()).await);
            })
        });
        // One nonce each: the raw baselines of SQLite and PostgreSQL write
        // to the store's own table.
        let (spent, spent_raw) = (nonces.next(), nonces.next());
        rt.block_on(async {
            let first = redeemer.redeem(&spent, expires_at(), &who).await;
            assert_eq!(first.expect("redeem"), Redemption::Redeemed);
            assert!(raw.redeem(&key(&spent_raw, &who), forget_at()).await);
        });
        group.bench_function("store_replayed", |b| {
            b.to_async(rt).iter(|| async {
                let answer = redeemer
                    .redeem(&spent, expires_at(), &who)
                    .await
                    .expect("redeem");
                assert_eq!(answer, Redemption::AlreadyRedeemed);
            })
        });
        group.bench_function("raw_replayed", |b| {
            b.to_async(rt).iter(|| async {
                assert!(!raw.redeem(&key(&spent_raw, &who), forget_at()).await);
            })
        });
        group.finish();
        rt.block_on(async {
            raw.close().await;
            harness.close(store).await;
            harness.teardown().await;
        });
    }
}

fn redeem(c: &mut Criterion) {
    let rt = common::runtime();
    for backend in common::selected() {
        common::visit(
            backend,
            Redeem {
                c: &mut *c,
                rt: &rt,
            },
        );
    }
}

criterion_group!(benches, redeem);
criterion_main!(benches);
