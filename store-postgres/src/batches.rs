//! Concurrent calls of one kind sharing one statement: the machinery of
//! the task creates ([`crate::creates`]) and task reads
//! ([`crate::tasks`]) a handle batches. (Appends have their own,
//! [`crate::append`], which also keeps the callers of a batch that just
//! finished together.)
//!
//! Under a burst of calls on one handle, each call alone costs the server a
//! statement (a round trip, its parse, bind and execute, a snapshot) and
//! waits for one of the pool's connections, and a write costs a commit,
//! which waits for a WAL flush: at most one commit per pooled connection
//! per flush. A batch carries many calls in one statement and one commit.
//!
//! A call that finds no other call of its kind in flight runs at once, on
//! its own ([`Statement::one`]): a lone call pays nothing for batching but
//! a task of its own, in which it runs to its end even if its caller gives
//! up meanwhile, so that nothing can cut a commit off from what must follow
//! it (a task step's announcement). Calls that arrive while others are in
//! flight queue for the batcher task, which sends everything queued, within
//! the batch's limits, in one call of [`Statement::many`]; a call whose
//! caller has gone (its future dropped) by then is left out, as if it had
//! never been made. One batch runs at a time as a rule, and the queue
//! fills while it does, so the busier the handle, the larger each batch;
//! another starts beside it only when a full batch is waiting or the
//! running one has taken longer than [`Statement::STALL`], at most
//! [`Statement::IN_FLIGHT`] at once.
//!
//! Calls of one key (a task's digest) either share one answer
//! ([`Statement::SHARE`]: reads, which may) or never go in one batch
//! (writes: each needs its own outcome, say which of two racing creates of
//! one id inserted the task); a batch's requests are sent in key order.
//!
//! If the server refuses a batch (a database error: its transaction rolled
//! back, so a write stored nothing), each of its calls runs again alone,
//! so that each caller gets its own answer. Any other failure (the
//! connection lost mid-statement) leaves a write's outcome unknown, and
//! every caller of the batch gets the error, as a lone call would. A batch
//! that panics answers each caller it had not answered with an error that
//! says so.

use std::any::Any;
use std::collections::{HashMap, VecDeque};
use std::future::Future;
use std::hash::Hash;
use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use futures_util::FutureExt;
use mcp_event_store_core::{Error, Result};
use tokio::sync::{mpsc, oneshot};

use crate::error::{NAME, backend};

/// One kind of call that batches: its limits and its two statements.
pub(crate) trait Statement: Send + Sync + 'static {
    type Request: Send + Sync + 'static;
    type Answer: Clone + Send + 'static;
    /// What a batch holds once ([`Statement::SHARE`]).
    type Key: Copy + Eq + Hash + Ord + Send + 'static;

    /// Distinct requests one batch carries at most.
    const MAX_REQUESTS: usize;
    /// Bytes ([`Statement::size`]) one batch carries at most; a larger
    /// single request still goes, alone.
    const MAX_BYTES: usize;
    /// Batches in flight at once, each on a pooled connection of its own.
    const IN_FLIGHT: usize;
    /// How long the newest running batch holds the next one back.
    const STALL: Duration;
    /// Whether requests of one key share one answer (else they go in
    /// different batches).
    const SHARE: bool;
    /// What a batch is, for the log.
    const WHAT: &'static str;

    fn key(request: &Self::Request) -> Self::Key;

    fn size(request: &Self::Request) -> usize;

    /// The statement for one request. It and [`Statement::many`] run to
    /// their end once started, whether or not their callers wait: what must
    /// follow a commit happens in them, right after it.
    fn one(
        &self,
        request: &Self::Request,
    ) -> impl Future<Output = sqlx::Result<Self::Answer>> + Send;

    /// The statement for requests of distinct keys, in key order; the
    /// answer to each, in the same order.
    fn many(
        &self,
        requests: &[&Self::Request],
    ) -> impl Future<Output = sqlx::Result<Vec<Self::Answer>>> + Send;
}

type Reply<S> = oneshot::Sender<Result<<S as Statement>::Answer>>;

type Waiting<S> = (<S as Statement>::Request, Reply<S>);

