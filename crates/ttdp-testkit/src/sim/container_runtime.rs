//! One container's life on a simulated node: a child process (image mapped to a local binary) or a
//! process-less "workload" container, its exec readiness probe, restarts with the kubelet's
//! exponential back-off, and graceful stop (SIGTERM to the process group, grace, SIGKILL).
//!
//! A workload container of a pod that uses the device is a simulated process holding
//! `/dev/tenstorrent` in its node's simulated kernel while it runs; if the host kills that process
//! (e.g. the agent's `forceUnload`), the container exits with 137 and restarts like any other.

use std::os::unix::process::ExitStatusExt;
use std::path::PathBuf;
use std::process::{ExitStatus, Stdio};
use std::sync::atomic::{AtomicI32, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use jiff::Timestamp;
use nix::sys::signal::{Signal, killpg};
use nix::unistd::Pid;
use tokio::io::{AsyncBufReadExt, AsyncRead, AsyncWriteExt, BufReader};
use tokio::process::{Child, Command};
use tokio::sync::{Notify, watch};
use tokio::task::JoinHandle;
use tracing::{debug, info};
use ttdp_kmod::SimKernel;

use super::container_spec::ProcessSpec;
use super::time_scale::TimeScale;

/// The kubelet's first restart delay.
const BACKOFF_BASE: Duration = Duration::from_secs(10);
/// The kubelet's longest restart delay.
const BACKOFF_MAX: Duration = Duration::from_secs(300);
/// A container that ran this long without crashing starts again from the first delay.
const BACKOFF_RESET: Duration = Duration::from_secs(600);
/// How often a workload process is checked for having been killed by the host.
const WORKLOAD_POLL: Duration = Duration::from_millis(100);

/// Simulated process ids for workload containers, shared by all simulated hosts.
static NEXT_SIM_PID: AtomicI32 = AtomicI32::new(40_000);

/// What a container runs.
#[derive(Debug, Clone)]
pub(crate) enum ContainerBody {
    /// A local child process, with an optional readiness probe.
    Process {
        process: ProcessSpec,
        probe: Option<ReadinessProbe>,
    },
    /// No process; optionally a simulated process holding the device.
    Workload { device: Option<DeviceHold> },
}

/// A workload's use of the device.
#[derive(Debug, Clone)]
pub(crate) struct DeviceHold {
    pub kernel: SimKernel,
    pub comm: String,
}

/// A readiness probe; `process: None` is a probe the simulation does not run (always succeeds).
#[derive(Debug, Clone)]
pub(crate) struct ReadinessProbe {
    pub process: Option<ProcessSpec>,
    pub initial_delay: Duration,
    pub period: Duration,
    pub timeout: Duration,
    /// Failures in a row that make the container unready; one success makes it ready.
    pub failure_threshold: u32,
}

/// How a container instance ended.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Termination {
    pub exit_code: i32,
    pub reason: String,
    pub message: Option<String>,
    pub started_at: Option<Timestamp>,
    pub finished_at: Timestamp,
}

impl Termination {
    /// An instance ending now: `Completed` on exit code 0, else `Error`.
    fn now(exit_code: i32, message: Option<String>, started_at: Option<Timestamp>) -> Self {
        let reason = if exit_code == 0 { "Completed" } else { "Error" };
        Self {
            exit_code,
            reason: reason.to_owned(),
            message,
            started_at,
            finished_at: Timestamp::now(),
        }
    }
}

/// The container's current state, as the pod status reports it.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum RunState {
    Waiting {
        reason: String,
        message: Option<String>,
    },
    Running {
        started_at: Timestamp,
    },
    Terminated(Termination),
}

/// Everything the pod status needs about one container.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct ContainerSnapshot {
    pub name: String,
    pub image: String,
    pub state: RunState,
    pub last_termination: Option<Termination>,
    pub ready: bool,
    pub restart_count: i32,
    /// Started at least once.
    pub ever_started: bool,
    /// Ended and will not restart.
    pub done: bool,
    /// Counts instances, so a late probe result of an old instance is ignored.
    pub instance: u64,
}

/// What the pod asks of a running container.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) enum StopRequest {
    /// SIGTERM, then SIGKILL after the grace period.
    Graceful(Duration),
    /// SIGKILL now (kubelet shutdown, or the pod vanished from the API).
    Kill,
}

