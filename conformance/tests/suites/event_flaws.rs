//! The conformance suite must fail stores that break the contract. Each test
//! here runs a case against a deliberately flawed wrapper of `MemoryStore`
//! and expects the case to panic.

use std::panic::AssertUnwindSafe;
use std::sync::Mutex;

use async_trait::async_trait;
use bytes::Bytes;
use futures_util::{FutureExt, StreamExt};
use mcp_event_store_conformance::events::{self as conformance, Harness};
use mcp_event_store_core::rewrite::{RewriteStore, SessionValuePage, Swap};
use mcp_event_store_core::task::Owner;
use mcp_event_store_core::{
    EventId, EventStore, FollowOptions, MemoryStore, NewEvent, PurgeReport, RedeemStore,
    Redemption, Replay, ReplayEvents, Result, SessionDigest, SessionStore, StoreOptions,
};

#[derive(Clone, Copy, Debug)]
enum Flaw {
    /// Replay silently drops the first event after the cursor.
    DropsFirstEvent,
    /// Lookup claims every well-formed id belongs to some stream.
    LookupAlwaysFinds,
    /// `purge_expired` does nothing.
    NeverPurges,
    /// Sessions never expire.
    SessionsNeverExpire,
    /// A follow ends with what is stored, as a plain replay does.
    FollowEndsWithTheStoredEvents,
    /// A replay from the oldest event starts one event late, as a replay
    /// after the oldest would.
    StreamReplaySkipsTheOldest,
    /// A replay from the oldest event replays every stream's events.
    StreamReplayMixesStreams,
    /// The store hands out no redemptions (a wrapper that forwards none).
    NoRedeemer,
    /// A nonce redeemed before is redeemed again.
    RedeemsTwice,
    /// Every principal redeems in one nonce space.
    RedeemIgnoresPrincipal,
    /// An expired nonce is redeemed (and stored) with an expiry of its own.
    RedeemsExpired,
    /// A swap writes whatever the value holds (C22).
    SwapsUnconditionally,
    /// A session swap puts the state back with a fresh, long expiry.
    SwapExtendsTheSession,
    /// Every page of sessions after the first skips its first session.
    ListingSkipsAcrossPages,
    /// An event swap finds the event by its id, whatever stream it names.
    EventSwapIgnoresTheStream,
}

struct Flawed {
    inner: MemoryStore,
    flaw: Flaw,
}

#[async_trait]
impl EventStore for Flawed {
    async fn store_event(&self, stream_id: &str, event: NewEvent<'_>) -> Result<EventId> {
        self.inner.store_event(stream_id, event).await
    }

    async fn replay_events_after(&self, last_event_id: &str) -> Result<Replay> {
        let replay = self.inner.replay_events_after(last_event_id).await?;
        match self.flaw {
            Flaw::DropsFirstEvent => Ok(Replay {
                stream_id: replay.stream_id,
                events: ReplayEvents::new(replay.events.skip(1)),
            }),
            _ => Ok(replay),
        }
    }

    async fn replay_stream(&self, stream_id: &str) -> Result<Replay> {
        let replay = self.inner.replay_stream(stream_id).await?;
        match self.flaw {
            Flaw::StreamReplaySkipsTheOldest => Ok(Replay {
                stream_id: replay.stream_id,
                events: ReplayEvents::new(replay.events.skip(1)),
            }),
            Flaw::StreamReplayMixesStreams => {
                let mut events = Vec::new();
                let mut after = None;
                loop {
                    let page = self.inner.list_streams(after.as_ref(), 100).await?;
                    for stream in page.streams {
                        let all = self.inner.replay_stream(&stream.stream_id).await?;
                        events.extend(all.events.collect::<Vec<_>>().await);
                    }
                    match page.next {
                        Some(next) => after = Some(next),
                        None => break,
                    }
                }
                Ok(Replay {
                    stream_id: replay.stream_id,
                    events: ReplayEvents::new(futures_util::stream::iter(events)),
                })
            }
            _ => Ok(replay),
        }
    }

    async fn get_stream_id_for_event_id(&self, event_id: &str) -> Result<Option<String>> {
        match self.flaw {
            Flaw::LookupAlwaysFinds if EventId::parse(event_id).is_some() => {
                Ok(Some("somewhere".into()))
            }
            _ => self.inner.get_stream_id_for_event_id(event_id).await,
        }
    }

    async fn delete_stream(&self, stream_id: &str) -> Result<u64> {
        self.inner.delete_stream(stream_id).await
    }

    async fn purge_expired(&self) -> Result<PurgeReport> {
        match self.flaw {
            Flaw::NeverPurges => Ok(PurgeReport::default()),
            _ => self.inner.purge_expired().await,
        }
    }

