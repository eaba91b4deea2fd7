//! Writes nodes' upgrade records ([`crate::pure::node_record`]) before a round acts on them,
//! several nodes at once. A node whose record could not be written is not acted on in that
//! round (the status still shows what was decided, newer than the node's record).

use std::collections::HashSet;

use futures::StreamExt;
use serde_json::Value;

use crate::error::{Error, error_chain};
use crate::runtime::context::Context;
use crate::runtime::node_actions;

/// How many record writes run at once.
const RECORDS_AT_ONCE: usize = 16;

/// The nodes whose record was not written, and the first failure.
#[derive(Debug, Default)]
pub struct Unwritten {
    /// The nodes not to act on in this round.
    pub nodes: HashSet<String>,
    /// The first write that failed.
    pub first_error: Option<Error>,
}

/// Applies each `(node, patch)`.
pub async fn write(ctx: &Context, patches: Vec<(String, Value)>) -> Unwritten {
    let writes = patches.into_iter().map(|(node, patch)| async move {
        let result =
            node_actions::merge_patch_node(&ctx.client, &node, patch, "record the upgrade").await;
        (node, result)
    });
    let mut results = futures::stream::iter(writes).buffer_unordered(RECORDS_AT_ONCE);
    let mut unwritten = Unwritten::default();
    while let Some((node, result)) = results.next().await {
        if let Err(e) = result {
            tracing::warn!(node = %node, error = %error_chain(&e), "upgrade record not written; the node waits");
            unwritten.nodes.insert(node);
            unwritten.first_error.get_or_insert(e);
        }
    }
    unwritten
}
