//! End-to-end drains against the real control plane: real eviction, PodDisruptionBudget status
//! from the real disruption controller, graceful deletion completed by a simulated kubelet,
//! finalizers honoured. The drainer talks through a recording, fault-injecting proxy (see
//! `support`), which also injects the 503/403/409 answers of the retry tests.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use k8s_openapi::api::core::v1::Node;
use kube::api::{Patch, PatchParams};
use serde_json::json;
use support::{Harness, fast, labels, with};
use ttdp_drain::{
    CordonOutcome, CordonOwner, DaemonSetsSeen, DevicePredicate, Disposition, DrainError,
    DrainEventKind, DrainOptions, Drainer, EventSink, NodePatchExtras, ObjectKey, Pass, PodRules,
    Reason, Removal, StuckReason, TwoPassDrain, UncordonOutcome,
};
use ttdp_selector::Selector;
use ttdp_testkit::faults::Fault;

fn all_flags() -> PodRules {
    PodRules {
        ignore_daemonsets: true,
        delete_emptydir_data: true,
        force: true,
        ..PodRules::default()
    }
}

fn names(refs: &[ttdp_drain::PodRef]) -> BTreeSet<String> {
    refs.iter().map(|r| r.name.clone()).collect()
}

fn set(items: &[&str]) -> BTreeSet<String> {
    items.iter().map(|s| s.to_string()).collect()
}

/// A node with one pod of every kind, plus a pod on another node.
async fn mixed_node(h: &Harness) {
    let rs = h.owner("ReplicaSet", "web").await;
    let sts = h.owner("StatefulSet", "db").await;
    let job = h.owner("Job", "batch").await;
    let ds = h.owner("DaemonSet", "proxy").await;
    h.pod("n1", "web-1", with(rs.clone(), labels("web"))).await;
    h.pod("n1", "db-0", sts).await;
    h.pod("n1", "batch-run", job.clone()).await;
    h.pod(
        "n1",
        "batch-done",
        with(job, json!({"status": {"phase": "Succeeded"}})),
    )
    .await;
    h.pod("n1", "bare", json!({})).await;
    h.pod(
        "n1",
        "etcd-n1",
        json!({"metadata": {"annotations": {"kubernetes.io/config.mirror": "hash"}}}),
    )
    .await;
    h.pod("n1", "proxy-n1", ds).await;
    h.pod(
        "n1",
        "cache",
        with(
            rs.clone(),
            json!({"spec": {"volumes": [{"name": "tmp", "emptyDir": {}}]}}),
        ),
    )
    .await;
    h.pod("n2", "web-2", with(rs, labels("web"))).await;
}

#[tokio::test]
async fn refuses_like_kubectl_without_flags_and_drains_every_kind_with_them() {
    let h = Harness::start(&["n1", "n2"]).await;
    mixed_node(&h).await;
    let drainer = h.drainer();

    let err = drainer
        .drain(&h.n("n1"), &fast(PodRules::default()))
        .await
        .unwrap_err();
    let DrainError::Refused { pods, .. } = &err else {
        panic!("expected a refusal, got {err}");
    };
    let refused: BTreeSet<(String, String)> = pods
        .iter()
        .map(|d| (d.pod.name.clone(), d.reason.to_string()))
        .collect();
    assert_eq!(
        refused,
        [
            (
                "bare",
                "cannot delete Pods that declare no controller (use --force to override)"
            ),
            (
                "cache",
                "Pods with local storage (use --delete-emptydir-data to override)"
            ),
            (
                "proxy-n1",
                "DaemonSet-managed Pods (use --ignore-daemonsets to ignore)"
            ),
        ]
        .iter()
        .map(|(a, b)| (a.to_string(), b.to_string()))
        .collect()
    );
    assert!(
        h.proxy
            .recorder()
            .filter(
                |r| r.subresource == "eviction" || (r.resource == "pods" && r.method == "DELETE")
            )
            .is_empty(),
        "a refused drain removes nothing"
    );
    assert_eq!(
        h.pod_names("n1").await.len(),
        8,
        "{:?}",
        h.pod_names("n1").await
    );

    let report = drainer.drain(&h.n("n1"), &fast(all_flags())).await.unwrap();
    assert_eq!(
        names(&report.evicted),
        set(&["web-1", "db-0", "batch-run", "bare", "cache"])
    );
    assert_eq!(names(&report.deleted), set(&["batch-done"]));
    assert_eq!(h.pod_names("n1").await, set(&["etcd-n1", "proxy-n1"]));
    assert_eq!(
        h.pod_names("n2").await,
        set(&["web-2"]),
        "other nodes untouched"
    );
    let skipped: BTreeSet<(String, Reason)> = report
        .with(Disposition::Skip)
        .map(|d| (d.pod.name.clone(), d.reason.clone()))
        .collect();
    assert_eq!(
        skipped,
        [
            ("etcd-n1".to_string(), Reason::Mirror),
            ("proxy-n1".to_string(), Reason::DaemonSetIgnored)
        ]
        .into_iter()
        .collect()
    );

    // Pods were only ever listed per node, evicted through the subresource, and the finished
    // pod deleted directly.
    let rec = h.proxy.recorder();
    let pod_lists = rec.filter(|r| r.resource == "pods" && r.verb == "list");
    assert!(!pod_lists.is_empty());
    for r in &pod_lists {
        assert!(
            r.query.contains("fieldSelector=spec.nodeName%3D"),
            "pods listed without the node field selector: {}",
            r.query
        );
    }
    let evictions: BTreeSet<String> = rec
        .filter(|r| r.subresource == "eviction")
        .into_iter()
        .map(|r| r.name)
        .collect();
    assert_eq!(
        evictions,
        set(&["web-1", "db-0", "batch-run", "bare", "cache"])
    );
    let deletes: Vec<String> = rec
        .filter(|r| r.resource == "pods" && r.method == "DELETE")
        .into_iter()
        .map(|r| r.name)
        .collect();
    assert_eq!(deletes, ["batch-done"]);

    // Events: evicting then gone for each, done last.
    let events = h.events();
    let gone: BTreeSet<(String, Removal)> = events
        .iter()
        .filter_map(|e| match &e.kind {
            DrainEventKind::Gone { pod, removal } => Some((pod.name.clone(), *removal)),
            _ => None,
        })
        .collect();
    assert_eq!(gone.len(), 6);
    assert!(gone.contains(&("batch-done".into(), Removal::Deleted)));
    assert!(gone.contains(&("web-1".into(), Removal::Evicted)));
    assert!(matches!(
        events.last().map(|e| &e.kind),
        Some(DrainEventKind::Done {
            evicted: 5,
            deleted: 1
        })
    ));
    let c = drainer.counters();
    assert_eq!((c.evictions, c.deletions, c.pods_gone), (5, 1, 6));
    assert_eq!(c.budget_blocks, 0);
    h.shutdown().await;
}

