//! [`TaskCall`]: the call a task runs, kept with the task as its context
//! (T13), in one encoding for every framework.

use std::fmt;

use serde_json::{Map, Value};

/// The key of the tool's name.
const TOOL: &str = "tool";
/// The key of the tool's arguments.
const ARGUMENTS: &str = "arguments";
/// The key of the W3C `traceparent`.
const TRACEPARENT: &str = "traceparent";
/// The key of the W3C `tracestate`.
const TRACESTATE: &str = "tracestate";

/// The call a task runs, as kept with the task (its context, T13): the
/// tool's name, its JSON arguments, the W3C trace context of the request
/// that created it, and whatever else a framework's integration keeps
/// there ([`extra`](Self::extra)).
///
/// Whichever runtime claims the task (a takeover, a worker) reads it back
/// to run the tool again, and (feature `otel`) continues the creating
/// request's trace ([`TaskRun::span`](crate::TaskRun::span)). Both
/// integrations keep this one encoding, so that operators' tooling reads
/// any task's tool the same way ([`TaskCall::tool_of`]).
///
/// **Encoding.** A JSON object: `tool` (a string), `arguments` (any JSON,
/// `null` for none), `traceparent` and `tracestate` (strings, absent when
/// there is no trace), and the extra fields beside them. Decoding keeps
/// every field it does not know in [`extra`](Self::extra), so contexts
/// written before (rmcp's `{"tool", "arguments"}`, tower-mcp's `{"v",
/// "tool", "arguments", "owner", "meta"}`) decode, and a release that only
/// reads them ignores the fields a later one adds.
///
/// ```
/// use mcp_event_store_runtime::TaskCall;
/// use serde_json::json;
///
/// let call = TaskCall::new("slow_count", json!({"count": 3}));
/// let bytes = call.encode();
/// assert_eq!(TaskCall::decode(&bytes).unwrap(), call);
/// assert_eq!(TaskCall::tool_of(&bytes).unwrap(), "slow_count");
/// // A context rmcp's integration wrote before this encoding was shared:
/// let old = br#"{"tool":"slow_count","arguments":{"count":3}}"#;
/// assert_eq!(TaskCall::decode(old).unwrap(), call);
/// ```
#[derive(Clone, Debug, Default, PartialEq)]
#[non_exhaustive]
pub struct TaskCall {
    /// The tool's name.
    pub tool: String,
    /// Its arguments, as given; `null` for none.
    pub arguments: Value,
    /// The W3C `traceparent` of the request that created the task, if it
    /// ran in a traced span (feature `otel`, [`with_current_trace`](Self::with_current_trace)).
    pub traceparent: Option<String>,
    /// The W3C `tracestate` that came with [`traceparent`](Self::traceparent),
    /// if any.
    pub tracestate: Option<String>,
    /// The integration's own fields (tower-mcp's owner and `_meta`, say),
    /// kept beside the others; a field named as one of those is ignored
    /// when encoding.
    pub extra: Map<String, Value>,
}

/// A task's context that is no [`TaskCall`]: not a JSON object, or without
/// a tool's name.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CallError(String);

impl fmt::Display for CallError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "the task's context is no call: {}", self.0)
    }
}

impl std::error::Error for CallError {}

impl CallError {
    /// A task without a context.
    pub(crate) fn missing() -> Self {
        Self("the task has none".into())
    }
}

impl TaskCall {
    /// The call of `tool` with `arguments` (`Value::Null` for none), with
    /// no trace and no extra fields.
    pub fn new(tool: impl Into<String>, arguments: Value) -> Self {
        Self {
            tool: tool.into(),
            arguments,
            ..Self::default()
        }
    }

    /// This call with `extra` as its integration's own fields.
    pub fn with_extra(mut self, extra: Map<String, Value>) -> Self {
        self.extra = extra;
        self
    }

    /// This call with the W3C trace context of the current `tracing` span
    /// (its OpenTelemetry context, through `tracing-opentelemetry`), when
    /// built with the feature `otel`, the span is traced and the call has
    /// none yet. Without the feature, or outside a traced span, the call
    /// as it is. [`Runtime::create_call`](crate::Runtime::create_call)
    /// does this for every task it creates.
    #[must_use]
    pub fn with_current_trace(self) -> Self {
        #[cfg(feature = "otel")]
        if self.traceparent.is_none() {
            let (traceparent, tracestate) = crate::otel::current_trace();
            return Self {
                traceparent,
                tracestate,
                ..self
            };
        }
        self
    }

    /// The call as JSON bytes, to keep as a task's context.
    pub fn encode(&self) -> Vec<u8> {
        let mut object = Map::new();
        object.insert(TOOL.to_owned(), Value::String(self.tool.clone()));
        object.insert(ARGUMENTS.to_owned(), self.arguments.clone());
        if let Some(traceparent) = &self.traceparent {
            object.insert(TRACEPARENT.to_owned(), Value::String(traceparent.clone()));
        }
        if let Some(tracestate) = &self.tracestate {
            object.insert(TRACESTATE.to_owned(), Value::String(tracestate.clone()));
        }
        for (key, value) in &self.extra {
            if !matches!(key.as_str(), TOOL | ARGUMENTS | TRACEPARENT | TRACESTATE) {
                object.insert(key.clone(), value.clone());
            }
        }
        serde_json::to_vec(&Value::Object(object)).expect("a JSON value always serializes")
    }

