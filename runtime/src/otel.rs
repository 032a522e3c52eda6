//! OpenTelemetry (feature `otel`): traces that follow the work.
//!
//! The request that creates a task runs in a `tracing` span; with
//! `tracing-opentelemetry`'s layer in the subscriber, that span is an
//! OpenTelemetry span. [`Runtime::create_call`](crate::Runtime::create_call)
//! keeps its W3C trace context (`traceparent`, `tracestate`, written by
//! OpenTelemetry's [`TraceContextPropagator`]) in the task's
//! [`TaskCall`], and every run of the task that a runtime claims (a
//! takeover, a worker's run) runs in a span whose parent is that context
//! ([`TaskRun::span`](crate::TaskRun::span)): on whichever instance, the
//! run continues the creating request's trace.
//!
//! Without the layer, or outside a span, a task keeps no trace and its
//! runs start traces of their own. [`parent_of`] gives the context for a
//! framework that runs a claimed task itself.
//!
//! With the feature `otel-export`, [`Tracing`] sets up the export of the
//! spans (to stdout, or with `otlp` to an OpenTelemetry collector): what
//! the example servers' `--trace` does.

use std::collections::HashMap;

use opentelemetry::Context;
use opentelemetry::propagation::TextMapPropagator;
use opentelemetry::trace::TraceContextExt;
use opentelemetry_sdk::propagation::TraceContextPropagator;
use tracing_opentelemetry::OpenTelemetrySpanExt;

use crate::TaskCall;

/// The W3C trace context of the current span, `(traceparent, tracestate)`;
/// `None`s outside a traced span.
pub(crate) fn current_trace() -> (Option<String>, Option<String>) {
    let context = tracing::Span::current().context();
    if !context.span().span_context().is_valid() {
        return (None, None);
    }
    let mut carrier = HashMap::new();
    TraceContextPropagator::new().inject_context(&context, &mut carrier);
    let traceparent = carrier.remove("traceparent");
    let tracestate = carrier
        .remove("tracestate")
        .filter(|state| !state.is_empty());
    match traceparent {
        Some(traceparent) => (Some(traceparent), tracestate),
        None => (None, None),
    }
}

/// The OpenTelemetry context `call` was created in: a remote parent for
/// its runs. `None` when it keeps no trace, or one that does not parse.
pub fn parent_of(call: &TaskCall) -> Option<Context> {
    let traceparent = call.traceparent.as_ref()?;
    let mut carrier = HashMap::from([("traceparent".to_owned(), traceparent.clone())]);
    if let Some(tracestate) = &call.tracestate {
        carrier.insert("tracestate".to_owned(), tracestate.clone());
    }
    let context = TraceContextPropagator::new().extract(&carrier);
    context.span().span_context().is_valid().then_some(context)
}

/// Makes `call`'s trace the parent of `span`, a span not entered yet.
pub(crate) fn continue_trace(span: &tracing::Span, call: &TaskCall) {
    let Some(parent) = parent_of(call) else {
        return;
    };
    if let Err(error) = span.set_parent(parent) {
        // No OpenTelemetry layer, or the span is filtered out: nothing
        // to continue.
        tracing::trace!(%error, "the task's trace is not continued");
    }
}

#[cfg(feature = "otel-export")]
pub use export::{Export, Tracing, TracingError};

#[cfg(feature = "otel-export")]
mod export {
    use std::fmt;
    use std::str::FromStr;

    use opentelemetry::trace::TracerProvider as _;
    use opentelemetry_sdk::Resource;
    use opentelemetry_sdk::trace::{SdkTracer, SdkTracerProvider};
    use tracing_opentelemetry::OpenTelemetryLayer;
    use tracing_subscriber::registry::LookupSpan;

    /// Where [`Tracing`] exports spans.
    #[derive(Clone, Copy, Debug, PartialEq, Eq)]
    #[non_exhaustive]
    pub enum Export {
        /// To stdout, human-readable, in batches as spans end
        /// (`opentelemetry-stdout`).
        Stdout,
        /// To an OpenTelemetry collector over OTLP/HTTP (protobuf), at
        /// `OTEL_EXPORTER_OTLP_ENDPOINT` (or
        /// `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`; default
        /// `http://localhost:4318`). Needs the feature `otlp`.
        Otlp,
    }

    impl FromStr for Export {
        type Err = TracingError;

        /// `stdout` or `otlp`.
        fn from_str(name: &str) -> Result<Self, TracingError> {
            match name {
                "stdout" => Ok(Self::Stdout),
                "otlp" => Ok(Self::Otlp),
                other => Err(TracingError(format!(
                    "unknown trace export {other:?}: stdout or otlp"
                ))),
            }
        }
    }