#[tokio::test]
async fn pod_selector_limits_the_drain_and_unselected_pods_cannot_block_it() {
    let h = Harness::start(&["n1"]).await;
    let rs = h.owner("ReplicaSet", "web").await;
    h.pod("n1", "web-1", with(rs.clone(), labels("web"))).await;
    h.pod("n1", "api-1", with(rs, labels("api"))).await;
    h.pod("n1", "bare", json!({})).await;
    let rules = PodRules {
        selector: Selector::parse("app in (web)").unwrap(),
        ..PodRules::default()
    };
    let report = h.drainer().drain(&h.n("n1"), &fast(rules)).await.unwrap();
    assert_eq!(names(&report.evicted), set(&["web-1"]));
    assert_eq!(h.pod_names("n1").await, set(&["api-1", "bare"]));
    assert_eq!(report.with(Disposition::Skip).count(), 2);
    h.shutdown().await;
}

#[tokio::test]
async fn budget_blocks_then_allows_as_replacements_become_ready() {
    let h = Harness::start(&["n1", "n2"]).await;
    let rs = h.owner("ReplicaSet", "web").await;
    h.pod("n1", "web-a", with(rs.clone(), labels("web"))).await;
    h.pod("n1", "web-b", with(rs.clone(), labels("web"))).await;
    h.pdb("web-pdb", "web", json!({"minAvailable": 2})).await;

    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    let counters = Arc::new(Mutex::new(None));
    let drain = {
        let events = h.events.clone();
        let counters = counters.clone();
        let drainer = Drainer::new(h.client.clone()).with_events(EventSink::new(move |e| {
            events.lock().unwrap().push(e.clone());
            let _ = tx.send(e.clone());
        }));
        let n1 = h.n("n1");
        // The drainer (and with it the channel's sender) is dropped when the drain ends.
        async move {
            let result = drainer.drain(&n1, &fast(PodRules::default())).await;
            *counters.lock().unwrap() = Some(drainer.counters());
            result
        }
    };
    // The "ReplicaSet controller": on the first block, allow one disruption; for every pod
    // that goes, start a Ready replacement on n2.
    let controller = async {
        let mut relaxed = false;
        let mut replacements = 0;
        while let Some(event) = rx.recv().await {
            match event.kind {
                DrainEventKind::EvictionBlocked {
                    budget,
                    disruptions_allowed,
                    ..
                } if !relaxed => {
                    assert_eq!(budget, Some(ObjectKey::new(h.ns(), "web-pdb")));
                    assert_eq!(disruptions_allowed, Some(0));
                    h.patch_pdb("web-pdb", json!({"minAvailable": 1})).await;
                    relaxed = true;
                }
                DrainEventKind::Gone { .. } => {
                    replacements += 1;
                    h.pod(
                        "n2",
                        &format!("web-new-{replacements}"),
                        with(rs.clone(), labels("web")),
                    )
                    .await;
                }
                DrainEventKind::Done { .. } => return relaxed,
                _ => {}
            }
        }
        relaxed
    };
    let (report, relaxed) = tokio::join!(drain, controller);
    let report = report.unwrap_or_else(|e| panic!("{e}\nevents: {:#?}", h.events()));
    assert!(relaxed, "the budget blocked at first");
    assert_eq!(names(&report.evicted), set(&["web-a", "web-b"]));
    let c = counters.lock().unwrap().unwrap();
    assert!(c.budget_blocks >= 2, "{c:?}");
    assert!(c.eviction_requests > c.evictions);
    // Never below the budget: each 201 eviction was granted by the server's budget check.
    let granted = h
        .proxy
        .recorder()
        .filter(|r| r.subresource == "eviction" && r.status == 201)
        .len();
    assert_eq!(granted, 2);
    h.shutdown().await;
}

/// Evictions a budget guards go first, though their pods list last: they are the ones that may
/// wait for replacements.
#[tokio::test]
async fn evictions_a_budget_guards_go_first() {
    let h = Harness::start(&["n1"]).await;
    let api = h.owner("ReplicaSet", "api").await;
    let web = h.owner("ReplicaSet", "web").await;
    h.pod("n1", "api-a", with(api.clone(), labels("api"))).await;
    h.pod("n1", "api-b", with(api, labels("api"))).await;
    h.pod("n1", "web-a", with(web, labels("web"))).await;
    h.pdb("web-pdb", "web", json!({"maxUnavailable": 1})).await;
    // Allowed from the start, so each pod is asked once and the order is the drainer's alone.
    h.wait_pdb_allows("web-pdb", 1).await;
    let options = DrainOptions {
        concurrency: 1,
        ..fast(PodRules::default())
    };
    h.drainer()
        .drain(&h.n("n1"), &options)
        .await
        .unwrap_or_else(|e| panic!("{e}\nevents: {:#?}", h.events()));
    let evictions: Vec<String> = h
        .proxy
        .recorder()
        .filter(|r| r.subresource == "eviction")
        .into_iter()
        .map(|r| r.name)
        .collect();
    assert_eq!(evictions, ["web-a", "api-a", "api-b"]);
    h.shutdown().await;
}

/// A removed pod is seen gone on the watch of the node's pods, not only by the periodic list:
/// with a list once a minute, the drain still ends well within its 20 s timeout.
#[tokio::test]
async fn removed_pods_are_seen_gone_on_the_watch() {
    let h = Harness::start(&["n1"]).await;
    let rs = h.owner("ReplicaSet", "web").await;
    h.pod("n1", "web-a", with(rs.clone(), labels("web"))).await;
    h.pod("n1", "web-b", with(rs, labels("web"))).await;
    let options = DrainOptions {
        poll_interval: Duration::from_secs(60),
        ..fast(PodRules::default())
    };
    let report = h
        .drainer()
        .drain(&h.n("n1"), &options)
        .await
        .unwrap_or_else(|e| panic!("{e}\nevents: {:#?}", h.events()));
    assert_eq!(names(&report.evicted), set(&["web-a", "web-b"]));
    h.shutdown().await;
}

/// A drain holds its node's pods until it ends, and a controller runs many drains at once:
/// the pods are kept without the managed fields the server sends with them.
#[tokio::test]
async fn a_nodes_pods_are_listed_without_their_managed_fields() {
    let h = Harness::start(&["n1"]).await;
    h.pod("n1", "web-a", labels("web")).await;
    let stored = h.admin_pods().get("web-a").await.unwrap();
    assert!(stored.metadata.managed_fields.is_some());
    let listed = ttdp_drain::list_node_pods(&h.admin, &h.n("n1"))
        .await
        .unwrap();
    assert_eq!(listed.len(), 1);
    assert_eq!(listed[0].metadata.uid, stored.metadata.uid);
    assert_eq!(listed[0].metadata.managed_fields, None);
    assert_eq!(listed[0].spec, stored.spec);
    h.shutdown().await;
}

