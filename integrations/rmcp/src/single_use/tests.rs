//! End to end, in process: two server instances (two rmcp services, each
//! with its own handle on one store and the replicas' shared codec key),
//! rmcp's own client on each, an MRTR tool call whose `requestState` is
//! sealed on one instance and replayed to the other.

use std::sync::Arc;
use std::time::Duration;

use rmcp::model::*;
use rmcp::service::{RequestContext, RoleClient, RoleServer, RunningService};
use rmcp::{ClientLifecycleMode, ClientServiceExt, ServerHandler, ServiceExt};
use serde_json::json;

use super::*;
use mcp_event_store_core::{ManualClock, MemoryStore, StoreOptions};

const KEY: &[u8] = b"the-replicas-shared-request-state-key";

/// One instance of a server whose `pay` tool asks for confirmation (an
/// MRTR round) before it pays, once.
#[derive(Clone)]
struct Payments {
    instance: &'static str,
    states: SingleUseStates,
}

/// The caller, as the server's authentication would establish it (here:
/// the client says, in the argument `as`), and what its states are bound
/// to.
fn caller(request: &CallToolRequestParams) -> (Owner, Vec<u8>) {
    let name = request
        .arguments
        .as_ref()
        .and_then(|a| a.get("as"))
        .and_then(|v| v.as_str())
        .unwrap_or_default();
    (
        Owner::principal(name.as_bytes()).unwrap(),
        format!("{name}|pay").into_bytes(),
    )
}

impl ServerHandler for Payments {
    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        _: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        let (owner, bound) = caller(&request);
        match &request.request_state {
            // Round one: remember the amount in a single-use state.
            None => {
                let amount = request
                    .arguments
                    .as_ref()
                    .and_then(|a| a.get("amount"))
                    .cloned()
                    .unwrap_or(json!(0));
                let state = self.states.seal_json(
                    &json!({ "amount": amount }),
                    Duration::from_secs(300),
                    &bound,
                )?;
                Ok(CallToolResponse::InputRequired(
                    InputRequiredResult::from_request_state(state),
                ))
            }
            // Round two: pay what the state says, once.
            Some(state) => {
                let sealed: serde_json::Value =
                    self.states.open_json(state, &bound, &owner).await?;
                Ok(CallToolResult::success(vec![ContentBlock::text(format!(
                    "{} paid {}",
                    self.instance, sealed["amount"]
                ))])
                .into())
            }
        }
    }

    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(ServerCapabilities::builder().enable_tools().build())
    }
}

/// A client of `server`, speaking MCP 2026-07-28 (MRTR's revision), and
/// the caller it pays as.
struct Client {
    service: RunningService<RoleClient, ClientConfig>,
    name: &'static str,
}

/// A client paying as `name`, connected to `server`.
async fn connect(server: &Payments, name: &'static str) -> Client {
    let (server_io, client_io) = tokio::io::duplex(64 * 1024);
    let server = server.clone();
    tokio::spawn(async move {
        if let Ok(running) = server.serve(server_io).await {
            let _ = running.waiting().await;
        }
    });
    let service = ClientConfig::new(
        ClientCapabilities::default(),
        Implementation::from_build_env(),
    )
    .serve_with_lifecycle(
        client_io,
        ClientLifecycleMode::Discover {
            preferred_versions: vec![ProtocolVersion::V_2026_07_28],
        },
    )
    .await
    .unwrap();
    Client { service, name }
}

/// Two instances, each with its own handle on one store.
fn instances(store: &MemoryStore) -> (Payments, Payments) {
    let codec = || RequestStateCodec::try_new(KEY.to_vec()).unwrap();
    let handle = || -> Arc<dyn Store> {
        Arc::new(store.share_with_options(StoreOptions::default()).unwrap())
    };
    (
        Payments {
            instance: "a",
            states: SingleUseStates::new(codec(), handle()),
        },
        Payments {
            instance: "b",
            states: SingleUseStates::new(codec(), handle()),
        },
    )
}

async fn pay(client: &Client, state: Option<&str>) -> Result<CallToolResponse, rmcp::ServiceError> {
    let arguments = json!({"amount": 100, "as": client.name});
    let mut params =
        CallToolRequestParams::new("pay").with_arguments(arguments.as_object().unwrap().clone());
    if let Some(state) = state {
        params = params.with_request_state(state.to_owned());
    }
    client.service.call_tool_once(params).await
}

fn state_of(response: CallToolResponse) -> String {
    match response {
        CallToolResponse::InputRequired(input) => input.request_state.expect("a request state"),
        other => panic!("expected input_required, got {other:?}"),
    }
}

