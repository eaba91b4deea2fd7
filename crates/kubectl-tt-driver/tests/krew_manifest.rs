//! The krew manifest (`deploy/krew/tt-driver.yaml`) stays installable: the fields krew
//! requires, the crate's version, the binary's name on every platform, and the completion
//! helper shipped beside it.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::PathBuf;

fn manifest() -> serde_json::Value {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../deploy/krew/tt-driver.yaml");
    let text = std::fs::read_to_string(&path).unwrap();
    serde_saphyr::from_str(&text).unwrap()
}

#[test]
fn krew_manifest_matches_the_crate() {
    let m = manifest();
    assert_eq!(
        m["apiVersion"],
        "krew.googlecontainertools.github.com/v1alpha2"
    );
    assert_eq!(m["kind"], "Plugin");
    assert_eq!(m["metadata"]["name"], "tt-driver");
    let version = format!("v{}", env!("CARGO_PKG_VERSION"));
    assert_eq!(m["spec"]["version"], version.as_str());
    for field in ["homepage", "shortDescription", "description", "caveats"] {
        assert!(
            m["spec"][field].as_str().is_some_and(|s| !s.is_empty()),
            "spec.{field} missing"
        );
    }
    let platforms = m["spec"]["platforms"].as_array().unwrap();
    assert!(!platforms.is_empty());
    for p in platforms {
        assert_eq!(p["bin"], "kubectl-tt-driver");
        let uri = p["uri"].as_str().unwrap();
        assert!(uri.starts_with("https://"), "{uri}");
        assert!(uri.contains(&version), "{uri} is not for {version}");
        let sha = p["sha256"].as_str().unwrap();
        assert!(
            sha.len() == 64 && sha.chars().all(|c| c.is_ascii_hexdigit()),
            "sha256 {sha:?}"
        );
        assert!(p["selector"]["matchLabels"]["os"].is_string());
        for exe in ["kubectl-tt-driver", "kubectl_complete-tt-driver"] {
            assert!(
                p["files"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .any(|f| f["from"] == exe),
                "{exe} not installed from {uri}"
            );
        }
    }
}