    async fn follow_events_after(
        &self,
        last_event_id: &str,
        options: FollowOptions,
    ) -> Result<Replay> {
        match self.flaw {
            Flaw::FollowEndsWithTheStoredEvents => {
                self.inner.replay_events_after(last_event_id).await
            }
            _ => self.inner.follow_events_after(last_event_id, options).await,
        }
    }

    fn open_follows(&self) -> usize {
        self.inner.open_follows()
    }
    fn retention(&self) -> mcp_event_store_core::Retention {
        self.inner.retention()
    }
    async fn stats(&self) -> mcp_event_store_core::Result<mcp_event_store_core::StoreStats> {
        self.inner.stats().await
    }
    async fn list_streams(
        &self,
        after: Option<&mcp_event_store_core::StreamCursor>,
        limit: usize,
    ) -> mcp_event_store_core::Result<mcp_event_store_core::StreamPage> {
        self.inner.list_streams(after, limit).await
    }
    async fn check(&self) -> mcp_event_store_core::Result<mcp_event_store_core::HealthReport> {
        self.inner.check().await
    }
    fn redeemer(&self) -> Option<&dyn RedeemStore> {
        match self.flaw {
            Flaw::NoRedeemer => None,
            _ => Some(self),
        }
    }
    fn rewriter(&self) -> Option<&dyn RewriteStore> {
        Some(self)
    }
}

/// The memory store's rewriter, with the rewrite flaws.
#[async_trait]
impl RewriteStore for Flawed {
    async fn event_values(&self, stream_id: &str) -> Result<Replay> {
        self.inner().event_values(stream_id).await
    }

    fn rewrites_events(&self) -> bool {
        self.inner().rewrites_events()
    }

    async fn swap_event(
        &self,
        stream_id: &str,
        id: &EventId,
        expected: &[u8],
        new: &[u8],
    ) -> Result<Swap> {
        let stream_id = match self.flaw {
            Flaw::EventSwapIgnoresTheStream => self
                .inner
                .get_stream_id_for_event_id(&id.to_string())
                .await?
                .unwrap_or_else(|| stream_id.to_owned()),
            _ => stream_id.to_owned(),
        };
        let expected = match self.flaw {
            Flaw::SwapsUnconditionally => {
                let events: Vec<_> = self
                    .inner()
                    .event_values(&stream_id)
                    .await?
                    .events
                    .collect()
                    .await;
                events
                    .into_iter()
                    .flatten()
                    .find(|event| event.id == *id)
                    .map_or_else(|| expected.to_vec(), |event| event.data.to_vec())
            }
            _ => expected.to_vec(),
        };
        self.inner()
            .swap_event(&stream_id, id, &expected, new)
            .await
    }

    async fn session_values(
        &self,
        after: Option<&SessionDigest>,
        limit: usize,
    ) -> Result<SessionValuePage> {
        let mut page = self.inner().session_values(after, limit).await?;
        if matches!(self.flaw, Flaw::ListingSkipsAcrossPages) && after.is_some() {
            page.sessions.drain(..page.sessions.len().min(1));
        }
        Ok(page)
    }

    async fn swap_session(
        &self,
        digest: &SessionDigest,
        expected: &[u8],
        new: &[u8],
    ) -> Result<Swap> {
        let current = || async {
            let mut after = None;
            loop {
                let page = self.inner().session_values(after.as_ref(), 100).await?;
                if let Some(found) = page.sessions.iter().find(|s| s.digest == *digest) {
                    return Ok::<_, mcp_event_store_core::Error>(Some(found.state.clone()));
                }
                match page.next {
                    Some(next) => after = Some(next),
                    None => return Ok(None),
                }
            }
        };
        match self.flaw {
            Flaw::SwapsUnconditionally => match current().await? {
                Some(state) => self.inner().swap_session(digest, &state, new).await,
                None => Ok(Swap::Changed),
            },
            Flaw::SwapExtendsTheSession => {
                let swapped = self.inner().swap_session(digest, expected, new).await?;
                if swapped == Swap::Swapped {
                    // The flawed store re-puts the value under its digest:
                    // through the memory store's backend, which is keyed
                    // by the digest's key.
                    for id in ["alpha", "beta", "gamma", "short"] {
                        if SessionDigest::of(id) == *digest {
                            self.inner
                                .put_session(id, new, std::time::Duration::from_secs(1 << 30))
                                .await?;
                        }
                    }
                }
                Ok(swapped)
            }
            _ => self.inner().swap_session(digest, expected, new).await,
        }
    }

    async fn task_values(
        &self,
        after: Option<&mcp_event_store_core::task::TaskDigest>,
        limit: usize,
    ) -> Result<mcp_event_store_core::rewrite::TaskValuePage> {
        self.inner().task_values(after, limit).await
    }

