//! [`FileReporter`]: keeps what the agent would publish to Kubernetes in one JSON file
//! ([`ReportFile`]), rewritten atomically after every change. For runs without a cluster (the
//! real-kernel VM tests) and for debugging.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use ttdp_api::agent_report::AgentReport;

use super::{EventKind, NodeEvent, ReportError, Reporter};
use crate::labels::NodeLabels;

/// How many Events the file keeps (oldest dropped first).
pub const MAX_EVENTS: usize = 100;

/// One Event as written to the file.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RecordedEvent {
    /// `Normal` or `Warning`.
    #[serde(rename = "type")]
    pub kind: EventKind,
    /// UpperCamelCase reason.
    pub reason: String,
    /// What the agent was doing.
    pub action: String,
    /// The human-readable account.
    pub note: String,
    /// When it was recorded.
    pub time: jiff::Timestamp,
}

/// The report file's content.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ReportFile {
    /// The node the agent runs on.
    pub node: String,
    /// The agent-managed labels as they would be on the node now.
    pub labels: BTreeMap<String, String>,
    /// The latest agent report.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub report: Option<AgentReport>,
    /// The latest Events, oldest first (at most [`MAX_EVENTS`]).
    #[serde(default)]
    pub events: Vec<RecordedEvent>,
}

impl ReportFile {
    /// Reads a report file.
    pub fn read(path: &Path) -> Result<Self, ReportError> {
        let file_error = |source| ReportError::File {
            path: path.to_path_buf(),
            source,
        };
        let text = std::fs::read_to_string(path).map_err(file_error)?;
        Ok(serde_json::from_str(&text)?)
    }
}

/// Writes the agent's labels, report and Events to a JSON file.
#[derive(Debug)]
pub struct FileReporter {
    path: PathBuf,
    state: Mutex<ReportFile>,
}

impl FileReporter {
    /// A reporter writing to `path` for node `node`. An existing file from an earlier run is
    /// continued (its labels and Events kept) when it parses, replaced otherwise.
    pub fn new(path: impl Into<PathBuf>, node: &str) -> Self {
        let path = path.into();
        let mut state = ReportFile::read(&path).unwrap_or_default();
        state.node = node.to_string();
        Self {
            path,
            state: Mutex::new(state),
        }
    }

    /// The file written.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Changes the content under the lock and writes the file.
    fn update(&self, change: impl FnOnce(&mut ReportFile)) -> Result<(), ReportError> {
        let mut state = self
            .state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        change(&mut state);
        let json = serde_json::to_vec_pretty(&*state)?;
        write_atomically(&self.path, &json)
    }
}

/// Writes `path` through a temporary file in the same directory renamed over it.
fn write_atomically(path: &Path, bytes: &[u8]) -> Result<(), ReportError> {
    let file_error = |source| ReportError::File {
        path: path.to_path_buf(),
        source,
    };
    let dir = match path.parent() {
        Some(dir) if !dir.as_os_str().is_empty() => dir,
        _ => Path::new("."),
    };
    let mut tmp = tempfile::Builder::new()
        .prefix(".ttdp-agent-report.")
        .tempfile_in(dir)
        .map_err(file_error)?;
    tmp.write_all(bytes).map_err(file_error)?;
    tmp.persist(path).map_err(|e| file_error(e.error))?;
    Ok(())
}

impl Reporter for FileReporter {
    async fn patch_labels(&self, labels: &NodeLabels) -> Result<(), ReportError> {
        self.update(|state| labels.apply_to(&mut state.labels))
    }

    async fn publish_report(&self, report: &AgentReport) -> Result<(), ReportError> {
        self.update(|state| state.report = Some(report.clone()))
    }

    async fn record_event(&self, event: &NodeEvent) -> Result<(), ReportError> {
        self.update(|state| {
            state.events.push(RecordedEvent {
                kind: event.kind,
                reason: event.reason.clone(),
                action: event.action.clone(),
                note: event.note.clone(),
                time: jiff::Timestamp::now(),
            });
            let excess = state.events.len().saturating_sub(MAX_EVENTS);
            state.events.drain(..excess);
        })
    }

