//! What a node's status entry says about the kernels it could boot into and about how its
//! module came up: [`NextKernels`] (the installed kernels other than the running one, only the
//! ones without a ready module listed) and [`NodeStartLoad`], built from the agent's report
//! ([`crate::agent_report`]). Compact on purpose: the policy's status holds an entry per node
//! and is bounded in bytes.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::agent_report::{KernelModuleState, KernelReadiness, StartLoad};

/// The most kernels without a ready module a node entry lists; the rest are counted in
/// [`NextKernels::not_ready_omitted`].
pub const MAX_KERNELS_LISTED: usize = 3;

/// The most characters of a listed kernel's `message` (the CRD's `maxLength`).
pub const MAX_KERNEL_MESSAGE_CHARS: usize = 256;

/// Why an installed kernel has no ready module.
#[derive(
    Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, JsonSchema,
)]
pub enum NextKernelState {
    /// It could not be made (headers missing, build failed, download refused); the agent
    /// retries.
    Failed,
    /// Not looked at yet, or being built or downloaded now.
    Pending,
}

impl NextKernelState {
    /// The state's name as written in the status.
    pub fn as_str(self) -> &'static str {
        match self {
            NextKernelState::Failed => "Failed",
            NextKernelState::Pending => "Pending",
        }
    }
}

/// One installed kernel whose module of the agent's target version is not ready.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct KernelNotReady {
    /// The kernel's release, e.g. `6.1.0-58-amd64`.
    pub release: String,
    /// `Failed` or `Pending`.
    pub state: NextKernelState,
    /// UpperCamelCase reason, e.g. `HeadersMissing`, `BuildFailed`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// What went wrong and what to do (at most [`MAX_KERNEL_MESSAGE_CHARS`] characters; a
    /// longer one is cut, with an ellipsis).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = MAX_KERNEL_MESSAGE_CHARS))]
    pub message: Option<String>,
}

/// The kernels installed on a node other than the running one, as its agent prepared them:
/// what the node would boot into after a reboot.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct NextKernels {
    /// How many have the module ready (verified, waiting in the node's cache).
    #[serde(default)]
    pub ready: i32,
    /// Those without a ready module, Failed first, then by release (at most
    /// [`MAX_KERNELS_LISTED`]).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub not_ready: Vec<KernelNotReady>,
    /// Kernels without a ready module past those listed, counted only.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub not_ready_omitted: i32,
}

fn is_zero(n: &i32) -> bool {
    *n == 0
}

impl NextKernels {
    /// The compact form of an agent's `installed_kernels`; `None` when it reports none (a host
    /// with one kernel, or an agent that does not look).
    pub fn of_report(kernels: &[KernelReadiness]) -> Option<Self> {
        if kernels.is_empty() {
            return None;
        }
        let mut not_ready: Vec<KernelNotReady> = kernels
            .iter()
            .filter_map(|k| {
                let state = match k.state {
                    KernelModuleState::Ready => return None,
                    KernelModuleState::Failed => NextKernelState::Failed,
                    KernelModuleState::Pending => NextKernelState::Pending,
                };
                Some(KernelNotReady {
                    release: k.release.clone(),
                    state,
                    reason: k.reason.clone(),
                    message: k.message.as_deref().map(bounded_kernel_message),
                })
            })
            .collect();
        not_ready.sort_by(|a, b| (a.state, &a.release).cmp(&(b.state, &b.release)));
        let count = |n: usize| i32::try_from(n).unwrap_or(i32::MAX);
        let omitted = not_ready.len().saturating_sub(MAX_KERNELS_LISTED);
        not_ready.truncate(MAX_KERNELS_LISTED);
        Some(Self {
            ready: count(kernels.len() - not_ready.len() - omitted),
            not_ready,
            not_ready_omitted: count(omitted),
        })
    }

    /// Whether every kernel has its module ready.
    pub fn all_ready(&self) -> bool {
        self.not_ready.is_empty() && self.not_ready_omitted == 0
    }

    /// How many kernels have no ready module.
    pub fn not_ready_count(&self) -> i32 {
        i32::try_from(self.not_ready.len())
            .unwrap_or(i32::MAX)
            .saturating_add(self.not_ready_omitted)
    }

