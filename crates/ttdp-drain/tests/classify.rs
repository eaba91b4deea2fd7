//! The pure parts: pod classification on every kind of pod, the device predicate, the two-pass
//! options and the messages a user reads.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use jiff::Timestamp;
use k8s_openapi::api::core::v1::Pod;
use serde_json::{Value, json};
use ttdp_drain::{
    CallerVerdict, ClassifyContext, DaemonSetLookup, DevicePredicate, Disposition, DrainError,
    ObjectKey, Pass, PodDecision, PodPredicate, PodRef, PodRules, Reason, StuckPod, StuckReason,
    TwoPassDrain, TwoPassReport, classify, classify_all,
};
use ttdp_selector::Selector;

/// A running pod `ns/name` with one container; `patch` is merged into it.
fn pod(name: &str, patch: Value) -> Pod {
    let mut v = json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": "default", "uid": format!("uid-{name}")},
        "spec": {"nodeName": "n1", "containers": [{"name": "main", "image": "busybox"}]},
        "status": {"phase": "Running"},
    });
    merge(&mut v, patch);
    serde_json::from_value(v).unwrap()
}

fn merge(target: &mut Value, patch: Value) {
    match (target, patch) {
        (Value::Object(t), Value::Object(p)) => {
            for (k, v) in p {
                merge(t.entry(k).or_insert(Value::Null), v);
            }
        }
        (t, p) => *t = p,
    }
}

fn owned_by(kind: &str, name: &str) -> Value {
    json!({"metadata": {"ownerReferences": [{
        "apiVersion": "apps/v1", "kind": kind, "name": name, "uid": format!("uid-{name}"), "controller": true,
    }]}})
}

fn with(a: Value, b: Value) -> Value {
    let mut a = a;
    merge(&mut a, b);
    a
}

fn empty_dir() -> Value {
    json!({"spec": {"volumes": [{"name": "scratch", "emptyDir": {}}]}})
}

fn phase(p: &str) -> Value {
    json!({"status": {"phase": p}})
}

fn now() -> Timestamp {
    "2026-01-01T12:00:00Z".parse().unwrap()
}

fn ctx() -> ClassifyContext {
    ClassifyContext::at(now())
}

fn decide(pod: &Pod, rules: &PodRules) -> (Disposition, Reason, Vec<Reason>) {
    let d = classify(pod, rules, &ctx());
    assert_eq!(d.pod, PodRef::of(pod));
    (d.disposition, d.reason, d.warnings)
}

fn kubectl_flags(ignore_daemonsets: bool, delete_emptydir_data: bool, force: bool) -> PodRules {
    PodRules {
        ignore_daemonsets,
        delete_emptydir_data,
        force,
        ..PodRules::default()
    }
}

#[test]
fn controlled_pods_are_evicted_naming_their_controller() {
    for (kind, name) in [
        ("ReplicaSet", "web-7d9f"),
        ("StatefulSet", "db"),
        ("Job", "batch"),
    ] {
        let p = pod("p", owned_by(kind, name));
        let (d, r, w) = decide(&p, &PodRules::default());
        assert_eq!(d, Disposition::Evict, "{kind}");
        assert_eq!(
            r,
            Reason::Controlled {
                kind: kind.into(),
                name: name.into()
            }
        );
        assert_eq!(r.to_string(), format!("controlled by {kind} {name}"));
        assert!(w.is_empty());
    }
}

#[test]
fn bare_pods_are_refused_unless_forced() {
    let p = pod("bare", json!({}));
    let (d, r, _) = decide(&p, &PodRules::default());
    assert_eq!((d, r.clone()), (Disposition::Refuse, Reason::Unmanaged));
    assert_eq!(
        r.to_string(),
        "cannot delete Pods that declare no controller (use --force to override)"
    );
    let (d, r, w) = decide(&p, &kubectl_flags(false, false, true));
    assert_eq!((d, r), (Disposition::Evict, Reason::NoController));
    assert_eq!(w, [Reason::DeletingUnmanaged]);
    assert_eq!(w[0].to_string(), "deleting Pods that declare no controller");
}