    impl fmt::Display for Export {
        fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str(match self {
                Self::Stdout => "stdout",
                Self::Otlp => "otlp",
            })
        }
    }

    /// Why [`Tracing`] could not start.
    #[derive(Clone, Debug, PartialEq, Eq)]
    pub struct TracingError(String);

    impl fmt::Display for TracingError {
        fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str(&self.0)
        }
    }

    impl std::error::Error for TracingError {}

    /// The export of a server's spans: an OpenTelemetry tracer provider
    /// and the `tracing` layer that feeds it, for a server's subscriber.
    ///
    /// ```no_run
    /// # fn demo() -> Result<(), Box<dyn std::error::Error>> {
    /// use mcp_event_store_runtime::otel::{Export, Tracing};
    /// use tracing_subscriber::layer::SubscriberExt;
    /// use tracing_subscriber::util::SubscriberInitExt;
    ///
    /// let tracing = Tracing::start(Export::Stdout, "my-server")?;
    /// tracing_subscriber::registry().with(tracing.layer()).init();
    /// // ... serve; at the end, the spans not exported yet are:
    /// tracing.shutdown();
    /// # Ok(()) }
    /// ```
    #[derive(Debug)]
    pub struct Tracing {
        provider: SdkTracerProvider,
    }

    impl Tracing {
        /// Exports spans to `export`, as the service `service_name`.
        /// Spans are batched and exported on a thread of the provider's,
        /// so no request waits on the exporter.
        ///
        /// # Errors
        ///
        /// [`Export::Otlp`] without the feature `otlp`, or when its exporter
        /// cannot be built (an endpoint that does not parse, say).
        pub fn start(export: Export, service_name: &str) -> Result<Self, TracingError> {
            let builder = SdkTracerProvider::builder().with_resource(
                Resource::builder()
                    .with_service_name(service_name.to_owned())
                    .build(),
            );
            let builder = match export {
                Export::Stdout => {
                    builder.with_batch_exporter(opentelemetry_stdout::SpanExporter::default())
                }
                Export::Otlp => builder.with_batch_exporter(otlp()?),
            };
            Ok(Self {
                provider: builder.build(),
            })
        }

        /// The `tracing` layer that turns spans into OpenTelemetry spans
        /// and hands them to this export; add it to the subscriber.
        pub fn layer<S>(&self) -> OpenTelemetryLayer<S, SdkTracer>
        where
            S: tracing::Subscriber + for<'span> LookupSpan<'span>,
        {
            let tracer = self.provider.tracer("mcp-event-store");
            tracing_opentelemetry::layer().with_tracer(tracer)
        }

        /// Exports the spans still batched and stops exporting; a failure
        /// goes to stderr (the subscriber may be gone by then).
        pub fn shutdown(self) {
            if let Err(error) = self.provider.shutdown() {
                eprintln!("trace export: shutting down: {error}");
            }
        }

        /// Installs the process's `tracing` subscriber as a server wants
        /// it: logs to stderr (in colour on a terminal), filtered by
        /// `RUST_LOG` or else `default_filter`, and, with `export`, the
        /// spans exported as traces too ([`start`](Self::start)). Returns
        /// that export, to [`shutdown`](Self::shutdown) at the end.
        ///
        /// # Errors
        ///
        /// As [`start`](Self::start), or when the process has a subscriber
        /// already.
        pub fn install(
            export: Option<Export>,
            service_name: &str,
            default_filter: &str,
        ) -> Result<Option<Self>, TracingError> {
            use tracing_subscriber::layer::SubscriberExt;
            use tracing_subscriber::util::SubscriberInitExt;

            let tracing = export
                .map(|export| Self::start(export, service_name))
                .transpose()?;
            let stderr = std::io::stderr();
            tracing_subscriber::registry()
                .with(
                    tracing_subscriber::fmt::layer()
                        .with_writer(std::io::stderr)
                        .with_ansi(std::io::IsTerminal::is_terminal(&stderr)),
                )
                .with(tracing.as_ref().map(|tracing| tracing.layer()))
                .with(
                    tracing_subscriber::EnvFilter::try_from_default_env()
                        .unwrap_or_else(|_| default_filter.into()),
                )
                .try_init()
                .map_err(|e| TracingError(format!("installing the subscriber: {e}")))?;
            Ok(tracing)
        }
    }

    #[cfg(feature = "otlp")]
    fn otlp() -> Result<opentelemetry_otlp::SpanExporter, TracingError> {
        opentelemetry_otlp::SpanExporter::builder()
            .with_http()
            .build()
            .map_err(|e| TracingError(format!("the OTLP exporter: {e}")))
    }

    #[cfg(not(feature = "otlp"))]
    fn otlp() -> Result<opentelemetry_stdout::SpanExporter, TracingError> {
        Err(TracingError(
            "OTLP export needs the feature `otlp` (`--features otlp`)".into(),
        ))
    }
}
