//! The module signing Secret of `spec.module.signing` in the agent's pod: a read-only Secret
//! volume (a tmpfs the kubelet fills) holding only the key and the certificate.

use k8s_openapi::api::core::v1::{EnvVar, KeyToPath, SecretVolumeSource, Volume, VolumeMount};
use ttdp_api::TenstorrentDriverPolicy;
use ttdp_api::driver::module_settings::{ModuleSigning, SIGNING_CERT_FILE, SIGNING_KEY_FILE};
use ttdp_api::names::env;

/// Where the agent finds the module signing key and certificate (`spec.module.signing`).
pub const SIGNING_DIR: &str = "/etc/ttdp/module-signing";
pub(super) const SIGNING_VOLUME: &str = "module-signing";

/// The signing Secret (`spec.module.signing`) as a volume: only its key and certificate, readable
/// by root alone. Optional: a missing Secret still starts the agent, which then fails the node
/// with `SigningKeyUnusable` naming the Secret (a pod stuck mounting it would say nothing in
/// the policy's status); the kubelet fills the volume once the Secret exists.
pub(super) fn signing_volume(policy: &TenstorrentDriverPolicy) -> Option<Volume> {
    let signing = signing(policy)?;
    let item = |key: &str| KeyToPath {
        key: key.to_owned(),
        path: key.to_owned(),
        mode: None,
    };
    Some(Volume {
        name: SIGNING_VOLUME.to_owned(),
        secret: Some(SecretVolumeSource {
            secret_name: Some(signing.secret_name.clone()),
            items: Some(vec![item(SIGNING_KEY_FILE), item(SIGNING_CERT_FILE)]),
            default_mode: Some(0o400),
            optional: Some(true),
        }),
        ..Default::default()
    })
}

pub(super) fn signing_mount(policy: &TenstorrentDriverPolicy) -> Option<VolumeMount> {
    signing(policy).map(|_| VolumeMount {
        name: SIGNING_VOLUME.to_owned(),
        mount_path: SIGNING_DIR.to_owned(),
        read_only: Some(true),
        ..Default::default()
    })
}

fn signing(policy: &TenstorrentDriverPolicy) -> Option<&ModuleSigning> {
    policy.spec.module.as_ref()?.signing.as_ref()
}

/// The agent's signing variables: where the Secret is mounted, and `<namespace>/<name>` of the
/// Secret for its messages; none without signing.
pub(super) fn signing_env(policy: &TenstorrentDriverPolicy, namespace: &str) -> Vec<EnvVar> {
    let Some(signing) = signing(policy) else {
        return Vec::new();
    };
    let value = |name: &str, value: String| EnvVar {
        name: name.to_owned(),
        value: Some(value),
        value_from: None,
    };
    vec![
        value(env::MODULE_SIGNING_DIR, SIGNING_DIR.to_owned()),
        value(
            env::MODULE_SIGNING_SECRET,
            format!("{namespace}/{}", signing.secret_name),
        ),
    ]
}