/// The handle calls of one kind go through: decides between running alone
/// and joining a batch, and owns the queue to the batcher task.
pub(crate) struct Batched<S: Statement> {
    queue: mpsc::UnboundedSender<Waiting<S>>,
    in_flight: AtomicUsize,
    statement: Arc<S>,
}

impl<S: Statement> Batched<S> {
    /// Starts the batcher task on the current tokio runtime. It ends when
    /// this is dropped and the queue has drained.
    pub(crate) fn start(statement: S) -> Self {
        let statement = Arc::new(statement);
        let (queue, requests) = mpsc::unbounded_channel();
        tokio::spawn(run(requests, statement.clone()));
        Self {
            queue,
            in_flight: AtomicUsize::new(0),
            statement,
        }
    }

    /// Runs `request`, alone or in a batch.
    pub(crate) async fn call(&self, request: S::Request) -> Result<S::Answer> {
        let alone = self.in_flight.fetch_add(1, Ordering::AcqRel) == 0;
        let _done = Leave(&self.in_flight);
        if alone {
            let statement = self.statement.clone();
            let one = tokio::spawn(async move { statement.one(&request).await });
            return match one.await {
                Ok(one) => one.map_err(backend),
                // The panic goes on in the caller, as if it had run there.
                Err(e) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
                Err(_) => Err(Error::Closed),
            };
        }
        let (reply, answer) = oneshot::channel();
        self.queue
            .send((request, reply))
            .map_err(|_| Error::Closed)?;
        answer.await.map_err(|_| Error::Closed)?
    }
}

/// Counts a call out of an in-flight count when it finishes, however it
/// finishes (appends' batcher too).
pub(crate) struct Leave<'a>(pub(crate) &'a AtomicUsize);

impl Drop for Leave<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

async fn run<S: Statement>(mut requests: mpsc::UnboundedReceiver<Waiting<S>>, statement: Arc<S>) {
    // Batches report here when they finish, also when their task panics.
    let (finished_tx, mut finished) = mpsc::unbounded_channel::<()>();
    let mut waiting = VecDeque::new();
    let mut open = true;
    // Batches running, and when the newest of them started.
    let mut running = 0;
    let mut newest = Instant::now();
    loop {
        while finished.try_recv().is_ok() {
            running -= 1;
        }
        while open {
            match requests.try_recv() {
                Ok(request) => waiting.push_back(request),
                Err(mpsc::error::TryRecvError::Empty) => break,
                Err(mpsc::error::TryRecvError::Disconnected) => open = false,
            }
        }
        let stalled = newest.elapsed() >= S::STALL;
        let start = !waiting.is_empty()
            && running < S::IN_FLIGHT
            && (running == 0 || stalled || full::<S>(&waiting));
        if !start {
            if !open && waiting.is_empty() {
                // Running batches answer their callers by themselves.
                break;
            }
            let stall_timer = running > 0 && running < S::IN_FLIGHT && !waiting.is_empty();
            tokio::select! {
                request = requests.recv(), if open => match request {
                    Some(request) => waiting.push_back(request),
                    None => open = false,
                },
                Some(()) = finished.recv() => running -= 1,
                () = tokio::time::sleep_until((newest + S::STALL).into()), if stall_timer => {}
            }
            continue;
        }
        let batch = take_batch::<S>(&mut waiting);
        running += 1;
        newest = Instant::now();
        let statement = statement.clone();
        let done = Finished(finished_tx.clone());
        tokio::spawn(async move {
            run_caught(&*statement, batch).await;
            drop(done);
        });
    }
}

/// Whether the queue holds a full batch (counting every request, also
/// those of one key: a cheap bound, asked at every wake-up).
fn full<S: Statement>(waiting: &VecDeque<Waiting<S>>) -> bool {
    waiting.len() >= S::MAX_REQUESTS
        || waiting
            .iter()
            .map(|(request, _)| S::size(request))
            .sum::<usize>()
            >= S::MAX_BYTES
}

/// Reports a batch finished when dropped, however its task ends.
struct Finished(mpsc::UnboundedSender<()>);