    /// Whether some kernel's module could not be made.
    pub fn any_failed(&self) -> bool {
        self.not_ready
            .iter()
            .any(|k| k.state == NextKernelState::Failed)
    }
}

/// `message` cut to [`MAX_KERNEL_MESSAGE_CHARS`] characters, the cut shown by an ellipsis.
fn bounded_kernel_message(message: &str) -> String {
    match message.char_indices().nth(MAX_KERNEL_MESSAGE_CHARS - 1) {
        Some((cut, _)) if message.chars().count() > MAX_KERNEL_MESSAGE_CHARS => {
            format!("{}…", &message[..cut])
        }
        _ => message.to_owned(),
    }
}

/// How the module came up when the node's agent started (after a reboot, or a new agent pod).
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct NodeStartLoad {
    /// Whether a verified module was waiting in the cache (nothing built or downloaded).
    pub cache_hit: bool,
    /// Milliseconds from the agent's start to the module loaded and the agent Ready.
    pub ready_after_ms: i64,
}

impl From<StartLoad> for NodeStartLoad {
    fn from(s: StartLoad) -> Self {
        Self {
            cache_hit: s.cache_hit,
            ready_after_ms: i64::try_from(s.ready_after_ms).unwrap_or(i64::MAX),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn kernel(release: &str, state: KernelModuleState, message: Option<&str>) -> KernelReadiness {
        KernelReadiness {
            release: release.into(),
            state,
            reason: (state != KernelModuleState::Ready).then(|| "BuildFailed".into()),
            message: message.map(str::to_owned),
        }
    }

    #[test]
    fn only_kernels_without_a_ready_module_are_listed_failed_first_and_bounded() {
        use KernelModuleState::*;
        assert_eq!(NextKernels::of_report(&[]), None);
        let all_ready = NextKernels::of_report(&[
            kernel("6.1.0-60-amd64", Ready, None),
            kernel("6.1.0-61-amd64", Ready, None),
        ])
        .unwrap();
        assert_eq!(
            all_ready,
            NextKernels {
                ready: 2,
                ..NextKernels::default()
            }
        );
        assert!(all_ready.all_ready() && !all_ready.any_failed());
        let long = "x".repeat(MAX_KERNEL_MESSAGE_CHARS + 50);
        let mixed = NextKernels::of_report(&[
            kernel("6.1.0-63-amd64", Pending, None),
            kernel("6.1.0-60-amd64", Ready, None),
            kernel("6.1.0-62-amd64", Pending, None),
            kernel("6.1.0-64-amd64", Failed, Some(&long)),
            kernel("6.1.0-58-amd64", Failed, Some("make modules failed")),
        ])
        .unwrap();
        let listed: Vec<(&str, NextKernelState)> = mixed
            .not_ready
            .iter()
            .map(|k| (k.release.as_str(), k.state))
            .collect();
        assert_eq!(
            listed,
            [
                ("6.1.0-58-amd64", NextKernelState::Failed),
                ("6.1.0-64-amd64", NextKernelState::Failed),
                ("6.1.0-62-amd64", NextKernelState::Pending),
            ]
        );
        assert_eq!((mixed.ready, mixed.not_ready_omitted), (1, 1));
        assert_eq!(mixed.not_ready_count(), 4);
        assert!(!mixed.all_ready() && mixed.any_failed());
        let cut = mixed.not_ready[1].message.as_deref().unwrap();
        assert_eq!(cut.chars().count(), MAX_KERNEL_MESSAGE_CHARS);
        assert!(cut.ends_with('…'), "{cut}");
        let json = serde_json::to_value(&mixed).unwrap();
        assert_eq!(json["notReady"][0]["state"], "Failed", "{json}");
        assert_eq!(json["notReadyOmitted"], 1, "{json}");
    }

    #[test]
    fn a_start_load_reads_in_milliseconds() {
        let load = NodeStartLoad::from(StartLoad {
            cache_hit: true,
            ready_after_ms: 2300,
        });
        assert_eq!(
            serde_json::to_value(load).unwrap(),
            serde_json::json!({"cacheHit": true, "readyAfterMs": 2300})
        );
    }
}
