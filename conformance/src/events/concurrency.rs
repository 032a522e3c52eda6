//! C6: concurrent appends, to one stream or many, never open a gap and never mix streams.

use std::collections::HashSet;
use std::sync::Arc;

use super::*;

/// C3: many streams, each replaying exactly its own events.
pub async fn many_streams_stay_separate<H: Harness>(h: &H) {
    let (store, _) = open_default(h).await;
    let mut firsts = Vec::new();
    for s in 0..300 {
        firsts.push(append(&store, &format!("stream-{s}"), b"0").await);
    }
    for round in 1..3u8 {
        for s in 0..300 {
            append(&store, &format!("stream-{s}"), &[round]).await;
        }
    }
    for (s, first) in firsts.iter().enumerate() {
        let (stream, events) = replay_all(&store, &text(first)).await.unwrap();
        assert_eq!(stream, format!("stream-{s}"));
        let data: Vec<_> = events.iter().map(|e| e.data.to_vec()).collect();
        assert_eq!(data, vec![vec![1u8], vec![2u8]]);
    }
    h.close(store).await;
}

/// C6: 1000 appends to one stream from 20 tasks while a reader follows the
/// stream by cursor. The reader must end up with every acknowledged event,
/// each once, in id order: an event that became visible behind its cursor
/// would be missing.
pub async fn concurrent_appends_to_one_stream_never_open_a_gap<H: Harness>(h: &H) {
    const WRITERS: usize = 20;
    const PER_WRITER: usize = 50;
    let (store, _) = open_default(h).await;
    let store = Arc::new(store);
    let start = append(&*store, "hot", b"start").await;
    let done = Arc::new(std::sync::atomic::AtomicBool::new(false));

    let reader = {
        let store = store.clone();
        let done = done.clone();
        tokio::spawn(async move {
            let mut cursor = start;
            let mut seen = Vec::new();
            loop {
                let finished = done.load(std::sync::atomic::Ordering::SeqCst);
                let (_, events) = replay_all(&*store, &text(&cursor)).await.unwrap();
                for event in events {
                    assert!(event.id.position > cursor.position, "replay went backwards");
                    cursor = event.id;
                    seen.push(event.id);
                }
                if finished {
                    return seen;
                }
                tick().await;
            }
        })
    };

    let writers: Vec<_> = (0..WRITERS)
        .map(|w| {
            let store = store.clone();
            tokio::spawn(async move {
                let mut ids = Vec::new();
                for i in 0..PER_WRITER {
                    ids.push(append(&*store, "hot", format!("{w}-{i}").as_bytes()).await);
                }
                ids
            })
        })
        .collect();
    let mut acknowledged = Vec::new();
    for writer in writers {
        acknowledged.extend(writer.await.unwrap());
    }
    done.store(true, std::sync::atomic::Ordering::SeqCst);
    let seen = reader.await.unwrap();

    acknowledged.sort_by_key(|id| id.position);
    assert_eq!(acknowledged.len(), WRITERS * PER_WRITER);
    let unique: HashSet<_> = acknowledged.iter().collect();
    assert_eq!(
        unique.len(),
        acknowledged.len(),
        "duplicate ids acknowledged"
    );
    assert_eq!(
        seen.len(),
        acknowledged.len(),
        "the reader missed events that appeared behind its cursor"
    );
    assert_eq!(seen, acknowledged);
    let store = Arc::into_inner(store).expect("all tasks finished");
    h.close(store).await;
}

/// C6: 32 tasks appending to 32 streams lose and duplicate nothing.
pub async fn concurrent_appends_to_many_streams<H: Harness>(h: &H) {
    let (store, _) = open_default(h).await;
    let store = Arc::new(store);
    let tasks: Vec<_> = (0..32)
        .map(|s| {
            let store = store.clone();
            tokio::spawn(async move {
                let stream = format!("stream-{s}");
                let first = append(&*store, &stream, b"first").await;
                for i in 0..30u32 {
                    append(&*store, &stream, &i.to_be_bytes()).await;
                }
                (first, stream)
            })
        })
        .collect();
    for task in tasks {
        let (first, stream) = task.await.unwrap();
        let (replayed, events) = replay_all(&*store, &text(&first)).await.unwrap();
        assert_eq!(replayed, stream);
        let data: Vec<_> = events.iter().map(|e| e.data.to_vec()).collect();
        let want: Vec<_> = (0..30u32).map(|i| i.to_be_bytes().to_vec()).collect();
        assert_eq!(data, want, "{stream}");
    }
    let store = Arc::into_inner(store).expect("all tasks finished");
    h.close(store).await;
}

/// Registers this file's cases with [`event_suite!`](crate::event_suite).
#[doc(hidden)]
#[macro_export]
macro_rules! __conformance_concurrency {
    ($harness:expr) => {
        $crate::__conformance_cases!($harness;
            many_streams_stay_separate,
            concurrent_appends_to_one_stream_never_open_a_gap,
            concurrent_appends_to_many_streams
        );
    };
}
