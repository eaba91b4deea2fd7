//! The API server's own record of one client's requests, so that a benchmark can count what a
//! program sent without putting a proxy (another hop, in a busy process) in its path.
//!
//! The launched API server audits the user [`AUDITED_USER`], the identity of
//! [`super::ControlPlane::audited_kubeconfig`], at the `Metadata` level once each request is
//! answered, and nobody else. [`AuditLog`] reads the records as the file grows. A watch is
//! recorded when it ends, not when it starts.

use std::io::{Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};

use serde_json::Value;

use super::LaunchError;

/// The user name of the audited identity (a member of `system:masters`).
pub const AUDITED_USER: &str = "ttdp-audited";

/// Only the audited user's requests, without their bodies, once answered.
fn policy_text() -> String {
    format!(
        "apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: [RequestReceived, ResponseStarted]
rules:
- level: Metadata
  users: [{AUDITED_USER}]
- level: None
"
    )
}

/// Writes the audit policy into `dir` and returns the API server's flags for it, with the log
/// at `log`.
pub(super) fn apiserver_flags(dir: &Path, log: &Path) -> Result<Vec<String>, LaunchError> {
    let policy = dir.join("audit-policy.yaml");
    std::fs::write(&policy, policy_text()).map_err(LaunchError::io(policy.display()))?;
    Ok(vec![
        format!("--audit-policy-file={}", policy.display()),
        format!("--audit-log-path={}", log.display()),
        "--audit-log-format=json".to_owned(),
    ])
}

/// One audited request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AuditedRequest {
    /// The Kubernetes verb: `get`, `list`, `watch`, `create`, `update`, `patch`, `delete`, ...
    pub verb: String,
    /// The resource's plural ("" for a non-resource path such as `/version`).
    pub resource: String,
    /// The subresource, e.g. `status` or `eviction` ("" for none).
    pub subresource: String,
    /// The answer's HTTP status code.
    pub code: u16,
}

impl AuditedRequest {
    /// Whether the request could change something (not get, list or watch).
    pub fn is_write(&self) -> bool {
        !matches!(self.verb.as_str(), "get" | "list" | "watch")
    }
}

/// An audit log read as it grows.
#[derive(Debug)]
pub struct AuditLog {
    path: PathBuf,
    read: u64,
}

impl AuditLog {
    /// The log at `path`, read from its start (the file appears with the first record).
    pub fn new(path: &Path) -> Self {
        Self {
            path: path.to_path_buf(),
            read: 0,
        }
    }

    /// The requests recorded since the last call. A record still being written is left for
    /// the next call.
    pub fn take(&mut self) -> std::io::Result<Vec<AuditedRequest>> {
        let mut file = match std::fs::File::open(&self.path) {
            Ok(file) => file,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(e) => return Err(e),
        };
        file.seek(SeekFrom::Start(self.read))?;
        let mut text = Vec::new();
        file.read_to_end(&mut text)?;
        let complete = text.iter().rposition(|b| *b == b'\n').map_or(0, |i| i + 1);
        self.read += complete as u64;
        Ok(parse(&text[..complete]))
    }
}

/// The requests of whole lines of the JSON log (lines that do not parse are skipped).
fn parse(lines: &[u8]) -> Vec<AuditedRequest> {
    let text = |value: &Value| value.as_str().unwrap_or_default().to_owned();
    lines
        .split(|b| *b == b'\n')
        .filter_map(|line| serde_json::from_slice::<Value>(line).ok())
        .filter(|record| record["verb"].is_string())
        .map(|record| AuditedRequest {
            verb: text(&record["verb"]),
            resource: text(&record["objectRef"]["resource"]),
            subresource: text(&record["objectRef"]["subresource"]),
            code: record["responseStatus"]["code"]
                .as_u64()
                .and_then(|code| u16::try_from(code).ok())
                .unwrap_or_default(),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_are_read_once_and_a_partial_line_waits() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("audit.log");
        let mut log = AuditLog::new(&path);
        assert_eq!(log.take().unwrap(), []);
        let patch = r#"{"kind":"Event","verb":"patch","objectRef":{"resource":"tenstorrentdriverpolicies","subresource":"status"},"responseStatus":{"code":200}}"#;
        let version = r#"{"kind":"Event","verb":"get","responseStatus":{"code":200}}"#;
        std::fs::write(&path, format!("{patch}\n{version}\n{{\"verb\":\"li")).unwrap();
        let first = log.take().unwrap();
        assert_eq!(
            first,
            [
                AuditedRequest {
                    verb: "patch".into(),
                    resource: "tenstorrentdriverpolicies".into(),
                    subresource: "status".into(),
                    code: 200,
                },
                AuditedRequest {
                    verb: "get".into(),
                    resource: String::new(),
                    subresource: String::new(),
                    code: 200,
                },
            ]
        );
        assert!(first[0].is_write() && !first[1].is_write());
        assert_eq!(log.take().unwrap(), []);
    }
}