#[test]
fn mirror_pods_are_always_skipped() {
    let mirror = with(
        json!({"metadata": {"annotations": {"kubernetes.io/config.mirror": "abc"}}}),
        json!({"metadata": {"ownerReferences": [{"apiVersion": "v1", "kind": "Node", "name": "n1", "uid": "n", "controller": true}]}}),
    );
    let p = pod("etcd-n1", mirror.clone());
    for rules in [PodRules::default(), kubectl_flags(true, true, true)] {
        assert_eq!(decide(&p, &rules).0, Disposition::Skip);
        assert_eq!(decide(&p, &rules).1, Reason::Mirror);
    }
    // A mirror pod without a controller reference is still skipped, not refused as bare.
    let p = pod(
        "static",
        json!({"metadata": {"annotations": {"kubernetes.io/config.mirror": "x"}}}),
    );
    assert_eq!(decide(&p, &PodRules::default()).1, Reason::Mirror);
    // Even when it has finished.
    let p = pod("etcd-done", with(mirror, phase("Succeeded")));
    assert_eq!(decide(&p, &PodRules::default()).0, Disposition::Skip);
}

#[test]
fn daemonset_pods_are_refused_or_ignored() {
    let p = pod("proxy-x", owned_by("DaemonSet", "proxy"));
    let (d, r, _) = decide(&p, &PodRules::default());
    assert_eq!(
        (d, r.clone()),
        (Disposition::Refuse, Reason::DaemonSetManaged)
    );
    assert_eq!(
        r.to_string(),
        "DaemonSet-managed Pods (use --ignore-daemonsets to ignore)"
    );
    let (d, r, _) = decide(&p, &kubectl_flags(true, false, false));
    assert_eq!(
        (d, r.clone()),
        (Disposition::Skip, Reason::DaemonSetIgnored)
    );
    assert_eq!(r.to_string(), "ignoring DaemonSet-managed Pods");
    // DaemonSet pods with emptyDir are skipped before the local-storage check.
    let p = pod("agent", with(owned_by("DaemonSet", "agent"), empty_dir()));
    assert_eq!(
        decide(&p, &kubectl_flags(true, false, false)).0,
        Disposition::Skip
    );
}

#[test]
fn orphaned_daemonset_pods_need_force_and_failed_lookups_refuse() {
    let p = pod("proxy-x", owned_by("DaemonSet", "proxy"));
    let key = ObjectKey::new("default", "proxy");
    let mut c = ctx();
    c.daemonsets.insert(key.clone(), DaemonSetLookup::Missing);
    let d = classify(&p, &kubectl_flags(true, false, false), &c);
    assert_eq!(d.disposition, Disposition::Refuse);
    assert_eq!(d.reason.to_string(), "daemonsets.apps \"proxy\" not found");
    let d = classify(&p, &kubectl_flags(true, false, true), &c);
    assert_eq!(d.disposition, Disposition::Evict);
    assert_eq!(
        d.reason,
        Reason::Controlled {
            kind: "DaemonSet".into(),
            name: "proxy".into()
        }
    );
    assert_eq!(
        d.warnings,
        [Reason::DaemonSetMissing {
            daemonset: key.clone()
        }]
    );

    c.daemonsets
        .insert(key.clone(), DaemonSetLookup::Failed("forbidden".into()));
    let d = classify(&p, &kubectl_flags(true, true, true), &c);
    assert_eq!(d.disposition, Disposition::Refuse);
    assert_eq!(
        d.reason.to_string(),
        "cannot look up DaemonSet default/proxy: forbidden"
    );
    assert_eq!(
        ttdp_drain::classify::daemonset_to_look_up(&p, &PodRules::default()),
        Some(key)
    );
}

#[test]
fn emptydir_pods_need_delete_emptydir_data() {
    let p = pod("cache", with(owned_by("ReplicaSet", "cache"), empty_dir()));
    let (d, r, _) = decide(&p, &PodRules::default());
    assert_eq!((d, r.clone()), (Disposition::Refuse, Reason::LocalStorage));
    assert_eq!(
        r.to_string(),
        "Pods with local storage (use --delete-emptydir-data to override)"
    );
    let (d, _, w) = decide(&p, &kubectl_flags(false, true, false));
    assert_eq!(d, Disposition::Evict);
    assert_eq!(w, [Reason::DeletingLocalStorage]);
    assert_eq!(w[0].to_string(), "deleting Pods with local storage");
}

