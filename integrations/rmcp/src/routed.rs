//! The session transport that names each server-to-client request's
//! instance in its id: [`Routed`].

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};

use futures_util::future::Either;
use mcp_event_store_runtime::Runtime;
use rmcp::model::{
    ClientJsonRpcMessage, NumberOrString, RequestId, ServerJsonRpcMessage, ServerNotification,
};
use rmcp::service::{RoleServer, RxJsonRpcMessage, TxJsonRpcMessage};
use rmcp::transport::Transport;

use crate::restores::{Replayed, Restoring};

/// A session's transport whose server-to-client request ids name this
/// instance, so that a client's answer reaching any instance finds the
/// request waiting for it.
///
/// rmcp numbers a session's requests to the client from 0 in every serve
/// run, on every instance: two instances serving one session send the same
/// ids, and an answer posted to the wrong one is taken by nobody, or by the
/// wrong request. Each request going out here gets a fresh id from the
/// runtime ([`Runtime::request_id`]), unique and naming this instance, and
/// the answer coming back gets rmcp's id again. An answer whose id this
/// session never sent (forged, repeated, or another session's) is dropped
/// and counted ([`Runtime::replies_dropped`]), never handed to a request.
/// [`SessionScoped`](crate::SessionScoped) serves every session on one.
/// Without a runtime it passes everything through unchanged.
///
/// The transport of a second restore of a session already held here
/// (see [`SessionScoped`](crate::SessionScoped), *Restores racing
/// requests*) is one too: it carries the replayed handshake to a handler
/// of its own and nothing else.
pub struct Routed<T> {
    inner: Leg<T>,
    runtime: Option<Runtime>,
    /// The requests out: their id on the wire, and rmcp's.
    pending: Arc<Mutex<HashMap<Arc<str>, RequestId>>>,
    /// The restore this transport was made for, while it is in flight.
    _restoring: Option<Restoring>,
}

/// What a [`Routed`] carries.
enum Leg<T> {
    /// A session's transport.
    Session(T),
    /// A handshake replayed for a session held here already.
    Replay(Replayed),
}

impl<T> Routed<T> {
    pub(crate) fn new(inner: T, runtime: Option<Runtime>) -> Self {
        Self {
            inner: Leg::Session(inner),
            runtime,
            pending: Arc::default(),
            _restoring: None,
        }
    }

    /// The transport of a handshake replayed for a session held here.
    pub(crate) fn replay(replayed: Replayed) -> Self {
        Self {
            inner: Leg::Replay(replayed),
            runtime: None,
            pending: Arc::default(),
            _restoring: None,
        }
    }

    /// Keeps `restoring` in flight until it finishes, or this transport is
    /// dropped before (rmcp gave up on the restore).
    pub(crate) fn restoring(mut self, restoring: Restoring) -> Self {
        self._restoring = Some(restoring);
        self
    }

    fn pending(&self) -> std::sync::MutexGuard<'_, HashMap<Arc<str>, RequestId>> {
        lock(&self.pending)
    }
}

fn lock(
    pending: &Mutex<HashMap<Arc<str>, RequestId>>,
) -> std::sync::MutexGuard<'_, HashMap<Arc<str>, RequestId>> {
    pending.lock().unwrap_or_else(PoisonError::into_inner)
}

/// rmcp's id for an answer to `id`, or `None` if this session never sent
/// `id` (or already had its answer).
fn answered(pending: &Mutex<HashMap<Arc<str>, RequestId>>, id: &RequestId) -> Option<RequestId> {
    match id {
        NumberOrString::String(wire) => lock(pending).remove(wire),
        NumberOrString::Number(_) => None,
    }
}

impl<T: Transport<RoleServer>> Transport<RoleServer> for Routed<T> {
    type Error = T::Error;

