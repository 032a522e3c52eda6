//! What a writer acknowledged, and the check that a store still has all of
//! it: the reader behind every crash test (C1, C10).

use std::collections::BTreeMap;

use futures_util::TryStreamExt;

use mcp_event_store_core::{EventStore, NewEvent};

/// One acknowledged append, as a writer reports it on a line of its
/// output: `ACK <stream> <n> <id>` (the `n`th event after the stream's
/// start, whose payload is [`Ack::payload`]), or the stream's first event
/// `START <stream> <id>`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Ack {
    /// The stream's first event: acknowledged events are read after it.
    Start {
        /// The stream.
        stream: String,
        /// The first event's id.
        id: String,
    },
    /// An event acknowledged after the start.
    Event {
        /// The stream.
        stream: String,
        /// Its number after the start, from 0.
        n: u64,
        /// Its id.
        id: String,
    },
}

impl Ack {
    /// The payload of event `n` of `stream`: what a writer appends, and what
    /// [`AckLog::verify`] expects back.
    pub fn payload(stream: &str, n: u64) -> Vec<u8> {
        format!("{stream}/{n}").into_bytes()
    }

    /// The line a writer prints for it (no newline).
    pub fn line(&self) -> String {
        match self {
            Ack::Start { stream, id } => format!("START {stream} {id}"),
            Ack::Event { stream, n, id } => format!("ACK {stream} {n} {id}"),
        }
    }

    /// Parses a line of [`line`](Self::line)'s shape; `None` for any other
    /// output. The acknowledgement may follow other text on its line: a
    /// test binary run with `--nocapture` prints `test <name> ... ` with no
    /// newline before the test's own first line.
    pub fn parse(line: &str) -> Option<Self> {
        let at = ["START ", "ACK "]
            .iter()
            .filter_map(|word| line.find(word))
            .min()?;
        let mut words = line[at..].split_whitespace();
        match (words.next()?, words.next()?, words.next()?) {
            ("START", stream, id) => Some(Ack::Start {
                stream: stream.to_owned(),
                id: id.to_owned(),
            }),
            ("ACK", stream, n) => Some(Ack::Event {
                stream: stream.to_owned(),
                n: n.parse().ok()?,
                id: words.next()?.to_owned(),
            }),
            _ => None,
        }
    }
}

/// Every acknowledged event, per stream, in acknowledgement order.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() {
/// use mcp_event_store_conformance::testkit::{Ack, AckLog};
/// use mcp_event_store_core::{EventStore, MemoryStore};
///
/// let store = MemoryStore::new();
/// let mut log = AckLog::default();
/// log.append_acknowledged(&store, "s", 3).await; // START and three ACKs
/// assert_eq!(log.acknowledged(), 3);
/// assert_eq!(log.verify(&store).await, Ok(3));
/// # }
/// ```
#[derive(Clone, Debug, Default)]
pub struct AckLog {
    streams: BTreeMap<String, Stream>,
}

#[derive(Clone, Debug, Default)]
struct Stream {
    start: Option<String>,
    acked: Vec<(u64, String)>,
}

impl AckLog {
    /// Records one acknowledgement.
    pub fn record(&mut self, ack: Ack) {
        match ack {
            Ack::Start { stream, id } => self.streams.entry(stream).or_default().start = Some(id),
            Ack::Event { stream, n, id } => {
                self.streams.entry(stream).or_default().acked.push((n, id));
            }
        }
    }

    /// Records the acknowledgement on `line`, if it is one; returns whether
    /// it was.
    pub fn record_line(&mut self, line: &str) -> bool {
        Ack::parse(line).map(|ack| self.record(ack)).is_some()
    }

    /// How many events (not counting starts) were acknowledged.
    pub fn acknowledged(&self) -> usize {
        self.streams.values().map(|s| s.acked.len()).sum()
    }

    /// The streams with at least a start.
    pub fn streams(&self) -> impl Iterator<Item = &str> {
        self.streams.keys().map(String::as_str)
    }

