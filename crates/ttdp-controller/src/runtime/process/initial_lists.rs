//! Which watches have delivered their first full list. A reconcile never decides from half-filled
//! caches: after a restart a node missing from the store would look unmatched and a missing
//! agent pod like one being replaced. (Several tasks awaiting one `Store::wait_until_ready` can
//! miss the wake-up, so each watch stream reports its first `InitDone` here instead.)

use std::collections::BTreeSet;
use std::time::Duration;

use kube::runtime::watcher;
use tokio::sync::watch;

/// A watch whose first list a reconcile waits for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Watched {
    /// The policies.
    Policies,
    /// The nodes.
    Nodes,
    /// The agent pods.
    AgentPods,
    /// The agent DaemonSets.
    DaemonSets,
}

/// How many watches there are.
const WATCHES: usize = 4;

/// The watches whose first list arrived.
#[derive(Clone, Debug)]
pub struct InitialLists {
    listed: watch::Sender<BTreeSet<Watched>>,
}

impl Default for InitialLists {
    fn default() -> Self {
        Self {
            listed: watch::Sender::new(BTreeSet::new()),
        }
    }
}

impl InitialLists {
    /// A stream inspector that records `watched`'s first full list.
    pub fn recorder<K>(
        &self,
        watched: Watched,
    ) -> impl FnMut(&Result<watcher::Event<K>, watcher::Error>) + use<K> {
        let listed = self.listed.clone();
        move |event| {
            if matches!(event, Ok(watcher::Event::InitDone)) {
                listed.send_if_modified(|set| set.insert(watched));
            }
        }
    }

    /// Waits until every watch has listed once; false when that takes longer than `limit`.
    pub async fn wait(&self, limit: Duration) -> bool {
        let mut listed = self.listed.subscribe();
        let all = listed.wait_for(|set| set.len() == WATCHES);
        matches!(tokio::time::timeout(limit, all).await, Ok(Ok(_)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn ready_only_when_every_watch_listed_once() {
        let lists = InitialLists::default();
        let short = Duration::from_millis(20);
        let mut record: Vec<_> = [
            Watched::Policies,
            Watched::Nodes,
            Watched::AgentPods,
            Watched::DaemonSets,
        ]
        .into_iter()
        .map(|w| lists.recorder::<()>(w))
        .collect();
        record[0](&Ok(watcher::Event::InitDone));
        record[1](&Ok(watcher::Event::Init));
        record[2](&Ok(watcher::Event::InitDone));
        record[3](&Ok(watcher::Event::InitDone));
        assert!(!lists.wait(short).await, "the nodes have not listed yet");
        record[1](&Ok(watcher::Event::InitDone));
        assert!(lists.wait(short).await);
    }
}
