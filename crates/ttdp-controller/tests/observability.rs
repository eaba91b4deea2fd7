//! The chart's alerts and Grafana dashboard, checked against the controller's own metrics.
//!
//! - The chart renders its PrometheusRule and dashboard ConfigMap only when asked to, lints with
//!   both, and its schema rejects malformed alert and dashboard values.
//! - `promtool` (Debian's prometheus package) checks the rules as the chart renders them and
//!   runs their unit tests (`tests/data/alerts.test.yaml`): each alert fires once its condition
//!   has held long enough, and not before.
//! - The dashboard parses, its panel ids are unique, its data source is templated, and every
//!   expression of a panel or a rule names only metrics the controller exports.
//! - On a real control plane, a real Prometheus scrapes the controller every second with the
//!   chart's rules (`for: 1s`): a rollout halted by failures fires `TtdpRolloutHalted` (and no
//!   controller alert), and a new version that completes clears it.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod harness;

use std::collections::{BTreeSet, HashSet};
use std::net::{SocketAddr, TcpListener};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use harness::{Harness, STEP, condition, helm_binary, http_get_body, tt_node};
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;
use ttdp_controller::metrics::Metrics;
use ttdp_controller::server::{self, Readiness};

fn chart() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../deploy/helm/tt-k8s-driver-manager")
}

/// A binary of Debian's prometheus package; the test fails, not skips, without it.
fn prometheus_tool(name: &str) -> PathBuf {
    let p = Path::new("/usr/bin").join(name);
    assert!(
        p.is_file(),
        "{} not found: install Debian's prometheus package (`apt-get install prometheus`, \
         as `bash .ci/deps` does)",
        p.display()
    );
    p
}

/// The chart's objects as `helm template` renders them with `sets`.
fn render(sets: &[&str]) -> Vec<Value> {
    let mut cmd = Command::new(helm_binary());
    cmd.args(["template", "tt-k8s-driver-manager"])
        .arg(chart())
        .args(["-n", "tt-k8s-driver-manager-system"]);
    for s in sets {
        cmd.args(["--set", s]);
    }
    let out = cmd.output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let docs: Vec<Value> =
        serde_saphyr::from_multiple(&String::from_utf8(out.stdout).unwrap()).unwrap();
    docs.into_iter().filter(|d| !d.is_null()).collect()
}

fn of_kind<'a>(docs: &'a [Value], kind: &str) -> Vec<&'a Value> {
    docs.iter().filter(|d| d["kind"] == kind).collect()
}

fn dashboards(docs: &[Value]) -> Vec<&Value> {
    of_kind(docs, "ConfigMap")
        .into_iter()
        .filter(|d| d["metadata"]["name"] == "tt-k8s-driver-manager-dashboard")
        .collect()
}

/// The rule groups the chart ships with these thresholds, as a rules file for Prometheus
/// (JSON is YAML).
fn rendered_rules(for_: &str, step_stuck_minutes: u32) -> String {
    let docs = render(&[
        "metrics.prometheusRule.enabled=true",
        &format!("metrics.prometheusRule.for={for_}"),
        &format!("metrics.prometheusRule.stepStuckMinutes={step_stuck_minutes}"),
    ]);
    let rule = of_kind(&docs, "PrometheusRule");
    assert_eq!(rule.len(), 1, "one PrometheusRule");
    serde_json::to_string_pretty(&rule[0]["spec"]).unwrap()
}

fn dashboard_file() -> String {
    std::fs::read_to_string(chart().join("dashboards/ttdp.json")).unwrap()
}