/// Settings shared by all containers of a kubelet.
#[derive(Debug, Clone)]
pub(crate) struct RuntimeSettings {
    pub time_scale: TimeScale,
    pub restart_policy: String,
    pub log_file: Option<PathBuf>,
    /// For logs: `namespace/pod`.
    pub pod: String,
}

/// A running container; its task ends after a stop request has been carried out.
#[derive(Debug)]
pub(crate) struct ContainerHandle {
    snapshot: Arc<Mutex<ContainerSnapshot>>,
    stop: watch::Sender<Option<StopRequest>>,
    task: JoinHandle<()>,
}

impl ContainerHandle {
    /// Starts the container; `changed` is notified whenever its snapshot changes.
    pub fn start(
        name: &str,
        image: &str,
        body: ContainerBody,
        settings: RuntimeSettings,
        changed: Arc<Notify>,
    ) -> Self {
        let snapshot = Arc::new(Mutex::new(ContainerSnapshot {
            name: name.to_owned(),
            image: image.to_owned(),
            state: RunState::Waiting {
                reason: "ContainerCreating".to_owned(),
                message: None,
            },
            last_termination: None,
            ready: false,
            restart_count: 0,
            ever_started: false,
            done: false,
            instance: 0,
        }));
        let (stop, stop_rx) = watch::channel(None);
        let task = tokio::spawn(
            ContainerTask {
                body,
                settings,
                snapshot: snapshot.clone(),
                changed,
                stop: stop_rx,
            }
            .run(),
        );
        Self {
            snapshot,
            stop,
            task,
        }
    }

    /// The container's current state.
    pub fn snapshot(&self) -> ContainerSnapshot {
        lock(&self.snapshot).clone()
    }

    /// Stops the container, waits until it has stopped, and returns its final state.
    pub async fn stop(self, request: StopRequest) -> ContainerSnapshot {
        let _ = self.stop.send(Some(request));
        let _ = self.task.await;
        lock(&self.snapshot).clone()
    }
}

/// Locks `mutex`, ignoring poisoning: a panicked holder leaves plain data behind.
pub(crate) fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

enum Outcome {
    /// The instance ended on its own.
    Exited(Termination),
    /// The instance was stopped on request.
    Stopped(Termination),
}

struct ContainerTask {
    body: ContainerBody,
    settings: RuntimeSettings,
    snapshot: Arc<Mutex<ContainerSnapshot>>,
    changed: Arc<Notify>,
    stop: watch::Receiver<Option<StopRequest>>,
}

impl ContainerTask {
    fn update(&self, f: impl FnOnce(&mut ContainerSnapshot)) {
        f(&mut lock(&self.snapshot));
        self.changed.notify_one();
    }

    /// The instance ended for good.
    fn finish(&self, end: Termination) {
        self.update(|s| {
            s.instance += 1;
            s.ready = false;
            s.state = RunState::Terminated(end);
            s.done = true;
        });
    }

    fn name(&self) -> String {
        lock(&self.snapshot).name.clone()
    }

    async fn run(mut self) {
        let mut backoff = BACKOFF_BASE;
        loop {
            if self.stop.borrow().is_some() {
                self.update(|s| s.done = true);
                return;
            }
            let started = Instant::now();
            let outcome = match self.body.clone() {
                ContainerBody::Process { process, probe } => self.run_process(process, probe).await,
                ContainerBody::Workload { device } => self.run_workload(device).await,
            };
            match outcome {
                Outcome::Stopped(end) => {
                    self.finish(end);
                    return;
                }
                Outcome::Exited(end) => {
                    let restart = match self.settings.restart_policy.as_str() {
                        "Never" => false,
                        "OnFailure" => end.exit_code != 0,
                        _ => true,
                    };
                    info!(pod = %self.settings.pod, container = %self.name(), exit_code = end.exit_code, restart, "container exited");
                    if !restart {
                        self.finish(end);
                        let _ = wait_stop(&mut self.stop).await;
                        return;
                    }
                    if started.elapsed() > self.settings.time_scale.scale(BACKOFF_RESET) {
                        backoff = BACKOFF_BASE;
                    }
                    let delay = self.settings.time_scale.scale(backoff);
                    let message = format!(
                        "back-off {}s restarting failed container={} pod={}",
                        backoff.as_secs(),
                        self.name(),
                        self.settings.pod
                    );
                    self.update(|s| {
                        s.instance += 1;
                        s.ready = false;
                        s.state = RunState::Waiting {
                            reason: "CrashLoopBackOff".to_owned(),
                            message: Some(message),
                        };
                        s.last_termination = Some(end.clone());
                    });
                    tokio::select! {
                        () = tokio::time::sleep(delay) => {}
                        _ = wait_stop(&mut self.stop) => {
                            self.finish(end);
                            return;
                        }
                    }
                    backoff = (backoff * 2).min(BACKOFF_MAX);
                    self.update(|s| s.restart_count += 1);
                }
            }
        }
    }

