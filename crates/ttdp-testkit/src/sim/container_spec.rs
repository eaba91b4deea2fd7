//! How a pod's container becomes a local process: program, arguments and environment, with
//! `valueFrom.fieldRef` and `$(VAR)` references resolved the way the kubelet resolves them.

use std::collections::BTreeMap;
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

/// Variables the kubelet adds to a mapped container's environment.
#[derive(Debug, Clone, Copy, Default)]
pub struct InjectedEnv<'a> {
    /// Set before the pod's `env`, which may override them (e.g. `KUBECONFIG`, `PATH`).
    pub defaults: &'a [(String, String)],
    /// Set after the pod's `env`, overriding it: the simulated host's view of itself
    /// (`TTDP_HOST_ROOT`, `TTDP_KERNEL`), which a real container gets from its mounts.
    pub forced: &'a [(String, String)],
}

/// The container's process when its image maps to `binary`: `command[0]` is replaced by the
/// binary, the rest of `command` and then `args` follow.
pub fn container_process(
    pod: &Pod,
    container: &Container,
    binary: &Path,
    injected: InjectedEnv<'_>,
    pod_ip: &str,
    host_ip: &str,
) -> ProcessSpec {
    let env = container_env(pod, container, injected, pod_ip, host_ip);
    let lookup: BTreeMap<&str, &str> = env.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    let command = container.command.as_deref().unwrap_or_default();
    let args = container.args.as_deref().unwrap_or_default();
    let args = command
        .iter()
        .skip(1)
        .chain(args.iter())
        .map(|a| expand_references(a, &lookup))
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
    let argv = exec.command.as_deref().unwrap_or_default();
    let (first, rest) = argv.split_first()?;
    let file_name = |p: &str| Path::new(p).file_name().map(|n| n.to_os_string());
    let entrypoint = container
        .command
        .as_ref()
        .and_then(|c| c.first())
        .and_then(|c| file_name(c));
    let binary = container_process
        .program
        .file_name()
        .map(|n| n.to_os_string());
    let mine = file_name(first);
    let program = if mine.is_some() && (mine == entrypoint || mine == binary) {
        container_process.program.clone()
    } else {
        PathBuf::from(first)
    };
    let lookup: BTreeMap<&str, &str> = container_process
        .env
        .iter()
        .map(|(k, v)| (k.as_str(), v.as_str()))
        .collect();
    Some(ProcessSpec {
        program,
        args: rest.iter().map(|a| expand_references(a, &lookup)).collect(),
        env: container_process.env.clone(),
    })
}

/// The container's environment: the injected defaults, then `env` in order (later names override
/// earlier ones), with `value` references expanded and `fieldRef`s resolved, then the forced
/// variables. Other sources (config maps, secrets, resource fields) are not simulated and are
/// left out with a warning.
pub fn container_env(
    pod: &Pod,
    container: &Container,
    injected: InjectedEnv<'_>,
    pod_ip: &str,
    host_ip: &str,
) -> Vec<(String, String)> {
    let mut env: Vec<(String, String)> = injected.defaults.to_vec();
    for var in container.env.as_deref().unwrap_or_default() {
        let value = if let Some(value) = &var.value {
            let lookup: BTreeMap<&str, &str> =
                env.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
            Some(expand_references(value, &lookup))
        } else if let Some(field) = var.value_from.as_ref().and_then(|f| f.field_ref.as_ref()) {
            field_value(pod, &field.field_path, pod_ip, host_ip)
        } else if var.value_from.is_some() {
            warn!(pod = %pod.name_any(), variable = %var.name, "env source not simulated; variable left out");
            None
        } else {
            Some(String::new())
        };
        if let Some(value) = value {
            env.retain(|(k, _)| k != &var.name);
            env.push((var.name.clone(), value));
        }
    }
    for (name, value) in injected.forced {
        env.retain(|(k, _)| k != name);
        env.push((name.clone(), value.clone()));
    }
    env
}

/// The value of a downward-API field path, as the kubelet resolves it.
pub fn field_value(pod: &Pod, path: &str, pod_ip: &str, host_ip: &str) -> Option<String> {
    let spec = pod.spec.as_ref();
    match path {
        "metadata.name" => Some(pod.name_any()),
        "metadata.namespace" => Some(pod.namespace().unwrap_or_default()),
        "metadata.uid" => Some(pod.uid().unwrap_or_default()),
        "spec.nodeName" => Some(spec.and_then(|s| s.node_name.clone()).unwrap_or_default()),
        "spec.serviceAccountName" => Some(
            spec.and_then(|s| s.service_account_name.clone())
                .unwrap_or_else(|| "default".to_owned()),
        ),
        "status.podIP" => Some(pod_ip.to_owned()),
        "status.hostIP" => Some(host_ip.to_owned()),
        other => {
            let (map, key) = other
                .strip_prefix("metadata.labels['")
                .map(|k| (pod.labels(), k))
                .or_else(|| {
                    other
                        .strip_prefix("metadata.annotations['")
                        .map(|k| (pod.annotations(), k))
                })?;
            let key = key.strip_suffix("']")?;
            Some(map.get(key).cloned().unwrap_or_default())
        }
    }
}

/// Expands `$(NAME)` from `env`; `$$(NAME)` is a literal `$(NAME)`; unknown names stay as written.
pub fn expand_references(input: &str, env: &BTreeMap<&str, &str>) -> String {
    let mut out = String::new();
    let mut rest = input;
    while let Some(pos) = rest.find('$') {
        out.push_str(&rest[..pos]);
        let after = &rest[pos + 1..];
        if let Some(tail) = after.strip_prefix('$') {
            out.push('$');
            rest = tail;
        } else if let Some(inner) = after.strip_prefix('(') {
            match inner.find(')') {
                Some(end) => {
                    let name = &inner[..end];
                    match env.get(name) {
                        Some(value) => out.push_str(value),
                        None => {
                            out.push_str("$(");
                            out.push_str(name);
                            out.push(')');
                        }
                    }
                    rest = &inner[end + 1..];
                }
                None => {
                    out.push_str("$(");
                    rest = inner;
                }
            }
        } else {
            out.push('$');
            rest = after;
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
            InjectedEnv {
                defaults: &defaults,
                forced: &forced,
            },
            "10.1.0.2",
            "10.0.0.1",
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
        let p = container_process(
            &pod(),
            &c,
            Path::new("/target/ttdp-agent"),
            InjectedEnv::default(),
            "",
            "",
        );
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
        let env = BTreeMap::from([("A", "1")]);
        assert_eq!(expand_references("x$(A)y", &env), "x1y");
        assert_eq!(expand_references("$(B)", &env), "$(B)");
        assert_eq!(expand_references("$$(A)", &env), "$(A)");
        assert_eq!(expand_references("cost $5 $(A", &env), "cost $5 $(A");
    }
}
