//! The DaemonSet controller and the agent, as the real ones behave. The DaemonSet (update
//! strategy OnDelete) creates a pod from its current template on a node it runs on that has
//! none, deletes the pods of nodes it no longer runs on, and never replaces a stale pod by
//! itself. The agent in a pod on a Ready node loads its target into an empty slot, swaps a
//! loaded module of another version only with its policy's grant for its target, and otherwise
//! waits for the grant; it labels the node with what is loaded and reports Ready at its target.
//! A failed agent retries on its next pass.

use ttdp_api::agent_report::{AgentPhase, AgentReport};
use ttdp_api::names::labels;

use super::{AgentSim, POLICY, World};

/// The DaemonSet controller and the agent on node `i` take one step.
pub(super) fn act(w: &mut World, i: usize) {
    let runs_here = w.daemonset_nodes.contains(&w.nodes[i].name);
    let template = w.daemonset.clone();
    let node = &mut w.nodes[i];
    match (&mut node.pod, template) {
        (Some(pod), _) if pod.terminating => node.pod = None,
        (Some(pod), _) if !runs_here => pod.terminating = true,
        (None, Some((hash, target))) if runs_here => {
            node.pod = Some(AgentSim {
                uid: w.next_uid,
                hash,
                target,
                terminating: false,
                ready: false,
                report: None,
            });
            w.next_uid += 1;
        }
        (Some(_), _) if !node.not_ready => {
            agent_pass(w, i);
        }
        _ => {}
    }
}

/// One pass of the agent on node `i`: converge on the pod's target as far as the grant allows.
fn agent_pass(w: &mut World, i: usize) {
    let node = &mut w.nodes[i];
    let granted = node.grant_of(POLICY);
    let Some(pod) = node.pod.as_mut() else {
        return;
    };
    let target = pod.target.clone();
    let phase = match node.loaded.as_deref() {
        Some(v) if v == target => AgentPhase::Ready,
        None => {
            node.loaded = Some(target.clone());
            AgentPhase::Ready
        }
        Some(_) if granted.as_deref() == Some(target.as_str()) => {
            node.loaded = Some(target.clone());
            AgentPhase::Ready
        }
        Some(_) => AgentPhase::WaitingForGrant,
    };
    pod.ready = phase == AgentPhase::Ready;
    pod.report = Some(report(phase, &target, node.loaded.clone()));
    label_loaded(w, i);
}

/// The agent on node `i` fails (a build, load or validation failure); with `unloaded`, the old
/// module is gone and nothing could be loaded back (only in a swap). Only a running agent on a
/// Ready node fails.
pub(super) fn fail(w: &mut World, i: usize, unloaded: bool) {
    let node = &mut w.nodes[i];
    let granted = node.grant_of(POLICY);
    let Some(pod) = node.pod.as_mut().filter(|p| !p.terminating) else {
        return;
    };
    if node.not_ready {
        return;
    }
    // Only a swap unloads: the old module is out, the target does not load and the old one
    // cannot be loaded back. A swap runs into an empty slot, or with the grant for its target.
    let swapping = node.loaded.as_deref() != Some(pod.target.as_str())
        && (node.loaded.is_none() || granted.as_deref() == Some(pod.target.as_str()));
    if unloaded && swapping {
        node.loaded = None;
    }
    pod.ready = false;
    let mut failed = report(AgentPhase::Failed, &pod.target, node.loaded.clone());
    failed.reason = Some("LoadFailed".into());
    failed.message = Some(format!("tt-kmd {} failed to load", pod.target));
    pod.report = Some(failed);
    label_loaded(w, i);
}

fn report(phase: AgentPhase, target: &str, loaded: Option<String>) -> AgentReport {
    AgentReport {
        phase,
        target_version: target.to_owned(),
        loaded_version: loaded,
        loaded_parameters: None,
        applied_parameters: None,
        loaded_commit: None,
        udev_rule: None,
        install_mode: "container".into(),
        holders: Vec::new(),
        reason: None,
        message: None,
        kernel_compiler: None,
        installed_kernels: Vec::new(),
        start_load: None,
        module_signer: None,
    }
}

/// The agent labels the node with the version loaded (none: no label).
fn label_loaded(w: &mut World, i: usize) {
    let node = &mut w.nodes[i];
    match &node.loaded {
        Some(v) => {
            node.labels.insert(labels::KMD_VERSION.into(), v.clone());
            w.ever_loaded.insert(v.clone());
        }
        None => {
            node.labels.remove(labels::KMD_VERSION);
        }
    }
}