#[tokio::test]
async fn timeout_names_each_remaining_pod_and_why() {
    let h = Harness::start(&["n1"]).await;
    let rs = h.owner("ReplicaSet", "web").await;
    h.pod("n1", "web-0", with(rs.clone(), labels("web"))).await;
    h.pdb("web-pdb", "web", json!({"maxUnavailable": 0})).await;
    h.pod(
        "n1",
        "slow",
        with(
            rs.clone(),
            json!({"metadata": {"finalizers": ["example.com/hold"]}}),
        ),
    )
    .await;
    h.pod("n1", "quick", rs).await;

    let options = DrainOptions {
        timeout: Some(Duration::from_secs(2)),
        ..fast(PodRules::default())
    };
    let started = std::time::Instant::now();
    let err = h.drainer().drain(&h.n("n1"), &options).await.unwrap_err();
    let returned = std::time::Instant::now();
    let elapsed = returned - started;
    assert!(
        elapsed >= Duration::from_secs(2) && elapsed < Duration::from_secs(4),
        "{elapsed:?}"
    );
    let DrainError::Timeout { remaining, .. } = &err else {
        panic!("expected a timeout, got {err}");
    };
    let text = err.to_string();
    assert!(
        text.contains(&format!(
            "{ns}/web-0: eviction blocked by PodDisruptionBudget {ns}/web-pdb (0 disruptions allowed)",
            ns = h.ns()
        )),
        "{text}"
    );
    assert!(
        text.contains(&format!(
            "{}: still terminating (removal accepted",
            h.key("slow")
        )),
        "{text}"
    );
    assert!(text.contains("finalizers: example.com/hold"), "{text}");
    assert_eq!(remaining.len(), 2, "the quick pod went: {text}");
    assert!(matches!(
        remaining.iter().find(|s| s.pod.name == "slow").unwrap().why,
        StuckReason::Terminating { .. }
    ));
    // Back-off, not a tight loop: 2 s with 50..400 ms delays allows ~10 attempts at most.
    let evictions = |keep: &dyn Fn(std::time::Instant) -> bool| {
        h.proxy
            .recorder()
            .filter(|r| r.subresource == "eviction" && r.name == "web-0" && keep(r.arrived))
            .len()
    };
    let attempts = evictions(&|arrived| arrived < returned);
    assert!((2..=15).contains(&attempts), "{attempts} eviction attempts");

    // Dropping the drain left no request running. An eviction sent just before the timeout
    // may be answered (and recorded) after it, so count by when requests arrived.
    tokio::time::sleep(Duration::from_millis(600)).await;
    let later = evictions(&|arrived| arrived >= returned);
    assert_eq!(later, 0, "eviction retries continued after the timeout");
    h.shutdown().await;
}

#[tokio::test]
async fn a_new_pod_with_the_same_name_counts_as_gone() {
    let h = Harness::start(&["n1"]).await;
    let sts = h.owner("StatefulSet", "db").await;
    let old = h
        .pod(
            "n1",
            "db-0",
            with(
                sts.clone(),
                json!({"metadata": {"finalizers": ["example.com/hold"]}}),
            ),
        )
        .await;
    let old_uid = old.metadata.uid.clone().unwrap();
    let options = DrainOptions {
        // Slow polling, so the replacement exists before the drain looks again.
        poll_interval: Duration::from_secs(2),
        ..fast(PodRules::default())
    };
    let drainer = h.drainer();
    let n1 = h.n("n1");
    let drain = drainer.drain(&n1, &options);
    let statefulset = async {
        let pods = h.pods();
        loop {
            let p = pods.get("db-0").await.unwrap();
            if p.metadata.deletion_timestamp.is_some() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        pods.patch(
            "db-0",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"finalizers": null}})),
        )
        .await
        .unwrap();
        while pods.get_opt("db-0").await.unwrap().is_some() {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        h.pod("n1", "db-0", sts).await
    };
    let (report, new) = tokio::join!(drain, statefulset);
    let report = report.unwrap();
    assert_ne!(new.metadata.uid.unwrap(), old_uid);
    assert_eq!(names(&report.evicted), set(&["db-0"]));
    assert_eq!(report.evicted[0].uid, old_uid);
    assert_eq!(h.pod_names("n1").await, set(&["db-0"]), "the new pod stays");
    h.shutdown().await;
}

#[tokio::test]
async fn concurrent_drains_of_two_nodes_stay_on_their_nodes() {
    let h = Harness::start(&["n1", "n2"]).await;
    let rs = h.owner("ReplicaSet", "web").await;
    for node in ["n1", "n2"] {
        for i in 0..6 {
            h.pod(
                node,
                &format!("{node}-web-{i}"),
                with(rs.clone(), labels("web")),
            )
            .await;
        }
    }
    h.pod("n2", "n2-bare", json!({})).await;
    let drainer = h.drainer();
    let options = DrainOptions {
        concurrency: 2,
        ..fast(all_flags())
    };
    let (n1, n2) = (h.n("n1"), h.n("n2"));
    let (a, b) = tokio::join!(drainer.drain(&n1, &options), drainer.drain(&n2, &options));
    let (a, b) = (a.unwrap(), b.unwrap());
    assert_eq!(a.evicted.len(), 6);
    assert_eq!(b.evicted.len(), 7);
    assert!(a.evicted.iter().all(|p| p.name.starts_with("n1-")));
    assert!(b.evicted.iter().all(|p| p.name.starts_with("n2-")));
    assert!(h.pod_names("n1").await.is_empty() && h.pod_names("n2").await.is_empty());
    for node in ["n1", "n2"] {
        let gone = h
            .events()
            .iter()
            .filter(|e| e.node == h.n(node) && matches!(e.kind, DrainEventKind::Gone { .. }))
            .count();
        assert_eq!(gone, if node == "n1" { 6 } else { 7 });
    }
    assert_eq!(drainer.counters().pods_gone, 13);
    h.shutdown().await;
}

fn owner(name: &str) -> CordonOwner {
    CordonOwner {
        owner: name.into(),
        owner_annotation: "example.com/cordoned-by".into(),
        time_annotation: "example.com/cordoned-at".into(),
    }
}

fn annotations(node: &Node) -> std::collections::BTreeMap<String, String> {
    node.metadata.annotations.clone().unwrap_or_default()
}

fn unschedulable(node: &Node) -> bool {
    node.spec
        .as_ref()
        .and_then(|s| s.unschedulable)
        .unwrap_or(false)
}