    /// The call a task's context holds: a JSON object with a string `tool`
    /// (`arguments` missing reads `null`; a `traceparent` or `tracestate`
    /// that is no string reads absent).
    pub fn decode(context: &[u8]) -> Result<Self, CallError> {
        let value: Value = serde_json::from_slice(context).map_err(|e| CallError(e.to_string()))?;
        let Value::Object(mut object) = value else {
            return Err(CallError("not a JSON object".into()));
        };
        let tool = match object.remove(TOOL) {
            Some(Value::String(tool)) => tool,
            Some(_) => return Err(CallError("its `tool` is not a string".into())),
            None => return Err(CallError("it names no `tool`".into())),
        };
        let arguments = object.remove(ARGUMENTS).unwrap_or(Value::Null);
        let string = |value: Option<Value>| match value {
            Some(Value::String(text)) => Some(text),
            _ => None,
        };
        let traceparent = string(object.remove(TRACEPARENT));
        let tracestate = string(object.remove(TRACESTATE));
        Ok(Self {
            tool,
            arguments,
            traceparent,
            tracestate,
            extra: object,
        })
    }

    /// The tool's name in a task's context, for operators' tooling: what
    /// [`decode`](Self::decode) reads as [`tool`](Self::tool).
    pub fn tool_of(context: &[u8]) -> Result<String, CallError> {
        Self::decode(context).map(|call| call.tool)
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn calls_round_trip_with_their_trace_and_extras() {
        let mut call = TaskCall::new("t", json!({"a": [1, 2]})).with_extra(
            json!({"v": 1, "owner": "alice"})
                .as_object()
                .unwrap()
                .clone(),
        );
        call.traceparent = Some("00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01".into());
        call.tracestate = Some("congo=t61rcWkgMzE".into());
        let bytes = call.encode();
        assert_eq!(TaskCall::decode(&bytes).unwrap(), call);
        let raw: Value = serde_json::from_slice(&bytes).unwrap();
        assert_eq!(raw["owner"], "alice");
        assert_eq!(raw["traceparent"], call.traceparent.clone().unwrap());
    }

    #[test]
    fn no_trace_writes_no_trace_fields() {
        let bytes = TaskCall::new("t", Value::Null).encode();
        let raw: Value = serde_json::from_slice(&bytes).unwrap();
        assert_eq!(raw, json!({"tool": "t", "arguments": null}));
    }

    /// What rmcp's integration wrote (`TakeoverCall`, serde): the tool and
    /// its arguments, `null` for none.
    #[test]
    fn decodes_the_rmcp_contexts_written_before() {
        let old = br#"{"tool":"slow_count","arguments":{"count":3,"interval_ms":10}}"#;
        let call = TaskCall::decode(old).unwrap();
        assert_eq!(call.tool, "slow_count");
        assert_eq!(call.arguments, json!({"count": 3, "interval_ms": 10}));
        assert_eq!((call.traceparent, call.tracestate), (None, None));
        assert!(call.extra.is_empty());
        let none = TaskCall::decode(br#"{"tool":"t","arguments":null}"#).unwrap();
        assert_eq!(none.arguments, Value::Null);
        assert_eq!(TaskCall::tool_of(old).unwrap(), "slow_count");
    }

    /// What tower-mcp's integration wrote (its `Context`): a version, the
    /// tool, its arguments, the owner and the task's `_meta`, which stay
    /// as extras and are written back.
    #[test]
    fn decodes_the_tower_mcp_contexts_written_before() {
        let old = br#"{"v":1,"tool":"slow_count","arguments":{"count":2},"owner":"u:alice","meta":{"k":"x"}}"#;
        let call = TaskCall::decode(old).unwrap();
        assert_eq!(call.tool, "slow_count");
        assert_eq!(call.arguments, json!({"count": 2}));
        assert_eq!(call.traceparent, None);
        assert_eq!(
            Value::Object(call.extra.clone()),
            json!({"v": 1, "owner": "u:alice", "meta": {"k": "x"}})
        );
        let again: Value = serde_json::from_slice(&call.encode()).unwrap();
        let before: Value = serde_json::from_slice(old).unwrap();
        assert_eq!(again, before);
        let anonymous = br#"{"v":1,"tool":"t","arguments":null,"owner":null}"#;
        assert_eq!(TaskCall::tool_of(anonymous).unwrap(), "t");
    }

    #[test]
    fn what_is_no_call_is_refused() {
        for bad in [
            &b"not json"[..],
            b"[1]",
            b"{}",
            br#"{"tool":7}"#,
            br#"{"arguments":{}}"#,
        ] {
            assert!(TaskCall::decode(bad).is_err(), "{bad:?}");
        }
        let odd = TaskCall::decode(br#"{"tool":"t","traceparent":5}"#).unwrap();
        assert_eq!(odd.traceparent, None);
        assert_eq!(odd.arguments, Value::Null);
    }

    #[test]
    fn extras_never_replace_the_call() {
        let call = TaskCall::new("t", json!(1)).with_extra(
            json!({"tool": "other", "x": 2})
                .as_object()
                .unwrap()
                .clone(),
        );
        let back = TaskCall::decode(&call.encode()).unwrap();
        assert_eq!(back.tool, "t");
        assert_eq!(Value::Object(back.extra), json!({"x": 2}));
    }
}
