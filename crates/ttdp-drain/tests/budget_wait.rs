//! Blocked evictions against the real control plane: they are retried when the budget's
//! status allows it, not when a timer says so, and an eviction the server granted but nobody
//! carried out (a drain killed mid-request) does not hold a resumed drain for two minutes.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use kube::api::{Api, Patch, PatchParams};
use serde_json::{Value, json};
use support::{Harness, fast, labels, with};
use ttdp_drain::{Backoff, DrainEventKind, Drainer, EventSink, PodRules};

fn set(items: &[&str]) -> BTreeSet<String> {
    items.iter().map(|s| (*s).to_owned()).collect()
}

fn names(refs: &[ttdp_drain::PodRef]) -> BTreeSet<String> {
    refs.iter().map(|p| p.name.clone()).collect()
}

/// Drain `node` while a stand-in ReplicaSet controller starts a Ready replacement on `spare`
/// for every pod that goes (and, with `surge`, one more when the budget first blocks); returns
/// the report and how long the drain took.
async fn drain_with_replacements(
    h: &Harness,
    node: &str,
    spare: &str,
    rs: &Value,
    backoff: Backoff,
    surge: bool,
) -> (ttdp_drain::DrainReport, Duration) {
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    let drain = {
        let events = h.events.clone();
        let drainer = Drainer::new(h.client.clone()).with_events(EventSink::new(move |e| {
            events.lock().unwrap().push(e.clone());
            let _ = tx.send(e.clone());
        }));
        let node = h.n(node);
        let options = ttdp_drain::DrainOptions {
            backoff,
            ..fast(PodRules::default())
        };
        async move {
            let started = Instant::now();
            let result = drainer.drain(&node, &options).await;
            (result, started.elapsed())
        }
    };
    let controller = async {
        let mut replacements = 0;
        let mut surged = !surge;
        while let Some(event) = rx.recv().await {
            match event.kind {
                DrainEventKind::EvictionBlocked { .. } if !surged => {
                    surged = true;
                    h.pod(spare, "web-surge", with(rs.clone(), labels("web")))
                        .await;
                }
                DrainEventKind::Gone { .. } => {
                    replacements += 1;
                    h.pod(
                        spare,
                        &format!("web-new-{replacements}"),
                        with(rs.clone(), labels("web")),
                    )
                    .await;
                }
                DrainEventKind::Done { .. } => return,
                _ => {}
            }
        }
    };
    let ((report, elapsed), ()) = tokio::join!(drain, controller);
    let report = report.unwrap_or_else(|e| panic!("{e}\nevents: {:#?}", h.events()));
    (report, elapsed)
}

#[tokio::test]
async fn a_blocked_eviction_is_retried_when_the_budget_allows_not_after_the_back_off() {
    let h = Harness::start(&["n1", "n2"]).await;
    let rs = h.owner("ReplicaSet", "web").await;
    for name in ["web-a", "web-b", "web-c"] {
        h.pod("n1", name, with(rs.clone(), labels("web"))).await;
    }
    h.pdb("web-pdb", "web", json!({"minAvailable": 3})).await;

    // A back-off far longer than the drain's timeout: only the budget's watch can retry in time.
    let slow = Backoff {
        initial: Duration::from_secs(60),
        max: Duration::from_secs(60),
    };
    let (report, elapsed) = drain_with_replacements(&h, "n1", "n2", &rs, slow, true).await;
    assert_eq!(names(&report.evicted), set(&["web-a", "web-b", "web-c"]));
    assert!(elapsed < Duration::from_secs(20), "{elapsed:?}");
    let recorder = h.proxy.recorder();
    // Never below the budget: each granted eviction passed the server's budget check.
    let granted = recorder
        .filter(|r| r.subresource == "eviction" && r.status == 201)
        .len();
    assert_eq!(granted, 3);
    // One watch of the budget, shared by every blocked pod.
    let watches = recorder
        .filter(|r| r.resource == "poddisruptionbudgets" && r.query.contains("watch=true"))
        .len();
    assert!(watches >= 1, "the budget was watched");
    let refused = recorder
        .filter(|r| r.subresource == "eviction" && r.status == 429)
        .len();
    assert!(
        refused <= 6,
        "{refused} refused evictions: retries follow the budget"
    );
    h.shutdown().await;
}