#[test]
fn checks_run_in_kubectls_order() {
    // A bare pod with emptyDir is refused for local storage first, as kubectl reports it.
    let p = pod("scratch", empty_dir());
    assert_eq!(decide(&p, &PodRules::default()).1, Reason::LocalStorage);
    assert_eq!(
        decide(&p, &kubectl_flags(false, true, false)).1,
        Reason::Unmanaged
    );
    let (d, _, w) = decide(&p, &kubectl_flags(false, true, true));
    assert_eq!(d, Disposition::Evict);
    assert_eq!(w, [Reason::DeletingLocalStorage, Reason::DeletingUnmanaged]);
}

#[test]
fn finished_pods_are_deleted_whatever_they_are() {
    for (name, extra) in [
        ("bare", json!({})),
        ("job", owned_by("Job", "j")),
        ("ds", owned_by("DaemonSet", "d")),
        ("scratch", empty_dir()),
    ] {
        for ph in ["Succeeded", "Failed"] {
            let p = pod(name, with(extra.clone(), phase(ph)));
            let (d, r, w) = decide(&p, &PodRules::default());
            assert_eq!(d, Disposition::Delete, "{name} {ph}");
            assert_eq!(r, Reason::Finished { phase: ph.into() });
            assert_eq!(r.to_string(), format!("pod has finished ({ph})"));
            assert!(w.is_empty());
            assert_eq!(
                ttdp_drain::classify::daemonset_to_look_up(&p, &PodRules::default()),
                None
            );
        }
    }
}

#[test]
fn pending_pods_are_evicted_like_running_ones() {
    let p = pod("p", with(owned_by("ReplicaSet", "r"), phase("Pending")));
    assert_eq!(decide(&p, &PodRules::default()).0, Disposition::Evict);
}

#[test]
fn the_selector_skips_unselected_pods_before_anything_can_refuse() {
    let rules = PodRules {
        selector: Selector::parse("tier notin (system),app").unwrap(),
        ..PodRules::default()
    };
    let selected = pod(
        "web",
        with(
            owned_by("ReplicaSet", "web"),
            json!({"metadata": {"labels": {"app": "web"}}}),
        ),
    );
    let system = pod(
        "sys",
        json!({"metadata": {"labels": {"app": "x", "tier": "system"}}}),
    );
    let unlabelled_bare = pod("bare", json!({}));
    let decisions = classify_all([&selected, &system, &unlabelled_bare], &rules, &ctx());
    let summary: Vec<(&str, Disposition, &Reason)> = decisions
        .iter()
        .map(|d| (d.pod.name.as_str(), d.disposition, &d.reason))
        .collect();
    assert_eq!(
        summary,
        [
            (
                "web",
                Disposition::Evict,
                &Reason::Controlled {
                    kind: "ReplicaSet".into(),
                    name: "web".into()
                }
            ),
            ("sys", Disposition::Skip, &Reason::NotSelected),
            ("bare", Disposition::Skip, &Reason::NotSelected),
        ]
    );
}

fn tt_device() -> DevicePredicate {
    DevicePredicate {
        host_path_prefixes: vec![ttdp_api::names::DEVICE_PATH.into()],
        resource_prefixes: vec![ttdp_api::names::DEVICE_RESOURCE_PREFIX.into()],
    }
}

fn host_path(path: &str, privileged: bool) -> Value {
    json!({"spec": {
        "volumes": [{"name": "dev", "hostPath": {"path": path}}],
        "containers": [{"name": "main", "image": "busybox",
            "securityContext": {"privileged": privileged},
            "volumeMounts": [{"name": "dev", "mountPath": "/dev/host"}]}],
    }})
}

#[test]
fn device_predicate_recognises_every_way_to_use_the_device() {
    let device = tt_device();
    let uses = |patch: Value| device.matches(&pod("p", patch));
    assert!(uses(host_path("/dev/tenstorrent", false)));
    assert!(uses(host_path("/dev/tenstorrent/", false)));
    assert!(uses(host_path("/dev/tenstorrent/0", false)));
    assert!(uses(host_path("/dev", true)));
    assert!(uses(host_path("/", true)));
    assert!(
        !uses(host_path("/dev", false)),
        "unprivileged /dev cannot open the device"
    );
    assert!(
        !uses(host_path("/dev/tenstorrentx", true)),
        "a sibling path"
    );
    assert!(!uses(host_path("/var/log", true)));
    assert!(uses(
        json!({"spec": {"containers": [{"name": "m", "image": "i",
        "resources": {"requests": {"tenstorrent.com/n300": "1"}}}]}})
    ));
    assert!(uses(
        json!({"spec": {"containers": [{"name": "m", "image": "i",
        "resources": {"limits": {"tenstorrent.com/p150": "1"}}}]}})
    ));
    assert!(uses(
        json!({"spec": {"initContainers": [{"name": "init", "image": "i",
        "resources": {"limits": {"tenstorrent.com/n150": "1"}}}]}})
    ));
    assert!(!uses(
        json!({"spec": {"containers": [{"name": "m", "image": "i",
        "resources": {"limits": {"nvidia.com/gpu": "1", "cpu": "1"}}}]}})
    ));
    // /dev mounted by an unprivileged container, privileged sibling without the mount.
    assert!(!uses(json!({"spec": {
        "volumes": [{"name": "dev", "hostPath": {"path": "/dev"}}],
        "containers": [
            {"name": "a", "image": "i", "volumeMounts": [{"name": "dev", "mountPath": "/dev"}]},
            {"name": "b", "image": "i", "securityContext": {"privileged": true}},
        ],
    }})));
    assert!(!DevicePredicate::default().matches(&pod("p", host_path("/dev", true))));
}

