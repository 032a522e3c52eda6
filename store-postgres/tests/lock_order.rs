//! Purges and appends lock stream rows in one order (by token), so they
//! never deadlock (defect 7 of issue 11).
//!
//! A test binary of its own, with one test, so the tracing subscriber it
//! installs for the whole process sees only this test's warnings: a batched
//! append that the server refused (a deadlock, say) is retried event by
//! event and logged, never returned, so the log is where such an error
//! shows.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use mcp_event_store_conformance::events::{Harness, test_clock, test_options};
use mcp_event_store_core::{EventStore, NewEvent, Retention};
use mcp_event_store_postgres::testing::PostgresHarness;
use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id, Record};
use tracing::{Event, Level, Metadata, Subscriber};

/// Keeps every event at WARN or above, as text.
#[derive(Clone, Default)]
struct Warnings(Arc<Mutex<Vec<String>>>);

struct Text<'a>(&'a mut String);

impl Visit for Text<'_> {
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        self.0.push_str(&format!(" {}={value:?}", field.name()));
    }
}

impl Subscriber for Warnings {
    fn enabled(&self, metadata: &Metadata<'_>) -> bool {
        *metadata.level() <= Level::WARN
    }
    fn new_span(&self, _: &Attributes<'_>) -> Id {
        Id::from_u64(1)
    }
    fn record(&self, _: &Id, _: &Record<'_>) {}
    fn record_follows_from(&self, _: &Id, _: &Id) {}
    fn event(&self, event: &Event<'_>) {
        let mut text = format!("{}:", event.metadata().target());
        event.record(&mut Text(&mut text));
        self.0.lock().unwrap().push(text);
    }
    fn enter(&self, _: &Id) {}
    fn exit(&self, _: &Id) {}
}

const STREAMS: usize = 48;
const APPENDERS: usize = 32;
const APPENDS_EACH: usize = 400;

/// Many appenders over many streams (so appends go in multi-stream
/// batches) while two handles purge in a loop and a third deletes streams:
/// count retention gives every purge a trim on most streams, and age
/// retention empties whole streams for the purge to remove while appends
/// start them again. Nothing may fail, and no batch may be refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn purges_under_a_multi_stream_append_load_never_deadlock() {
    let warnings = Warnings::default();
    tracing::subscriber::set_global_default(warnings.clone()).expect("the only subscriber");

    let h = PostgresHarness::new().await;
    let clock = test_clock();
    let retention = Retention::unbounded()
        .max_events_per_stream(3)
        .max_age(Duration::from_secs(60));
    let open = || async {
        h.open_with(
            h.options(test_options(&clock).retention(retention))
                .max_connections(12),
        )
        .await
    };
    let appender_store = Arc::new(open().await);
    let purgers = [Arc::new(open().await), Arc::new(open().await)];
    let deleter_store = Arc::new(open().await);
    let done = Arc::new(AtomicBool::new(false));
    let errors: Arc<Mutex<Vec<String>>> = Arc::default();

    let mut appenders = Vec::new();
    for a in 0..APPENDERS {
        let (store, errors) = (appender_store.clone(), errors.clone());
        appenders.push(tokio::spawn(async move {
            for i in 0..APPENDS_EACH {
                let stream = format!("s-{}", (a * 7 + i * 13) % STREAMS);
                if let Err(e) = store.store_event(&stream, NewEvent::new(b"x")).await {
                    errors.lock().unwrap().push(format!("append: {e:?}"));
                }
            }
        }));
    }
    let purges = Arc::new(AtomicU64::new(0));
    let mut loops = Vec::new();
    for store in &purgers {
        let (store, done, errors) = (store.clone(), done.clone(), errors.clone());
        let purges = purges.clone();
        loops.push(tokio::spawn(async move {
            while !done.load(Ordering::SeqCst) {
                match store.purge_expired().await {
                    Ok(_) => purges.fetch_add(1, Ordering::Relaxed),
                    Err(e) => {
                        errors.lock().unwrap().push(format!("purge: {e:?}"));
                        0
                    }
                };
            }
        }));
    }
    {
        // Time moves on, so streams not written for a while expire whole.
        let (clock, done) = (clock.clone(), done.clone());
        loops.push(tokio::spawn(async move {
            while !done.load(Ordering::SeqCst) {
                clock.advance(Duration::from_secs(20));
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }));
    }
    {
        let (store, done, errors) = (deleter_store.clone(), done.clone(), errors.clone());
        loops.push(tokio::spawn(async move {
            let mut n = 0;
            while !done.load(Ordering::SeqCst) {
                n += 1;
                if let Err(e) = store.delete_stream(&format!("s-{}", n % STREAMS)).await {
                    errors.lock().unwrap().push(format!("delete_stream: {e:?}"));
                }
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        }));
    }
    for appender in appenders {
        appender.await.unwrap();
    }
    done.store(true, Ordering::SeqCst);
    for task in loops {
        task.await.unwrap();
    }
    let purges = purges.load(Ordering::Relaxed);
    for store in [appender_store, deleter_store].into_iter().chain(purgers) {
        h.close(Arc::into_inner(store).unwrap()).await;
    }
    h.teardown().await;

    // sqlx's own "slow statement" warnings only say a statement waited
    // (on a busy machine, for a lock or the CPU); any other warning of
    // ours, or any deadlock, counts.
    let errors = errors.lock().unwrap().clone();
    let warnings: Vec<String> = warnings
        .0
        .lock()
        .unwrap()
        .iter()
        .filter(|text| {
            // The connect-time vacuum advice depends on the server's
            // settings, not on this test.
            let ours = text.starts_with("mcp_event_store")
                && !text.starts_with("mcp_event_store_postgres::setup");
            ours || text.contains("deadlock")
        })
        .cloned()
        .collect();
    let deadlocks = errors
        .iter()
        .chain(warnings.iter().filter(|text| text.contains("batch")))
        .filter(|text| text.contains("40P01") || text.contains("deadlock"))
        .count();
    assert!(
        errors.is_empty() && warnings.is_empty(),
        "{deadlocks} deadlocks; {} calls failed, {} warnings, in {purges} purges:\n{}\n{}",
        errors.len(),
        warnings.len(),
        errors.join("\n"),
        warnings.join("\n"),
    );
    assert!(purges >= 2, "the purges never overlapped the appends");
}
