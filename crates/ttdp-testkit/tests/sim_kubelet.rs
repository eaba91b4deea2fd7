//! The simulated kubelet: a mapped image runs as a child process with the pod's command, args and
//! environment, its exec readiness probe drives the Ready condition, crashed containers restart
//! with back-off, and deletions are graceful (SIGTERM, grace period, SIGKILL, then gone).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::Path;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{
    Container, EnvVar, EnvVarSource, ExecAction, ObjectFieldSelector, Pod, PodSpec, Probe,
};
use kube::api::{Api, DeleteParams, ObjectMeta, PostParams};
use ttdp_testkit::sim::{SimCluster, SimClusterOptions, eventually};

const SHELL_IMAGE: &str = "sim.test/shell";
const WAIT: Duration = Duration::from_secs(20);

fn field(name: &str, path: &str) -> EnvVar {
    EnvVar {
        name: name.to_owned(),
        value: None,
        value_from: Some(EnvVarSource {
            field_ref: Some(ObjectFieldSelector {
                api_version: None,
                field_path: path.to_owned(),
            }),
            ..EnvVarSource::default()
        }),
    }
}

fn shell_pod(name: &str, node: &str, script: &str) -> Pod {
    Pod {
        metadata: ObjectMeta {
            name: Some(name.to_owned()),
            ..ObjectMeta::default()
        },
        spec: Some(PodSpec {
            node_name: Some(node.to_owned()),
            containers: vec![Container {
                name: "main".to_owned(),
                image: Some(format!("{SHELL_IMAGE}:1")),
                command: Some(vec!["/bin/sh".to_owned(), "-c".to_owned()]),
                args: Some(vec![script.to_owned()]),
                env: Some(vec![
                    field("NODE_NAME", "spec.nodeName"),
                    field("POD_NAME", "metadata.name"),
                    field("POD_NAMESPACE", "metadata.namespace"),
                    EnvVar {
                        name: "GREETING".to_owned(),
                        value: Some("hello $(POD_NAME)".to_owned()),
                        value_from: None,
                    },
                ]),
                ..Container::default()
            }],
            ..PodSpec::default()
        }),
        status: None,
    }
}

async fn start() -> SimCluster {
    SimCluster::start(
        SimClusterOptions::new()
            .tenstorrent_nodes(1)
            .image(SHELL_IMAGE, "/bin/sh")
            .time_scale(0.05),
    )
    .await
    .unwrap()
}

async fn wait_pod<T>(
    api: &Api<Pod>,
    name: &str,
    what: &str,
    check: impl Fn(&Pod) -> Option<T>,
) -> T {
    eventually(what, WAIT, || {
        let api = api.clone();
        let found = async move { api.get_opt(name).await.ok().flatten() };
        let check = &check;
        async move { found.await.as_ref().and_then(check) }
    })
    .await
    .unwrap()
}

fn condition(pod: &Pod, type_: &str) -> Option<String> {
    pod.status
        .as_ref()?
        .conditions
        .as_ref()?
        .iter()
        .find(|c| c.type_ == type_)
        .map(|c| c.status.clone())
}

