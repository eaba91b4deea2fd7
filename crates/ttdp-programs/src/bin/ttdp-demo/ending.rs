//! How the demo ends: check the cluster, print the verdict and the timings, write the report,
//! keep the cluster up for the user until Ctrl-C (unless `--exit-after-rollout`), then stop the
//! controller, the simulated nodes and the control plane, deleting on a shared cluster what the
//! demo created.

use std::path::Path;

use k8s_openapi::api::core::v1::{Namespace, Pod};
use kube::ResourceExt;
use kube::api::{Api, ListParams};
use ttdp_api::names::labels;
use ttdp_programs::rollout_watch::stragglers;

use crate::cluster_source::{delete, delete_policy};
use crate::final_state::Outcome;
use crate::hints;
use crate::live_view::flush;
use crate::scenario::{Demo, Ending, shutdown_signal};
use crate::timings::{self, RolloutTimes};

impl Demo {
    /// Checks, reports, waits for Ctrl-C when asked to, and stops everything.
    pub async fn finish(self, ending: Ending) -> Ending {
        let interrupted = matches!(ending, Ending::Interrupted);
        let mut outcome = self.outcome(ending);
        if !interrupted {
            self.inspect(&mut outcome).await;
        }
        outcome.success = outcome.problems.is_empty() && !interrupted;
        self.print_verdict(&outcome, interrupted).await;
        self.write_report(&outcome);
        if outcome.success && !self.args.exit_after_rollout {
            let interrupt = shutdown_signal();
            self.print_hints();
            interrupt.await;
        }
        let mut problems = outcome.problems;
        problems.extend(self.stop_everything().await);
        if interrupted {
            Ending::Interrupted
        } else if problems.is_empty() {
            Ending::Success
        } else {
            Ending::Failure(problems)
        }
    }

    /// The outcome so far: why the story stopped (or that the controller died), the phases and
    /// the upgrade's times.
    fn outcome(&self, ending: Ending) -> Outcome {
        let mut problems = match ending {
            Ending::Failure(problems) => problems,
            _ => Vec::new(),
        };
        if problems.is_empty()
            && let Some(Err(exited)) = self.controller.as_ref().map(|c| c.check_running())
        {
            problems.push(format!("{exited:#}"));
        }
        let transitions = self.watch.as_ref().map(|w| w.transitions());
        let upgrade = match (self.upgrade_started, transitions) {
            (Some(since), Some(transitions)) => RolloutTimes::from_transitions(&transitions, since),
            _ => RolloutTimes::default(),
        };
        Outcome {
            policy: self.names.policy.clone(),
            cluster: self.source.kind,
            from: self.args.from.clone(),
            to: self.args.to.clone(),
            problems,
            phases: self.phases.clone(),
            upgrade,
            ..Outcome::default()
        }
    }

    async fn print_verdict(&self, outcome: &Outcome, interrupted: bool) {
        println!();
        if outcome.success {
            println!("Checks passed:");
            println!(
                "  every Tenstorrent node ttdp manages is Done at {} (status and kmd-version label)",
                self.args.to
            );
            if let Some(node) = self.fleet.host_managed_node() {
                println!(
                    "  {node} is HostManaged and kept its DKMS driver; its device workload still runs"
                );
            }
            if self.fleet.plain > 0 {
                println!("  plain nodes carry no driver label and their workloads still run");
            }
            println!(
                "  no node is left cordoned or with a deploy gate; drained workloads were evicted"
            );
        } else if !interrupted {
            println!("The demo FAILED:");
            for problem in &outcome.problems {
                println!("  - {problem}");
            }
            self.print_failure_logs().await;
        }
        println!();
        print!(
            "{}",
            timings::render(&self.phases, &outcome.upgrade, &self.args.max_unavailable)
        );
        flush();
    }

    fn write_report(&self, outcome: &Outcome) {
        let Some(path) = &self.args.report else {
            return;
        };
        let written = serde_json::to_vec_pretty(outcome)
            .map_err(std::io::Error::other)
            .and_then(|json| std::fs::write(path, json));
        if let Err(e) = written {
            eprintln!("warning: cannot write the report {}: {e}", path.display());
        }
    }