#[tokio::test]
async fn cordon_ownership_never_claims_or_lifts_someone_elses_cordon() {
    let h = Harness::start(&["n1"]).await;
    h.node("n2", json!({"spec": {"unschedulable": true}})).await;
    let (a, b) = (owner("ttdp/policy-a"), owner("ttdp/policy-b"));
    let d = h.drainer();

    assert_eq!(
        d.cordon(&h.n("n1"), &a).await.unwrap(),
        CordonOutcome::Cordoned
    );
    let n1 = h.get_node("n1").await;
    assert!(unschedulable(&n1));
    assert_eq!(annotations(&n1)["example.com/cordoned-by"], "ttdp/policy-a");
    let at: jiff::Timestamp = annotations(&n1)["example.com/cordoned-at"].parse().unwrap();
    assert!((jiff::Timestamp::now() - at).get_seconds().abs() < 60);
    assert_eq!(
        d.cordon(&h.n("n1"), &a).await.unwrap(),
        CordonOutcome::AlreadyOwned
    );
    assert_eq!(
        d.cordon(&h.n("n1"), &b).await.unwrap(),
        CordonOutcome::External {
            owner: Some("ttdp/policy-a".into())
        }
    );
    assert_eq!(
        d.uncordon(&h.n("n1"), &b).await.unwrap(),
        UncordonOutcome::External {
            owner: Some("ttdp/policy-a".into())
        }
    );
    assert!(unschedulable(&h.get_node("n1").await));
    assert_eq!(
        d.uncordon(&h.n("n1"), &a).await.unwrap(),
        UncordonOutcome::Uncordoned
    );
    let n1 = h.get_node("n1").await;
    assert!(!unschedulable(&n1));
    assert!(!annotations(&n1).contains_key("example.com/cordoned-by"));
    assert!(!annotations(&n1).contains_key("example.com/cordoned-at"));
    assert_eq!(
        d.uncordon(&h.n("n1"), &a).await.unwrap(),
        UncordonOutcome::NotCordoned
    );

    // An administrator's cordon is reported, not claimed, and survives our uncordon.
    assert_eq!(
        d.cordon(&h.n("n2"), &a).await.unwrap(),
        CordonOutcome::External { owner: None }
    );
    assert!(!annotations(&h.get_node("n2").await).contains_key("example.com/cordoned-by"));
    assert_eq!(
        d.uncordon(&h.n("n2"), &a).await.unwrap(),
        UncordonOutcome::External { owner: None }
    );
    assert!(unschedulable(&h.get_node("n2").await));
    assert_eq!(
        d.uncordon(&h.n("gone"), &a).await.unwrap(),
        UncordonOutcome::NodeMissing
    );
    assert!(matches!(
        d.cordon(&h.n("gone"), &a).await,
        Err(DrainError::NodeRead { .. })
    ));

    // Node writes were minimal merge patches carrying the resourceVersion. A patch refused for a
    // conflict with the cluster's own node writes (kubelet status, the unschedulable taint) is
    // retried and wrote nothing, so only accepted patches count.
    let patches = h
        .proxy
        .recorder()
        .filter(|r| r.resource == "nodes" && r.verb == "patch" && r.status < 300);
    assert_eq!(patches.len(), 2, "one cordon, one uncordon");
    for p in &patches {
        assert!(p.content_type.starts_with("application/merge-patch+json"));
        let body = p.body.clone().unwrap();
        let top: BTreeSet<&str> = body
            .as_object()
            .unwrap()
            .keys()
            .map(String::as_str)
            .collect();
        assert!(
            top.is_subset(
                &set(&["metadata", "spec"])
                    .iter()
                    .map(String::as_str)
                    .collect()
            )
        );
        let meta: BTreeSet<&str> = body["metadata"]
            .as_object()
            .unwrap()
            .keys()
            .map(String::as_str)
            .collect();
        assert_eq!(
            meta,
            ["annotations", "resourceVersion"].into_iter().collect()
        );
    }
    h.shutdown().await;
}

#[tokio::test]
async fn cordon_retries_after_a_write_conflict() {
    let h = Harness::start(&["n1"]).await;
    h.proxy
        .faults()
        .inject(Fault::conflict().resource("nodes").verb("patch").times(2));
    let outcome = h.drainer().cordon(&h.n("n1"), &owner("me")).await.unwrap();
    assert_eq!(outcome, CordonOutcome::Cordoned);
    assert!(unschedulable(&h.get_node("n1").await));
    h.shutdown().await;
}

/// A caller's gate label and the annotation listing the gates it closed.
const GATE: &str = "example.com/workloads";
const OTHER_GATE: &str = "example.com/more-workloads";
const GATES: &str = "example.com/closed-gates";

fn closing_gate() -> NodePatchExtras {
    NodePatchExtras::new()
        .set_label(GATE, "false")
        .set_annotation(GATES, GATE)
}

/// Reopens the gates the node's annotation lists: extras decided from the node as read.
fn reopening_listed_gates(node: &Node) -> NodePatchExtras {
    let listed = annotations(node).get(GATES).cloned().unwrap_or_default();
    let extras = listed
        .split(',')
        .filter(|g| !g.is_empty())
        .fold(NodePatchExtras::new(), |e, g| e.remove_label(g));
    if extras.is_empty() {
        extras
    } else {
        extras.remove_annotation(GATES)
    }
}

fn node_labels(node: &Node) -> std::collections::BTreeMap<String, String> {
    node.metadata.labels.clone().unwrap_or_default()
}

/// The node patches of the drainer the server accepted (writes), in order. A patch refused for a
/// conflict (the node lifecycle controller taints a cordoned node, say) changed nothing.
fn node_patches(h: &Harness) -> Vec<serde_json::Value> {
    h.proxy
        .recorder()
        .filter(|r| r.resource == "nodes" && r.verb == "patch" && r.status < 300)
        .into_iter()
        .map(|r| r.body.unwrap())
        .collect()
}

#[tokio::test]
async fn cordon_with_writes_the_extras_in_the_same_patch_as_the_cordon() {
    let h = Harness::start(&["n1"]).await;
    let a = owner("ttdp/policy-a");
    let d = h.drainer();

    assert_eq!(
        d.cordon_with(&h.n("n1"), &a, closing_gate()).await.unwrap(),
        CordonOutcome::Cordoned
    );
    let n1 = h.get_node("n1").await;
    assert!(unschedulable(&n1));
    assert_eq!(node_labels(&n1)[GATE], "false");
    assert_eq!(annotations(&n1)[GATES], GATE);
    assert_eq!(annotations(&n1)["example.com/cordoned-by"], "ttdp/policy-a");
    let patches = node_patches(&h);
    assert_eq!(patches.len(), 1, "cordon and extras in one write");
    let p = &patches[0];
    assert_eq!(p["spec"], json!({"unschedulable": true}));
    assert_eq!(p["metadata"]["labels"], json!({GATE: "false"}));
    assert_eq!(p["metadata"]["annotations"][GATES], GATE);
    assert_eq!(
        p["metadata"]["annotations"]["example.com/cordoned-by"],
        "ttdp/policy-a"
    );
    assert!(p["metadata"]["annotations"]["example.com/cordoned-at"].is_string());
    assert!(p["metadata"]["resourceVersion"].is_string());

    // Cordon and extras in place: nothing to write.
    assert_eq!(
        d.cordon_with(&h.n("n1"), &a, closing_gate()).await.unwrap(),
        CordonOutcome::AlreadyOwned
    );
    assert_eq!(node_patches(&h).len(), 1);

    assert_eq!(
        d.uncordon_with(&h.n("n1"), &a, reopening_listed_gates, None)
            .await
            .unwrap(),
        UncordonOutcome::Uncordoned
    );
    let n1 = h.get_node("n1").await;
    assert!(!unschedulable(&n1));
    assert!(!node_labels(&n1).contains_key(GATE));
    assert!(!annotations(&n1).contains_key(GATES));
    assert!(!annotations(&n1).contains_key("example.com/cordoned-by"));
    let patches = node_patches(&h);
    assert_eq!(patches.len(), 2, "uncordon and extras in one write");
    let p = &patches[1];
    assert_eq!(p["spec"], json!({"unschedulable": null}));
    assert_eq!(p["metadata"]["labels"], json!({GATE: null}));
    assert_eq!(
        p["metadata"]["annotations"],
        json!({GATES: null, "example.com/cordoned-by": null, "example.com/cordoned-at": null})
    );

    assert_eq!(
        d.uncordon_with(&h.n("n1"), &a, reopening_listed_gates, None)
            .await
            .unwrap(),
        UncordonOutcome::NotCordoned
    );
    assert_eq!(node_patches(&h).len(), 2);
    h.shutdown().await;
}

