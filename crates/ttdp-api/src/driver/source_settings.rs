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
/// `.sha256` file next to it (what `cargo xtask prebuild` writes). What the agents load is
/// vouched for by the policy, not by the server: the checksums pinned in `checksums`, or, only
/// when `trustServerChecksum` says so, the server's own checksum files.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new("self.url.startsWith('https://') || (has(self.allowInsecureHttp) && self.allowInsecureHttp)").message(
    "spec.source.prebuilt.url must be https://; set spec.source.prebuilt.allowInsecureHttp: true to download over plain http"
))]
#[x_kube(validation = Rule::new("(has(self.checksums) && size(self.checksums) > 0) || (has(self.trustServerChecksum) && self.trustServerChecksum)").message(
    "spec.source.prebuilt needs the checksum of each module in checksums (version, kernelRelease, sha256), or trustServerChecksum: true to trust the server's .sha256 files"
))]
pub struct PrebuiltSettings {
    /// URL template of the `.ko`, with `{version}` and `{kernelRelease}` (the node's `uname -r`),
    /// e.g. `https://ko.example.com/tt-kmd/{version}/{kernelRelease}/tenstorrent.ko`. Its
    /// checksum is read from the same URL plus `.sha256`. `http://` only with
    /// `allowInsecureHttp`.
    #[schemars(length(min = 1, max = 2048))]
    #[x_kube(validation = Rule::new("(self.startsWith('https://') || self.startsWith('http://')) && self.contains('{version}') && self.contains('{kernelRelease}') && !self.contains(' ')").message(
        "spec.source.prebuilt.url must be an http:// or https:// URL without spaces that contains {version} and {kernelRelease}"
    ))]
    pub url: String,

    /// The sha256 of each `.ko` the agents may load, one entry per version and kernel release
    /// (the `.sha256` files `cargo xtask prebuild` wrote, checked by you). A download that does
    /// not match is refused (`PrebuiltRejected`), a cached module that does not match is
    /// replaced by the download, and a pinned file the server lacks fails the node
    /// (`PrebuiltMissing`) rather than being built. A version and kernel without an entry is not
    /// downloaded: it is built, or refused with `PrebuiltUnpinned` when the fallback is `Fail`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 1024))]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["version", "kernelRelease"]))]
    pub checksums: Vec<PinnedChecksum>,

    /// Trust the server's `.sha256` file for a module whose checksum is not in `checksums`: whoever
    /// controls the server (or, with `allowInsecureHttp`, the network) then chooses the code the
    /// nodes load. Never applies to a version whose commit is pinned (`spec.source.commit`): a
    /// download cannot show its commit. Default false.
    #[serde(default, skip_serializing_if = "is_false")]
    pub trust_server_checksum: bool,

    /// Allow `http://` for `url` and for redirects. Default false: only https.
    #[serde(default, skip_serializing_if = "is_false")]
    pub allow_insecure_http: bool,

    /// Follow redirects to another host (an artifact store behind the server). Default false:
    /// redirects stay on the URL's host and port.
    #[serde(default, skip_serializing_if = "is_false")]
    pub allow_cross_host_redirects: bool,

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

/// The checksum of one ready-built `.ko`: the one version for the one kernel release.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct PinnedChecksum {
    /// The tt-kmd version, e.g. `2.8.0`.
    #[schemars(length(min = 1, max = 32))]
    #[x_kube(validation = Rule::new("self.matches('^[0-9]+[.][0-9]+[.][0-9]+$')").message(
        "spec.source.prebuilt.checksums[].version must be MAJOR.MINOR.PATCH, e.g. 2.8.0"
    ))]
    pub version: String,
    /// The kernel release (`uname -r` on the node), e.g. `6.8.0-111-generic`.
    #[schemars(length(min = 1, max = 128))]
    #[x_kube(validation = Rule::new("self.matches('^[A-Za-z0-9._+~-]+$')").message(
        "spec.source.prebuilt.checksums[].kernelRelease must be a kernel release as uname -r prints it, e.g. 6.8.0-111-generic"
    ))]
    pub kernel_release: String,
    /// The `.ko`'s sha256: 64 lowercase hex digits.
    #[schemars(length(min = 64, max = 64))]
    #[x_kube(validation = Rule::new("self.matches('^[0-9a-f]{64}$')").message(
        "spec.source.prebuilt.checksums[].sha256 must be 64 lowercase hex digits"
    ))]
    pub sha256: String,
}

fn is_false(value: &bool) -> bool {
    !value
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