impl Drop for Finished {
    fn drop(&mut self) {
        let _ = self.0.send(());
    }
}

/// A batch: distinct requests, each with its callers.
type Batch<S> = Vec<(<S as Statement>::Request, Vec<Reply<S>>)>;

/// Takes the next batch off the queue: in arrival order, within the
/// limits; a request of a key the batch holds joins it ([`Statement::SHARE`])
/// or waits for a later batch. Then sorted by key. What is left keeps its
/// order.
fn take_batch<S: Statement>(waiting: &mut VecDeque<Waiting<S>>) -> Batch<S> {
    let mut batch: Batch<S> = Vec::new();
    let mut at: HashMap<S::Key, usize> = HashMap::new();
    let mut bytes = 0;
    let mut rest = VecDeque::new();
    while let Some((request, reply)) = waiting.pop_front() {
        let key = S::key(&request);
        if let Some(&i) = at.get(&key) {
            if S::SHARE {
                let (_, replies): &mut (S::Request, Vec<Reply<S>>) = &mut batch[i];
                replies.push(reply);
            } else {
                rest.push_back((request, reply));
            }
            continue;
        }
        let size = S::size(&request);
        let fits =
            batch.is_empty() || (batch.len() < S::MAX_REQUESTS && bytes + size <= S::MAX_BYTES);
        if fits {
            bytes += size;
            at.insert(key, batch.len());
            batch.push((request, vec![reply]));
        } else {
            rest.push_back((request, reply));
        }
    }
    *waiting = rest;
    batch.sort_by_key(|(request, _)| S::key(request));
    batch
}

/// Sends `answer` to every caller of a request (moved to the last one:
/// a request that is not shared is answered with the value itself).
fn answer<S: Statement>(replies: Vec<Reply<S>>, answer: Result<S::Answer, Arc<sqlx::Error>>) {
    let to_caller = |answer: Result<S::Answer, Arc<sqlx::Error>>| match answer {
        Ok(answer) => Ok(answer),
        Err(e) if matches!(*e, sqlx::Error::PoolClosed) => Err(Error::Closed),
        Err(e) => Err(Error::backend(NAME, e)),
    };
    let mut replies = replies.into_iter().peekable();
    while let Some(reply) = replies.next() {
        if replies.peek().is_none() {
            let _ = reply.send(to_caller(answer));
            return;
        }
        let _ = reply.send(to_caller(answer.clone()));
    }
}

/// Runs a batch; if it panics, answers each caller it had not answered
/// with an error that says so (not [`Error::Closed`]: the store is open).
async fn run_caught<S: Statement>(statement: &S, mut batch: Batch<S>) {
    let ran = AssertUnwindSafe(run_batch(statement, &mut batch))
        .catch_unwind()
        .await;
    let Err(panic) = ran else {
        return;
    };
    let why = format!("a {} panicked: {}", S::WHAT, panic_message(&*panic));
    tracing::error!("{why}");
    for (_, replies) in batch {
        for reply in replies {
            let _ = reply.send(Err(Error::backend(NAME, why.clone())));
        }
    }
}

fn panic_message(panic: &(dyn Any + Send)) -> &str {
    panic
        .downcast_ref::<&str>()
        .copied()
        .or_else(|| panic.downcast_ref::<String>().map(String::as_str))
        .unwrap_or("no message")
}

/// Leaves out the callers that have gone, and the requests left with none.
fn drop_gone<S: Statement>(batch: &mut Batch<S>) {
    batch.retain_mut(|(_, replies)| {
        replies.retain(|reply| !reply.is_closed());
        !replies.is_empty()
    });
}

