//! Writes nodes' upgrade records ([`crate::pure::node_record`]) before a round records the
//! status and acts, several nodes at once.

use futures::StreamExt;
use serde_json::Value;

use crate::error::Error;
use crate::runtime::context::Context;
use crate::runtime::node_actions;

/// How many record writes run at once.
const RECORDS_AT_ONCE: usize = 16;

/// Applies each `(node, patch)`; the first failure is returned after trying them all.
pub async fn write(ctx: &Context, patches: Vec<(String, Value)>) -> Result<(), Error> {
    let writes = patches.into_iter().map(|(node, patch)| async move {
        node_actions::merge_patch_node(&ctx.client, &node, patch, "record the upgrade").await
    });
    let mut results = futures::stream::iter(writes).buffer_unordered(RECORDS_AT_ONCE);
    let mut first_error = None;
    while let Some(result) = results.next().await {
        if let Err(e) = result {
            first_error.get_or_insert(e);
        }
    }
    first_error.map_or(Ok(()), Err)
}