#[tokio::test]
async fn extras_beside_someone_elses_cordon_never_touch_that_cordon() {
    let h = Harness::start(&["n1"]).await;
    h.node("n2", json!({"spec": {"unschedulable": true}})).await;
    let (a, b) = (owner("ttdp/policy-a"), owner("ttdp/policy-b"));
    let d = h.drainer();
    assert_eq!(
        d.cordon(&h.n("n1"), &b).await.unwrap(),
        CordonOutcome::Cordoned
    );

    // Another owner's cordon and an administrator's: the extras are written, the cordon is
    // neither claimed nor lifted, and the patch names nothing of it.
    for (short, holder) in [("n1", Some("ttdp/policy-b")), ("n2", None)] {
        let external = holder.map(str::to_owned);
        h.proxy.recorder().clear();
        assert_eq!(
            d.cordon_with(&h.n(short), &a, closing_gate())
                .await
                .unwrap(),
            CordonOutcome::External {
                owner: external.clone()
            }
        );
        let node = h.get_node(short).await;
        assert!(unschedulable(&node));
        assert_eq!(node_labels(&node)[GATE], "false");
        assert_eq!(
            annotations(&node)
                .get("example.com/cordoned-by")
                .map(String::as_str),
            holder
        );
        let patches = node_patches(&h);
        assert_eq!(patches.len(), 1);
        assert_eq!(
            patches[0]["metadata"],
            json!({
                "resourceVersion": patches[0]["metadata"]["resourceVersion"],
                "labels": {GATE: "false"},
                "annotations": {GATES: GATE},
            })
        );
        assert!(patches[0].get("spec").is_none());

        // Extras in place beside the foreign cordon: no write at all.
        assert_eq!(
            d.cordon_with(&h.n(short), &a, closing_gate())
                .await
                .unwrap(),
            CordonOutcome::External {
                owner: external.clone()
            }
        );
        assert_eq!(node_patches(&h).len(), 1);

        assert_eq!(
            d.uncordon_with(&h.n(short), &a, reopening_listed_gates, None)
                .await
                .unwrap(),
            UncordonOutcome::External {
                owner: external.clone()
            }
        );
        let node = h.get_node(short).await;
        assert!(unschedulable(&node), "the foreign cordon stays");
        assert!(!node_labels(&node).contains_key(GATE));
        assert!(!annotations(&node).contains_key(GATES));
        assert_eq!(
            annotations(&node)
                .get("example.com/cordoned-by")
                .map(String::as_str),
            holder
        );
        let patches = node_patches(&h);
        assert_eq!(patches.len(), 2);
        assert_eq!(patches[1]["metadata"]["labels"], json!({GATE: null}));
        assert_eq!(patches[1]["metadata"]["annotations"], json!({GATES: null}));
        assert!(patches[1].get("spec").is_none());

        // Nothing of ours left: the foreign cordon is reported and nothing is written.
        assert_eq!(
            d.uncordon_with(&h.n(short), &a, reopening_listed_gates, None)
                .await
                .unwrap(),
            UncordonOutcome::External { owner: external }
        );
        assert_eq!(node_patches(&h).len(), 2);
    }
    h.shutdown().await;
}

#[tokio::test]
async fn cordon_from_a_cached_copy_saves_the_read_and_a_stale_one_is_decided_again() {
    let h = Harness::start(&["n1"]).await;
    let a = owner("ttdp/policy-a");
    let d = h.drainer();

    // A fresh copy: one patch, no read.
    let fresh = h.get_node("n1").await;
    h.proxy.recorder().clear();
    assert_eq!(
        d.cordon_with_cached(&h.n("n1"), &a, closing_gate(), Some(fresh))
            .await
            .unwrap(),
        CordonOutcome::Cordoned
    );
    let calls: Vec<String> = h
        .proxy
        .recorder()
        .filter(|r| r.resource == "nodes")
        .iter()
        .map(|r| r.verb.clone())
        .collect();
    assert_eq!(calls, ["patch"], "no read before the cordon");
    assert!(unschedulable(&h.get_node("n1").await));

    // A copy showing the cordon, taken before someone lifted it: the copy says nothing to do,
    // a fresh read says otherwise, and the node is cordoned again.
    let cordoned = h.get_node("n1").await;
    d.uncordon_with(&h.n("n1"), &a, reopening_listed_gates, None)
        .await
        .unwrap();
    assert_eq!(
        d.cordon_with_cached(&h.n("n1"), &a, closing_gate(), Some(cordoned))
            .await
            .unwrap(),
        CordonOutcome::Cordoned
    );
    let n1 = h.get_node("n1").await;
    assert!(unschedulable(&n1));
    assert_eq!(node_labels(&n1)[GATE], "false");
    h.shutdown().await;
}

#[tokio::test]
async fn uncordon_with_a_stale_cached_copy_decides_again_from_a_fresh_read() {
    let h = Harness::start(&["n1"]).await;
    let a = owner("ttdp/policy-a");
    let d = h.drainer();

    // A copy from before the cordon shows nothing to lift: a fresh read decides.
    let before = h.get_node("n1").await;
    d.cordon_with(&h.n("n1"), &a, closing_gate()).await.unwrap();
    assert_eq!(
        d.uncordon_with(&h.n("n1"), &a, reopening_listed_gates, Some(before))
            .await
            .unwrap(),
        UncordonOutcome::Uncordoned
    );
    let n1 = h.get_node("n1").await;
    assert!(!unschedulable(&n1));
    assert!(!node_labels(&n1).contains_key(GATE));

    // A copy of the cordoned node that someone else's write has moved on (closing one more
    // gate): the patch made from the copy fails its precondition, and the extras are decided
    // again from the fresh read, so both gates reopen and the other write is kept.
    d.cordon_with(&h.n("n1"), &a, closing_gate()).await.unwrap();
    let cordoned = h.get_node("n1").await;
    h.proxy.recorder().clear();
    kube::Api::<Node>::all(h.admin.clone())
        .patch(
            &h.n("n1"),
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {
                "labels": {OTHER_GATE: "false", "example.com/other": "x"},
                "annotations": {GATES: format!("{GATE},{OTHER_GATE}")},
            }})),
        )
        .await
        .unwrap();
    assert_eq!(
        d.uncordon_with(&h.n("n1"), &a, reopening_listed_gates, Some(cordoned))
            .await
            .unwrap(),
        UncordonOutcome::Uncordoned
    );
    let n1 = h.get_node("n1").await;
    assert!(!unschedulable(&n1));
    let labels = node_labels(&n1);
    assert!(!labels.contains_key(GATE) && !labels.contains_key(OTHER_GATE));
    assert_eq!(labels["example.com/other"], "x");
    assert!(!annotations(&n1).contains_key(GATES));
    let statuses: Vec<u16> = h
        .proxy
        .recorder()
        .filter(|r| r.resource == "nodes" && r.verb == "patch")
        .iter()
        .map(|r| r.status)
        .collect();
    assert_eq!(
        statuses.first(),
        Some(&409),
        "the stale copy's patch is refused"
    );
    assert_eq!(
        statuses.iter().filter(|s| **s < 300).count(),
        1,
        "then one write: {statuses:?}"
    );
    h.shutdown().await;
}

