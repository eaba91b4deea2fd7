//! ServiceAccount tokens for tests that act as a workload instead of as the admin: a token from
//! the TokenRequest API (bound to a Pod, as a projected token in that pod would be, or bound to
//! nothing), and a kubeconfig that presents it to the same cluster an admin kubeconfig names.
//!
//! A token bound to a Pod carries `authentication.kubernetes.io/pod-name` and `.../node-name`
//! in the request's `userInfo.extra` (what ValidatingAdmissionPolicies read) and stops being
//! accepted once the pod is gone. RBAC and admission apply to it as to any workload; this module
//! grants nothing.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result, anyhow};
use k8s_openapi::api::authentication::v1::{BoundObjectReference, TokenRequest, TokenRequestSpec};
use k8s_openapi::api::core::v1::{Pod, ServiceAccount};
use kube::api::{Api, PostParams};
use kube::config::Kubeconfig;
use kube::{Client, ResourceExt};

use super::pki::{ServerTrust, write_kubeconfig};

/// How long a requested token is valid; long enough for any test, short enough to expire on
/// its own if a test leaks it.
const TOKEN_SECONDS: i64 = 3600;

/// A token for the ServiceAccount `service_account` of `namespace`, bound to no object.
pub async fn service_account_token(
    client: &Client,
    namespace: &str,
    service_account: &str,
) -> Result<String> {
    request_token(client, namespace, service_account, None).await
}

/// A token for `pod`'s ServiceAccount, bound to the pod (by name and uid): what the pod's
/// projected token would be. `pod` must be read from the server (it needs its uid).
pub async fn pod_token(client: &Client, pod: &Pod) -> Result<String> {
    let incomplete = |missing| {
        let pod = pod.name_any();
        anyhow!("pod {pod} has no {missing}: pass a pod read from the server")
    };
    let namespace = pod.namespace().ok_or_else(|| incomplete("namespace"))?;
    let uid = pod.uid().ok_or_else(|| incomplete("uid"))?;
    let service_account = pod
        .spec
        .as_ref()
        .and_then(|s| s.service_account_name.clone())
        .ok_or_else(|| incomplete("service account"))?;
    let bound = BoundObjectReference {
        api_version: Some("v1".into()),
        kind: Some("Pod".into()),
        name: Some(pod.name_any()),
        uid: Some(uid),
    };
    request_token(client, &namespace, &service_account, Some(bound)).await
}

async fn request_token(
    client: &Client,
    namespace: &str,
    service_account: &str,
    bound_object_ref: Option<BoundObjectReference>,
) -> Result<String> {
    let account = format!("service account {namespace}/{service_account}");
    let request = TokenRequest {
        spec: TokenRequestSpec {
            bound_object_ref,
            expiration_seconds: Some(TOKEN_SECONDS),
            ..TokenRequestSpec::default()
        },
        ..TokenRequest::default()
    };
    let answer: TokenRequest = Api::<ServiceAccount>::namespaced(client.clone(), namespace)
        .create_subresource("token", service_account, &PostParams::default(), &request)
        .await
        .with_context(|| format!("requesting a token for {account}"))?;
    let token = answer.status.map(|s| s.token).filter(|t| !t.is_empty());
    token.ok_or_else(|| anyhow!("the token request for {account} returned no token"))
}

