//! Every case of the shared task suite, the persistent cases too.

use mcp_event_store_nats::testing::NatsHarness;

mcp_event_store_conformance::task_suite!(NatsHarness::new(), persistent);
