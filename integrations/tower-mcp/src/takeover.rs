//! Tasks that outlive their process: tower-mcp's router as the runtime's
//! [`Executor`], running a claimed task's handler again; see the
//! [crate docs](crate#takeover).

use std::sync::Arc;

use futures_util::future::BoxFuture;
use mcp_event_store_runtime::{Executor, Outcome, Takeovers, TaskRun, internal_error};
use serde_json::json;
use tower_mcp::error::JsonRpcError;
use tower_mcp::protocol::{CallToolParams, McpRequest, McpResponse, RequestId};
use tower_mcp::stateless::StatelessRequestMeta;
use tower_mcp::{McpRouter, RouterRequest};
use tower_service::Service;

use crate::tasks::{Context, TowerTaskStore, decode_responses, fit_message, to_json};

impl TowerTaskStore {
    /// Takes over tasks through `router`, the router this task store was
    /// given to (`McpRouter::task_store`), until the returned handle is
    /// dropped; must run inside a tokio runtime.
    ///
    /// From now on, the tasks of the tools the builder opted in
    /// ([`takeover`](crate::TowerTaskStoreBuilder::takeover),
    /// [`takeover_tools`](crate::TowerTaskStoreBuilder::takeover_tools)) are
    /// created so that they may outlive this process, and the runtime's
    /// takeover runner claims the tasks waiting for a runtime (their
    /// instance lapsed with runs left, or they were answered after parking)
    /// and has `router` run their tool again, from the top, with their
    /// arguments and every answer so far, writing the outcome under its
    /// claim. See the [crate docs](crate#takeover) for what that
    /// guarantees.
    ///
    /// Dropping the handle stops the takeovers and lets go of the router,
    /// which holds this task store: drop it before the task store's last
    /// handle.
    pub fn run_takeovers(&self, router: McpRouter) -> Takeovers {
        self.runtime()
            .run_takeovers(Arc::new(RouterExecutor(router)))
    }
}

/// A router running claimed tasks.
struct RouterExecutor(McpRouter);

impl Executor for RouterExecutor {
    fn run(&self, run: TaskRun) -> BoxFuture<'static, Outcome> {
        let mut router = self.0.clone();
        Box::pin(async move {
            let request = match request(&run) {
                Ok(request) => request,
                Err(message) => return Outcome::Failed(internal_error(message)),
            };
            match router.call(request).await {
                Ok(response) => outcome(response.inner),
                Err(never) => match never {},
            }
        })
    }
}

/// The 2026-07-28 `tools/call` that runs a claimed task again: its tool
/// and arguments from its context, every answer so far.
fn request(run: &TaskRun) -> Result<RouterRequest, &'static str> {
    let unreadable = "the task was taken over, but its tool and arguments cannot be read";
    let context = run
        .context()
        .map(Context::decode)
        .transpose()
        .map_err(|_| unreadable)?
        .ok_or(unreadable)?;
    let responses = decode_responses(run.answers()).map_err(|_| unreadable)?;
    Ok(RouterRequest {
        id: RequestId::String(format!(
            "takeover-{}",
            run.claim().map_or(1, |claim| claim.epoch)
        )),
        inner: McpRequest::CallTool(CallToolParams {
            name: context.call.tool,
            arguments: context.call.arguments,
            input_responses: (!responses.is_empty()).then_some(responses),
            request_state: None,
            meta: None,
            task: None,
        }),
        extensions: replay_extensions().map_err(|_| "a replay's request metadata")?,
    })
}

/// How the router's answer to a run is stored: a result completes the
/// task, input asked for parks it (as tower-mcp's router parks its own),
/// anything else fails it.
fn outcome(response: Result<McpResponse, JsonRpcError>) -> Outcome {
    match response {
        Ok(McpResponse::CallTool(result)) => Outcome::Completed(json(&result)),
        Ok(McpResponse::InputRequired(asked)) => {
            let requests = asked
                .input_requests
                .unwrap_or_default()
                .iter()
                .map(|(key, request)| {
                    to_json(request, "an input request").map(|r| (key.clone(), r))
                })
                .collect::<Result<Vec<_>, _>>();
            match requests {
                Ok(requests) => Outcome::InputRequired {
                    requests,
                    message: asked
                        .request_state
                        .as_deref()
                        .map(|m| fit_message(m).to_owned()),
                },
                Err(e) => Outcome::Failed(internal_error(&e.to_string())),
            }
        }
        Ok(_) => Outcome::Failed(json(&JsonRpcError::internal_error(
            "the tool answered a task's run with no result",
        ))),
        Err(error) => Outcome::Failed(json(&error)),
    }
}

/// An answer's bytes.
fn json<T: serde::Serialize>(value: &T) -> Vec<u8> {
    serde_json::to_vec(value).unwrap_or_else(|e| internal_error(&e.to_string()))
}

/// The extensions of a request that runs a task again: the 2026-07-28
/// lifecycle (the one whose tasks park for input), with every client
/// capability an input request may need. tower-mcp's own replay checks
/// none (it parks what the handler asks); the original client declared
/// what it supports when the task was created.
fn replay_extensions() -> Result<tower_mcp::Extensions, serde_json::Error> {
    let meta: StatelessRequestMeta = serde_json::from_value(json!({
        "io.modelcontextprotocol/protocolVersion": tower_mcp::protocol::PROTOCOL_VERSION_2026_07_28,
        "io.modelcontextprotocol/clientCapabilities": {
            "roots": {},
            "sampling": {"tools": {}, "context": {}},
            "elicitation": {"form": {}, "url": {}}
        }
    }))?;
    let mut extensions = tower_mcp::Extensions::new();
    extensions.insert(meta);
    Ok(extensions)
}
