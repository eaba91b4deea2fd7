//! The kubeconfig file clients use to reach the server (context `ttdp-test`, plain HTTP, no
//! credentials).

use std::path::{Path, PathBuf};

/// The context, cluster and user name in the written kubeconfig.
pub const CONTEXT: &str = "ttdp-test";

/// Render a kubeconfig for `url` with default namespace `default`.
pub fn render(url: &str) -> String {
    format!(
        "apiVersion: v1\n\
         kind: Config\n\
         clusters:\n\
         - name: {CONTEXT}\n  cluster:\n    server: {url}\n\
         contexts:\n\
         - name: {CONTEXT}\n  context:\n    cluster: {CONTEXT}\n    user: {CONTEXT}\n    namespace: default\n\
         current-context: {CONTEXT}\n\
         users:\n\
         - name: {CONTEXT}\n  user: {{}}\n\
         preferences: {{}}\n"
    )
}

/// Write the kubeconfig into `dir` and return its path.
pub fn write(dir: &Path, url: &str) -> std::io::Result<PathBuf> {
    let path = dir.join("kubeconfig");
    std::fs::write(&path, render(url))?;
    Ok(path)
}