#[test]
fn device_scope_skips_other_pods_and_removes_device_users() {
    let rules = PodRules {
        device: Some(tt_device()),
        ignore_daemonsets: true,
        ..PodRules::default()
    };
    let bare_other = pod("other", json!({}));
    assert_eq!(
        decide(&bare_other, &rules).1,
        Reason::NotDeviceUser,
        "a bare pod without the device must not block a device-only drain"
    );
    let user = pod(
        "llm",
        with(
            owned_by("StatefulSet", "llm"),
            host_path("/dev/tenstorrent", false),
        ),
    );
    assert_eq!(decide(&user, &rules).0, Disposition::Evict);
    let bare_user = pod("bare-llm", host_path("/dev/tenstorrent/1", false));
    assert_eq!(decide(&bare_user, &rules).1, Reason::Unmanaged);
    let agent = pod(
        "agent",
        with(owned_by("DaemonSet", "ttdrv-x"), host_path("/dev", true)),
    );
    assert_eq!(decide(&agent, &rules).1, Reason::DaemonSetIgnored);
}

#[test]
fn the_callers_predicate_runs_after_kubectls_checks() {
    let verdict = |v: CallerVerdict| PodRules {
        extra: Some(PodPredicate::new(move |p: &Pod| {
            if p.metadata.name.as_deref() == Some("keep") {
                v.clone()
            } else {
                CallerVerdict::Allow
            }
        })),
        ..PodRules::default()
    };
    let keep = pod("keep", owned_by("ReplicaSet", "r"));
    let other = pod("other", owned_by("ReplicaSet", "r"));
    let skip = verdict(CallerVerdict::Skip("pinned by the caller".into()));
    assert_eq!(
        decide(&keep, &skip).1,
        Reason::Caller("pinned by the caller".into())
    );
    assert_eq!(decide(&keep, &skip).0, Disposition::Skip);
    assert_eq!(decide(&other, &skip).0, Disposition::Evict);
    let refuse = verdict(CallerVerdict::Refuse("holds a lease".into()));
    assert_eq!(decide(&keep, &refuse).0, Disposition::Refuse);
    // kubectl's refusal wins over the caller's skip.
    let bare_keep = pod("keep", json!({}));
    assert_eq!(decide(&bare_keep, &skip).1, Reason::Unmanaged);
}

#[test]
fn long_terminating_pods_are_skipped_only_with_skip_wait_timeout() {
    let since = |ago_secs: i64| {
        let t = now() - jiff::SignedDuration::from_secs(ago_secs);
        with(
            owned_by("ReplicaSet", "r"),
            json!({"metadata": {"deletionTimestamp": t.to_string(), "deletionGracePeriodSeconds": 30}}),
        )
    };
    let rules = PodRules {
        skip_wait_for_delete_timeout: Some(Duration::from_secs(300)),
        ..PodRules::default()
    };
    assert_eq!(
        decide(&pod("old", since(600)), &rules).1,
        Reason::DeletionOverdue
    );
    assert_eq!(decide(&pod("new", since(60)), &rules).0, Disposition::Evict);
    assert_eq!(
        decide(&pod("old", since(600)), &PodRules::default()).0,
        Disposition::Evict
    );
}

fn two_pass() -> TwoPassDrain {
    TwoPassDrain {
        device: tt_device(),
        full_node: true,
        pod_selector: Selector::parse("team=ml").unwrap(),
        force: true,
        delete_emptydir_data: false,
        options: Default::default(),
    }
}