    async fn run_process(
        &mut self,
        process: ProcessSpec,
        probe: Option<ReadinessProbe>,
    ) -> Outcome {
        let started_at = Timestamp::now();
        let mut instance = match ProcessInstance::spawn(&process, self.settings.log_file.as_ref()) {
            Ok(instance) => instance,
            Err(err) => {
                let message = format!("cannot run {}: {err}", process.program.display());
                return Outcome::Exited(Termination::now(128, Some(message), None));
            }
        };
        let instance_id = {
            let mut s = lock(&self.snapshot);
            s.state = RunState::Running { started_at };
            s.ever_started = true;
            s.ready = probe.is_none();
            s.instance
        };
        self.changed.notify_one();
        debug!(pod = %self.settings.pod, container = %self.name(), program = %process.program.display(), "container started");
        let probe_task = probe.map(|p| {
            tokio::spawn(probe_loop(
                p,
                self.settings.time_scale,
                self.snapshot.clone(),
                self.changed.clone(),
                instance_id,
            ))
        });
        let (status, outcome): (_, fn(Termination) -> Outcome) = tokio::select! {
            status = instance.child.wait() => (status.ok(), Outcome::Exited),
            request = wait_stop(&mut self.stop) => (instance.stop(request).await, Outcome::Stopped),
        };
        if let Some(task) = probe_task {
            task.abort();
        }
        let exit_code = status.map_or(137, |s| {
            s.code().unwrap_or_else(|| 128 + s.signal().unwrap_or(9))
        });
        let message = instance.last_line().await;
        outcome(Termination::now(exit_code, message, Some(started_at)))
    }

    async fn run_workload(&mut self, device: Option<DeviceHold>) -> Outcome {
        let started_at = Timestamp::now();
        let pid = NEXT_SIM_PID.fetch_add(1, Ordering::Relaxed);
        if let Some(device) = &device {
            if let Err(err) = device.kernel.hold(pid, &device.comm) {
                let message = format!("cannot open /dev/tenstorrent/0: {err}");
                return Outcome::Exited(Termination::now(1, Some(message), Some(started_at)));
            }
            info!(pod = %self.settings.pod, container = %self.name(), pid, "workload holds /dev/tenstorrent");
        }
        self.update(|s| {
            s.state = RunState::Running { started_at };
            s.ever_started = true;
            s.ready = true;
        });
        let killed = async {
            match &device {
                Some(d) => {
                    while d.kernel.process_alive(pid) {
                        tokio::time::sleep(WORKLOAD_POLL).await;
                    }
                }
                None => std::future::pending::<()>().await,
            }
        };
        let outcome = tokio::select! {
            () = killed => {
                let message = format!("simulated process {pid} was killed (SIGKILL) on the host");
                Outcome::Exited(Termination::now(137, Some(message), Some(started_at)))
            }
            _ = wait_stop(&mut self.stop) => Outcome::Stopped(Termination::now(0, None, Some(started_at))),
        };
        if let Some(device) = &device {
            if let Err(err) = device.kernel.exit_process(pid) {
                debug!(pid, error = %err, "simulated workload process cleanup failed");
            }
            info!(pod = %self.settings.pod, container = %self.name(), pid, "workload released /dev/tenstorrent");
        }
        outcome
    }
}

/// Waits for a stop request; a dropped sender counts as `Kill`.
async fn wait_stop(stop: &mut watch::Receiver<Option<StopRequest>>) -> StopRequest {
    loop {
        if let Some(request) = *stop.borrow_and_update() {
            return request;
        }
        if stop.changed().await.is_err() {
            return StopRequest::Kill;
        }
    }
}

/// A running child process in its own process group, its output going to a log file.
struct ProcessInstance {
    child: Child,
    pgid: Option<Pid>,
    last_line: Arc<Mutex<Option<String>>>,
    readers: Vec<JoinHandle<()>>,
}