/// Writes `<dir>/<stem>.kubeconfig`: the server and certificate authority of `admin`'s current
/// context, with `token` as the only credential. Returns its path.
pub fn write_token_kubeconfig(
    admin: &Path,
    token: &str,
    dir: &Path,
    stem: &str,
) -> Result<PathBuf> {
    let no_cluster = |problem| anyhow!("kubeconfig {}: {problem}", admin.display());
    let config = Kubeconfig::read_from(admin)
        .with_context(|| format!("reading kubeconfig {}", admin.display()))?;
    let context = config
        .current_context
        .as_deref()
        .and_then(|name| config.contexts.iter().find(|c| c.name == name))
        .and_then(|c| c.context.as_ref())
        .ok_or_else(|| no_cluster("no current context"))?;
    let named = config.clusters.iter().find(|c| c.name == context.cluster);
    let cluster = named.and_then(|c| c.cluster.as_ref());
    let cluster = cluster.ok_or_else(|| no_cluster("the current context names no cluster"))?;
    let server = cluster
        .server
        .as_deref()
        .ok_or_else(|| no_cluster("the cluster has no server"))?;
    // `read_from` made a relative certificate-authority path absolute.
    let trust = match (
        &cluster.certificate_authority_data,
        &cluster.certificate_authority,
    ) {
        (Some(data), _) => ServerTrust::CaData(data),
        (None, Some(file)) => ServerTrust::CaFile(Path::new(file)),
        (None, None) => return Err(no_cluster("the cluster names no certificate authority")),
    };
    let user_entry = format!("    token: {token}\n");
    Ok(write_kubeconfig(dir, stem, server, trust, &user_entry)?)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    fn admin(dir: &Path, cluster: &str) -> PathBuf {
        let path = dir.join("admin.kubeconfig");
        let text = format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster:\n{cluster}\
             users:\n- name: u\n  user:\n    token: admin-secret\ncontexts:\n- name: x\n  \
             context:\n    cluster: c\n    user: u\ncurrent-context: x\n"
        );
        std::fs::write(&path, text).unwrap();
        path
    }

    /// (server, CA file, CA data, the user entry) of a written kubeconfig.
    fn written(path: &Path) -> (String, Option<String>, Option<String>, serde_json::Value) {
        let config = Kubeconfig::read_from(path).unwrap();
        let cluster = config.clusters[0].cluster.clone().unwrap();
        let raw: serde_json::Value =
            serde_saphyr::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
        (
            cluster.server.unwrap(),
            cluster.certificate_authority,
            cluster.certificate_authority_data,
            raw["users"][0]["user"].clone(),
        )
    }

    #[test]
    fn the_token_kubeconfig_keeps_the_server_and_a_ca_file_made_absolute() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("ca.crt"), "pem").unwrap();
        let admin = admin(
            dir.path(),
            "    server: https://127.0.0.1:6443\n    certificate-authority: ca.crt\n",
        );
        let path = write_token_kubeconfig(&admin, "t0k.en", dir.path(), "agent").unwrap();
        assert_eq!(path, dir.path().join("agent.kubeconfig"));
        let (server, ca, data, token) = written(&path);
        assert_eq!(server, "https://127.0.0.1:6443");
        assert_eq!(ca, Some(dir.path().join("ca.crt").display().to_string()));
        assert_eq!(data, None);
        assert_eq!(token, serde_json::json!({"token": "t0k.en"}));
    }

    #[test]
    fn the_token_kubeconfig_keeps_inline_ca_data() {
        let dir = tempfile::tempdir().unwrap();
        let admin = admin(
            dir.path(),
            "    server: https://kind:6443\n    certificate-authority-data: cGVt\n",
        );
        let path = write_token_kubeconfig(&admin, "abc", dir.path(), "controller").unwrap();
        let (server, ca, data, user) = written(&path);
        assert_eq!(
            (server.as_str(), ca, data.as_deref()),
            ("https://kind:6443", None, Some("cGVt"))
        );
        assert_eq!(user, serde_json::json!({"token": "abc"}));
    }

    #[test]
    fn a_cluster_without_a_certificate_authority_is_an_error() {
        let dir = tempfile::tempdir().unwrap();
        let admin = admin(dir.path(), "    server: https://x:6443\n");
        let error = write_token_kubeconfig(&admin, "abc", dir.path(), "c").unwrap_err();
        assert!(
            error
                .to_string()
                .ends_with("names no certificate authority"),
            "{error}"
        );
    }
}
