//! Waiting for jobs to finish before a drain, on the real control plane: the simulated kubelet
//! runs the job's container to its end, the wait counts the running pods down, and a timeout
//! either hands over to the drain or fails without evicting anything.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::time::{Duration, Instant};

use serde_json::json;
use support::{Harness, SLEEP_IMAGE, labels, with};
use ttdp_drain::{CompletionWait, DrainError, DrainEventKind, OnCompletionTimeout};
use ttdp_selector::Selector;

fn wait(timeout: Option<Duration>, on_timeout: OnCompletionTimeout) -> CompletionWait {
    CompletionWait {
        selector: Selector::parse("job-name").unwrap(),
        timeout,
        on_timeout,
        poll_interval: Duration::from_millis(200),
    }
}

/// A Job-like pod labelled `job-name` whose container runs for `seconds`.
fn job(seconds: u32) -> serde_json::Value {
    json!({"metadata": {"labels": {"job-name": "train"}},
           "spec": {"restartPolicy": "Never",
                    "containers": [{"name": "main", "image": SLEEP_IMAGE, "args": [seconds.to_string()]}]}})
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_wait_ends_when_the_job_finishes_and_counts_it_down() {
    let h = Harness::start(&["n1"]).await;
    h.pod("n1", "train-0", job(3)).await;
    h.pod("n1", "web", with(labels("web"), json!({}))).await;
    let started = Instant::now();
    let left = h
        .drainer()
        .wait_for_completion(&h.n("n1"), &wait(None, OnCompletionTimeout::Fail))
        .await
        .unwrap();
    assert!(left.is_empty(), "{left:?}");
    assert!(
        started.elapsed() >= Duration::from_secs(1),
        "returned before the job could finish: {:?}",
        started.elapsed()
    );
    let counts: Vec<usize> = h
        .events()
        .iter()
        .filter_map(|e| match &e.kind {
            DrainEventKind::WaitingForCompletion { running, .. } => Some(running.len()),
            _ => None,
        })
        .collect();
    assert_eq!(counts, [1, 0], "the web pod is not waited for");
    let phase = h
        .admin_pods()
        .get("train-0")
        .await
        .unwrap()
        .status
        .unwrap()
        .phase;
    assert_eq!(phase.as_deref(), Some("Succeeded"));
    h.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_timeout_fails_or_hands_over_to_the_drain_as_asked() {
    let h = Harness::start(&["n1"]).await;
    h.pod("n1", "train-0", job(600)).await;
    let err = h
        .drainer()
        .wait_for_completion(
            &h.n("n1"),
            &wait(Some(Duration::from_secs(1)), OnCompletionTimeout::Fail),
        )
        .await
        .unwrap_err();
    let DrainError::CompletionTimeout { running, .. } = &err else {
        panic!("{err}");
    };
    assert_eq!(running.len(), 1);
    assert!(
        err.to_string()
            .contains("1 selected pods still running after waiting 1s for them to finish"),
        "{err}"
    );
    assert!(
        h.admin_pods().get_opt("train-0").await.unwrap().is_some(),
        "nothing evicted"
    );
    let left = h
        .drainer()
        .wait_for_completion(
            &h.n("n1"),
            &wait(Some(Duration::from_secs(1)), OnCompletionTimeout::Drain),
        )
        .await
        .unwrap();
    assert_eq!(
        left.iter().map(|p| p.name.as_str()).collect::<Vec<_>>(),
        ["train-0"]
    );
    h.shutdown().await;
}