#[tokio::test]
async fn disable_eviction_deletes_and_bypasses_budgets() {
    let h = Harness::start(&["n1"]).await;
    let rs = h.owner("ReplicaSet", "web").await;
    h.pod("n1", "web-0", with(rs, labels("web"))).await;
    h.pdb("web-pdb", "web", json!({"maxUnavailable": 0})).await;
    let options = DrainOptions {
        disable_eviction: true,
        ..fast(PodRules::default())
    };
    let report = h.drainer().drain(&h.n("n1"), &options).await.unwrap();
    assert_eq!(names(&report.deleted), set(&["web-0"]));
    assert!(report.evicted.is_empty());
    let deletes = h
        .proxy
        .recorder()
        .filter(|r| r.resource == "pods" && r.method == "DELETE");
    assert_eq!(deletes.len(), 1);
    let body = deletes[0].body.clone().unwrap();
    assert_eq!(
        body["preconditions"]["uid"],
        json!(report.deleted[0].uid),
        "{body}"
    );
    assert!(
        h.proxy
            .recorder()
            .filter(|r| r.subresource == "eviction")
            .is_empty()
    );
    h.shutdown().await;
}

#[tokio::test]
async fn dry_run_writes_nothing() {
    let h = Harness::start(&["n1"]).await;
    let rs = h.owner("ReplicaSet", "web").await;
    h.pod("n1", "web-0", rs).await;
    h.proxy.recorder().clear();
    let options = DrainOptions {
        dry_run: true,
        ..fast(PodRules::default())
    };
    let report = h.drainer().drain(&h.n("n1"), &options).await.unwrap();
    assert!(report.dry_run);
    assert_eq!(report.with(Disposition::Evict).count(), 1);
    assert!(report.evicted.is_empty());
    assert!(h.proxy.recorder().writes().is_empty());
    assert_eq!(h.pod_names("n1").await, set(&["web-0"]));
    h.shutdown().await;
}

#[tokio::test]
async fn transient_errors_are_retried_and_fatal_ones_fail_only_their_pod() {
    let h = Harness::start(&["n1"]).await;
    let rs = h.owner("ReplicaSet", "web").await;
    h.pod("n1", "flaky", rs.clone()).await;
    h.pod("n1", "forbidden", rs.clone()).await;
    h.pod("n1", "fine", rs).await;
    let faults = h.proxy.faults();
    faults.inject(
        Fault::error(503)
            .subresource("eviction")
            .name("flaky")
            .times(2),
    );
    faults.inject(Fault::error(403).subresource("eviction").name("forbidden"));
    let drainer = h.drainer();
    let err = drainer
        .drain(&h.n("n1"), &fast(PodRules::default()))
        .await
        .unwrap_err();
    let DrainError::Failed { failed, .. } = &err else {
        panic!("expected a failure, got {err}");
    };
    assert_eq!(failed.len(), 1);
    assert_eq!(failed[0].pod.name, "forbidden");
    assert!(
        err.to_string()
            .contains(&format!("{}: removal failed", h.key("forbidden"))),
        "{err}"
    );
    assert_eq!(h.pod_names("n1").await, set(&["forbidden"]));
    let retried = h
        .events()
        .iter()
        .filter(
            |e| matches!(&e.kind, DrainEventKind::RequestFailed { pod, .. } if pod.name == "flaky"),
        )
        .count();
    assert_eq!(retried, 2);
    assert!(drainer.counters().request_errors >= 3);
    h.shutdown().await;
}

#[tokio::test]
async fn two_pass_drain_frees_the_device_first_then_sweeps_selected_pods() {
    let h = Harness::start(&["n1"]).await;
    let rs = h.owner("ReplicaSet", "work").await;
    let ds = h.owner("DaemonSet", "ttdrv-default").await;
    let device_mount = device_mount();
    let device_request = json!({"spec": {"containers": [{"name": "main", "image": "busybox",
        "resources": {"limits": {"tenstorrent.com/n300": "1"}, "requests": {"tenstorrent.com/n300": "1"}}}]}});
    h.pod("n1", "llm", with(rs.clone(), device_mount.clone()))
        .await;
    h.pod(
        "n1",
        "llm-scratch",
        with(
            with(rs.clone(), device_request),
            json!({"spec": {"volumes": [{"name": "tmp", "emptyDir": {}}]}}),
        ),
    )
    .await;
    h.pod(
        "n1",
        "privileged",
        with(
            rs.clone(),
            with(
                json!({"metadata": {"labels": {"team": "ml"}}}),
                json!({"spec": {"containers": [{"name": "main", "image": "busybox",
                    "securityContext": {"privileged": true}}]}}),
            ),
        ),
    )
    .await;
    h.pod(
        "n1",
        "web",
        with(rs.clone(), json!({"metadata": {"labels": {"team": "web"}}})),
    )
    .await;
    h.pod("n1", "agent", with(ds, device_mount)).await;

    let plan = TwoPassDrain {
        device: DevicePredicate {
            host_path_prefixes: vec![ttdp_api::names::DEVICE_PATH.into()],
            resource_prefixes: vec![ttdp_api::names::DEVICE_RESOURCE_PREFIX.into()],
        },
        full_node: true,
        pod_selector: Selector::parse("team=ml").unwrap(),
        force: false,
        // llm-scratch's emptyDir may go (without it the device pass refuses it)
        delete_emptydir_data: true,
        options: fast(PodRules::default()),
    };
    let report = h.drainer().drain_two_pass(&h.n("n1"), &plan).await.unwrap();
    assert_eq!(names(&report.device.evicted), set(&["llm", "llm-scratch"]));
    let full = report.full_node.unwrap();
    assert_eq!(names(&full.evicted), set(&["privileged"]));
    assert_eq!(h.pod_names("n1").await, set(&["agent", "web"]));

    // Pass 1's pods were gone before pass 2 evicted anything.
    let events = h.events();
    let pass2_start = events
        .iter()
        .position(|e| {
            e.kind
                == DrainEventKind::PassStarted {
                    pass: Pass::FullNode,
                }
        })
        .unwrap();
    let device_gone = events
        .iter()
        .rposition(
            |e| matches!(&e.kind, DrainEventKind::Gone { pod, .. } if pod.name.starts_with("llm")),
        )
        .unwrap();
    let first_pass2_eviction = events
        .iter()
        .position(
            |e| matches!(&e.kind, DrainEventKind::Evicting { pod } if pod.name == "privileged"),
        )
        .unwrap();
    assert!(device_gone < pass2_start && pass2_start < first_pass2_eviction);
    h.shutdown().await;
}

/// A node's reads of its pods and of DaemonSets that went through the proxy.
fn reads(h: &Harness) -> (usize, usize) {
    let count = |resource: &str, verb: &str| {
        h.proxy
            .recorder()
            .filter(|r| r.resource == resource && r.verb == verb && r.subresource.is_empty())
            .len()
    };
    (count("pods", "list"), count("daemonsets", "get"))
}

