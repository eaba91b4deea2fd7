//! What the demo prints once the rollout is done: how to look at the still-running cluster with
//! `kubectl` and `kubectl tt driver`.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

/// Where `.ci/kube-tools` installs kubectl, relative to `$HOME`.
const KUBE_TOOLS_KUBECTL: &str = ".local/ttdp-tools/bin/kubectl";

/// The real kubectl, if `.ci/kube-tools` installed it.
pub fn installed_kubectl() -> Option<PathBuf> {
    let path = PathBuf::from(std::env::var_os("HOME")?).join(KUBE_TOOLS_KUBECTL);
    path.is_file().then_some(path)
}

/// The block of example commands for the cluster behind `kubeconfig`; `shared`: an existing
/// cluster, where the demo deletes what it created at Ctrl-C.
pub fn render(
    kubeconfig: &Path,
    plugin: &Path,
    policy: &str,
    from: &str,
    kubectl: Option<&Path>,
    shared: bool,
) -> String {
    let plugin_dir = plugin.parent().unwrap_or(Path::new(".")).display();
    let lifetime = if shared {
        "The demo's nodes, policy and controller stay for inspection until Ctrl-C; then the demo deletes what it created."
    } else {
        "The cluster keeps running until Ctrl-C."
    };
    let mut out = format!(
        "{lifetime} In another terminal:\n\n  export KUBECONFIG={}\n",
        kubeconfig.display()
    );
    match kubectl {
        Some(kubectl) => {
            let k = kubectl.display();
            let _ = write!(
                out,
                "  export PATH={plugin_dir}:$PATH   # kubectl finds the kubectl-tt-driver plugin there
  {k} get ttdp
  {k} tt driver nodes {policy}
  {k} tt driver describe {policy}
  {k} get nodes -L driver.tenstorrent.com/kmd-version,driver.tenstorrent.com/install-mode
  {k} get ttdp {policy} -o jsonpath='{{.status.nodes}}'
  {k} patch ttdp {policy} --type merge -p '{{\"spec\":{{\"version\":\"{from}\"}}}}'   # downgrade, then:
  {k} tt driver watch
"
            );
        }
        None => {
            let p = plugin.display();
            let tools_dir = KUBE_TOOLS_KUBECTL.trim_end_matches("/kubectl");
            let _ = write!(
                out,
                "  {p} nodes {policy}        # kubectl tt driver nodes {policy}
  {p} describe {policy}
  {p} watch

  With kubectl (`bash .ci/kube-tools` installs it into ~/{tools_dir}), add {plugin_dir} to PATH and run
  `kubectl get ttdp` and `kubectl tt driver nodes {policy}`.
"
            );
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hints_name_the_kubeconfig_and_the_plugin_commands() {
        let text = render(
            Path::new("/tmp/k/kubeconfig"),
            Path::new("/t/debug/kubectl-tt-driver"),
            "default",
            "2.7.0",
            Some(Path::new("/h/.local/ttdp-tools/bin/kubectl")),
            false,
        );
        assert!(text.contains("export KUBECONFIG=/tmp/k/kubeconfig"));
        assert!(text.contains("export PATH=/t/debug:$PATH"));
        assert!(text.contains("/h/.local/ttdp-tools/bin/kubectl tt driver nodes default"));
        let without = render(
            Path::new("/k"),
            Path::new("/t/debug/kubectl-tt-driver"),
            "default",
            "2.7.0",
            None,
            true,
        );
        assert!(without.contains("deletes what it created"));
        assert!(without.contains("/t/debug/kubectl-tt-driver nodes default"));
        assert!(without.contains(".ci/kube-tools"));
    }
}
