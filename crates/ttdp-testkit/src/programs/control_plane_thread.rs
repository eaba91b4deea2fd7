//! A real control plane owned by a program: started on a thread of its own, because the
//! launcher ties its processes to the thread that starts them (`setpriv --pdeathsig`), and an
//! async runtime's threads come and go. The control plane lives until
//! [`ControlPlaneThread::stop`], or until the program dies.

use std::path::{Path, PathBuf};
use std::sync::{Mutex, mpsc};
use std::thread::JoinHandle;

use crate::launcher::audit::{AuditLog, AuditedRequest};
use crate::launcher::{Assets, ControlPlane, ControlPlaneOptions, LaunchError};

/// A running control plane and the thread that holds it.
#[derive(Debug)]
pub struct ControlPlaneThread {
    kubeconfig: PathBuf,
    audited_kubeconfig: PathBuf,
    audit_log: Mutex<AuditLog>,
    run_dir: PathBuf,
    stop: mpsc::Sender<()>,
    thread: Option<JoinHandle<()>>,
}

impl ControlPlaneThread {
    /// Starts etcd, kube-apiserver, kube-controller-manager and kube-scheduler from `assets`
    /// under `runs` with `options` (about 10 s) and returns once they serve. Blocking.
    pub fn start(
        assets: Assets,
        runs: PathBuf,
        options: ControlPlaneOptions,
    ) -> Result<Self, LaunchError> {
        let (ready_tx, ready_rx) = mpsc::channel();
        let (stop, stopped) = mpsc::channel::<()>();
        let thread = std::thread::Builder::new()
            .name("control-plane".into())
            .spawn(
                move || match ControlPlane::start_with(&assets, &runs, &options) {
                    Ok(plane) => {
                        let paths = (
                            plane.kubeconfig().to_path_buf(),
                            plane.audited_kubeconfig().to_path_buf(),
                            plane.audit_log(),
                            plane.dir().to_path_buf(),
                        );
                        let _ = ready_tx.send(Ok(paths));
                        // Until stop() or the sender's drop; then `plane` drops and stops.
                        let _ = stopped.recv();
                    }
                    Err(e) => {
                        let _ = ready_tx.send(Err(e));
                    }
                },
            )
            .map_err(|e| LaunchError::Io {
                what: "starting the control-plane thread".to_owned(),
                source: e,
            })?;
        let (kubeconfig, audited_kubeconfig, audit_log, run_dir) =
            ready_rx.recv().map_err(|_| {
                LaunchError::Kube("the control-plane thread ended without an answer".to_owned())
            })??;
        Ok(Self {
            kubeconfig,
            audited_kubeconfig,
            audit_log: Mutex::new(audit_log),
            run_dir,
            stop,
            thread: Some(thread),
        })
    }

    /// The admin kubeconfig.
    pub fn kubeconfig(&self) -> &Path {
        &self.kubeconfig
    }

    /// The kubeconfig whose requests the API server records (see [`crate::launcher::audit`]).
    pub fn audited_kubeconfig(&self) -> &Path {
        &self.audited_kubeconfig
    }

    /// The requests of [`ControlPlaneThread::audited_kubeconfig`] recorded since the last call.
    pub fn audited_requests(&self) -> std::io::Result<Vec<AuditedRequest>> {
        let mut log = self.audit_log.lock().unwrap_or_else(|p| p.into_inner());
        log.take()
    }

    /// The run folder (`logs/` holds each component's output).
    pub fn run_dir(&self) -> &Path {
        &self.run_dir
    }

    /// Stops the processes and waits for them. Blocking.
    pub fn stop(mut self) {
        self.stop_now();
    }

    fn stop_now(&mut self) {
        let _ = self.stop.send(());
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

impl Drop for ControlPlaneThread {
    fn drop(&mut self) {
        self.stop_now();
    }
}