    /// The file stands for the Node: a label an admin (or a test) added to its `labels`, even
    /// while the agent runs, is read from the file and kept in it.
    async fn node_label(&self, key: &str) -> Result<Option<String>, ReportError> {
        let on_disk = ReportFile::read(&self.path)
            .ok()
            .and_then(|f| f.labels.get(key).cloned());
        let mut state = self
            .state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        match &on_disk {
            Some(value) => state.labels.insert(key.to_string(), value.clone()),
            None => state.labels.remove(key),
        };
        Ok(on_disk)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::labels::InstallMode;
    use ttdp_api::agent_report::AgentPhase;

    #[tokio::test]
    async fn labels_report_and_events_land_in_the_file_and_survive_a_restart() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("report.json");
        let reporter = FileReporter::new(&path, "n1");
        reporter
            .patch_labels(&NodeLabels::desired(
                InstallMode::Container,
                Some("2.8.0"),
                Some("3.0.0"),
            ))
            .await
            .unwrap();
        let report = AgentReport {
            phase: AgentPhase::Ready,
            target_version: "2.8.0".into(),
            loaded_version: Some("2.8.0".into()),
            loaded_parameters: None,
            applied_parameters: None,
            loaded_commit: None,
            udev_rule: None,
            install_mode: "container".into(),
            holders: vec![],
            reason: None,
            message: None,
            kernel_compiler: None,
            installed_kernels: Vec::new(),
            start_load: None,
            module_signer: None,
        };
        reporter.publish_report(&report).await.unwrap();
        for i in 0..(MAX_EVENTS + 5) {
            reporter
                .record_event(&NodeEvent {
                    kind: EventKind::Normal,
                    reason: "ModuleInstalled".into(),
                    action: "Load".into(),
                    note: format!("event {i}"),
                })
                .await
                .unwrap();
        }
        let file = ReportFile::read(&path).unwrap();
        assert_eq!(file.node, "n1");
        assert_eq!(file.labels["driver.tenstorrent.com/kmd-version"], "2.8.0");
        assert_eq!(file.report, Some(report));
        assert_eq!(file.events.len(), MAX_EVENTS);
        assert_eq!(file.events[0].note, "event 5");

        // a restarted agent continues the file; a removed label disappears from it
        let again = FileReporter::new(&path, "n1");
        again
            .patch_labels(&NodeLabels::desired(InstallMode::Container, None, None))
            .await
            .unwrap();
        let file = ReportFile::read(&path).unwrap();
        assert!(
            !file
                .labels
                .contains_key("driver.tenstorrent.com/kmd-version")
        );
        assert_eq!(
            file.labels["tt-smi.driver.tenstorrent.com/version"],
            "3.0.0"
        );
        assert_eq!(file.events.len(), MAX_EVENTS);
        let json: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
        assert_eq!(json["events"][0]["type"], "Normal");
    }

    #[tokio::test]
    async fn a_label_added_to_the_file_is_read_and_kept() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("report.json");
        let reporter = FileReporter::new(&path, "n1");
        reporter
            .patch_labels(&NodeLabels::desired(InstallMode::Container, None, None))
            .await
            .unwrap();
        assert_eq!(
            reporter.node_label("example.com/opt-in").await.unwrap(),
            None
        );
        let mut file = ReportFile::read(&path).unwrap();
        file.labels
            .insert("example.com/opt-in".into(), "true".into());
        std::fs::write(&path, serde_json::to_vec(&file).unwrap()).unwrap();
        assert_eq!(
            reporter.node_label("example.com/opt-in").await.unwrap(),
            Some("true".into())
        );
        // the agent's next write keeps it
        reporter
            .patch_labels(&NodeLabels::desired(
                InstallMode::Container,
                Some("2.8.0"),
                None,
            ))
            .await
            .unwrap();
        let file = ReportFile::read(&path).unwrap();
        assert_eq!(file.labels["example.com/opt-in"], "true");
    }

    #[tokio::test]
    async fn an_unwritable_file_is_an_error_naming_it() {
        let reporter = FileReporter::new("/nonexistent-dir/report.json", "n1");
        let err = reporter
            .patch_labels(&NodeLabels::default())
            .await
            .unwrap_err();
        assert!(
            err.to_string().contains("/nonexistent-dir/report.json"),
            "{err}"
        );
    }
}
