//! What the stand-in controllers share: a cached watch of one kind whose events only wake the
//! controller up, and the wait for the next batch of wake-ups.

use std::fmt::Debug;
use std::hash::Hash;
use std::pin::Pin;
use std::time::{Duration, Instant};

use futures::stream::SelectAll;
use futures::{FutureExt, Stream, StreamExt};
use kube::runtime::reflector::{self, Store};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client, Resource};
use serde::de::DeserializeOwned;
use tokio_util::sync::CancellationToken;
use tracing::debug;

/// A watch stream reduced to wake-ups.
pub type Wakeups = Pin<Box<dyn Stream<Item = ()> + Send>>;

/// A cache of every object of kind `K` and the wake-ups of its watch (errors are logged; the
/// watcher retries them with back-off).
pub fn watched<K>(client: &Client) -> (Store<K>, Wakeups)
where
    K: Resource + Clone + DeserializeOwned + Debug + Send + Sync + 'static,
    K::DynamicType: Default + Eq + Hash + Clone,
{
    watched_observing(client, |_: &K| {})
}

/// [`watched`], also showing `observe` every object its watch delivers (added, changed or
/// deleted), including the ones the cache no longer holds by the time anyone looks.
pub fn watched_observing<K>(
    client: &Client,
    mut observe: impl FnMut(&K) + Send + 'static,
) -> (Store<K>, Wakeups)
where
    K: Resource + Clone + DeserializeOwned + Debug + Send + Sync + 'static,
    K::DynamicType: Default + Eq + Hash + Clone,
{
    let (store, writer) = reflector::store::<K>();
    let events = watcher(Api::<K>::all(client.clone()), watcher::Config::default())
        .default_backoff()
        .reflect(writer)
        .map(move |event| match event {
            Ok(
                watcher::Event::Apply(object)
                | watcher::Event::Delete(object)
                | watcher::Event::InitApply(object),
            ) => observe(&object),
            Ok(watcher::Event::Init | watcher::Event::InitDone) => {}
            Err(err) => debug!(error = %err, "stand-in watch error; retrying"),
        });
    (store, Box::pin(events))
}

/// Whether a cache has had its first full list.
pub fn has_synced<K>(store: &Store<K>) -> bool
where
    K: Resource + Clone + 'static,
    K::DynamicType: Eq + Hash + Clone,
{
    matches!(store.wait_until_ready().now_or_never(), Some(Ok(())))
}

/// Waits for wake-ups (taking every one already there, so a burst makes one reconcile) or for
/// `wait`; false when `cancel` fired or the watches ended. Returns no sooner than `not_before`,
/// reading the watches meanwhile (a watch left unread is closed by the server as too slow).
pub async fn next_batch(
    events: &mut SelectAll<Wakeups>,
    cancel: &CancellationToken,
    wait: Duration,
    not_before: Instant,
) -> bool {
    let first = tokio::select! {
        () = cancel.cancelled() => return false,
        event = events.next() => event,
        () = tokio::time::sleep(wait) => Some(()),
    };
    if first.is_none() {
        return false;
    }
    loop {
        tokio::select! {
            () = cancel.cancelled() => return false,
            event = events.next() => if event.is_none() { return false },
            () = tokio::time::sleep_until(not_before.into()) => break,
        }
    }
    while let Some(Some(())) = events.next().now_or_never() {}
    true
}