#[test]
fn two_pass_options_follow_the_spec() {
    let plan = two_pass();
    assert_eq!(plan.passes(), [Pass::Device, Pass::FullNode]);
    let p1 = plan.pass_options(Pass::Device).rules;
    assert!(p1.device.is_some() && p1.selector.is_empty());
    assert!(p1.force && p1.ignore_daemonsets && p1.skip_unmanaged);
    assert!(
        !p1.delete_emptydir_data,
        "deleteEmptyDir off keeps emptyDir data in pass 1 too"
    );
    let p2 = plan.pass_options(Pass::FullNode).rules;
    assert!(p2.device.is_none());
    assert_eq!(p2.selector.to_string(), "team=ml");
    assert!(p2.force && p2.ignore_daemonsets && !p2.delete_emptydir_data && p2.skip_unmanaged);

    // Both passes refuse a device user with emptyDir while deleteEmptyDir is off, and evict it
    // once it is on.
    let scratch_user = pod(
        "u",
        with(
            owned_by("ReplicaSet", "u"),
            json!({
                "metadata": {"labels": {"team": "ml"}},
                "spec": {"volumes": [
                    {"name": "scratch", "emptyDir": {}},
                    {"name": "dev", "hostPath": {"path": "/dev/tenstorrent"}},
                ]},
            }),
        ),
    );
    let (disposition, reason, _) = decide(&scratch_user, &p1);
    assert_eq!(
        (disposition, reason),
        (Disposition::Refuse, Reason::LocalStorage)
    );
    assert_eq!(decide(&scratch_user, &p2).1, Reason::LocalStorage);
    let deleting = TwoPassDrain {
        delete_emptydir_data: true,
        ..two_pass()
    };
    for pass in [Pass::Device, Pass::FullNode] {
        let rules = deleting.pass_options(pass).rules;
        assert!(rules.delete_emptydir_data, "{pass} pass");
        assert_eq!(decide(&scratch_user, &rules).0, Disposition::Evict);
    }

    let no_full = TwoPassDrain {
        full_node: false,
        ..two_pass()
    };
    assert_eq!(no_full.passes(), [Pass::Device]);
}

#[test]
fn messages_name_the_pod_and_the_cause() {
    let web = PodRef {
        namespace: "default".into(),
        name: "web-0".into(),
        uid: "u".into(),
    };
    let blocked = StuckPod {
        pod: web.clone(),
        why: StuckReason::Blocked {
            budget: Some(ObjectKey::new("default", "web-pdb")),
            disruptions_allowed: Some(0),
            message: "Cannot evict pod as it would violate the pod's disruption budget.".into(),
            held: Vec::new(),
        },
    };
    assert_eq!(
        blocked.to_string(),
        "default/web-0: eviction blocked by PodDisruptionBudget default/web-pdb (0 disruptions allowed)"
    );
    let terminating = StuckPod {
        pod: web.clone(),
        why: StuckReason::Terminating {
            waiting: Some(Duration::from_secs(42)),
            grace_period_seconds: Some(30),
            finalizers: vec!["example.com/flush".into()],
        },
    };
    assert_eq!(
        terminating.to_string(),
        "default/web-0: still terminating (removal accepted 42s ago; grace period 30s; finalizers: example.com/flush)"
    );
    let timeout = DrainError::Timeout {
        node: "n1".into(),
        pass: Some(Pass::FullNode),
        timeout: Duration::from_secs(60),
        remaining: vec![blocked, terminating],
    };
    let text = timeout.to_string();
    assert!(
        text.starts_with("drain of node n1 (full-node pass) timed out after 60s; still on the node: default/web-0: eviction blocked"),
        "{text}"
    );
    let refused = DrainError::Refused {
        node: "n1".into(),
        pass: None,
        pods: vec![PodDecision {
            pod: web,
            disposition: Disposition::Refuse,
            reason: Reason::Unmanaged,
            warnings: vec![],
        }],
    };
    assert_eq!(
        refused.to_string(),
        "cannot drain node n1: default/web-0: cannot delete Pods that declare no controller (use --force to override)"
    );
}

/// The spec's `force`: without it, pods nothing recreates are skipped and the drain goes on.
fn spec_rules(force: bool) -> PodRules {
    PodRules {
        ignore_daemonsets: true,
        delete_emptydir_data: true,
        force,
        skip_unmanaged: true,
        ..PodRules::default()
    }
}