    fn print_hints(&self) {
        println!();
        print!(
            "{}",
            hints::render(
                &self.kubeconfig,
                &self.args.plugin,
                &self.names.policy,
                &self.args.from,
                hints::installed_kubectl().as_deref(),
                self.source.is_shared(),
            )
        );
        println!("\n  controller log: {}", self.controller_log().display());
        println!("  agent logs:     {}", self.cluster.log_dir().display());
        flush();
    }

    /// Stops the controller, the simulated nodes and the control plane; on a shared cluster it
    /// first deletes the policy (so the controller can remove its finalizer) and at the end the
    /// operator namespace. Returns what could not be cleaned up.
    async fn stop_everything(self) -> Vec<String> {
        let shared = self.source.is_shared();
        let mut problems = Vec::new();
        if shared {
            println!(
                "\nstopping: deleting policy {}, then the controller, agents, kubelets, nodes and namespaces the demo created ...",
                self.names.policy
            );
            flush();
            problems.extend(delete_policy(&self.client, &self.names).await);
        } else {
            println!("\nstopping: controller, agents, kubelets, control plane ...");
            flush();
        }
        if let Some(controller) = self.controller {
            controller.stop().await;
        }
        drop(self.watch);
        if let Err(e) = self.cluster.shutdown().await {
            problems.push(format!("the simulated nodes did not stop cleanly: {e}"));
        }
        if shared {
            // The controller is stopped: nothing puts objects in its namespace any more.
            let namespaces = Api::<Namespace>::all(self.client.clone());
            problems.extend(delete(&namespaces, &self.names.operator_namespace).await);
        }
        // Blocking: a launched control plane stops its processes as it drops.
        drop(self.source);
        for problem in &problems {
            eprintln!("warning: {problem}");
        }
        println!("stopped.");
        problems
    }

    /// The last lines of the controller's log and of the agents on nodes that did not finish.
    async fn print_failure_logs(&self) {
        print_log_tail("the controller log", &self.controller_log(), 20);
        let Some(policy) = self.watch.as_ref().and_then(|w| w.policy()) else {
            return;
        };
        let pods: Api<Pod> = Api::namespaced(self.client.clone(), &self.names.operator_namespace);
        let selector = format!("{}={}", labels::APP_NAME, labels::APP_NAME_AGENT);
        let Ok(list) = pods.list(&ListParams::default().labels(&selector)).await else {
            return;
        };
        let stuck: Vec<String> = stragglers(&policy)
            .iter()
            .filter_map(|line| line.split_whitespace().next().map(str::to_owned))
            .collect();
        for pod in list.items {
            let node = pod.spec.as_ref().and_then(|s| s.node_name.clone());
            let Some(node) = node.filter(|node| stuck.contains(node)) else {
                continue;
            };
            let (namespace, name) = (pod.namespace().unwrap_or_default(), pod.name_any());
            let container = ttdp_api::names::AGENT_CONTAINER;
            let file = self
                .cluster
                .log_dir()
                .join(format!("{namespace}_{name}_{container}.log"));
            print_log_tail(&format!("agent {name} on {node}"), &file, 10);
        }
    }
}

/// Longest log line [`print_log_tail`] shows in full.
const LINE_LIMIT: usize = 400;

/// Prints the last `lines` lines of the log at `path` (none when unreadable), indented and each
/// cut at `LINE_LIMIT` characters, under a title naming `what`.
fn print_log_tail(what: &str, path: &Path, lines: usize) {
    println!("\nlast lines of {what} ({}):", path.display());
    let text = std::fs::read_to_string(path).unwrap_or_default();
    for line in ttdp_kmod::log_tail(&text, lines).lines() {
        match line.char_indices().nth(LINE_LIMIT) {
            Some((cut, _)) => println!("    {} ...", &line[..cut]),
            None => println!("    {line}"),
        }
    }
}
