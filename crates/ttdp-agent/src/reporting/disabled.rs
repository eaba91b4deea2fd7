//! [`NoReporter`]: publishes nothing (the agent's logs remain).

use ttdp_api::agent_report::AgentReport;

use super::{NodeEvent, ReportError, Reporter};
use crate::labels::NodeLabels;

/// A reporter that drops everything (`--report none`).
#[derive(Debug, Clone, Copy, Default)]
pub struct NoReporter;

impl Reporter for NoReporter {
    async fn patch_labels(&self, _labels: &NodeLabels) -> Result<(), ReportError> {
        Ok(())
    }

    async fn publish_report(&self, _report: &AgentReport) -> Result<(), ReportError> {
        Ok(())
    }

    async fn record_event(&self, _event: &NodeEvent) -> Result<(), ReportError> {
        Ok(())
    }
}
