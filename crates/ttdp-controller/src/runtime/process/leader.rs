//! Leader election through a `coordination.k8s.io` Lease (kube-lease-manager), so two replicas
//! never act at once. The controller runs only while this replica holds the lease; losing it
//! stops the controller (the process then exits and restarts as a follower).

use kube::Client;
use kube_lease_manager::LeaseManagerBuilder;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use crate::error::Error;

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

/// Holding the lease: `lost` is cancelled if the lease is lost.
#[derive(Debug)]
pub struct Leadership {
    /// Cancelled when this replica stops leading.
    pub lost: CancellationToken,
    task: tokio::task::JoinHandle<()>,
}

impl Leadership {
    /// Stops renewing (the lease then expires).
    pub fn stop(self) {
        self.task.abort();
    }
}

/// Waits until this replica holds the lease (or `shutdown` is cancelled: `Ok(None)`).
pub async fn acquire(
    client: Client,
    settings: &LeaderElection,
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
    info!(lease = %settings.lease_name, "leading");
    let lost = CancellationToken::new();
    let task = tokio::spawn(watch_lease(channel, manager_task, lost.clone()));
    Ok(Some(Leadership { lost, task }))
}

async fn watch_lease(
    mut channel: watch::Receiver<bool>,
    manager_task: tokio::task::JoinHandle<
        kube_lease_manager::Result<kube_lease_manager::LeaseManager>,
    >,
    lost: CancellationToken,
) {
    while channel.changed().await.is_ok() {
        if !*channel.borrow_and_update() {
            break;
        }
    }
    warn!("leader lease lost; stopping the controller");
    lost.cancel();
    drop(channel);
    // Dropping the channel ends the manager task; it releases the lease if it still holds it.
    let _ = manager_task.await;
}
