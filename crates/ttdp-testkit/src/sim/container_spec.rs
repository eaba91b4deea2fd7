//! How a pod's container becomes a local process: program, arguments and environment, with
//! `valueFrom.fieldRef` and `$(VAR)` references resolved the way the kubelet resolves them.

use std::path::{Path, PathBuf};

use k8s_openapi::api::core::v1::{Container, ExecAction, Pod};
use kube::ResourceExt;
use tracing::warn;

/// A process to start for a container or an exec probe.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProcessSpec {
    /// The program.
    pub program: PathBuf,
    /// Its arguments (without argv\[0\]).
    pub args: Vec<String>,
    /// Its whole environment (nothing is inherited).
    pub env: Vec<(String, String)>,
}

/// The container's process when its image maps to `binary`: `command[0]` is replaced by the
/// binary, the rest of `command` and then `args` follow. Its environment is `defaults` (e.g.
/// `KUBECONFIG`, `PATH`), then the container's `env` (later names override earlier ones), then
/// `forced`: the simulated host's view of itself (`TTDP_HOST_ROOT`, `TTDP_KERNEL`), which a real
/// container gets from its mounts.
pub fn container_process(
    pod: &Pod,
    container: &Container,
    binary: &Path,
    defaults: &[(String, String)],
    forced: &[(String, String)],
) -> ProcessSpec {
    let mut env = defaults.to_vec();
    for var in container.env.iter().flatten() {
        let field = var.value_from.as_ref().and_then(|f| f.field_ref.as_ref());
        let value = match (&var.value, field) {
            (Some(value), _) => Some(expand_references(value, &env)),
            (None, Some(field)) => field_value(pod, &field.field_path),
            (None, None) => var.value_from.is_none().then(String::new),
        };
        let Some(value) = value else {
            warn!(pod = %pod.name_any(), variable = %var.name, "env source not simulated; variable left out");
            continue;
        };
        env.retain(|(k, _)| k != &var.name);
        env.push((var.name.clone(), value));
    }
    env.retain(|(k, _)| !forced.iter().any(|(name, _)| name == k));
    env.extend_from_slice(forced);
    let command = container.command.iter().flatten().skip(1);
    let args = command
        .chain(container.args.iter().flatten())
        .map(|a| expand_references(a, &env))
        .collect();
    ProcessSpec {
        program: binary.to_path_buf(),
        args,
        env,
    }
}

/// The process of an exec probe of a mapped container: when argv\[0\] names the container's
/// entrypoint or the mapped binary (same file name), it runs the binary; otherwise argv\[0\] runs
/// as a program of this machine.
pub fn probe_process(
    exec: &ExecAction,
    container: &Container,
    container_process: &ProcessSpec,
) -> Option<ProcessSpec> {
    let (first, rest) = exec.command.as_deref()?.split_first()?;
    let mine = Path::new(first).file_name();
    let entrypoint = container.command.iter().flatten().next().map(Path::new);
    let mapped = [entrypoint, Some(container_process.program.as_path())]
        .into_iter()
        .flatten()
        .any(|p| mine.is_some() && p.file_name() == mine);
    let env = &container_process.env;
    Some(ProcessSpec {
        program: if mapped {
            container_process.program.clone()
        } else {
            PathBuf::from(first)
        },
        args: rest.iter().map(|a| expand_references(a, env)).collect(),
        env: env.clone(),
    })
}

/// The value of a downward-API field path, as the kubelet resolves it: only the paths pods here
/// use (the agent's and the tests'); others are not simulated.
fn field_value(pod: &Pod, path: &str) -> Option<String> {
    match path {
        "metadata.name" => Some(pod.name_any()),
        "metadata.namespace" => Some(pod.namespace().unwrap_or_default()),
        "spec.nodeName" => pod.spec.as_ref()?.node_name.clone(),
        other => {
            let key = other
                .strip_prefix("metadata.labels['")?
                .strip_suffix("']")?;
            Some(pod.labels().get(key).cloned().unwrap_or_default())
        }
    }
}