#[test]
fn bare_pods_are_skipped_without_force_and_evicted_with_it() {
    let p = pod("bare", json!({}));
    let d = classify(&p, &spec_rules(false), &ctx());
    assert_eq!(
        (d.disposition, &d.reason),
        (Disposition::Skip, &Reason::UnmanagedSkipped)
    );
    assert!(d.warnings.is_empty() && d.skipped_without_force());
    assert_eq!(
        d.reason.to_string(),
        "declares no controller; skipped because force is off"
    );
    let d = classify(&p, &spec_rules(true), &ctx());
    assert_eq!(
        (d.disposition, &d.reason),
        (Disposition::Evict, &Reason::NoController)
    );
    assert_eq!(d.warnings, [Reason::DeletingUnmanaged]);
    assert!(!d.skipped_without_force());
}

#[test]
fn skip_unmanaged_is_off_by_default_so_default_rules_stay_kubectl() {
    assert!(!PodRules::default().skip_unmanaged);
    let p = pod("bare", json!({}));
    let rules = PodRules {
        skip_unmanaged: false,
        ..spec_rules(false)
    };
    assert_eq!(decide(&p, &rules).1, Reason::Unmanaged);
    assert!(!classify(&p, &rules, &ctx()).skipped_without_force());
}

#[test]
fn a_bare_pod_with_emptydir_is_skipped_not_refused_for_its_data() {
    // It stays, so its data is safe: skipped even when emptyDir data may not be deleted.
    let p = pod("scratch", empty_dir());
    let keep_data = PodRules {
        delete_emptydir_data: false,
        ..spec_rules(false)
    };
    assert_eq!(decide(&p, &keep_data).1, Reason::UnmanagedSkipped);
    // With force it would be removed, so the emptyDir check refuses it, as kubectl does.
    let forced = PodRules {
        force: true,
        ..keep_data
    };
    assert_eq!(decide(&p, &forced).1, Reason::LocalStorage);
    // With both it goes, with both warnings.
    let (d, _, w) = decide(&p, &spec_rules(true));
    assert_eq!(d, Disposition::Evict);
    assert_eq!(w, [Reason::DeletingLocalStorage, Reason::DeletingUnmanaged]);
}

#[test]
fn controlled_emptydir_pods_are_still_refused_without_delete_emptydir_data() {
    let p = pod("cache", with(owned_by("ReplicaSet", "cache"), empty_dir()));
    let rules = PodRules {
        delete_emptydir_data: false,
        ..spec_rules(false)
    };
    assert_eq!(
        decide(&p, &rules),
        (Disposition::Refuse, Reason::LocalStorage, vec![])
    );
}

#[test]
fn finished_and_mirror_bare_pods_are_not_skipped_for_force() {
    let done = pod("done", phase("Succeeded"));
    let d = classify(&done, &spec_rules(false), &ctx());
    assert_eq!(d.disposition, Disposition::Delete);
    assert!(!d.skipped_without_force());
    let mirror = pod(
        "static",
        json!({"metadata": {"annotations": {"kubernetes.io/config.mirror": "x"}}}),
    );
    let d = classify(&mirror, &spec_rules(false), &ctx());
    assert_eq!(
        (d.disposition, d.reason.clone()),
        (Disposition::Skip, Reason::Mirror)
    );
    assert!(!d.skipped_without_force());
}

#[test]
fn orphaned_daemonset_pods_are_skipped_without_force() {
    let p = pod("proxy-x", owned_by("DaemonSet", "proxy"));
    let key = ObjectKey::new("default", "proxy");
    let mut c = ctx();
    c.daemonsets.insert(key.clone(), DaemonSetLookup::Missing);
    let d = classify(&p, &spec_rules(false), &c);
    assert_eq!(d.disposition, Disposition::Skip);
    assert_eq!(d.reason, Reason::DaemonSetMissing { daemonset: key });
    assert!(d.skipped_without_force());
    assert_eq!(
        classify(&p, &spec_rules(true), &c).disposition,
        Disposition::Evict
    );
    // A DaemonSet that could not be looked up still refuses: that is not force's to decide.
    c.daemonsets.insert(
        ObjectKey::new("default", "proxy"),
        DaemonSetLookup::Failed("forbidden".into()),
    );
    assert_eq!(
        classify(&p, &spec_rules(false), &c).disposition,
        Disposition::Refuse
    );
}

