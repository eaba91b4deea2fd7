//! `spec.source`: where the agents fetch tt-kmd from (an internal mirror on a cluster without
//! internet), optionally the commit the release tag must still point at, and a server of
//! ready-built modules.

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

    /// Ready-built modules: on a cache miss, the agents download the `.ko` for their kernel from
    /// this server instead of building it. Unset: every miss is built from `repository`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prebuilt: Option<PrebuiltSettings>,
}

/// A server of ready-built `.ko` files, one per version and kernel release, each with a
/// `.sha256` file next to it (what `cargo xtask prebuild` writes).
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct PrebuiltSettings {
    /// URL template of the `.ko`, with `{version}` and `{kernelRelease}` (the node's `uname -r`),
    /// e.g. `https://ko.example.com/tt-kmd/{version}/{kernelRelease}/tenstorrent.ko`. Its
    /// checksum is read from the same URL plus `.sha256`.
    #[schemars(length(min = 1, max = 2048))]
    #[x_kube(validation = Rule::new("(self.startsWith('https://') || self.startsWith('http://')) && self.contains('{version}') && self.contains('{kernelRelease}') && !self.contains(' ')").message(
        "spec.source.prebuilt.url must be an http:// or https:// URL without spaces that contains {version} and {kernelRelease}"
    ))]
    pub url: String,

    /// What a missing file (HTTP 404) means: `Build` (build it from the source, as without a
    /// prebuilt server) or `Fail` (fail the node with `PrebuiltMissing`; nothing is built). A
    /// file failing its checks, or a server that cannot be reached, always fails the node.
    #[serde(default = "default_fallback")]
    #[x_kube(validation = Rule::new("self in ['Build', 'Fail']").message(
        "spec.source.prebuilt.fallback must be Build or Fail"
    ))]
    pub fallback: String,

    /// A CA bundle (PEM) that signs the server's certificate, trusted in addition to the
    /// system's, from a ConfigMap or a Secret in the namespace the agents run in.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ca_bundle: Option<CaBundleSource>,
}

fn default_fallback() -> String {
    "Build".to_owned()
}

/// Where a CA bundle is kept: one key of a ConfigMap or of a Secret.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new("has(self.configMapName) != has(self.secretName)").message(
    "spec.source.prebuilt.caBundle needs exactly one of configMapName and secretName"
))]
pub struct CaBundleSource {
    /// The ConfigMap holding the bundle.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 253))]
    pub config_map_name: Option<String>,
    /// The Secret holding the bundle.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 253))]
    pub secret_name: Option<String>,
    /// The key of the bundle in it; `ca.crt` when unset.
    #[serde(default = "default_ca_key")]
    #[schemars(length(min = 1, max = 253))]
    pub key: String,
}

fn default_ca_key() -> String {
    "ca.crt".to_owned()
}
