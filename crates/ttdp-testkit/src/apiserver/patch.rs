//! Patches: JSON merge patch (RFC 7386, `json_patch::merge`), JSON patch (RFC 6902), and an
//! approximation of server-side apply: the applied object is JSON-merged into the stored one,
//! creating it when missing; no field ownership is tracked, so an apply never conflicts and
//! never removes a field its manager stopped applying. A strategic merge patch is refused
//! (415): no client of the demo sends one, and merging it as a JSON merge patch would replace
//! lists the real server merges by key.

use serde_json::Value;

use super::status::ApiError;

/// The patch formats, by request `Content-Type`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PatchType {
    /// `application/merge-patch+json`.
    Merge,
    /// `application/json-patch+json`.
    Json,
    /// `application/apply-patch+yaml` (server-side apply), with a JSON body as kube-rs and
    /// kubectl send it.
    Apply,
}

impl PatchType {
    /// Parse a `Content-Type` header value.
    pub fn from_content_type(ct: &str) -> Result<Self, ApiError> {
        match ct.split(';').next().unwrap_or_default().trim() {
            "application/merge-patch+json" => Ok(Self::Merge),
            "application/json-patch+json" => Ok(Self::Json),
            "application/apply-patch+yaml" => Ok(Self::Apply),
            _ => Err(ApiError::unsupported_media_type(ct)),
        }
    }
}

/// RFC 6902 JSON patch; a failed operation (e.g. a failed `test`) is 422, as on the real server.
pub fn json_patch(target: &mut Value, patch: Value) -> Result<(), ApiError> {
    let mut ops: json_patch::Patch = serde_json::from_value(patch)
        .map_err(|e| ApiError::bad_request(format!("error decoding patch: {e}")))?;
    // The real server treats a missing path as null in `test`, so `{"op":"test",
    // "path":"/metadata/finalizers","value":null}` passes on an object without finalizers
    // (kube-runtime's finalizer helper sends exactly that).
    ops.0.retain(|op| match op {
        json_patch::PatchOperation::Test(t) => {
            !(t.value.is_null() && target.pointer(t.path.as_str()).is_none())
        }
        _ => true,
    });
    // Not atomic: on an error the caller drops `target`.
    json_patch::patch_unsafe(target, &ops).map_err(|e| {
        let message =
            format!("the server rejected our request due to an error in our request: {e}");
        ApiError::new(422, "Invalid", message)
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_json_patch_test_of_null_passes_on_a_missing_field() {
        let mut obj = json!({"metadata": {"name": "p"}});
        let patch = json!([
            {"op": "test", "path": "/metadata/finalizers", "value": null},
            {"op": "add", "path": "/metadata/finalizers", "value": ["f"]},
        ]);
        json_patch(&mut obj, patch).unwrap();
        assert_eq!(obj["metadata"]["finalizers"], json!(["f"]));
        let failing = json!([{"op": "test", "path": "/metadata/name", "value": "q"}]);
        assert_eq!(json_patch(&mut obj, failing).unwrap_err().code, 422);
    }
}