fn paid(response: CallToolResponse) -> String {
    match response {
        CallToolResponse::Complete(result) => result.content[0].as_text().unwrap().text.clone(),
        other => panic!("expected a result, got {other:?}"),
    }
}

fn refused(outcome: Result<CallToolResponse, rmcp::ServiceError>) {
    match outcome {
        Err(rmcp::ServiceError::McpError(e)) => {
            assert_eq!(e.code, ErrorCode::INVALID_PARAMS, "{e:?}");
            assert_eq!(e.message, "invalid or already used request state");
        }
        other => panic!("expected the state refused, got {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_state_replayed_to_another_instance_is_refused() {
    let store = MemoryStore::new();
    let (a, b) = instances(&store);
    let on_a = connect(&a, "alice").await;
    let on_b = connect(&b, "alice").await;

    // Sealed on A, retried on A: paid. The same state replayed to B (or A):
    // refused.
    let state = state_of(pay(&on_a, None).await.unwrap());
    assert_eq!(paid(pay(&on_a, Some(&state)).await.unwrap()), "a paid 100");
    refused(pay(&on_b, Some(&state)).await);
    refused(pay(&on_a, Some(&state)).await);

    // Sealed on A, the retry reaches B first: B pays, A refuses it.
    let state = state_of(pay(&on_a, None).await.unwrap());
    assert_eq!(paid(pay(&on_b, Some(&state)).await.unwrap()), "b paid 100");
    refused(pay(&on_a, Some(&state)).await);

    // Another principal cannot use (or burn) alice's state: the codec
    // refuses it (its associated data names alice), and alice's retry
    // still pays.
    let state = state_of(pay(&on_a, None).await.unwrap());
    let mallory = connect(&b, "mallory").await;
    refused(pay(&mallory, Some(&state)).await);
    assert_eq!(paid(pay(&on_b, Some(&state)).await.unwrap()), "b paid 100");

    // Replayed concurrently to both instances: exactly one pays.
    for _ in 0..8 {
        let state = state_of(pay(&on_a, None).await.unwrap());
        let (x, y) = tokio::join!(pay(&on_a, Some(&state)), pay(&on_b, Some(&state)));
        let paid = [x, y]
            .into_iter()
            .filter(|outcome| matches!(outcome, Ok(CallToolResponse::Complete(_))))
            .count();
        assert_eq!(paid, 1);
    }
    for client in [on_a, on_b, mallory] {
        client.service.cancel().await.unwrap();
    }
}

#[tokio::test]
async fn states_refuse_what_is_not_theirs_to_accept() {
    let clock = Arc::new(ManualClock::new(
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap()
            .as_millis() as u64,
    ));
    let store = Arc::new(MemoryStore::with_options(
        StoreOptions::default().clock(clock.clone()),
    ));
    let codec = RequestStateCodec::try_new(KEY.to_vec()).unwrap();
    let states = SingleUseStates::new(codec.clone(), store.clone());
    let alice = Owner::principal(b"alice").unwrap();

    // A state sealed by the codec alone carries no nonce.
    let plain = codec.seal(b"no nonce in here, nor enough bytes");
    assert!(matches!(
        states.open(&plain, b"", &alice).await,
        Err(SingleUseError::NotSingleUse)
    ));
    // Altered: the codec refuses it.
    let state = states.seal(b"x", Duration::from_secs(60), b"").unwrap();
    let altered = state.replacen("rs1.", "rs1.AAAA", 1);
    assert_ne!(altered, state);
    assert!(matches!(
        states.open(&altered, b"", &alice).await,
        Err(SingleUseError::Invalid(_))
    ));
    // Past its expiry by the store's clock: refused, and not stored.
    clock.advance(Duration::from_secs(61));
    assert!(matches!(
        states.open(&state, b"", &alice).await,
        Err(SingleUseError::Expired)
    ));
    // Lifetimes out of range are refused at sealing.
    for ttl in [Duration::ZERO, MAX_REDEEM_HORIZON + Duration::from_secs(1)] {
        assert!(matches!(
            states.seal(b"x", ttl, b""),
            Err(SingleUseError::Lifetime(_))
        ));
    }
    // JSON round trip, once (sealed by the real clock, a minute behind the
    // store's now).
    let state = states
        .seal_json(&json!({"step": 2}), Duration::from_secs(600), b"")
        .unwrap();
    let opened: serde_json::Value = states.open_json(&state, b"", &alice).await.unwrap();
    assert_eq!(opened, json!({"step": 2}));
    assert!(matches!(
        states
            .open_json::<serde_json::Value>(&state, b"", &alice)
            .await,
        Err(SingleUseError::AlreadyRedeemed)
    ));
}