    fn send(
        &mut self,
        mut item: TxJsonRpcMessage<RoleServer>,
    ) -> impl Future<Output = Result<(), Self::Error>> + Send + 'static {
        if let Leg::Replay(replayed) = &mut self.inner {
            replayed.send(item);
            return Either::Left(std::future::ready(Ok(())));
        }
        let mut sent_as = None;
        if let Some(runtime) = &self.runtime {
            match &mut item {
                ServerJsonRpcMessage::Request(request) => {
                    let wire: Arc<str> = runtime.request_id().into();
                    let ours =
                        std::mem::replace(&mut request.id, NumberOrString::String(wire.clone()));
                    self.pending().insert(wire.clone(), ours);
                    sent_as = Some(wire);
                }
                // rmcp cancels a request it gave up on by its own id.
                ServerJsonRpcMessage::Notification(notification) => {
                    if let ServerNotification::CancelledNotification(cancelled) =
                        &mut notification.notification
                        && let Some(request_id) = &mut cancelled.params.request_id
                    {
                        let mut pending = self.pending();
                        let wire = pending
                            .iter()
                            .find(|(_, ours)| *ours == request_id)
                            .map(|(wire, _)| wire.clone());
                        if let Some(wire) = wire {
                            pending.remove(&wire);
                            *request_id = NumberOrString::String(wire);
                        }
                    }
                }
                _ => {}
            }
        }
        let Leg::Session(inner) = &mut self.inner else {
            unreachable!("a replay returned above");
        };
        let sending = inner.send(item);
        let pending = self.pending.clone();
        Either::Right(async move {
            let sent = sending.await;
            if sent.is_err()
                && let Some(wire) = sent_as
            {
                lock(&pending).remove(&wire);
            }
            sent
        })
    }

    async fn receive(&mut self) -> Option<RxJsonRpcMessage<RoleServer>> {
        let inner = match &mut self.inner {
            Leg::Session(inner) => inner,
            Leg::Replay(replayed) => return replayed.receive().await,
        };
        loop {
            let mut message = inner.receive().await?;
            let Some(runtime) = &self.runtime else {
                return Some(message);
            };
            let id = match &mut message {
                ClientJsonRpcMessage::Response(response) => &mut response.id,
                ClientJsonRpcMessage::Error(error) => match &mut error.id {
                    Some(id) => id,
                    None => return Some(message),
                },
                _ => return Some(message),
            };
            match answered(&self.pending, id) {
                Some(ours) => {
                    *id = ours;
                    return Some(message);
                }
                None => {
                    tracing::warn!(id = %id, "dropped an answer to a request this session did not send, or already had answered");
                    runtime.reply_dropped();
                }
            }
        }
    }

    async fn close(&mut self) -> Result<(), Self::Error> {
        self.pending().clear();
        match &mut self.inner {
            Leg::Session(inner) => inner.close().await,
            Leg::Replay(_) => Ok(()),
        }
    }
}