#[tokio::test]
async fn a_device_pass_that_removes_nothing_hands_its_reads_to_the_full_node_pass() {
    let h = Harness::start(&["n1", "n2"]).await;
    let rs = h.owner("ReplicaSet", "work").await;
    let ds = h.owner("DaemonSet", "ttdrv-default").await;
    let device_mount = device_mount();
    for node in ["n1", "n2"] {
        h.pod(
            node,
            &format!("{node}-agent"),
            with(ds.clone(), device_mount.clone()),
        )
        .await;
    }
    let team = |t: &str| json!({"metadata": {"labels": {"team": t}}});
    h.pod("n1", "n1-web", with(rs.clone(), team("web"))).await;
    h.pod("n2", "n2-ml", with(rs, team("ml"))).await;
    let plan = TwoPassDrain {
        pod_selector: Selector::parse("team=ml").unwrap(),
        ..spec_plan(false)
    };

    // Nothing to remove: like `kubectl drain`, the node's pods are listed once and the agent's
    // DaemonSet is read once.
    h.proxy.recorder().clear();
    let report = h.drainer().drain_two_pass(&h.n("n1"), &plan).await.unwrap();
    assert!(report.device.evicted.is_empty());
    assert!(report.full_node.unwrap().evicted.is_empty());
    assert_eq!(reads(&h), (1, 1));

    // Pass 2 removes what pass 1's listing showed it.
    let report = h.drainer().drain_two_pass(&h.n("n2"), &plan).await.unwrap();
    assert!(report.device.evicted.is_empty());
    assert_eq!(names(&report.full_node.unwrap().evicted), set(&["n2-ml"]));
    assert_eq!(h.pod_names("n2").await, set(&["n2-agent"]));
    h.shutdown().await;
}

#[tokio::test]
async fn drains_that_share_what_they_found_read_a_daemonset_once() {
    let h = Harness::start(&["n1", "n2", "n3"]).await;
    let ds = h.owner("DaemonSet", "ttdrv-default").await;
    for node in ["n1", "n2", "n3"] {
        h.pod(node, &format!("{node}-agent"), ds.clone()).await;
    }
    let drain = |drainer: Drainer, node: &'static str| {
        let node = h.n(node);
        async move {
            let report = drainer.drain(&node, &fast(all_flags())).await.unwrap();
            assert!(report.evicted.is_empty() && report.deleted.is_empty());
            drainer.counters().daemonset_lookups
        }
    };

    // Each drain on its own reads the DaemonSet of its node's agent pod.
    h.proxy.recorder().clear();
    assert_eq!(drain(h.drainer(), "n1").await, 1);
    assert_eq!(drain(h.drainer(), "n2").await, 1);
    assert_eq!(reads(&h), (2, 2));

    // Drains sharing what they found read it once, and skip its pods all the same.
    let seen = DaemonSetsSeen::default();
    h.proxy.recorder().clear();
    for node in ["n1", "n2", "n3"] {
        drain(h.drainer().with_daemonsets_seen(seen.clone()), node).await;
    }
    assert_eq!(reads(&h), (3, 1));
    for node in ["n1", "n2", "n3"] {
        assert_eq!(h.pod_names(node).await, set(&[&format!("{node}-agent")]));
    }
    h.shutdown().await;
}

#[tokio::test]
async fn a_dropped_drain_is_resumed_by_the_next_call() {
    let h = Harness::start(&["n1"]).await;
    let rs = h.owner("ReplicaSet", "web").await;
    h.pod("n1", "web-0", with(rs, labels("web"))).await;
    // Its own owner: a budget's maxUnavailable counts against the scale of the selected pods'
    // controllers, so sharing web's ReplicaSet would leave web no disruption to spend.
    let other = h.owner("ReplicaSet", "other").await;
    h.pod("n1", "other", other).await;
    h.pdb("web-pdb", "web", json!({"maxUnavailable": 0})).await;
    let drainer = h.drainer();
    let options = fast(PodRules::default());
    let first = tokio::time::timeout(
        Duration::from_millis(800),
        drainer.drain(&h.n("n1"), &options),
    )
    .await;
    assert!(first.is_err(), "the budget keeps the first call waiting");
    assert_eq!(h.pod_names("n1").await, set(&["web-0"]));
    h.patch_pdb("web-pdb", json!({"maxUnavailable": 1})).await;
    let report = drainer.drain(&h.n("n1"), &options).await.unwrap();
    assert_eq!(names(&report.evicted), set(&["web-0"]));
    assert!(h.pod_names("n1").await.is_empty());
    h.shutdown().await;
}

#[tokio::test]
async fn evictions_carry_the_pods_uid_as_a_precondition() {
    let h = Harness::start(&["n1"]).await;
    let rs = h.owner("ReplicaSet", "web").await;
    let pod = h.pod("n1", "web-0", rs).await;
    let options = DrainOptions {
        grace_period: Some(5),
        ..fast(PodRules::default())
    };
    h.drainer().drain(&h.n("n1"), &options).await.unwrap();
    let evictions = h.proxy.recorder().filter(|r| r.subresource == "eviction");
    assert_eq!(evictions.len(), 1);
    let body = evictions[0].body.clone().unwrap();
    assert_eq!(body["kind"], "Eviction");
    assert_eq!(body["apiVersion"], "policy/v1");
    assert_eq!(body["deleteOptions"]["gracePeriodSeconds"], 5);
    assert_eq!(
        body["deleteOptions"]["preconditions"]["uid"],
        json!(pod.metadata.uid.unwrap())
    );
    h.shutdown().await;
}

#[tokio::test]
async fn two_budgets_selecting_one_pod_fail_it_at_once() {
    let h = Harness::start(&["n1"]).await;
    let rs = h.owner("ReplicaSet", "web").await;
    h.pod("n1", "web-0", with(rs, labels("web"))).await;
    h.pdb("pdb-a", "web", json!({"maxUnavailable": 1})).await;
    h.pdb("pdb-b", "web", json!({"maxUnavailable": 1})).await;
    let started = std::time::Instant::now();
    let err = h
        .drainer()
        .drain(&h.n("n1"), &fast(PodRules::default()))
        .await
        .unwrap_err();
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "not retried until the timeout"
    );
    assert!(matches!(err, DrainError::Failed { .. }), "{err}");
    assert!(
        err.to_string()
            .contains("more than one PodDisruptionBudget"),
        "{err}"
    );
    h.shutdown().await;
}

#[tokio::test]
async fn many_pods_drain_in_parallel_not_one_by_one() {
    let h = Harness::start(&["n1"]).await;
    let rs = h.owner("ReplicaSet", "web").await;
    for i in 0..60 {
        h.pod("n1", &format!("web-{i}"), rs.clone()).await;
    }
    let started = std::time::Instant::now();
    let report = h
        .drainer()
        .drain(&h.n("n1"), &fast(PodRules::default()))
        .await
        .unwrap();
    let elapsed = started.elapsed();
    assert_eq!(report.evicted.len(), 60);
    // Each pod takes a kubelet round trip to terminate; one at a time would take far longer.
    assert!(elapsed < Duration::from_secs(6), "{elapsed:?}");
    h.shutdown().await;
}