    /// Appends a start and `count` events to `stream` of `store` and
    /// records each as it returns: the writer's side, in process.
    ///
    /// # Panics
    ///
    /// When an append fails.
    pub async fn append_acknowledged<S: EventStore + ?Sized>(
        &mut self,
        store: &S,
        stream: &str,
        count: u64,
    ) {
        let start = store
            .store_event(stream, NewEvent::new(b"start"))
            .await
            .unwrap_or_else(|e| panic!("appending the start of {stream}: {e}"));
        self.record(Ack::Start {
            stream: stream.to_owned(),
            id: start.to_string(),
        });
        for n in 0..count {
            let id = store
                .store_event(stream, NewEvent::new(&Ack::payload(stream, n)))
                .await
                .unwrap_or_else(|e| panic!("appending event {n} of {stream}: {e}"));
            self.record(Ack::Event {
                stream: stream.to_owned(),
                n,
                id: id.to_string(),
            });
        }
    }

    /// Reads each stream by cursor from its start and checks that every
    /// acknowledged event is there, in order, with its id and payload; a
    /// stream may hold one more event after its last acknowledged one (its
    /// append was durable, its acknowledgement not yet printed). Returns
    /// how many acknowledged events it found, or what is wrong.
    pub async fn verify<S: EventStore + ?Sized>(&self, store: &S) -> Result<usize, String> {
        let mut found = 0;
        for (stream, log) in &self.streams {
            let Some(start) = &log.start else {
                return Err(format!("{stream}: acknowledgements without a START"));
            };
            let replay = store
                .replay_events_after(start)
                .await
                .map_err(|e| format!("{stream}: replay after its start {start}: {e}"))?;
            if replay.stream_id != *stream {
                return Err(format!(
                    "{stream}: its start {start} replays stream {:?}",
                    replay.stream_id
                ));
            }
            let stored: Vec<_> = replay
                .events
                .try_collect()
                .await
                .map_err(|e| format!("{stream}: reading after {start}: {e}"))?;
            for (i, (n, id)) in log.acked.iter().enumerate() {
                let Some(event) = stored.get(i) else {
                    return Err(format!(
                        "{stream}: acknowledged event {n} ({id}) is missing: only {} stored after the start",
                        stored.len()
                    ));
                };
                if event.id.to_string() != *id || event.data[..] != Ack::payload(stream, *n)[..] {
                    return Err(format!(
                        "{stream}: acknowledged event {n} ({id}) reads back as {} with {} bytes",
                        event.id,
                        event.data.len()
                    ));
                }
                found += 1;
            }
            if stored.len() > log.acked.len() + 1 {
                return Err(format!(
                    "{stream}: {} events stored after the last acknowledged one, at most one was in flight",
                    stored.len() - log.acked.len()
                ));
            }
            if stored
                .windows(2)
                .any(|pair| pair[0].id.position >= pair[1].id.position)
            {
                return Err(format!("{stream}: ids out of order after the start"));
            }
        }
        Ok(found)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use mcp_event_store_core::MemoryStore;

    #[test]
    fn lines_round_trip() {
        for ack in [
            Ack::Start {
                stream: "s".into(),
                id: "v1.x.1".into(),
            },
            Ack::Event {
                stream: "s".into(),
                n: 7,
                id: "v1.x.8".into(),
            },
        ] {
            assert_eq!(Ack::parse(&ack.line()), Some(ack));
        }
        assert_eq!(Ack::parse("test crash_child ... ok"), None);
        assert_eq!(
            Ack::parse("test sigkill_child_appender ... START crash-0 v1.x.1"),
            Some(Ack::Start {
                stream: "crash-0".into(),
                id: "v1.x.1".into(),
            })
        );
        assert_eq!(Ack::parse("ACK s notanumber id"), None);
    }

    #[tokio::test]
    async fn verify_finds_a_missing_or_altered_event() {
        let store = MemoryStore::new();
        let mut log = AckLog::default();
        log.append_acknowledged(&store, "a", 2).await;
        assert_eq!(log.verify(&store).await, Ok(2));

        let mut lying = log.clone();
        lying.record(Ack::Event {
            stream: "a".into(),
            n: 2,
            id: "v1.AAAAAAAAAAAAAAAAAAAA.9".into(),
        });
        assert!(lying.verify(&store).await.unwrap_err().contains("missing"));

        // Two unacknowledged events: more than one in flight.
        store
            .store_event("a", NewEvent::new(&Ack::payload("a", 2)))
            .await
            .unwrap();
        assert_eq!(log.verify(&store).await, Ok(2));
        store
            .store_event("a", NewEvent::new(&Ack::payload("a", 3)))
            .await
            .unwrap();
        assert!(log.verify(&store).await.unwrap_err().contains("in flight"));
    }
}