impl<T> std::fmt::Debug for Routed<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Routed")
            .field("routes", &self.runtime.is_some())
            .field("replay", &matches!(self.inner, Leg::Replay(_)))
            .field("pending", &self.pending().len())
            .finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use std::collections::VecDeque;

    use mcp_event_store_core::MemoryStore;
    use rmcp::model::{ClientJsonRpcMessage, ServerJsonRpcMessage, ServerRequest};
    use serde_json::json;

    use super::*;

    /// A transport that records what is sent and hands out what it holds.
    #[derive(Default)]
    struct Scripted {
        sent: Arc<Mutex<Vec<serde_json::Value>>>,
        incoming: VecDeque<ClientJsonRpcMessage>,
    }

    impl Transport<RoleServer> for Scripted {
        type Error = std::io::Error;

        fn send(
            &mut self,
            item: TxJsonRpcMessage<RoleServer>,
        ) -> impl Future<Output = Result<(), Self::Error>> + Send + 'static {
            self.sent
                .lock()
                .unwrap()
                .push(serde_json::to_value(&item).unwrap());
            std::future::ready(Ok(()))
        }

        async fn receive(&mut self) -> Option<RxJsonRpcMessage<RoleServer>> {
            self.incoming.pop_front()
        }

        async fn close(&mut self) -> Result<(), Self::Error> {
            Ok(())
        }
    }

    fn answer(id: serde_json::Value) -> ClientJsonRpcMessage {
        serde_json::from_value(json!({"jsonrpc": "2.0", "id": id, "result": {}})).unwrap()
    }

    fn request(id: i64) -> ServerJsonRpcMessage {
        let request: ServerRequest =
            serde_json::from_value(json!({"method": "roots/list"})).unwrap();
        ServerJsonRpcMessage::request(request, NumberOrString::Number(id))
    }

    /// A request goes out under an id naming the instance; its answer
    /// comes back under rmcp's id, once. A repeated answer, a forged id of
    /// this instance, another session's and a number are dropped and
    /// counted; rmcp's own cancel names the id the client saw.
    #[tokio::test]
    async fn answers_find_their_request_once_and_nothing_else_passes() {
        let runtime = Runtime::builder(Arc::new(MemoryStore::new()))
            .start()
            .await
            .unwrap();
        let mut other_session = Routed::new(Scripted::default(), Some(runtime.clone()));
        other_session.send(request(0)).await.unwrap();
        let foreign = other_session.pending().keys().next().unwrap().to_string();

        let sent = Arc::default();
        let mut routed = Routed::new(
            Scripted {
                sent: Arc::clone(&sent),
                incoming: VecDeque::new(),
            },
            Some(runtime.clone()),
        );
        routed.send(request(0)).await.unwrap();
        routed.send(request(1)).await.unwrap();
        let wire: Vec<String> = sent
            .lock()
            .unwrap()
            .iter()
            .map(|m: &serde_json::Value| m["id"].as_str().unwrap().to_owned())
            .collect();
        assert!(
            wire[0].starts_with(&runtime.instance().to_string()),
            "{wire:?}"
        );
        assert_ne!(wire[0], wire[1]);
        assert_ne!(wire[0], foreign, "ids are unique across sessions");

        let Leg::Session(scripted) = &mut routed.inner else {
            unreachable!("a session's transport");
        };
        scripted.incoming.extend([
            answer(json!(wire[0])),
            answer(json!(wire[0])),
            answer(json!(format!("{}.999", runtime.instance()))),
            answer(json!(foreign)),
            answer(json!(0)),
            answer(json!(wire[1])),
        ]);
        let first = routed.receive().await.unwrap();
        assert!(
            matches!(&first, ClientJsonRpcMessage::Response(r) if r.id == NumberOrString::Number(0)),
            "{first:?}"
        );
        let second = routed.receive().await.unwrap();
        assert!(
            matches!(&second, ClientJsonRpcMessage::Response(r) if r.id == NumberOrString::Number(1)),
            "{second:?}"
        );
        assert_eq!(runtime.replies_dropped(), 4);
        assert!(routed.receive().await.is_none());

        routed.send(request(2)).await.unwrap();
        let cancel: ServerJsonRpcMessage = serde_json::from_value(json!({
            "jsonrpc": "2.0", "method": "notifications/cancelled",
            "params": {"requestId": 2, "reason": "timeout"}
        }))
        .unwrap();
        routed.send(cancel).await.unwrap();
        let sent = sent.lock().unwrap().clone();
        assert_eq!(sent[3]["params"]["requestId"], sent[2]["id"], "{sent:?}");
        assert!(routed.pending().is_empty());
        runtime.shutdown().await;
    }

    /// Without a runtime, everything passes as it is.
    #[tokio::test]
    async fn without_a_runtime_nothing_changes() {
        let sent = Arc::default();
        let mut routed = Routed::new(
            Scripted {
                sent: Arc::clone(&sent),
                incoming: VecDeque::from([answer(json!(7))]),
            },
            None,
        );
        routed.send(request(7)).await.unwrap();
        assert_eq!(sent.lock().unwrap()[0]["id"], 7);
        let received = routed.receive().await.unwrap();
        assert!(
            matches!(&received, ClientJsonRpcMessage::Response(r) if r.id == NumberOrString::Number(7))
        );
    }
}