#[tokio::test]
async fn on_refused_skip_removes_the_rest_and_reports_the_refused() {
    let h = Harness::start(&["n1"]).await;
    let rs = h.owner("ReplicaSet", "web").await;
    h.pod("n1", "web-0", rs).await;
    h.pod("n1", "bare", json!({})).await;
    let options = DrainOptions {
        on_refused: ttdp_drain::OnRefused::Skip,
        ..fast(PodRules::default())
    };
    let report = h.drainer().drain(&h.n("n1"), &options).await.unwrap();
    assert_eq!(names(&report.evicted), set(&["web-0"]));
    let refused: Vec<_> = report.with(Disposition::Refuse).collect();
    assert_eq!(refused.len(), 1);
    assert_eq!(refused[0].reason, Reason::Unmanaged);
    assert_eq!(h.pod_names("n1").await, set(&["bare"]));
    h.shutdown().await;
}

/// The plan the operator runs for `upgradePolicy.drain` (device prefixes as in ttdp-api).
/// A pod patch that mounts the device by its `hostPath`.
fn device_mount() -> serde_json::Value {
    json!({"spec": {
        "volumes": [{"name": "tt", "hostPath": {"path": "/dev/tenstorrent"}}],
        "containers": [{"name": "main", "image": "busybox",
            "volumeMounts": [{"name": "tt", "mountPath": "/dev/tenstorrent"}]}]}})
}

fn spec_plan(force: bool) -> TwoPassDrain {
    TwoPassDrain {
        device: DevicePredicate {
            host_path_prefixes: vec![ttdp_api::names::DEVICE_PATH.into()],
            resource_prefixes: vec![ttdp_api::names::DEVICE_RESOURCE_PREFIX.into()],
        },
        full_node: true,
        pod_selector: Selector::default(),
        force,
        delete_emptydir_data: true,
        options: fast(PodRules::default()),
    }
}

/// A node with a ReplicaSet pod, a DaemonSet pod, a mirror pod, a bare pod with `emptyDir`
/// and a bare pod that uses the device.
async fn node_with_bare_pods(h: &Harness, node: &str) {
    let rs = h.owner("ReplicaSet", &format!("{node}-web")).await;
    let ds = h.owner("DaemonSet", &format!("{node}-agent")).await;
    let device_mount = device_mount();
    h.pod(node, &format!("{node}-web"), with(rs, labels("web")))
        .await;
    h.pod(
        node,
        &format!("{node}-agent"),
        with(ds, device_mount.clone()),
    )
    .await;
    h.pod(
        node,
        &format!("{node}-etcd"),
        json!({"metadata": {"annotations": {"kubernetes.io/config.mirror": "hash"}}}),
    )
    .await;
    h.pod(
        node,
        &format!("{node}-debug"),
        json!({"spec": {"volumes": [{"name": "tmp", "emptyDir": {}}]}}),
    )
    .await;
    h.pod(node, &format!("{node}-bare-llm"), device_mount).await;
}

#[tokio::test]
async fn without_force_bare_pods_are_skipped_and_named_and_with_force_evicted() {
    let h = Harness::start(&["n1", "n2"]).await;
    node_with_bare_pods(&h, "n1").await;
    node_with_bare_pods(&h, "n2").await;

    // Without force: the drain completes, the bare pods stay and are named.
    let report = h
        .drainer()
        .drain_two_pass(&h.n("n1"), &spec_plan(false))
        .await
        .unwrap();
    assert!(report.device.evicted.is_empty());
    assert_eq!(
        names(&report.device.skipped_without_force),
        set(&["n1-bare-llm"]),
        "pass 1 names the bare device user it left"
    );
    let full = report.full_node.as_ref().unwrap();
    assert_eq!(names(&full.evicted), set(&["n1-web"]));
    let skipped: Vec<String> = report
        .skipped_without_force()
        .iter()
        .map(ToString::to_string)
        .collect();
    assert_eq!(
        skipped,
        [h.key("n1-bare-llm"), h.key("n1-debug")],
        "each skipped pod once, as namespace/name"
    );
    assert_eq!(
        h.pod_names("n1").await,
        set(&["n1-agent", "n1-etcd", "n1-debug", "n1-bare-llm"])
    );
    let evictions: BTreeSet<String> = h
        .proxy
        .recorder()
        .filter(|r| r.subresource == "eviction")
        .into_iter()
        .map(|r| r.name)
        .collect();
    assert_eq!(evictions, set(&["n1-web"]), "skipped pods are not touched");

    // With force: the bare pods are evicted too; DaemonSet and mirror pods stay.
    let report = h
        .drainer()
        .drain_two_pass(&h.n("n2"), &spec_plan(true))
        .await
        .unwrap();
    assert_eq!(names(&report.device.evicted), set(&["n2-bare-llm"]));
    assert_eq!(
        names(&report.full_node.as_ref().unwrap().evicted),
        set(&["n2-web", "n2-debug"])
    );
    assert!(report.skipped_without_force().is_empty());
    assert_eq!(h.pod_names("n2").await, set(&["n2-agent", "n2-etcd"]));
    assert_eq!(
        h.pod_names("n1").await.len(),
        4,
        "the other node is untouched"
    );
    h.shutdown().await;
}

#[tokio::test]
async fn a_device_user_with_empty_dir_blocks_the_device_pass_until_delete_empty_dir_is_on() {
    let h = Harness::start(&["n1"]).await;
    let rs = h.owner("ReplicaSet", "llm").await;
    h.pod("n1", "llm", with(rs.clone(), device_mount())).await;
    // the device's hostPath and a scratch emptyDir (a merge replaces the list: both here)
    let scratch = json!({"spec": {"volumes": [
        {"name": "tt", "hostPath": {"path": "/dev/tenstorrent"}},
        {"name": "tmp", "emptyDir": {}},
    ]}});
    h.pod("n1", "llm-scratch", with(with(rs, device_mount()), scratch))
        .await;
    let keep_data = TwoPassDrain {
        delete_emptydir_data: false,
        ..spec_plan(false)
    };

    // deleteEmptyDir off: the device pass refuses, names the pod and the way out, evicts nothing.
    let err = h
        .drainer()
        .drain_two_pass(&h.n("n1"), &keep_data)
        .await
        .unwrap_err();
    let DrainError::Refused { pass, pods, .. } = &err else {
        panic!("expected a refusal, got {err}");
    };
    assert_eq!(*pass, Some(Pass::Device));
    let refused: Vec<(String, Reason)> = pods
        .iter()
        .map(|d| (d.pod.name.clone(), d.reason.clone()))
        .collect();
    assert_eq!(refused, [("llm-scratch".to_string(), Reason::LocalStorage)]);
    let message = err.to_string();
    for part in [
        "(device pass)",
        &h.key("llm-scratch"),
        "local storage (use --delete-emptydir-data",
    ] {
        assert!(message.contains(part), "{part:?} not in {message:?}");
    }
    assert!(
        h.proxy
            .recorder()
            .filter(|r| r.subresource == "eviction" || r.method == "DELETE")
            .is_empty(),
        "a refused pass removes nothing"
    );
    assert_eq!(h.pod_names("n1").await, set(&["llm", "llm-scratch"]));

    // deleteEmptyDir on: both are evicted in the device pass.
    let report = h
        .drainer()
        .drain_two_pass(&h.n("n1"), &spec_plan(false))
        .await
        .unwrap();
    assert_eq!(names(&report.device.evicted), set(&["llm", "llm-scratch"]));
    assert!(h.pod_names("n1").await.is_empty());
    h.shutdown().await;
}