impl ProcessInstance {
    fn spawn(spec: &ProcessSpec, log_file: Option<&PathBuf>) -> std::io::Result<Self> {
        let mut child = command(spec, Stdio::piped).process_group(0).spawn()?;
        let pgid = child
            .id()
            .and_then(|id| i32::try_from(id).ok())
            .map(Pid::from_raw);
        let last_line = Arc::new(Mutex::new(None));
        let reader = |stream: Box<dyn AsyncRead + Send + Unpin>| {
            tokio::spawn(read_lines(stream, log_file.cloned(), last_line.clone()))
        };
        let readers = [
            child.stdout.take().map(|out| reader(Box::new(out))),
            child.stderr.take().map(|err| reader(Box::new(err))),
        ];
        let readers = readers.into_iter().flatten().collect();
        Ok(Self {
            child,
            pgid,
            last_line,
            readers,
        })
    }

    /// SIGTERM (or SIGKILL) to the whole process group, then SIGKILL after the grace period.
    async fn stop(&mut self, request: StopRequest) -> Option<ExitStatus> {
        let grace = match request {
            StopRequest::Graceful(grace) => {
                self.signal(Signal::SIGTERM);
                grace
            }
            StopRequest::Kill => Duration::ZERO,
        };
        let exited = tokio::time::timeout(grace, self.child.wait()).await;
        // Also when the leader exited: the group may still have members.
        self.signal(Signal::SIGKILL);
        match exited {
            Ok(status) => status.ok(),
            Err(_) => self.child.wait().await.ok(),
        }
    }

    fn signal(&self, signal: Signal) {
        if let Some(pgid) = self.pgid {
            let _ = killpg(pgid, signal);
        }
    }

    /// The last line the process wrote (stdout or stderr), once its output has ended.
    async fn last_line(&mut self) -> Option<String> {
        for reader in self.readers.drain(..) {
            // Grandchildren can keep the pipes open: do not wait for them long.
            let _ = tokio::time::timeout(Duration::from_millis(200), reader).await;
        }
        lock(&self.last_line).clone()
    }
}

async fn read_lines(
    stream: impl AsyncRead + Unpin,
    log_file: Option<PathBuf>,
    last_line: Arc<Mutex<Option<String>>>,
) {
    let mut log = match &log_file {
        Some(path) => tokio::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
            .await
            .ok(),
        None => None,
    };
    let mut lines = BufReader::new(stream).lines();
    while let Ok(Some(line)) = lines.next_line().await {
        if let Some(file) = log.as_mut() {
            let _ = file.write_all(format!("{line}\n").as_bytes()).await;
        }
        if !line.trim().is_empty() {
            *lock(&last_line) = Some(line);
        }
    }
}

async fn probe_loop(
    probe: ReadinessProbe,
    scale: TimeScale,
    snapshot: Arc<Mutex<ContainerSnapshot>>,
    changed: Arc<Notify>,
    instance: u64,
) {
    tokio::time::sleep(scale.scale(probe.initial_delay)).await;
    let mut failures = 0u32;
    loop {
        let ready = match &probe.process {
            Some(process) => run_probe(process, probe.timeout).await,
            None => true,
        };
        failures = if ready { 0 } else { failures + 1 };
        if ready || failures >= probe.failure_threshold.max(1) {
            let mut s = lock(&snapshot);
            if s.instance == instance
                && matches!(s.state, RunState::Running { .. })
                && s.ready != ready
            {
                s.ready = ready;
                drop(s);
                changed.notify_one();
            }
        }
        tokio::time::sleep(scale.scale(probe.period)).await;
    }
}

async fn run_probe(process: &ProcessSpec, timeout: Duration) -> bool {
    let Ok(mut child) = command(process, Stdio::null).spawn() else {
        return false;
    };
    matches!(
        tokio::time::timeout(timeout, child.wait()).await,
        Ok(Ok(status)) if status.success()
    )
}

/// The command for `spec`, with nothing inherited and no input, its output going to `output`.
fn command(spec: &ProcessSpec, output: fn() -> Stdio) -> Command {
    let mut command = Command::new(&spec.program);
    command
        .args(&spec.args)
        .env_clear()
        .envs(spec.env.iter().map(|(k, v)| (k, v)))
        .stdin(Stdio::null())
        .stdout(output())
        .stderr(output())
        .kill_on_drop(true);
    command
}