#[tokio::test]
async fn a_mapped_image_runs_with_the_pods_env_and_its_probe_drives_readiness() {
    let cluster = start().await;
    let node = cluster.tenstorrent_node_names().remove(0);
    let root = cluster
        .node(&node)
        .unwrap()
        .host_root()
        .unwrap()
        .to_path_buf();
    let mut pod = shell_pod(
        "runner",
        &node,
        "env > \"$TTDP_HOST_ROOT/env.$POD_NAME\"; echo started; \
         trap 'echo got SIGTERM; exit 0' TERM; while :; do sleep 0.05; done",
    );
    pod.spec.as_mut().unwrap().containers[0].readiness_probe = Some(Probe {
        exec: Some(ExecAction {
            command: Some(vec![
                "/bin/sh".to_owned(),
                "-c".to_owned(),
                "test -f \"$TTDP_HOST_ROOT/ready\"".to_owned(),
            ]),
        }),
        period_seconds: Some(2),
        ..Probe::default()
    });
    let api: Api<Pod> = Api::namespaced(cluster.client(), cluster.namespace());
    api.create(&PostParams::default(), &pod).await.unwrap();

    let env_file = root.join("env.runner");
    let env = eventually("the container to write its environment", WAIT, || {
        let path = env_file.clone();
        async move {
            std::fs::read_to_string(path)
                .ok()
                .filter(|s| s.contains("GREETING"))
        }
    })
    .await
    .unwrap();
    let has = |line: &str| env.lines().any(|l| l == line);
    assert!(has(&format!("NODE_NAME={node}")), "{env}");
    assert!(has("POD_NAME=runner"), "{env}");
    assert!(
        has(&format!("POD_NAMESPACE={}", cluster.namespace())),
        "{env}"
    );
    assert!(
        has("GREETING=hello runner"),
        "$(VAR) references expand: {env}"
    );
    assert!(has(&format!("TTDP_HOST_ROOT={}", root.display())), "{env}");
    assert!(has("TTDP_KERNEL=sim"), "{env}");
    assert!(
        has(&format!(
            "KUBECONFIG={}",
            cluster.kubeconfig_path().display()
        )),
        "{env}"
    );

    // Running but not ready until the probe passes.
    let running = wait_pod(&api, "runner", "phase Running", |p| {
        (p.status.as_ref()?.phase.as_deref() == Some("Running")).then(|| p.clone())
    })
    .await;
    assert_eq!(condition(&running, "Ready").as_deref(), Some("False"));
    let status = running.status.unwrap();
    assert!(status.pod_ip.is_some() && status.host_ip.is_some());
    assert!(
        status.container_statuses.unwrap()[0]
            .state
            .as_ref()
            .unwrap()
            .running
            .is_some()
    );

    std::fs::write(root.join("ready"), "").unwrap();
    wait_pod(&api, "runner", "Ready=True", |p| {
        (condition(p, "Ready")? == "True").then_some(())
    })
    .await;
    let pod = api.get("runner").await.unwrap();
    assert_eq!(condition(&pod, "ContainersReady").as_deref(), Some("True"));
    assert!(pod.status.unwrap().container_statuses.unwrap()[0].ready);

    std::fs::remove_file(root.join("ready")).unwrap();
    wait_pod(&api, "runner", "Ready=False after failures", |p| {
        (condition(p, "Ready")? == "False").then_some(())
    })
    .await;

    // Graceful deletion: the process gets SIGTERM and the pod disappears.
    api.delete("runner", &DeleteParams::default())
        .await
        .unwrap();
    eventually("the pod to be gone", WAIT, || {
        let api = api.clone();
        async move { api.get_opt("runner").await.ok()?.is_none().then_some(()) }
    })
    .await
    .unwrap();
    let log = std::fs::read_to_string(
        cluster
            .log_dir()
            .join(format!("{}_runner_main.log", cluster.namespace())),
    )
    .unwrap();
    assert!(
        log.contains("started") && log.contains("got SIGTERM"),
        "{log}"
    );
    cluster.shutdown().await.unwrap();
}

fn alive(pid: &str) -> bool {
    Path::new("/proc").join(pid.trim()).exists()
}

#[tokio::test]
async fn a_process_ignoring_sigterm_is_killed_after_the_grace_period() {
    let cluster = start().await;
    let node = cluster.tenstorrent_node_names().remove(0);
    let root = cluster
        .node(&node)
        .unwrap()
        .host_root()
        .unwrap()
        .to_path_buf();
    // `$$$$` is `$$` after the kubelet's escaping: the shell's pid.
    let mut pod = shell_pod(
        "stubborn",
        &node,
        "trap '' TERM; echo $$$$ > \"$TTDP_HOST_ROOT/pid\"; while :; do sleep 0.05; done",
    );
    // 20 s at time scale 0.05: 1 s.
    pod.spec.as_mut().unwrap().termination_grace_period_seconds = Some(20);
    let api: Api<Pod> = Api::namespaced(cluster.client(), cluster.namespace());
    api.create(&PostParams::default(), &pod).await.unwrap();
    let pid = eventually("the pid file", WAIT, || {
        let path = root.join("pid");
        async move {
            std::fs::read_to_string(path)
                .ok()
                .filter(|s| !s.trim().is_empty())
        }
    })
    .await
    .unwrap();
    assert!(alive(&pid));

    let asked = Instant::now();
    api.delete("stubborn", &DeleteParams::default())
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(500)).await;
    let terminating = api.get_opt("stubborn").await.unwrap();
    assert!(
        terminating.is_some_and(|p| p.metadata.deletion_timestamp.is_some()),
        "within the grace period the pod is still there, terminating"
    );
    assert!(
        alive(&pid),
        "SIGTERM is ignored, so the process lives on during the grace period"
    );
    eventually("the pod to be gone", WAIT, || {
        let api = api.clone();
        async move { api.get_opt("stubborn").await.ok()?.is_none().then_some(()) }
    })
    .await
    .unwrap();
    assert!(
        asked.elapsed() >= Duration::from_millis(900),
        "gone only after the grace period"
    );
    assert!(!alive(&pid), "SIGKILL after the grace period");
    cluster.shutdown().await.unwrap();
}

