//! `spec.source`: where the agents fetch tt-kmd from (an internal mirror on a cluster without
//! internet) and, optionally, the commit the release tag must still point at.

use kube::KubeSchema;
use serde::{Deserialize, Serialize};

/// Where tt-kmd's sources come from.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct SourceSettings {
    /// The git repository the agents fetch tag `ttkmd-<version>` from, e.g. an internal mirror
    /// `https://git.example.com/mirrors/tt-kmd.git`. Unset: the chart's `driver.kmdRepository`
    /// (by default `https://github.com/tenstorrent/tt-kmd.git`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 2048))]
    #[x_kube(validation = Rule::new("(self.startsWith('https://') || self.startsWith('http://') || self.startsWith('ssh://') || self.startsWith('git://') || self.startsWith('file://') || self.startsWith('git@')) && !self.contains(' ')").message(
        "spec.source.repository must be a git URL (https://, http://, ssh://, git://, file:// or git@host:path) without spaces"
    ))]
    pub repository: Option<String>,

    /// Pin: the full commit id tag `ttkmd-<version>` must point at. A build finding the tag
    /// elsewhere (it was moved) is refused with `SourceCommitMoved` and the loaded driver stays;
    /// a cached module built from another commit is rebuilt. Applies to builds of
    /// `spec.version`. Unset: whatever the tag points at.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 64))]
    #[x_kube(validation = Rule::new("self.matches('^[0-9a-f]{40}([0-9a-f]{24})?$')").message(
        "spec.source.commit must be a full commit id: 40 lowercase hex digits (64 in a SHA-256 repository)"
    ))]
    pub commit: Option<String>,
}
