//! Pure rendering: a [`Fleet`](crate::fleet::Fleet) in, text out. No I/O, no clock, no
//! terminal queries: everything that varies comes in through [`RenderOptions`], so the output is
//! reproducible and golden-tested.

pub mod describe;
pub mod kernels;
pub mod nodes;
pub mod policy_summary;
pub mod status;

use jiff::Timestamp;
use ttdp_api::NodeState;

use crate::palette::Palette;

/// Terminal width assumed when nothing says otherwise.
pub const DEFAULT_WIDTH: usize = 80;

/// What the renderers need to know about where the text goes.
#[derive(Clone, Copy, Debug)]
pub struct RenderOptions {
    /// Colours on or off.
    pub palette: Palette,
    /// Terminal width in columns; wide fleets wrap into blocks to fit it.
    pub width: usize,
    /// The time ages are measured from.
    pub now: Timestamp,
}

/// `current → target` when they differ, else the version; `<none>` for a missing version.
/// HostManaged and Conflict nodes are not being moved anywhere by the policy: only `current`.
pub fn version_change(state: NodeState, current: Option<&str>, target: &str) -> String {
    if matches!(state, NodeState::HostManaged | NodeState::Conflict) {
        return current.unwrap_or("<none>").to_owned();
    }
    match current {
        Some(c) if c == target => c.to_owned(),
        Some(c) => format!("{c} → {target}"),
        None => format!("<none> → {target}"),
    }
}