/// Writes into the budget's status what a cut-off eviction of `pod` leaves there: the API
/// server's eviction handler records the pod in `status.disruptedPods` (and takes one from
/// `disruptionsAllowed`) before it deletes the pod.
async fn grant_without_deleting(h: &Harness, budget: &str, pod: &str) {
    let api: Api<PodDisruptionBudget> = Api::namespaced(h.admin.clone(), h.ns());
    let now = jiff::Timestamp::now().to_string();
    let pdb = api.get(budget).await.unwrap();
    let allowed = pdb.status.as_ref().unwrap().disruptions_allowed;
    api.patch_status(
        budget,
        &PatchParams::default(),
        &Patch::Merge(json!({"status": {
            "disruptedPods": {pod: now},
            "disruptionsAllowed": allowed - 1,
        }})),
    )
    .await
    .unwrap();
    // The disruption controller keeps the entry: the pod is neither deleted nor expired.
    let started = Instant::now();
    loop {
        tokio::time::sleep(Duration::from_millis(300)).await;
        let pdb = api.get(budget).await.unwrap();
        let status = pdb.status.unwrap();
        let held = status.disrupted_pods.is_some_and(|m| m.contains_key(pod));
        assert!(held, "the disruption controller dropped the entry of {pod}");
        if status.disruptions_allowed == 0 && started.elapsed() > Duration::from_secs(1) {
            return;
        }
        assert!(started.elapsed() < Duration::from_secs(20));
    }
}

#[tokio::test]
async fn a_resumed_drain_deletes_a_pod_whose_eviction_was_granted_but_cut_off() {
    let h = Harness::start(&["n1", "n2"]).await;
    let rs = h.owner("ReplicaSet", "web").await;
    for name in ["web-a", "web-b", "web-c"] {
        h.pod("n1", name, with(rs.clone(), labels("web"))).await;
    }
    h.pdb("web-pdb", "web", json!({"minAvailable": 2})).await;
    // The killed drain's eviction of web-a got as far as the budget: 0 disruptions allowed
    // now, and the disruption controller would keep it so for two minutes.
    grant_without_deleting(&h, "web-pdb", "web-a").await;

    let (report, elapsed) = drain_with_replacements(
        &h,
        "n1",
        "n2",
        &rs,
        Backoff {
            initial: Duration::from_millis(200),
            max: Duration::from_secs(2),
        },
        false,
    )
    .await;
    assert_eq!(names(&report.evicted), set(&["web-a", "web-b", "web-c"]));
    assert!(elapsed < Duration::from_secs(20), "{elapsed:?}");
    let recorder = h.proxy.recorder();
    let deleted: Vec<String> = recorder
        .filter(|r| r.method == "DELETE" && r.resource == "pods" && r.status == 200)
        .into_iter()
        .map(|r| r.name)
        .collect();
    assert_eq!(
        deleted,
        ["web-a"],
        "only the granted pod is deleted directly"
    );
    let evicted: BTreeSet<String> = recorder
        .filter(|r| r.subresource == "eviction" && r.status == 201)
        .into_iter()
        .map(|r| r.name)
        .collect();
    assert_eq!(evicted, set(&["web-b", "web-c"]));
    // The others' blocks named the disruption Kubernetes held for web-a, and never a pod this
    // drain was removing itself (web-c, once its eviction was granted, is no held disruption).
    let held_named: Vec<String> = h
        .events()
        .into_iter()
        .filter_map(|e| match e.kind {
            DrainEventKind::EvictionBlocked { held, .. } => Some(held),
            _ => None,
        })
        .flatten()
        .map(|held| held.pod)
        .collect();
    assert!(held_named.iter().all(|p| p == "web-a"), "{held_named:?}");
    h.shutdown().await;
}
