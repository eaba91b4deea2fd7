//! Leader election through a `coordination.k8s.io` Lease (kube-lease-manager), so two replicas
//! never act at once. The controller runs only while this replica holds the lease; losing it
//! stops the controller (the process then exits and restarts as a follower).

use std::time::Duration;

use kube::Client;
use kube_lease_manager::LeaseManagerBuilder;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use crate::error::Error;
use crate::runtime::process::server::Readiness;

/// Lease settings.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LeaderElection {
    /// The Lease's name.
    pub lease_name: String,
    /// The Lease's namespace.
    pub namespace: String,
    /// This replica's identity (its pod name).
    pub identity: String,
    /// Lease duration in seconds.
    pub duration_seconds: u64,
}

/// How long a stopping leader waits for its Lease to be released.
const RELEASE_WAIT: Duration = Duration::from_secs(5);

/// Holding the lease: `lost` is cancelled if the lease is lost.
#[derive(Debug)]
pub struct Leadership {
    /// Cancelled when this replica stops leading.
    pub lost: CancellationToken,
    stopping: CancellationToken,
    task: tokio::task::JoinHandle<()>,
}

impl Leadership {
    /// Releases the lease, so that a standby takes over at once rather than after the lease
    /// expires (a rolling update stops the old leader once the new pod stands by).
    pub async fn stop(self) {
        self.stopping.cancel();
        if tokio::time::timeout(RELEASE_WAIT, self.task).await.is_err() {
            warn!("the leader lease was not released in time; it expires on its own");
        }
    }
}

/// Waits until this replica holds the lease (or `shutdown` is cancelled: `Ok(None)`), standing
/// by (`readiness`) meanwhile.
pub async fn acquire(
    client: Client,
    settings: &LeaderElection,
    readiness: &Readiness,
    shutdown: &CancellationToken,
) -> Result<Option<Leadership>, Error> {
    let err = |source| Error::Leader {
        lease: format!("{}/{}", settings.namespace, settings.lease_name),
        source,
    };
    let manager = LeaseManagerBuilder::new(client, settings.lease_name.clone())
        .with_namespace(settings.namespace.clone())
        .with_identity(settings.identity.clone())
        .with_duration(settings.duration_seconds)
        .with_grace(settings.duration_seconds.div_ceil(3).max(1))
        .build()
        .await
        .map_err(err)?;
    let (mut channel, manager_task) = manager.watch().await;
    readiness.standing_by();
    info!(lease = %settings.lease_name, identity = %settings.identity, "waiting for the leader lease");
    loop {
        if *channel.borrow_and_update() {
            break;
        }
        tokio::select! {
            _ = shutdown.cancelled() => {
                drop(channel);
                manager_task.abort();
                return Ok(None);
            }
            changed = channel.changed() => {
                if changed.is_err() {
                    warn!("the lease manager stopped before this replica became leader");
                    return Ok(None);
                }
            }
        }
    }
    readiness.leading();
    info!(lease = %settings.lease_name, "leading");
    let (lost, stopping) = (CancellationToken::new(), CancellationToken::new());
    let task = tokio::spawn(watch_lease(
        channel,
        manager_task,
        lost.clone(),
        stopping.clone(),
    ));
    Ok(Some(Leadership {
        lost,
        stopping,
        task,
    }))
}

/// Follows the lease until it is lost or this replica stops, then releases it.
async fn watch_lease(
    mut channel: watch::Receiver<bool>,
    manager_task: tokio::task::JoinHandle<
        kube_lease_manager::Result<kube_lease_manager::LeaseManager>,
    >,
    lost: CancellationToken,
    stopping: CancellationToken,
) {
    loop {
        tokio::select! {
            _ = stopping.cancelled() => {
                info!("stopping; releasing the leader lease");
                break;
            }
            changed = channel.changed() => {
                if changed.is_err() || !*channel.borrow_and_update() {
                    warn!("leader lease lost; stopping the controller");
                    break;
                }
            }
        }
    }
    lost.cancel();
    drop(channel);
    // Dropping the channel ends the manager task; it releases the lease if it still holds it.
    let _ = manager_task.await;
}