#[test]
fn chart_renders_the_rule_and_the_dashboard_only_when_enabled() {
    let default = render(&[]);
    assert!(of_kind(&default, "PrometheusRule").is_empty());
    assert!(dashboards(&default).is_empty());
    let on = render(&[
        "metrics.prometheusRule.enabled=true",
        "metrics.prometheusRule.labels.release=kube-prometheus-stack",
        "metrics.grafanaDashboard.enabled=true",
        "metrics.grafanaDashboard.annotations.grafana_folder=Tenstorrent",
    ]);
    let rule = of_kind(&on, "PrometheusRule")[0];
    assert_eq!(rule["apiVersion"], "monitoring.coreos.com/v1");
    assert_eq!(
        rule["metadata"]["labels"]["release"],
        "kube-prometheus-stack"
    );
    assert_eq!(
        rule["metadata"]["namespace"],
        "tt-k8s-driver-manager-system"
    );
    let alerts: Vec<&str> = rule["spec"]["groups"][0]["rules"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["alert"].as_str().unwrap())
        .collect();
    assert_eq!(
        alerts,
        [
            "TtdpRolloutHalted",
            "TtdpNodeFailed",
            "TtdpStepStuck",
            "TtdpControllerDown",
            "TtdpControllerNotLeading",
            "TtdpNodesWouldBootWithoutDriver"
        ]
    );
    let dashboard = dashboards(&on)[0];
    assert_eq!(dashboard["metadata"]["labels"]["grafana_dashboard"], "1");
    assert_eq!(
        dashboard["metadata"]["annotations"]["grafana_folder"],
        "Tenstorrent"
    );
    assert_eq!(
        dashboard["data"]["tt-k8s-driver-manager.json"].as_str(),
        Some(dashboard_file().trim_end()),
        "the ConfigMap carries the chart's dashboard file unchanged"
    );
    let relabelled = render(&[
        "metrics.grafanaDashboard.enabled=true",
        "metrics.grafanaDashboard.labels.grafana_dashboard=null",
        "metrics.grafanaDashboard.labels.dashboards=ttdp",
    ]);
    let labels = &dashboards(&relabelled)[0]["metadata"]["labels"];
    assert_eq!(labels["dashboards"], "ttdp");
    assert!(labels.get("grafana_dashboard").is_none(), "{labels}");
    let metrics_off = render(&[
        "metrics.enabled=false",
        "metrics.prometheusRule.enabled=true",
        "metrics.grafanaDashboard.enabled=true",
    ]);
    assert!(of_kind(&metrics_off, "PrometheusRule").is_empty());
    assert!(dashboards(&metrics_off).is_empty());
}

