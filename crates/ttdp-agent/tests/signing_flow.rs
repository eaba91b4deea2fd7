//! The agent with `spec.module.signing` on simulated nodes: a missing Secret fails the node with
//! `SigningKeyUnusable` naming it and leaves the loaded module alone; with the key, the module
//! it builds is signed and the report names the signer; where signatures are enforced and the
//! module is unsigned, nothing is unloaded and the message says how to enroll the key. The
//! report names the signer of the module that is loaded, even once its cache entry was
//! re-signed with another key without a reload.
//!
//! Needs `openssl` and a kernel `sign-file` (installed by `.ci/deps` and `.ci/vm-deps`).
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::path::Path;
use std::time::Duration;

use common::{Node, Recording, make_signing_key, v};
use tokio_util::sync::CancellationToken;
use ttdp_agent::{NodeAgent, NodeKernel};
use ttdp_api::agent_report::AgentPhase;
use ttdp_kmod::{CacheOutcome, InstallerConfig, ModuleInstaller, SigningConfig};

const SECRET: &str = "Secret ttdp-system/tt-kmd-signing (spec.module.signing)";

fn signing_in(dir: &Path) -> SigningConfig {
    SigningConfig {
        key: dir.join("tls.key"),
        cert: dir.join("tls.crt"),
        source: SECRET.into(),
    }
}

fn agent(node: &Node, version: &str, reporter: &Recording) -> NodeAgent<NodeKernel, Recording> {
    let mut config = node.config(version);
    config.retry.initial = Duration::from_secs(3600);
    config.signing = Some(signing_in(&node.dir.path().join("secret")));
    let kernel = NodeKernel::new(config.kernel, &config.host);
    NodeAgent::new(config, kernel, reporter.clone()).unwrap()
}

#[tokio::test]
async fn a_missing_signing_secret_fails_the_node_naming_it_and_keeps_the_module() {
    let node = Node::new(&["1.0.0", "2.0.0"]);
    node.preinstall("1.0.0");
    let reporter = Recording::default();
    let mut agent = agent(&node, "2.0.0", &reporter);

    agent.pass(&CancellationToken::new()).await.unwrap();

    assert_eq!(node.loaded().as_deref(), Some("1.0.0"));
    let failed = reporter.last_report().unwrap();
    assert_eq!(failed.phase, AgentPhase::Failed);
    assert_eq!(failed.reason.as_deref(), Some("SigningKeyUnusable"));
    let message = failed.message.unwrap();
    assert!(
        message.contains(SECRET) && message.contains("tls.crt"),
        "{message}"
    );
    assert!(
        !node.cached().contains(&"2.0.0".to_string()),
        "nothing unsigned was cached"
    );
}

#[tokio::test]
async fn the_module_built_is_signed_and_the_report_names_the_signer() {
    let node = Node::new(&["1.0.0"]);
    make_signing_key(&node.dir.path().join("secret"), "tt-kmd fleet key");
    let reporter = Recording::default();
    let mut agent = agent(&node, "1.0.0", &reporter);

    agent.pass(&CancellationToken::new()).await.unwrap();

    assert_eq!(node.loaded().as_deref(), Some("1.0.0"));
    let ready = reporter.last_report().unwrap();
    assert_eq!(ready.phase, AgentPhase::Ready, "{ready:?}");
    assert_eq!(ready.module_signer.as_deref(), Some("tt-kmd fleet key"));
}

#[tokio::test]
async fn enforcement_refuses_an_unsigned_module_before_unloading_and_says_how_to_enroll() {
    let node = Node::new(&["1.0.0", "2.0.0"]);
    node.preinstall("1.0.0");
    node.sim.enforce_signatures(true).unwrap();
    let reporter = Recording::default();
    let mut config = node.config("2.0.0");
    config.retry.initial = Duration::from_secs(3600);
    let kernel = NodeKernel::new(config.kernel, &config.host);
    let mut agent = NodeAgent::new(config, kernel, reporter.clone()).unwrap();

    agent.pass(&CancellationToken::new()).await.unwrap();

    assert_eq!(node.loaded().as_deref(), Some("1.0.0"));
    let failed = reporter.last_report().unwrap();
    assert_eq!(failed.reason.as_deref(), Some("SignatureRequired"));
    let message = failed.message.unwrap();
    assert!(
        message.contains("nothing was unloaded")
            && message.contains("mokutil --import")
            && message.contains("spec.module.signing"),
        "{message}"
    );
    assert_eq!(failed.module_signer, None, "the loaded module is unsigned");
}

/// The key is rotated after the load: the cache entry is re-signed with key B (as the next
/// swap's or the next kernel's preparation would do it) and the module is not reloaded. The
/// agent started with key B still reports key A, the signer of what the kernel runs.
#[tokio::test]
async fn the_report_names_the_signer_of_the_load_not_of_the_re_signed_entry() {
    let node = Node::new(&["1.0.0"]);
    let secret = node.dir.path().join("secret");
    make_signing_key(&secret, "tt-kmd key A");
    let reporter = Recording::default();
    let mut first = agent(&node, "1.0.0", &reporter);
    first.pass(&CancellationToken::new()).await.unwrap();
    let ready = reporter.last_report().unwrap();
    assert_eq!(ready.phase, AgentPhase::Ready, "{ready:?}");
    assert_eq!(ready.module_signer.as_deref(), Some("tt-kmd key A"));

    make_signing_key(&secret, "tt-kmd key B");
    let installer = ModuleInstaller::new(
        node.host().clone(),
        node.kernel(),
        InstallerConfig {
            build: node.config("1.0.0").build,
            ..InstallerConfig::default()
        },
    )
    .unwrap()
    .with_signing(signing_in(&secret));
    let resigned = installer.ensure_ko(&v("1.0.0")).unwrap();
    assert!(
        matches!(resigned.cache, CacheOutcome::Resigned { .. }),
        "{:?}",
        resigned.cache
    );
    let entry = resigned.ko.record.signature.unwrap();
    assert_eq!(entry.signer, "tt-kmd key B", "the entry is re-signed");

    let reporter = Recording::default();
    let mut restarted = agent(&node, "1.0.0", &reporter);
    restarted.pass(&CancellationToken::new()).await.unwrap();
    let report = reporter.last_report().unwrap();
    assert_eq!(report.phase, AgentPhase::Ready, "{report:?}");
    assert_eq!(node.loaded().as_deref(), Some("1.0.0"));
    assert_eq!(
        report.module_signer.as_deref(),
        Some("tt-kmd key A"),
        "the loaded module was signed by key A"
    );
}