    async fn swap_task(
        &self,
        digest: &mcp_event_store_core::task::TaskDigest,
        field: &mcp_event_store_core::rewrite::TaskField,
        expected: &[u8],
        new: &[u8],
    ) -> Result<Swap> {
        self.inner().swap_task(digest, field, expected, new).await
    }
}

impl Flawed {
    /// The memory store's own rewriter.
    fn inner(&self) -> &dyn RewriteStore {
        self.inner.rewriter().expect("the memory store rewrites")
    }
}

#[async_trait]
impl RedeemStore for Flawed {
    async fn redeem(
        &self,
        nonce: &[u8],
        expires_at: std::time::SystemTime,
        principal: &Owner,
    ) -> Result<Redemption> {
        let inner = self.inner.redeemer().unwrap();
        let principal = match self.flaw {
            Flaw::RedeemIgnoresPrincipal => &Owner::Anonymous,
            _ => principal,
        };
        match (self.flaw, inner.redeem(nonce, expires_at, principal).await?) {
            (Flaw::RedeemsTwice, Redemption::AlreadyRedeemed) => Ok(Redemption::Redeemed),
            (Flaw::RedeemsExpired, Redemption::Expired) => {
                let later = std::time::SystemTime::now() + std::time::Duration::from_secs(3600);
                inner.redeem(nonce, later, principal).await
            }
            (_, answer) => Ok(answer),
        }
    }
}

#[async_trait]
impl SessionStore for Flawed {
    async fn put_session(&self, id: &str, state: &[u8], ttl: std::time::Duration) -> Result<()> {
        let ttl = match self.flaw {
            Flaw::SessionsNeverExpire => std::time::Duration::from_secs(1 << 40),
            _ => ttl,
        };
        self.inner.put_session(id, state, ttl).await
    }

    async fn get_session(&self, id: &str) -> Result<Option<Bytes>> {
        self.inner.get_session(id).await
    }

    async fn delete_session(&self, id: &str) -> Result<bool> {
        self.inner.delete_session(id).await
    }
}

struct FlawedHarness {
    flaw: Flaw,
    shared: Mutex<Option<MemoryStore>>,
}

#[async_trait]
impl Harness for FlawedHarness {
    type Store = Flawed;

    async fn open(&self, options: StoreOptions) -> Flawed {
        let mut shared = self.shared.lock().unwrap();
        let inner = match &*shared {
            Some(store) => store.share_with_options(options).unwrap(),
            None => shared.insert(MemoryStore::with_options(options)).clone(),
        };
        Flawed {
            inner,
            flaw: self.flaw,
        }
    }
}

async fn assert_case_fails<F, Fut>(flaw: Flaw, case: F)
where
    F: FnOnce(FlawedHarness) -> Fut,
    Fut: std::future::Future<Output = ()>,
{
    let harness = FlawedHarness {
        flaw,
        shared: Mutex::new(None),
    };
    let outcome = AssertUnwindSafe(case(harness)).catch_unwind().await;
    assert!(outcome.is_err(), "the suite let {flaw:?} through");
}

#[tokio::test]
async fn a_replay_that_drops_an_event_fails() {
    assert_case_fails(Flaw::DropsFirstEvent, |h| async move {
        conformance::round_trip(&h).await
    })
    .await;
    assert_case_fails(Flaw::DropsFirstEvent, |h| async move {
        conformance::concurrent_appends_to_one_stream_never_open_a_gap(&h).await
    })
    .await;
}

#[tokio::test]
async fn a_lookup_that_invents_streams_fails() {
    assert_case_fails(Flaw::LookupAlwaysFinds, |h| async move {
        conformance::unknown_well_formed_id_is_refused(&h).await
    })
    .await;
}

#[tokio::test]
async fn a_store_that_never_purges_fails() {
    assert_case_fails(Flaw::NeverPurges, |h| async move {
        conformance::retention_by_age(&h).await
    })
    .await;
}

#[tokio::test]
async fn sessions_that_never_expire_fail() {
    assert_case_fails(Flaw::SessionsNeverExpire, |h| async move {
        conformance::session_expires(&h).await
    })
    .await;
}

#[tokio::test]
async fn a_follow_that_ends_with_the_stored_events_fails() {
    assert_case_fails(Flaw::FollowEndsWithTheStoredEvents, |h| async move {
        conformance::follow_yields_the_stored_rest_then_live_events(&h).await
    })
    .await;
    assert_case_fails(Flaw::FollowEndsWithTheStoredEvents, |h| async move {
        conformance::follow_from_the_newest_event_waits_for_the_next(&h).await
    })
    .await;
}