#[test]
fn chart_lints_with_both_enabled_and_rejects_bad_alert_values() {
    let enabled = [
        "metrics.prometheusRule.enabled=true",
        "metrics.grafanaDashboard.enabled=true",
    ];
    let mut lint = Command::new(helm_binary());
    lint.args(["lint", "--strict"]).arg(chart());
    for s in enabled {
        lint.args(["--set", s]);
    }
    let out = lint.output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
    for bad in [
        "metrics.prometheusRule.stepStuckMinutes=0",
        "metrics.prometheusRule.for=5 minutes",
        "metrics.prometheusRule.severity=page",
        "metrics.grafanaDashboard.folder=ttdp",
    ] {
        let out = Command::new(helm_binary())
            .args(["template", "x"])
            .arg(chart())
            .args(["--set", enabled[0], "--set", enabled[1], "--set", bad])
            .output()
            .unwrap();
        assert!(!out.status.success(), "{bad} accepted");
        assert!(
            String::from_utf8_lossy(&out.stderr).contains("values don't meet the specifications"),
            "{bad}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

#[test]
fn alert_rules_pass_promtool_and_their_unit_tests() {
    let promtool = prometheus_tool("promtool");
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("ttdp.rules.yaml"), rendered_rules("5m", 30)).unwrap();
    let tests = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/data/alerts.test.yaml");
    std::fs::copy(tests, dir.path().join("alerts.test.yaml")).unwrap();
    for args in [
        ["check", "rules", "ttdp.rules.yaml"],
        ["test", "rules", "alerts.test.yaml"],
    ] {
        let out = Command::new(&promtool)
            .args(args)
            .current_dir(dir.path())
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "promtool {args:?}:\n{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

/// Every series name the controller exports, from its registry.
fn exported_series_names() -> BTreeSet<String> {
    Metrics::default().series_names().iter().cloned().collect()
}

/// The PromQL words and label names an expression may use besides metric names.
const PROMQL_WORDS: &[&str] = &[
    "sum",
    "min",
    "max",
    "by",
    "rate",
    "histogram_quantile",
    "time",
    "absent",
    "policy",
    "state",
    "phase",
    "result",
    "reason",
    "le",
    "to",
    "namespace",
];

/// The identifiers of a PromQL expression, without string literals, numbers, durations and
/// Grafana variables (`$policy`).
fn identifiers(expr: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut chars = expr.chars().peekable();
    while let Some(c) = chars.next() {
        let word_char = |c: &char| c.is_ascii_alphanumeric() || *c == '_' || *c == ':';
        if c == '"' {
            while chars.next().is_some_and(|c| c != '"') {}
        } else if c == '$' || c.is_ascii_digit() {
            while chars.next_if(|c| word_char(c) || *c == '.').is_some() {}
        } else if word_char(&c) {
            let mut word = c.to_string();
            while let Some(c) = chars.next_if(word_char) {
                word.push(c);
            }
            out.push(word);
        }
    }
    out
}

/// Checks that `expr` reads at least one of the controller's metrics and names nothing but
/// those, PromQL words and their labels.
fn check_names(what: &str, expr: &str, exported: &BTreeSet<String>) {
    let words = identifiers(expr);
    assert!(
        words.iter().any(|w| exported.contains(w)),
        "{what}: `{expr}` reads no metric of the controller"
    );
    for w in words {
        assert!(
            exported.contains(&w) || PROMQL_WORDS.contains(&w.as_str()),
            "{what}: `{expr}` names `{w}`, which the controller does not export \
             (it exports {exported:?})"
        );
    }
}

#[test]
fn the_name_check_catches_a_metric_the_controller_does_not_export() {
    let exported = exported_series_names();
    assert!(exported.contains("ttdp_leader"), "{exported:?}");
    assert!(exported.contains("ttdp_phase_duration_seconds_bucket"));
    assert!(exported.contains("ttdp_reconciles_total"));
    let wrong = std::panic::catch_unwind(|| {
        check_names("probe", r#"sum(ttdp_node{state="Failed"}) > 0"#, &exported);
    });
    assert!(wrong.is_err(), "a misspelled metric is caught");
    check_names(
        "probe",
        r#"histogram_quantile(0.95, sum by (le) (rate(ttdp_phase_duration_seconds_bucket{policy=~"$policy"}[$__rate_interval])))"#,
        &exported,
    );
}

#[test]
fn rule_expressions_name_only_exported_metrics() {
    let exported = exported_series_names();
    let rules: Value = serde_json::from_str(&rendered_rules("5m", 60)).unwrap();
    for rule in rules["groups"][0]["rules"].as_array().unwrap() {
        check_names(
            rule["alert"].as_str().unwrap(),
            rule["expr"].as_str().unwrap(),
            &exported,
        );
    }
}

/// The expressions of every panel, each with the panel's title.
fn panel_exprs(dashboard: &Value) -> Vec<(String, String)> {
    let mut out = Vec::new();
    for panel in dashboard["panels"].as_array().unwrap() {
        for target in panel["targets"].as_array().unwrap() {
            out.push((
                panel["title"].as_str().unwrap().to_owned(),
                target["expr"].as_str().unwrap().to_owned(),
            ));
        }
    }
    out
}

#[test]
fn dashboard_is_valid_and_reads_only_exported_metrics() {
    let dashboard: Value = serde_json::from_str(&dashboard_file()).expect("the dashboard parses");
    assert!(dashboard["title"].is_string() && dashboard["uid"].is_string());
    let variables = dashboard["templating"]["list"].as_array().unwrap();
    let datasource = variables
        .iter()
        .find(|v| v["name"] == "datasource")
        .expect("a data source variable");
    assert_eq!(
        (&datasource["type"], &datasource["query"]),
        (&json!("datasource"), &json!("prometheus"))
    );
    let templated = json!({"type": "prometheus", "uid": "${datasource}"});
    let panels = dashboard["panels"].as_array().unwrap();
    assert!(
        panels.len() >= 3,
        "rollout progress, states, step durations"
    );
    let mut ids = HashSet::new();
    for panel in panels {
        let title = panel["title"].as_str().unwrap();
        assert!(
            ids.insert(panel["id"].as_u64().unwrap()),
            "{title}: id taken"
        );
        assert_eq!(panel["datasource"], templated, "{title}");
        for key in ["x", "y", "w", "h"] {
            assert!(panel["gridPos"][key].is_u64(), "{title}: gridPos.{key}");
        }
        let targets = panel["targets"].as_array().unwrap();
        assert!(!targets.is_empty(), "{title}: no query");
        let mut refs = HashSet::new();
        for t in targets {
            assert_eq!(t["datasource"], templated, "{title}");
            assert!(refs.insert(t["refId"].as_str().unwrap()), "{title}: refId");
        }
    }
    let known: Vec<String> = variables
        .iter()
        .map(|v| format!("${}", v["name"].as_str().unwrap()))
        .chain(["$__rate_interval".to_owned()])
        .collect();
    let exported = exported_series_names();
    for (title, expr) in panel_exprs(&dashboard) {
        check_names(&title, &expr, &exported);
        for var in expr.match_indices('$').map(|(i, _)| &expr[i..]) {
            assert!(
                known.iter().any(|k| var.starts_with(k.as_str())),
                "{title}: unknown variable in {expr}"
            );
        }
    }
}

/// A loopback port nothing listens on now.
fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// A GET on `address`; the JSON body.
fn get_json(address: SocketAddr, path_and_query: &str) -> Option<Value> {
    serde_json::from_str(&http_get_body(address, path_and_query)?).ok()
}

fn url_encoded(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                char::from(b).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// Debian's Prometheus server, killed when dropped.
struct Prometheus {
    child: Child,
    address: SocketAddr,
    log: PathBuf,
}

impl Prometheus {
    /// Scrapes `target` every second and evaluates `rules` every second.
    fn start(dir: &Path, target: SocketAddr, rules: &str) -> Self {
        let binary = prometheus_tool("prometheus");
        std::fs::write(dir.join("ttdp.rules.yaml"), rules).unwrap();
        let config = json!({
            "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
            "rule_files": ["ttdp.rules.yaml"],
            "scrape_configs": [{
                "job_name": "ttdp-controller",
                "static_configs": [{"targets": [target.to_string()]}],
            }],
        });
        std::fs::write(dir.join("prometheus.yml"), config.to_string()).unwrap();
        let address: SocketAddr = format!("127.0.0.1:{}", free_port()).parse().unwrap();
        let log = dir.join("prometheus.log");
        let file = std::fs::File::create(&log).unwrap();
        let child = Command::new("setpriv")
            .args(["--pdeathsig", "KILL", "--"])
            .arg(binary)
            .arg(format!(
                "--config.file={}",
                dir.join("prometheus.yml").display()
            ))
            .arg(format!(
                "--storage.tsdb.path={}",
                dir.join("data").display()
            ))
            .arg(format!("--web.listen-address={address}"))
            .current_dir(dir)
            .stdin(Stdio::null())
            .stdout(file.try_clone().unwrap())
            .stderr(file)
            .spawn()
            .expect("cannot start prometheus under setpriv (util-linux)");
        Prometheus {
            child,
            address,
            log,
        }
    }

    fn log_tail(&self) -> String {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(20)..].join("\n")
    }

    /// The result of an instant query; `None` until Prometheus answers it.
    fn query(&self, expr: &str) -> Option<Value> {
        let answer = get_json(
            self.address,
            &format!("/api/v1/query?query={}", url_encoded(expr)),
        )?;
        assert_eq!(answer["status"], "success", "{expr}: {answer}");
        Some(answer["data"]["result"].clone())
    }

    /// The alerts pending or firing now.
    fn alerts(&self) -> Vec<Value> {
        get_json(self.address, "/api/v1/alerts")
            .and_then(|a| a["data"]["alerts"].as_array().cloned())
            .unwrap_or_default()
    }

    /// The state (`pending`, `firing`) of alert `name` for `policy`, if active.
    fn alert_state(&self, name: &str, policy: &str) -> Option<String> {
        self.alerts()
            .into_iter()
            .find(|a| a["labels"]["alertname"] == name && a["labels"]["policy"] == policy)
            .map(|a| a["state"].as_str().unwrap_or_default().to_owned())
    }

    /// Waits until `done` holds, polling every 200 ms.
    async fn wait(&self, what: &str, timeout: Duration, done: impl Fn(&Self) -> bool) {
        let start = Instant::now();
        while !done(self) {
            assert!(
                start.elapsed() < timeout,
                "Prometheus: {what} not seen in {timeout:?}; alerts {:?}; its log:\n{}",
                self.alerts(),
                self.log_tail()
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A rollout halted by failures fires `TtdpRolloutHalted` in a real Prometheus scraping the
/// controller, with the chart's rules; it was not firing before, and a new version that
/// completes clears it. Every dashboard expression is a query this Prometheus answers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_halted_rollout_fires_its_alert_in_a_real_prometheus() {
    let dir = tempfile::tempdir().unwrap();
    let h = Harness::start(|p| (0..3).map(|_| tt_node(p).loaded("2.7.0")).collect()).await;
    let stop_serving = CancellationToken::new();
    let (metrics_address, serving) = server::serve(
        "127.0.0.1:0".parse().unwrap(),
        h.metrics.clone(),
        Readiness::default(),
        stop_serving.clone(),
    )
    .await
    .unwrap();
    let prometheus = Prometheus::start(dir.path(), metrics_address, &rendered_rules("1s", 60));
    prometheus
        .wait("the controller scraped, leading", STEP, |p| {
            p.query("ttdp_leader == 1")
                .is_some_and(|r| r.as_array().is_some_and(|r| r.len() == 1))
        })
        .await;
    let policy = h.create_policy("fleet", "2.7.0", json!({})).await;
    h.wait_ready(&policy, STEP).await;
    prometheus
        .wait("the policy's halted gauge at 0", STEP, |p| {
            p.query(&format!(r#"ttdp_rollout_halted{{policy="{policy}"}} == 0"#))
                .is_some_and(|r| r.as_array().is_some_and(|r| r.len() == 1))
        })
        .await;
    assert_eq!(prometheus.alert_state("TtdpRolloutHalted", &policy), None);
    // 2.9.0's tag cannot be fetched: two nodes fail with one slot, which halts the rollout.
    h.patch_spec(&policy, json!({"version": "2.9.0"})).await;
    h.wait_policy(&policy, "the rollout halted", STEP * 2, |p| {
        condition(p, "Degraded").is_some_and(|c| c.0 == "True" && c.1 == "RolloutHalted")
    })
    .await;
    let halted_at = Instant::now();
    prometheus
        .wait("TtdpRolloutHalted firing", STEP, |p| {
            p.alert_state("TtdpRolloutHalted", &policy).as_deref() == Some("firing")
        })
        .await;
    eprintln!(
        "TtdpRolloutHalted firing {:?} after the halt",
        halted_at.elapsed()
    );
    let firing: Vec<Value> = prometheus.alerts();
    for quiet in ["TtdpControllerDown", "TtdpControllerNotLeading"] {
        assert!(
            !firing.iter().any(|a| a["labels"]["alertname"] == quiet),
            "{quiet} while the controller leads: {firing:?}"
        );
    }
    for (title, expr) in panel_exprs(&serde_json::from_str(&dashboard_file()).unwrap()) {
        let expr = expr
            .replace("$policy", ".*")
            .replace("$__rate_interval", "1m");
        let result = prometheus.query(&expr);
        assert!(result.is_some(), "{title}: `{expr}` not answered");
    }
    h.patch_spec(&policy, json!({"version": "2.8.0"})).await;
    h.wait_ready(&policy, STEP * 3).await;
    prometheus
        .wait("TtdpRolloutHalted cleared", STEP, |p| {
            p.alert_state("TtdpRolloutHalted", &policy).is_none()
        })
        .await;
    drop(prometheus);
    stop_serving.cancel();
    let _ = serving.await;
    h.shutdown().await;
}