#[test]
fn a_mixed_node_without_force_refuses_nothing_and_skips_only_bare_pods() {
    let pods = [
        pod("web", owned_by("ReplicaSet", "web")),
        pod(
            "agent",
            with(owned_by("DaemonSet", "ttdrv-x"), host_path("/dev", true)),
        ),
        pod("bare", json!({})),
        pod("bare-scratch", empty_dir()),
        pod("cache", with(owned_by("ReplicaSet", "cache"), empty_dir())),
        pod(
            "etcd-n1",
            json!({"metadata": {"annotations": {"kubernetes.io/config.mirror": "h"}}}),
        ),
        pod("bare-done", phase("Failed")),
    ];
    let decisions = classify_all(&pods, &spec_rules(false), &ctx());
    let got: Vec<_> = decisions
        .iter()
        .map(|d| {
            (
                d.pod.name.as_str(),
                d.disposition,
                d.skipped_without_force(),
            )
        })
        .collect();
    assert_eq!(
        got,
        [
            ("web", Disposition::Evict, false),
            ("agent", Disposition::Skip, false),
            ("bare", Disposition::Skip, true),
            ("bare-scratch", Disposition::Skip, true),
            ("cache", Disposition::Evict, false),
            ("etcd-n1", Disposition::Skip, false),
            ("bare-done", Disposition::Delete, false),
        ]
    );
    let forced = classify_all(&pods, &spec_rules(true), &ctx());
    let removed: Vec<_> = forced
        .iter()
        .filter(|d| d.disposition.removes())
        .map(|d| d.pod.name.as_str())
        .collect();
    assert_eq!(
        removed,
        ["web", "bare", "bare-scratch", "cache", "bare-done"]
    );
}

#[test]
fn the_device_pass_skips_bare_device_users_without_force() {
    let plan = TwoPassDrain {
        force: false,
        ..two_pass()
    };
    let bare_user = pod("bare-llm", host_path("/dev/tenstorrent/1", false));
    let bare_other = pod(
        "bare-other",
        json!({"metadata": {"labels": {"team": "ml"}}}),
    );
    let p1 = plan.pass_options(Pass::Device).rules;
    assert_eq!(decide(&bare_user, &p1).1, Reason::UnmanagedSkipped);
    assert_eq!(decide(&bare_other, &p1).1, Reason::NotDeviceUser);
    let p2 = plan.pass_options(Pass::FullNode).rules;
    assert_eq!(decide(&bare_other, &p2).1, Reason::UnmanagedSkipped);
    let forced = two_pass().pass_options(Pass::Device).rules;
    assert_eq!(decide(&bare_user, &forced).0, Disposition::Evict);
}

#[test]
fn the_two_pass_report_names_each_skipped_pod_once() {
    let bare_user = pod("bare-llm", host_path("/dev/tenstorrent/1", false));
    let bare_other = pod(
        "bare-other",
        json!({"metadata": {"labels": {"team": "ml"}}}),
    );
    let web = pod(
        "web",
        with(
            owned_by("ReplicaSet", "web"),
            json!({"metadata": {"labels": {"team": "ml"}}}),
        ),
    );
    let plan = TwoPassDrain {
        force: false,
        ..two_pass()
    };
    let report = |pass: Pass, pods: &[&Pod]| {
        let decisions = classify_all(pods.iter().copied(), &plan.pass_options(pass).rules, &ctx());
        ttdp_drain::DrainReport {
            node: "n1".into(),
            skipped_without_force: decisions
                .iter()
                .filter(|d| d.skipped_without_force())
                .map(|d| d.pod.clone())
                .collect(),
            decisions,
            evicted: vec![],
            deleted: vec![],
            dry_run: false,
            elapsed: Duration::ZERO,
        }
    };
    let all = [&bare_user, &bare_other, &web];
    let two = TwoPassReport {
        device: report(Pass::Device, &all),
        full_node: Some(report(Pass::FullNode, &all)),
    };
    let names: Vec<_> = two
        .skipped_without_force()
        .into_iter()
        .map(|p| p.name)
        .collect();
    assert_eq!(names, ["bare-llm", "bare-other"]);
    let device: Vec<_> = two
        .device
        .skipped_without_force
        .iter()
        .map(|p| p.name.as_str())
        .collect();
    assert_eq!(
        device,
        ["bare-llm"],
        "pass 1's skipped pods are the device users"
    );
}