/// Runs a batch, taking each request's callers out of `batch` as it
/// answers them.
async fn run_batch<S: Statement>(statement: &S, batch: &mut Batch<S>) {
    drop_gone::<S>(batch);
    if batch.len() > 1 {
        let requests: Vec<&S::Request> = batch.iter().map(|(request, _)| request).collect();
        match statement.many(&requests).await {
            Ok(answers) if answers.len() == batch.len() => {
                for ((_, replies), one) in batch.iter_mut().zip(answers) {
                    answer::<S>(std::mem::take(replies), Ok(one));
                }
                return;
            }
            Ok(answers) => {
                let e = Arc::new(sqlx::Error::Protocol(format!(
                    "{} of {} requests answered {}",
                    S::WHAT,
                    batch.len(),
                    answers.len()
                )));
                for (_, replies) in batch.iter_mut() {
                    answer::<S>(std::mem::take(replies), Err(e.clone()));
                }
                return;
            }
            // The server refused the statement, so its transaction rolled
            // back and nothing of the batch is stored: each request again,
            // alone, for its own answer.
            Err(e @ sqlx::Error::Database(_)) => tracing::warn!(error = %e, requests = batch.len(),
                "a {} failed; retrying its requests one by one", S::WHAT),
            // Otherwise the outcome is unknown: every caller gets the
            // error, as a lone call would.
            Err(e) => {
                let e = Arc::new(e);
                for (_, replies) in batch.iter_mut() {
                    answer::<S>(std::mem::take(replies), Err(e.clone()));
                }
                return;
            }
        }
        // Callers may have gone while the batch ran.
        drop_gone::<S>(batch);
    }
    for (request, replies) in batch.iter_mut() {
        let one = statement.one(request).await.map_err(Arc::new);
        answer::<S>(std::mem::take(replies), one);
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;

    use super::*;

    /// Answers each request with itself; records what each batch carried.
    #[derive(Default)]
    struct Echo {
        panics: bool,
        sent: Mutex<Vec<Vec<u32>>>,
    }

    impl Statement for Echo {
        type Request = u32;
        type Answer = u32;
        type Key = u32;

        const MAX_REQUESTS: usize = 8;
        const MAX_BYTES: usize = usize::MAX;
        const IN_FLIGHT: usize = 1;
        const STALL: Duration = Duration::from_millis(20);
        const SHARE: bool = false;
        const WHAT: &'static str = "test batch";

        fn key(request: &u32) -> u32 {
            *request
        }

        fn size(_: &u32) -> usize {
            0
        }

        async fn one(&self, request: &u32) -> sqlx::Result<u32> {
            self.sent.lock().unwrap().push(vec![*request]);
            Ok(*request)
        }

        async fn many(&self, requests: &[&u32]) -> sqlx::Result<Vec<u32>> {
            assert!(!self.panics, "on purpose");
            let requests: Vec<u32> = requests.iter().map(|r| **r).collect();
            self.sent.lock().unwrap().push(requests.clone());
            Ok(requests)
        }
    }

    fn batch_of(requests: &[u32]) -> (Batch<Echo>, Vec<oneshot::Receiver<Result<u32>>>) {
        requests
            .iter()
            .map(|request| {
                let (reply, answer) = oneshot::channel();
                ((*request, vec![reply]), answer)
            })
            .unzip()
    }

    #[tokio::test]
    async fn a_request_whose_caller_has_gone_is_not_sent() {
        let echo = Echo::default();
        let (batch, mut answers) = batch_of(&[1, 2, 3]);
        drop(answers.remove(1));
        run_caught(&echo, batch).await;
        assert_eq!(*echo.sent.lock().unwrap(), [vec![1, 3]]);
        for (answer, want) in answers.into_iter().zip([1, 3]) {
            assert_eq!(answer.await.unwrap().unwrap(), want);
        }

        let echo = Echo::default();
        let (batch, mut answers) = batch_of(&[1, 2]);
        drop(answers.remove(0));
        run_caught(&echo, batch).await;
        assert_eq!(*echo.sent.lock().unwrap(), [vec![2]]);
    }

    #[tokio::test]
    async fn a_batch_that_panics_tells_its_callers() {
        let echo = Echo {
            panics: true,
            ..Echo::default()
        };
        let (batch, answers) = batch_of(&[1, 2]);
        run_caught(&echo, batch).await;
        for answer in answers {
            let e = answer.await.expect("answered").expect_err("the panic");
            assert!(matches!(e, Error::Backend { .. }), "{e:?}");
            assert!(
                std::error::Error::source(&e)
                    .is_some_and(|s| s.to_string().contains("test batch panicked: on purpose")),
                "{e:?}"
            );
        }
    }
}