#[tokio::test]
async fn crashing_containers_restart_with_back_off() {
    let cluster = start().await;
    let node = cluster.tenstorrent_node_names().remove(0);
    let api: Api<Pod> = Api::namespaced(cluster.client(), cluster.namespace());
    api.create(
        &PostParams::default(),
        &shell_pod("crasher", &node, "echo first line; echo boom; exit 3"),
    )
    .await
    .unwrap();
    let started = Instant::now();
    let status = wait_pod(&api, "crasher", "two restarts", |p| {
        let s = p.status.as_ref()?.container_statuses.as_ref()?[0].clone();
        (s.restart_count >= 2).then_some(s)
    })
    .await;
    let elapsed = started.elapsed();
    let last = status.last_state.unwrap().terminated.unwrap();
    assert_eq!(last.exit_code, 3);
    assert_eq!(last.message.as_deref(), Some("boom"), "the last log line");
    assert_eq!(last.reason.as_deref(), Some("Error"));
    // Back-off 10 s then 20 s at scale 0.05: at least 1.5 s for two restarts, not a tight loop.
    assert!(
        elapsed >= Duration::from_millis(1400),
        "restarted too fast: {elapsed:?}"
    );

    let waiting = wait_pod(&api, "crasher", "CrashLoopBackOff", |p| {
        let s = p.status.as_ref()?.container_statuses.as_ref()?[0].clone();
        s.state?
            .waiting
            .filter(|w| w.reason.as_deref() == Some("CrashLoopBackOff"))
    })
    .await;
    assert!(waiting.message.unwrap().contains("back-off"));
    let pod = api.get("crasher").await.unwrap();
    assert_eq!(
        pod.status.as_ref().unwrap().phase.as_deref(),
        Some("Running"),
        "restartPolicy Always keeps it Running"
    );
    assert_eq!(condition(&pod, "Ready").as_deref(), Some("False"));
    cluster.shutdown().await.unwrap();
}

#[tokio::test]
async fn restart_policy_never_ends_in_succeeded_or_failed() {
    let cluster = start().await;
    let node = cluster.tenstorrent_node_names().remove(0);
    let api: Api<Pod> = Api::namespaced(cluster.client(), cluster.namespace());
    for (name, code, phase) in [("ok", 0, "Succeeded"), ("bad", 4, "Failed")] {
        let mut pod = shell_pod(name, &node, &format!("exit {code}"));
        pod.spec.as_mut().unwrap().restart_policy = Some("Never".to_owned());
        api.create(&PostParams::default(), &pod).await.unwrap();
        let pod = wait_pod(&api, name, phase, |p| {
            (p.status.as_ref()?.phase.as_deref() == Some(phase)).then(|| p.clone())
        })
        .await;
        let s = &pod.status.unwrap().container_statuses.unwrap()[0];
        assert_eq!(s.restart_count, 0);
        assert_eq!(
            s.state
                .as_ref()
                .unwrap()
                .terminated
                .as_ref()
                .unwrap()
                .exit_code,
            code
        );
    }
    cluster.shutdown().await.unwrap();
}

#[tokio::test]
async fn unmapped_images_are_workloads_ready_at_once() {
    let cluster = start().await;
    let node = cluster.tenstorrent_node_names().remove(0);
    let api: Api<Pod> = Api::namespaced(cluster.client(), cluster.namespace());
    let mut pod = shell_pod("app", &node, "exit 1");
    pod.spec.as_mut().unwrap().containers[0].image = Some("docker.io/library/nginx:1".to_owned());
    api.create(&PostParams::default(), &pod).await.unwrap();
    let pod = wait_pod(&api, "app", "Ready", |p| {
        (condition(p, "Ready")? == "True").then(|| p.clone())
    })
    .await;
    let s = &pod
        .status
        .as_ref()
        .unwrap()
        .container_statuses
        .as_ref()
        .unwrap()[0];
    assert_eq!(s.restart_count, 0, "no process ran, so nothing exited");
    let status = pod.status.clone().unwrap();
    assert_ne!(status.pod_ip, status.host_ip, "a pod network address");

    let mut host = shell_pod("host-net", &node, "exit 1");
    let spec = host.spec.as_mut().unwrap();
    spec.containers[0].image = Some("docker.io/library/nginx:1".to_owned());
    spec.host_network = Some(true);
    api.create(&PostParams::default(), &host).await.unwrap();
    let host = wait_pod(&api, "host-net", "Ready", |p| {
        (condition(p, "Ready")? == "True").then(|| p.clone())
    })
    .await;
    let status = host.status.unwrap();
    assert_eq!(
        status.pod_ip, status.host_ip,
        "hostNetwork pods use the node's address"
    );
    cluster.shutdown().await.unwrap();
}