/// Expands `$(NAME)` from `env`; `$$(NAME)` is a literal `$(NAME)`; unknown names stay as written.
pub fn expand_references(input: &str, env: &[(String, String)]) -> String {
    let mut out = String::new();
    let mut rest = input;
    while let Some(pos) = rest.find('$') {
        out.push_str(&rest[..pos]);
        rest = &rest[pos + 1..];
        if let Some(tail) = rest.strip_prefix('$') {
            out.push('$');
            rest = tail;
        } else if let Some((name, tail)) = rest.strip_prefix('(').and_then(|r| r.split_once(')')) {
            match env.iter().find(|(k, _)| k == name) {
                Some((_, value)) => out.push_str(value),
                None => out.push_str(&format!("$({name})")),
            }
            rest = tail;
        } else {
            out.push('$');
        }
    }
    out.push_str(rest);
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{EnvVar, EnvVarSource, ObjectFieldSelector, PodSpec};
    use kube::api::ObjectMeta;
    use std::collections::BTreeMap;

    fn field(name: &str, path: &str) -> EnvVar {
        EnvVar {
            name: name.to_owned(),
            value: None,
            value_from: Some(EnvVarSource {
                field_ref: Some(ObjectFieldSelector {
                    api_version: None,
                    field_path: path.to_owned(),
                }),
                ..EnvVarSource::default()
            }),
        }
    }

    fn value(name: &str, v: &str) -> EnvVar {
        EnvVar {
            name: name.to_owned(),
            value: Some(v.to_owned()),
            value_from: None,
        }
    }

    fn pod() -> Pod {
        Pod {
            metadata: ObjectMeta {
                name: Some("agent-x1".to_owned()),
                namespace: Some("ttdp".to_owned()),
                labels: Some(BTreeMap::from([("app".to_owned(), "agent".to_owned())])),
                ..ObjectMeta::default()
            },
            spec: Some(PodSpec {
                node_name: Some("tt-0".to_owned()),
                ..PodSpec::default()
            }),
            status: None,
        }
    }

    fn container() -> Container {
        Container {
            name: "agent".to_owned(),
            command: Some(vec![
                "/usr/local/bin/ttdp-agent".to_owned(),
                "run".to_owned(),
            ]),
            args: Some(vec![
                "--node=$(NODE_NAME)".to_owned(),
                "$$(NODE_NAME)".to_owned(),
            ]),
            env: Some(vec![
                field("NODE_NAME", "spec.nodeName"),
                field("POD_NAME", "metadata.name"),
                field("POD_NAMESPACE", "metadata.namespace"),
                field("APP", "metadata.labels['app']"),
                value("GREETING", "hello $(POD_NAME)"),
                value("TTDP_KERNEL", "overridden"),
            ]),
            ..Container::default()
        }
    }

    #[test]
    fn env_resolves_field_refs_and_layers_injected_variables() {
        let defaults = vec![
            ("KUBECONFIG".to_owned(), "/tmp/kc".to_owned()),
            ("TTDP_KERNEL".to_owned(), "real".to_owned()),
        ];
        let forced = vec![
            ("TTDP_HOST_ROOT".to_owned(), "/tmp/h".to_owned()),
            ("POD_NAME".to_owned(), "forced".to_owned()),
        ];
        let p = container_process(
            &pod(),
            &container(),
            Path::new("/bin/agent"),
            &defaults,
            &forced,
        );
        let env: BTreeMap<_, _> = p.env.iter().cloned().collect();
        assert_eq!(env["NODE_NAME"], "tt-0");
        assert_eq!(
            env["POD_NAME"], "forced",
            "forced variables win over the pod's"
        );
        assert_eq!(env["POD_NAMESPACE"], "ttdp");
        assert_eq!(env["APP"], "agent");
        assert_eq!(env["GREETING"], "hello agent-x1");
        assert_eq!(env["TTDP_HOST_ROOT"], "/tmp/h");
        assert_eq!(env["KUBECONFIG"], "/tmp/kc");
        assert_eq!(
            env["TTDP_KERNEL"], "overridden",
            "the pod's env wins over defaults"
        );
        assert_eq!(p.program, PathBuf::from("/bin/agent"));
        assert_eq!(p.args, vec!["run", "--node=tt-0", "$(NODE_NAME)"]);
    }

    #[test]
    fn probe_maps_the_entrypoint_only() {
        let c = container();
        let p = container_process(&pod(), &c, Path::new("/target/ttdp-agent"), &[], &[]);
        let exec = |argv: &[&str]| ExecAction {
            command: Some(argv.iter().map(|s| (*s).to_owned()).collect()),
        };
        let probe = probe_process(&exec(&["ttdp-agent", "ready"]), &c, &p).unwrap();
        assert_eq!(probe.program, PathBuf::from("/target/ttdp-agent"));
        assert_eq!(probe.args, vec!["ready"]);
        let probe = probe_process(&exec(&["/bin/true"]), &c, &p).unwrap();
        assert_eq!(probe.program, PathBuf::from("/bin/true"));
        assert!(probe_process(&exec(&[]), &c, &p).is_none());
    }

    #[test]
    fn references_expand_like_the_kubelet() {
        let env = [("A".to_owned(), "1".to_owned())];
        assert_eq!(expand_references("x$(A)y", &env), "x1y");
        assert_eq!(expand_references("$(B)", &env), "$(B)");
        assert_eq!(expand_references("$$(A)", &env), "$(A)");
        assert_eq!(expand_references("cost $5 $(A", &env), "cost $5 $(A");
    }
}
