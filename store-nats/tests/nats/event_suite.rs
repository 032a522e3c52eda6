//! Every case of the shared event suite, the restart and format cases too.

use mcp_event_store_nats::testing::NatsHarness;

mcp_event_store_conformance::event_suite!(NatsHarness::new(), persistent);
