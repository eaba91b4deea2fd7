//! A stand-in's background task: it runs until asked to stop or until its handle is dropped.

use std::future::Future;

use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

/// A spawned task with its stop signal.
#[derive(Debug)]
pub struct BackgroundTask {
    cancel: CancellationToken,
    task: Option<JoinHandle<()>>,
}

impl BackgroundTask {
    /// Spawns `run` with the token it must watch to stop.
    pub fn spawn<F>(run: impl FnOnce(CancellationToken) -> F) -> Self
    where
        F: Future<Output = ()> + Send + 'static,
    {
        let cancel = CancellationToken::new();
        let task = tokio::spawn(run(cancel.clone()));
        Self {
            cancel,
            task: Some(task),
        }
    }

    /// Stops the task and waits for it to finish.
    pub async fn shutdown(mut self) {
        self.cancel.cancel();
        if let Some(task) = self.task.take() {
            let _ = task.await;
        }
    }
}

impl Drop for BackgroundTask {
    fn drop(&mut self) {
        self.cancel.cancel();
    }
}