#[tokio::test]
async fn a_replay_from_the_oldest_that_skips_or_mixes_fails() {
    assert_case_fails(Flaw::StreamReplaySkipsTheOldest, |h| async move {
        conformance::replay_stream_yields_every_event_from_the_oldest(&h).await
    })
    .await;
    assert_case_fails(Flaw::StreamReplaySkipsTheOldest, |h| async move {
        conformance::replay_stream_starts_at_the_oldest_retained(&h).await
    })
    .await;
    assert_case_fails(Flaw::StreamReplayMixesStreams, |h| async move {
        conformance::replay_stream_yields_every_event_from_the_oldest(&h).await
    })
    .await;
}

#[tokio::test]
async fn a_store_without_redemptions_fails() {
    assert_case_fails(Flaw::NoRedeemer, |h| async move {
        conformance::a_nonce_is_redeemed_once(&h).await
    })
    .await;
}

#[tokio::test]
async fn a_nonce_redeemed_twice_fails() {
    assert_case_fails(Flaw::RedeemsTwice, |h| async move {
        conformance::a_nonce_is_redeemed_once(&h).await
    })
    .await;
    assert_case_fails(Flaw::RedeemsTwice, |h| async move {
        conformance::concurrent_redemptions_have_one_winner(&h).await
    })
    .await;
    assert_case_fails(Flaw::RedeemsTwice, |h| async move {
        conformance::expired_redemptions_are_forgotten_and_stay_refused(&h).await
    })
    .await;
}

#[tokio::test]
async fn redemptions_shared_between_principals_fail() {
    assert_case_fails(Flaw::RedeemIgnoresPrincipal, |h| async move {
        conformance::principals_redeem_independently(&h).await
    })
    .await;
}

#[tokio::test]
async fn an_expired_nonce_redeemed_fails() {
    assert_case_fails(Flaw::RedeemsExpired, |h| async move {
        conformance::refused_redemptions_store_nothing(&h).await
    })
    .await;
    assert_case_fails(Flaw::RedeemsExpired, |h| async move {
        conformance::expired_redemptions_are_forgotten_and_stay_refused(&h).await
    })
    .await;
}

#[tokio::test]
async fn redemptions_never_forgotten_fail() {
    assert_case_fails(Flaw::NeverPurges, |h| async move {
        conformance::expired_redemptions_are_forgotten_and_stay_refused(&h).await
    })
    .await;
}

/// The same cases pass on the unflawed store, so the failures above are the
/// flaws' doing.
#[tokio::test]
async fn the_cases_pass_on_a_sound_store() {
    let h = conformance::MemoryHarness::new().await;
    conformance::round_trip(&h).await;
    conformance::unknown_well_formed_id_is_refused(&h).await;
    let h = conformance::MemoryHarness::new().await;
    conformance::retention_by_age(&h).await;
    let h = conformance::MemoryHarness::new().await;
    conformance::session_expires(&h).await;
    let h = conformance::MemoryHarness::new().await;
    conformance::follow_yields_the_stored_rest_then_live_events(&h).await;
    conformance::follow_from_the_newest_event_waits_for_the_next(&h).await;
    let h = conformance::MemoryHarness::new().await;
    conformance::replay_stream_yields_every_event_from_the_oldest(&h).await;
    let h = conformance::MemoryHarness::new().await;
    conformance::replay_stream_starts_at_the_oldest_retained(&h).await;
    let h = conformance::MemoryHarness::new().await;
    conformance::a_nonce_is_redeemed_once(&h).await;
    conformance::concurrent_redemptions_have_one_winner(&h).await;
    conformance::principals_redeem_independently(&h).await;
    conformance::refused_redemptions_store_nothing(&h).await;
    conformance::expired_redemptions_are_forgotten_and_stay_refused(&h).await;
}

#[tokio::test]
async fn an_unconditional_swap_fails() {
    assert_case_fails(Flaw::SwapsUnconditionally, |h| async move {
        conformance::sessions_are_swapped_only_over_the_bytes_read(&h).await
    })
    .await;
    assert_case_fails(Flaw::SwapsUnconditionally, |h| async move {
        conformance::events_are_swapped_only_over_the_bytes_read(&h).await
    })
    .await;
}

#[tokio::test]
async fn a_swap_that_extends_a_session_fails() {
    assert_case_fails(Flaw::SwapExtendsTheSession, |h| async move {
        conformance::sessions_are_swapped_only_over_the_bytes_read(&h).await
    })
    .await;
}

#[tokio::test]
async fn a_listing_that_skips_across_pages_fails() {
    assert_case_fails(Flaw::ListingSkipsAcrossPages, |h| async move {
        conformance::sessions_are_swapped_only_over_the_bytes_read(&h).await
    })
    .await;
}

#[tokio::test]
async fn an_event_swap_through_another_stream_fails() {
    assert_case_fails(Flaw::EventSwapIgnoresTheStream, |h| async move {
        conformance::events_are_swapped_only_over_the_bytes_read(&h).await
    })
    .await;
}
