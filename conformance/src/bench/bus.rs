//! Carrying one message from one handle or connection to another: the
//! store's bus and following, and, beside them, the database's own
//! primitive ([`crate::bench::Kit::bus`]).

use std::future::Future;
use std::time::Duration;

/// How long one delivery may take before the bench fails.
pub const GUARD: Duration = Duration::from_secs(30);

/// One way of carrying a message from one handle or connection to
/// another.
pub trait Delivery {
    /// Sends one message and waits until the other side has it: the time
    /// the case measures.
    fn one(&mut self) -> impl Future<Output = Duration>;
}

/// Where a kit hands its raw deliveries ([`crate::bench::Kit::bus`]).
pub trait DeliveryCases {
    /// Times `delivery` as the case `bus/<backend>/<id>`.
    fn case(&mut self, id: &str, delivery: &mut impl Delivery);
}

/// Waits at most [`GUARD`] for `next`; panics past it or when the
/// subscription has ended.
pub async fn within_guard<T>(next: impl Future<Output = Option<T>>) -> T {
    tokio::time::timeout(GUARD, next)
        .await
        .expect("delivered within the guard")
        .expect("the subscription goes on")
}
