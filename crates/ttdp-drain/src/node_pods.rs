//! Listing the pods of one node, with a `spec.nodeName` field selector (never every pod of the
//! cluster).

use k8s_openapi::api::core::v1::Pod;
use kube::Client;
use kube::api::{Api, ListParams};

/// Pods per list page.
const PAGE_SIZE: u32 = 500;

/// Every pod bound to `node`, in every namespace, following continue tokens, without their
/// managed fields: nothing in a drain reads them, and a controller runs many drains at once,
/// each holding its node's pods until the drain ends.
pub async fn list_node_pods(client: &Client, node: &str) -> Result<Vec<Pod>, kube::Error> {
    let pods: Api<Pod> = Api::all(client.clone());
    let mut params = ListParams::default()
        .fields(&format!("spec.nodeName={node}"))
        .limit(PAGE_SIZE);
    let mut out = Vec::new();
    loop {
        let page = pods.list(&params).await?;
        out.extend(page.items.into_iter().map(without_managed_fields));
        match page.metadata.continue_.filter(|c| !c.is_empty()) {
            Some(token) => params = params.continue_token(&token),
            None => return Ok(out),
        }
    }
}

fn without_managed_fields(mut pod: Pod) -> Pod {
    pod.metadata.managed_fields = None;
    pod
}
