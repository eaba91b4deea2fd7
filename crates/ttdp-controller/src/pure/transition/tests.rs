use super::*;
use NodeState::*;

fn rules() -> RolloutRules {
    RolloutRules {
        target_version: "2.8.0".parse().unwrap(),
        target_parameters: String::new(),
        drain_enabled: true,
        gates_configured: true,
        drain_timeout: None,
        node_timeout: None,
        completion_wait: None,
    }
}

fn base() -> NodeObservation {
    NodeObservation {
        recorded: None,
        conflict_with: None,
        host_managed: false,
        loaded_version: None,
        parameters_differ: false,
        agent: AgentPod::Missing,
        cordoned_by_us: false,
        externally_cordoned: false,
        gates_closed_by_us: false,
        grant: UpgradeGrant::Absent,
        drain: DrainProgress::NotStarted,
        retry: RetryGate::NotYet,
        start: StartGate::Allowed,
        in_state_for: None,
        node_not_ready: None,
        held_for_jobs: false,
        failed_for_other_target: false,
        lifted_unrecorded: false,
        unsupported_compiler: None,
    }
}

fn with(f: impl FnOnce(&mut NodeObservation)) -> NodeObservation {
    let mut o = base();
    f(&mut o);
    o
}

fn old(o: &mut NodeObservation) {
    o.loaded_version = Some("2.7.0".into());
}

fn ours(o: &mut NodeObservation) {
    o.cordoned_by_us = true;
    o.gates_closed_by_us = true;
}

#[test]
fn a_drain_that_skipped_bare_pods_names_them_and_goes_on() {
    let t = next(
        &with(|o| {
            o.recorded = Some(Draining);
            ours(o);
            o.agent = AgentPod::Stale;
            old(o);
            o.drain = DrainProgress::Succeeded {
                skipped: vec![
                    "jobs/notebook (uses /dev/tenstorrent)".into(),
                    "default/debug".into(),
                ],
            }
        }),
        &rules(),
    );
    assert_eq!(
        (t.state, t.reason.as_deref()),
        (Upgrading, Some(reasons::BARE_PODS_SKIPPED))
    );
    let message = t.message.unwrap_or_default();
    assert!(
        message.contains("left 2 pod(s)")
            && message.contains("jobs/notebook (uses /dev/tenstorrent), default/debug")
            && message.contains("drain.force is off"),
        "{message}"
    );
    assert_eq!(
        t.actions,
        vec![Action::Grant, Action::ReplaceAgent { even_current: true }],
        "the swap goes on: skipped pods do not hold the node back"
    );
}

fn ready_on_target(o: &mut NodeObservation) {
    o.agent = AgentPod::Current(AgentCondition::Ready);
    o.loaded_version = Some("2.8.0".into());
}

/// Columns in the order of `NodeState::ALL`:
/// Pending, Cordoning, Draining, Upgrading, Uncordoning, Done, Failed, HostManaged, Conflict.
fn table() -> Vec<(&'static str, NodeObservation, [NodeState; 9])> {
    vec![
        (
            "no agent pod, no module",
            base(),
            [
                Pending, Cordoning, Cordoning, Upgrading, Done, Pending, Failed, Pending, Pending,
            ],
        ),
        (
            // Found in Upgrading without our cordon or grant: it never went through the
            // drain, so it goes through the gate again.
            "stale agent, old module loaded",
            with(|o| {
                o.agent = AgentPod::Stale;
                old(o)
            }),
            [
                Cordoning, Cordoning, Cordoning, Cordoning, Done, Cordoning, Failed, Cordoning,
                Cordoning,
            ],
        ),
        (
            "stale agent, no module loaded",
            with(|o| o.agent = AgentPod::Stale),
            [
                Upgrading, Cordoning, Cordoning, Upgrading, Done, Upgrading, Failed, Upgrading,
                Upgrading,
            ],
        ),
        (
            "stale agent, target already loaded (template-only change)",
            with(|o| {
                o.agent = AgentPod::Stale;
                o.loaded_version = Some("2.8.0".into())
            }),
            [
                Upgrading, Cordoning, Cordoning, Upgrading, Done, Upgrading, Failed, Upgrading,
                Upgrading,
            ],
        ),
        (
            // A recreated pod, or a node that joined with a module loaded: it takes the
            // gate like a stale pod, never straight to Upgrading.
            "current agent working, old module",
            with(|o| {
                o.agent = AgentPod::Current(AgentCondition::Working);
                old(o)
            }),
            [
                Cordoning, Cordoning, Cordoning, Cordoning, Done, Cordoning, Failed, Cordoning,
                Cordoning,
            ],
        ),
        (
            "current agent waiting for the grant, old module",
            with(|o| {
                o.agent = AgentPod::Current(AgentCondition::WaitingForGrant);
                old(o)
            }),
            [
                Cordoning, Cordoning, Cordoning, Cordoning, Done, Cordoning, Failed, Cordoning,
                Cordoning,
            ],
        ),
        (
            "current agent working, no module (fresh install)",
            with(|o| o.agent = AgentPod::Current(AgentCondition::Working)),
            [
                Upgrading, Cordoning, Cordoning, Upgrading, Done, Upgrading, Failed, Upgrading,
                Upgrading,
            ],
        ),
        (
            "cordoned by us, current agent waiting for the grant, old module",
            with(|o| {
                ours(o);
                o.agent = AgentPod::Current(AgentCondition::WaitingForGrant);
                old(o)
            }),
            [
                Draining,
                Draining,
                Draining,
                Upgrading,
                Uncordoning,
                Draining,
                Failed,
                Draining,
                Draining,
            ],
        ),
        (
            "cordoned by us and granted, current agent working, old module",
            with(|o| {
                ours(o);
                o.grant = UpgradeGrant::Target;
                o.agent = AgentPod::Current(AgentCondition::Working);
                old(o)
            }),
            [
                Upgrading,
                Draining,
                Draining,
                Upgrading,
                Uncordoning,
                Upgrading,
                Failed,
                Upgrading,
                Upgrading,
            ],
        ),
        (
            "up to date",
            with(ready_on_target),
            [Done, Done, Done, Done, Done, Done, Done, Done, Done],
        ),
        (
            "current agent ready, label not yet flipped",
            with(|o| {
                o.agent = AgentPod::Current(AgentCondition::Ready);
                old(o)
            }),
            [
                Upgrading, Cordoning, Cordoning, Upgrading, Done, Upgrading, Failed, Upgrading,
                Upgrading,
            ],
        ),
        (
            "current agent waiting for holders of the old module",
            with(|o| {
                o.agent = AgentPod::Current(AgentCondition::WaitingForHolders {
                    message: "held by pid 7 (python3)".into(),
                });
                old(o)
            }),
            [
                Cordoning, Cordoning, Cordoning, Cordoning, Done, Cordoning, Failed, Cordoning,
                Cordoning,
            ],
        ),
        (
            "current agent failed",
            with(|o| {
                o.agent = AgentPod::Current(AgentCondition::Failed {
                    reason: "BuildFailed".into(),
                    message: "make failed".into(),
                });
                old(o)
            }),
            [
                Failed, Cordoning, Cordoning, Failed, Done, Failed, Failed, Failed, Failed,
            ],
        ),
        (
            "agent pod terminating",
            with(|o| {
                o.agent = AgentPod::Terminating;
                old(o)
            }),
            [
                Pending, Cordoning, Cordoning, Upgrading, Done, Pending, Failed, Pending, Pending,
            ],
        ),
        (
            "cordoned by us, stale agent, old module",
            with(|o| {
                ours(o);
                o.agent = AgentPod::Stale;
                old(o)
            }),
            [
                Draining,
                Draining,
                Draining,
                Upgrading,
                Uncordoning,
                Draining,
                Failed,
                Draining,
                Draining,
            ],
        ),
        (
            "cordoned by us, up to date",
            with(|o| {
                ours(o);
                ready_on_target(o)
            }),
            [Uncordoning; 9],
        ),
        (
            "cordoned by us, drain finished",
            with(|o| {
                ours(o);
                o.agent = AgentPod::Stale;
                old(o);
                o.drain = DrainProgress::Succeeded { skipped: vec![] }
            }),
            [
                Draining,
                Draining,
                Upgrading,
                Upgrading,
                Uncordoning,
                Draining,
                Failed,
                Draining,
                Draining,
            ],
        ),
        (
            "cordoned by us, drain failed",
            with(|o| {
                ours(o);
                o.agent = AgentPod::Stale;
                old(o);
                o.drain = DrainProgress::Failed {
                    reason: "DrainTimeout".into(),
                    message: "web-0 blocked".into(),
                }
            }),
            [
                Draining,
                Draining,
                Failed,
                Upgrading,
                Uncordoning,
                Draining,
                Failed,
                Draining,
                Draining,
            ],
        ),
        (
            "host-managed",
            with(|o| {
                o.host_managed = true;
                old(o)
            }),
            [HostManaged; 9],
        ),
        (
            "selected by an older policy",
            with(|o| {
                o.conflict_with = Some("prod".into());
                o.agent = AgentPod::Stale
            }),
            [Conflict; 9],
        ),
        (
            "cordoned by someone else, up to date",
            with(|o| {
                o.externally_cordoned = true;
                ready_on_target(o)
            }),
            [Done; 9],
        ),
        (
            "retry requested, stale agent, old module",
            with(|o| {
                o.retry = RetryGate::Requested;
                o.agent = AgentPod::Stale;
                old(o)
            }),
            [
                Cordoning, Cordoning, Cordoning, Cordoning, Done, Cordoning, Cordoning, Cordoning,
                Cordoning,
            ],
        ),
        (
            "retry due, stale agent, no module",
            with(|o| {
                o.retry = RetryGate::Due;
                o.agent = AgentPod::Stale
            }),
            [
                Upgrading, Cordoning, Cordoning, Upgrading, Done, Upgrading, Upgrading, Upgrading,
                Upgrading,
            ],
        ),
    ]
}

#[test]
fn every_state_times_every_observation() {
    let mut checked = 0;
    for (name, obs, expected) in table() {
        for (from, want) in NodeState::ALL.iter().zip(expected) {
            let o = NodeObservation {
                recorded: Some(*from),
                ..obs.clone()
            };
            let got = next(&o, &rules());
            assert_eq!(got.state, want, "{from} + {name}: {got:?}");
            checked += 1;
        }
    }
    assert_eq!(checked, 23 * 9);
}

/// What Kubernetes says about an agent it does not run becomes the node's reason and
/// message, and the node waits (Kubernetes keeps retrying) instead of failing.
#[test]
fn agents_kubernetes_does_not_run_wait_with_kubernetes_words() {
    let blocker = |reason: &str| Blocker {
        reason: reason.into(),
        message: format!("{reason}: what Kubernetes says"),
    };
    let not_created = with(|o| o.agent = AgentPod::NotCreated(blocker("FailedCreate")));
    for recorded in [None, Some(Pending)] {
        let mut obs = not_created.clone();
        obs.recorded = recorded;
        let t = next(&obs, &rules());
        assert_eq!(t.state, Pending, "{recorded:?}");
        assert_eq!(t.reason.as_deref(), Some("FailedCreate"));
        assert_eq!(
            t.message.as_deref(),
            Some("FailedCreate: what Kubernetes says")
        );
    }
    let mut upgrading = not_created.clone();
    upgrading.recorded = Some(Upgrading);
    let t = next(&upgrading, &rules());
    assert_eq!(
        (t.state, t.reason.as_deref()),
        (Upgrading, Some("FailedCreate"))
    );
    for reason in [
        "Unschedulable",
        "NodeNotReady",
        "CreateContainerConfigError",
    ] {
        let stuck = with(|o| {
            o.agent = AgentPod::Current(AgentCondition::Stuck(blocker(reason)));
            old(o)
        });
        for recorded in [None, Some(Upgrading)] {
            let mut obs = stuck.clone();
            obs.recorded = recorded;
            let t = next(&obs, &rules());
            assert_eq!(t.state, Upgrading, "{reason} {recorded:?}");
            assert_eq!(t.reason.as_deref(), Some(reason));
            assert!(
                t.message
                    .as_deref()
                    .is_some_and(|m| m.contains("what Kubernetes says"))
            );
            assert!(t.actions.is_empty(), "nothing to replace: {t:?}");
        }
    }
}

#[test]
fn a_never_seen_node_is_treated_as_pending() {
    for (name, obs, expected) in table() {
        assert_eq!(next(&obs, &rules()).state, expected[0], "{name}");
    }
}

#[test]
fn closed_gates_keep_new_nodes_waiting_with_a_reason() {
    let stale_old = with(|o| {
        o.agent = AgentPod::Stale;
        old(o)
    });
    for (gate, reason) in [
        (StartGate::NoSlot, reasons::WAITING_FOR_SLOT),
        (StartGate::Paused, reasons::PAUSED),
        (StartGate::Halted, reasons::ROLLOUT_HALTED),
    ] {
        let o = NodeObservation {
            start: gate,
            recorded: Some(Pending),
            ..stale_old.clone()
        };
        let t = next(&o, &rules());
        assert_eq!(t.state, Pending);
        assert_eq!(t.reason.as_deref(), Some(reason));
        assert!(t.actions.is_empty());
        let failed = NodeObservation {
            start: gate,
            recorded: Some(Failed),
            retry: RetryGate::Due,
            ..stale_old.clone()
        };
        assert_eq!(
            next(&failed, &rules()).state,
            Failed,
            "{gate:?}: a retry needs a slot too"
        );
    }
}

#[test]
fn pause_holds_nobody_out_of_service_steps_in_flight_run_to_done() {
    let paused = |f: &dyn Fn(&mut NodeObservation)| {
        let mut o = base();
        o.start = StartGate::Paused;
        f(&mut o);
        next(&o, &rules())
    };
    let t = paused(&|o| {
        o.recorded = Some(Cordoning);
        ours(o);
        o.agent = AgentPod::Stale;
        old(o)
    });
    assert_eq!(
        (t.state, t.actions.as_slice()),
        (Draining, [Action::Drain].as_slice()),
        "a cordoned node is drained, not held cordoned through the pause"
    );
    let t = paused(&|o| {
        o.recorded = Some(Cordoning);
        o.agent = AgentPod::Stale;
        old(o)
    });
    assert_eq!(
        t.actions,
        vec![Action::Cordon],
        "a cordon in flight completes"
    );
    let t = paused(&|o| {
        o.recorded = Some(Draining);
        ours(o);
        o.agent = AgentPod::Stale;
        old(o)
    });
    assert_eq!(
        t.actions,
        vec![Action::Drain],
        "a drain in flight runs to its end"
    );
    let t = paused(&|o| {
        o.recorded = Some(Draining);
        ours(o);
        o.agent = AgentPod::Stale;
        old(o);
        o.drain = DrainProgress::Succeeded { skipped: vec![] }
    });
    assert_eq!(
        (t.state, t.actions.as_slice()),
        (
            Upgrading,
            [Action::Grant, Action::ReplaceAgent { even_current: true }].as_slice()
        ),
        "a drained node swaps and is uncordoned, not held drained through the pause"
    );
    let t = paused(&|o| {
        o.recorded = Some(Upgrading);
        ours(o);
        ready_on_target(o)
    });
    assert_eq!(t.state, Uncordoning);
    let t = paused(&|o| o.recorded = Some(Uncordoning));
    assert_eq!(t.state, Done);
}

#[test]
fn actions_follow_the_step() {
    let t = next(
        &with(|o| {
            o.agent = AgentPod::Stale;
            old(o)
        }),
        &rules(),
    );
    assert_eq!(t.actions, vec![Action::Cordon]);
    let t = next(
        &with(|o| {
            o.recorded = Some(Cordoning);
            ours(o);
            o.agent = AgentPod::Stale;
            old(o)
        }),
        &rules(),
    );
    assert_eq!(t.actions, vec![Action::Drain]);
    let t = next(
        &with(|o| {
            o.recorded = Some(Draining);
            ours(o);
            o.agent = AgentPod::Stale;
            old(o);
            o.drain = DrainProgress::Succeeded { skipped: vec![] }
        }),
        &rules(),
    );
    assert_eq!(
        t.actions,
        vec![Action::Grant, Action::ReplaceAgent { even_current: true }],
        "entering Upgrading grants the swap, then gives the agent a fresh start"
    );
    let t = next(
        &with(|o| {
            o.recorded = Some(Upgrading);
            ours(o);
            o.grant = UpgradeGrant::Target;
            o.agent = AgentPod::Stale;
            old(o)
        }),
        &rules(),
    );
    assert_eq!(
        t.actions,
        vec![Action::ReplaceAgent {
            even_current: false
        }]
    );
    let t = next(
        &with(|o| {
            o.recorded = Some(Upgrading);
            ours(o);
            o.agent = AgentPod::Stale;
            old(o)
        }),
        &rules(),
    );
    assert_eq!(
        (t.state, t.actions),
        (
            Upgrading,
            vec![
                Action::Grant,
                Action::ReplaceAgent {
                    even_current: false
                }
            ]
        ),
        "drained, but a crash lost the grant: grant it again"
    );
    let t = next(
        &with(|o| {
            o.recorded = Some(Upgrading);
            ours(o);
            ready_on_target(o)
        }),
        &rules(),
    );
    assert_eq!((t.state, t.actions), (Uncordoning, vec![Action::Release]));
    let t = next(
        &with(|o| {
            o.recorded = Some(Upgrading);
            ready_on_target(o)
        }),
        &rules(),
    );
    assert_eq!(t.state, Done, "nothing to release: straight to Done");
    let t = next(
        &with(|o| {
            o.recorded = Some(Failed);
            ours(o);
            o.agent = AgentPod::Stale;
            old(o)
        }),
        &rules(),
    );
    assert_eq!(
        t.actions,
        vec![Action::Release],
        "a Failed node does not keep its cordon or slot"
    );
    let t = next(
        &with(|o| {
            o.recorded = Some(Conflict);
            ours(o);
            o.conflict_with = Some("prod".into())
        }),
        &rules(),
    );
    assert_eq!(t.actions, vec![Action::Release]);
}

#[test]
fn grants_are_given_only_through_the_gate_and_released_at_the_end() {
    let recreated = with(|o| {
        o.recorded = Some(Pending);
        o.agent = AgentPod::Current(AgentCondition::WaitingForGrant);
        old(o)
    });
    for gate in [StartGate::NoSlot, StartGate::Paused, StartGate::Halted] {
        let t = next(
            &NodeObservation {
                start: gate,
                ..recreated.clone()
            },
            &rules(),
        );
        assert_eq!((t.state, t.actions), (Pending, vec![]), "{gate:?}");
    }
    let t = next(&recreated, &rules());
    assert_eq!((t.state, t.actions), (Cordoning, vec![Action::Cordon]));
    let starting = with(|o| o.agent = AgentPod::Current(AgentCondition::Starting));
    assert_eq!(
        next(&starting, &rules()).state,
        Pending,
        "nothing known loaded before the agent's first report: no fresh install assumed"
    );
    let fresh = with(|o| o.agent = AgentPod::Current(AgentCondition::Working));
    let t = next(
        &NodeObservation {
            start: StartGate::NoSlot,
            ..fresh
        },
        &rules(),
    );
    assert_eq!(
        (t.state, t.actions),
        (Upgrading, vec![]),
        "a fresh install needs neither slot nor grant"
    );
    let granted = with(|o| {
        o.recorded = Some(Upgrading);
        ours(o);
        o.grant = UpgradeGrant::Target;
        o.agent = AgentPod::Current(AgentCondition::WaitingForGrant);
        old(o)
    });
    let t = next(&granted, &rules());
    assert_eq!(
        (t.state, t.reason.as_deref(), t.actions),
        (Upgrading, Some(reasons::WAITING_FOR_GRANT), vec![])
    );
    let done_but_granted = with(|o| {
        o.recorded = Some(Upgrading);
        o.grant = UpgradeGrant::Target;
        ready_on_target(o)
    });
    let t = next(&done_but_granted, &rules());
    assert_eq!(
        (t.state, t.actions),
        (Uncordoning, vec![Action::Release]),
        "the grant goes with the release"
    );
    let stale_grant = with(|o| {
        o.recorded = Some(Upgrading);
        ours(o);
        o.grant = UpgradeGrant::OtherVersion;
        o.agent = AgentPod::Current(AgentCondition::WaitingForGrant);
        old(o)
    });
    assert_eq!(
        next(&stale_grant, &rules()).actions,
        vec![Action::Grant],
        "the target changed: grant the new one"
    );
}

#[test]
fn retry_requests_are_cleared_once_acted_on() {
    let requested = with(|o| {
        o.recorded = Some(Failed);
        o.retry = RetryGate::Requested;
        o.agent = AgentPod::Stale;
        old(o)
    });
    let t = next(&requested, &rules());
    assert_eq!(t.state, Cordoning);
    assert_eq!(t.reason.as_deref(), Some(reasons::RETRYING));
    assert!(t.actions.contains(&Action::ClearRetry));
    let waiting = NodeObservation {
        start: StartGate::NoSlot,
        ..requested.clone()
    };
    let t = next(&waiting, &rules());
    assert_eq!(t.state, Failed);
    assert!(
        !t.actions.contains(&Action::ClearRetry),
        "kept until it can act"
    );
    let stray = with(|o| {
        o.recorded = Some(Done);
        o.retry = RetryGate::Requested;
        ready_on_target(o)
    });
    assert_eq!(next(&stray, &rules()).actions, vec![Action::ClearRetry]);
}

#[test]
fn messages_say_what_is_happening() {
    let t = next(
        &with(|o| {
            o.recorded = Some(Upgrading);
            ours(o);
            old(o);
            o.grant = UpgradeGrant::Target;
            o.agent = AgentPod::Current(AgentCondition::WaitingForHolders {
                message: "held by pid 1234 (python3)".into(),
            });
        }),
        &rules(),
    );
    assert_eq!(t.reason.as_deref(), Some(reasons::DEVICE_HELD));
    assert!(
        t.message
            .as_deref()
            .unwrap()
            .starts_with("held by pid 1234 (python3)")
    );
    let t = next(
        &with(|o| {
            o.recorded = Some(Draining);
            ours(o);
            old(o);
            o.agent = AgentPod::Stale;
            o.drain = DrainProgress::Failed {
                reason: "DrainTimeout".into(),
                message: "default/web-0: eviction blocked by PodDisruptionBudget default/web"
                    .into(),
            };
        }),
        &rules(),
    );
    assert_eq!(
        (t.state, t.reason.as_deref()),
        (Failed, Some("DrainTimeout"))
    );
    assert!(t.message.as_deref().unwrap().contains("default/web-0"));
    assert_eq!(t.actions, vec![Action::Release]);
    let t = next(&with(|o| o.conflict_with = Some("prod".into())), &rules());
    assert!(t.message.as_deref().unwrap().contains("prod"));
    let t = next(
        &with(|o| {
            o.recorded = Some(Uncordoning);
            o.externally_cordoned = true;
            ready_on_target(o)
        }),
        &rules(),
    );
    assert_eq!(
        (t.state, t.reason.as_deref()),
        (Done, Some(reasons::CORDONED_BY_OTHER))
    );
}

#[test]
fn without_drain_a_version_change_goes_straight_to_upgrading() {
    let mut r = rules();
    r.drain_enabled = false;
    let t = next(
        &with(|o| {
            o.agent = AgentPod::Stale;
            old(o)
        }),
        &r,
    );
    assert_eq!(t.state, Upgrading);
    assert_eq!(
        t.actions,
        vec![Action::Grant, Action::ReplaceAgent { even_current: true }]
    );
    let t = next(
        &with(|o| {
            o.recorded = Some(Upgrading);
            ready_on_target(o)
        }),
        &r,
    );
    assert_eq!(t.state, Done);
}

#[test]
fn an_externally_cordoned_node_is_drained_without_claiming_it() {
    let o = with(|o| {
        o.recorded = Some(Cordoning);
        o.externally_cordoned = true;
        o.gates_closed_by_us = true;
        o.agent = AgentPod::Stale;
        old(o);
    });
    assert_eq!(next(&o, &rules()).state, Draining);
    let no_gates = RolloutRules {
        gates_configured: false,
        ..rules()
    };
    let o = with(|o| {
        o.recorded = Some(Cordoning);
        o.externally_cordoned = true;
        o.agent = AgentPod::Stale;
        old(o)
    });
    assert_eq!(
        next(&o, &no_gates).state,
        Draining,
        "no gates configured: nothing to close"
    );
    assert_eq!(next(&o, &rules()).state, Cordoning, "gates still to close");
}

/// A drained node in Upgrading whose agent waits for a skipped bare pod holding the
/// device, `waited` after it entered Upgrading.
fn held_by_bare_pod(waited: u64) -> NodeObservation {
    with(|o| {
        o.recorded = Some(Upgrading);
        ours(o);
        o.grant = UpgradeGrant::Target;
        old(o);
        o.agent = AgentPod::Current(AgentCondition::WaitingForHolders {
            message: "held by pid 1234 (python3)".into(),
        });
        o.drain = DrainProgress::Succeeded {
            skipped: vec![
                "jobs/notebook (uses /dev/tenstorrent)".into(),
                "default/debug".into(),
            ],
        };
        o.in_state_for = Some(Duration::from_secs(waited));
    })
}

fn timed(secs: u64) -> RolloutRules {
    RolloutRules {
        drain_timeout: Some(Duration::from_secs(secs)),
        ..rules()
    }
}

#[test]
fn holders_are_waited_for_until_the_drain_timeout_naming_skipped_device_pods() {
    let t = next(&held_by_bare_pod(599), &timed(600));
    assert_eq!(
        (t.state, t.reason.as_deref()),
        (Upgrading, Some(reasons::DEVICE_HELD))
    );
    let message = t.message.unwrap_or_default();
    assert!(
        message.contains("held by pid 1234 (python3)")
            && message.contains("drain skipped that use the device: jobs/notebook;")
            && !message.contains("default/debug"),
        "{message}"
    );
    assert!(t.actions.is_empty());
}

#[test]
fn holders_past_the_drain_timeout_fail_the_node_naming_the_blockers() {
    let t = next(&held_by_bare_pod(600), &timed(600));
    assert_eq!(
        (t.state, t.reason.as_deref()),
        (Failed, Some(reasons::DRAIN_TIMEOUT))
    );
    assert_eq!(t.actions, vec![Action::Release]);
    let message = t.message.unwrap_or_default();
    assert!(
        message.contains("held by pid 1234 (python3)")
            && message.contains("jobs/notebook")
            && message.contains("stop them or set upgradePolicy.drain.force: true"),
        "{message}"
    );
    // After a controller restart the drain's skipped pods are unknown: the pids alone.
    let restarted = NodeObservation {
        drain: DrainProgress::NotStarted,
        ..held_by_bare_pod(600)
    };
    let t = next(&restarted, &timed(600));
    assert_eq!(t.state, Failed);
    let message = t.message.unwrap_or_default();
    assert!(
        message.contains("held by pid 1234 (python3)") && !message.contains("bare pod"),
        "{message}"
    );
}

#[test]
fn holders_have_no_deadline_without_a_drain_timeout() {
    let long = held_by_bare_pod(86_400);
    let t = next(&long, &rules());
    assert_eq!(
        (t.state, t.reason.as_deref()),
        (Upgrading, Some(reasons::DEVICE_HELD)),
        "no drain timeout"
    );
    let no_drain = RolloutRules {
        drain_enabled: false,
        ..timed(600)
    };
    assert_eq!(next(&long, &no_drain).state, Upgrading, "drain disabled");
    let unknown = NodeObservation {
        in_state_for: None,
        ..long.clone()
    };
    assert_eq!(
        next(&unknown, &timed(600)).state,
        Upgrading,
        "entry time unknown"
    );
}

const DOWN: &str = "Ready=Unknown: NodeStatusUnknown: Kubelet stopped posting node status.";

fn down(o: &mut NodeObservation) {
    o.node_not_ready = Some(DOWN.into());
}

fn with_node_timeout(secs: u64) -> RolloutRules {
    RolloutRules {
        node_timeout: Some(Duration::from_secs(secs)),
        completion_wait: None,
        ..rules()
    }
}

/// The incident: a node without a kubelet whose agent pod is bound but never runs. Whatever
/// its module, it stays Pending with the node's own words, and is never started.
#[test]
fn a_node_that_is_not_ready_when_its_turn_comes_stays_pending() {
    let stuck = AgentPod::Current(AgentCondition::Stuck(Blocker {
        reason: "NodeNotReady".into(),
        message: "agent pod bound to a node that is not Ready".into(),
    }));
    let cases: Vec<(&str, NodeObservation)> = vec![
        (
            "fresh install, agent bound",
            with(|o| {
                o.agent = stuck.clone();
                down(o)
            }),
        ),
        (
            "fresh install, stale agent",
            with(|o| {
                o.agent = AgentPod::Stale;
                down(o)
            }),
        ),
        (
            "loaded, stale agent",
            with(|o| {
                o.agent = AgentPod::Stale;
                old(o);
                down(o)
            }),
        ),
        ("no agent pod", with(down)),
    ];
    for (name, obs) in cases {
        for (recorded, gate) in [
            (None, StartGate::Allowed),
            (Some(Pending), StartGate::Allowed),
            (Some(Pending), StartGate::NoSlot),
        ] {
            let o = NodeObservation {
                recorded,
                start: gate,
                ..obs.clone()
            };
            let t = next(&o, &rules());
            assert_eq!(
                (t.state, t.reason.as_deref()),
                (Pending, Some(reasons::NODE_NOT_READY)),
                "{name}, {recorded:?}, {gate:?}"
            );
            assert!(t.actions.is_empty(), "{name}: nothing is done to it");
            let message = t.message.unwrap_or_default();
            assert!(
                message.contains(DOWN) && message.contains("takes no slot"),
                "{message}"
            );
        }
    }
    // The policy-wide reasons win: they hold every node back.
    let paused = with(|o| {
        o.agent = AgentPod::Stale;
        old(o);
        down(o);
        o.start = StartGate::Paused;
    });
    assert_eq!(
        next(&paused, &rules()).reason.as_deref(),
        Some(reasons::PAUSED)
    );
    let halted = NodeObservation {
        start: StartGate::Halted,
        ..paused
    };
    assert_eq!(
        next(&halted, &rules()).reason.as_deref(),
        Some(reasons::ROLLOUT_HALTED)
    );
    // Ready again: it takes its turn at once.
    let back = with(|o| {
        o.agent = AgentPod::Stale;
        old(o);
    });
    assert_eq!(next(&back, &rules()).state, Cordoning);
}

#[test]
fn a_done_node_that_goes_down_stays_done_saying_so() {
    let o = with(|o| {
        o.recorded = Some(Done);
        o.loaded_version = Some("2.8.0".into());
        o.agent = AgentPod::Current(AgentCondition::Stuck(Blocker {
            reason: "NodeNotReady".into(),
            message: "m".into(),
        }));
        down(o);
    });
    let t = next(&o, &rules());
    assert_eq!(
        (t.state, t.reason.as_deref()),
        (Done, Some(reasons::NODE_NOT_READY)),
        "never back in flight, where it would hold a slot"
    );
    assert!(t.message.unwrap_or_default().contains("ran tt-kmd 2.8.0"));
    assert!(t.actions.is_empty());
}

/// A Failed node that is not Ready is not retried by the back-off (it keeps counting against
/// the failure budget); a retry asked for by hand puts it back in line.
#[test]
fn a_failed_node_that_is_not_ready_waits_for_a_requested_retry() {
    let failed = with(|o| {
        o.recorded = Some(Failed);
        o.agent = AgentPod::Stale;
        old(o);
        down(o);
        o.retry = RetryGate::Due;
    });
    let t = next(&failed, &rules());
    assert_eq!(t.state, Failed);
    assert!(t.actions.is_empty());
    let asked = NodeObservation {
        retry: RetryGate::Requested,
        ..failed
    };
    let t = next(&asked, &rules());
    assert_eq!(
        (t.state, t.reason.as_deref()),
        (Pending, Some(reasons::NODE_NOT_READY))
    );
    assert_eq!(t.actions, vec![Action::ClearRetry]);
}

/// A node in flight that goes down keeps its step (a kubelet may come back) until the node
/// timeout; then it fails, saying what it waited on and for how long, and lets go of what it
/// holds so the slot frees up.
#[test]
fn a_step_without_progress_fails_at_the_node_timeout() {
    let waiting = |secs: u64| {
        with(|o| {
            o.recorded = Some(Upgrading);
            ours(o);
            old(o);
            o.grant = UpgradeGrant::Target;
            o.agent = AgentPod::Missing;
            down(o);
            o.in_state_for = Some(Duration::from_secs(secs));
        })
    };
    let t = next(&waiting(1799), &with_node_timeout(1800));
    assert_eq!(
        (t.state, t.reason.as_deref()),
        (Upgrading, Some(reasons::WAITING_FOR_AGENT))
    );
    let t = next(&waiting(1805), &with_node_timeout(1800));
    assert_eq!(
        (t.state, t.reason.as_deref()),
        (Failed, Some(reasons::NODE_TIMEOUT))
    );
    assert_eq!(t.actions, vec![Action::Release]);
    let message = t.message.unwrap_or_default();
    assert!(
        message.contains("no progress in Upgrading for 30m5s")
            && message.contains("upgradePolicy.nodeTimeoutSeconds (1800s)")
            && message.contains(
                "waiting for the DaemonSet to start the agent for 2.8.0 (WaitingForAgentPod)"
            )
            && message.contains("kubectl tt driver retry"),
        "{message}"
    );
    assert_eq!(
        next(&waiting(86_400), &rules()).state,
        Upgrading,
        "no node timeout, no deadline"
    );
    let unknown = NodeObservation {
        in_state_for: None,
        ..waiting(86_400)
    };
    assert_eq!(next(&unknown, &with_node_timeout(1800)).state, Upgrading);
    // A fresh install holds nothing to release.
    let fresh = with(|o| {
        o.recorded = Some(Upgrading);
        o.agent = AgentPod::Current(AgentCondition::Working);
        o.in_state_for = Some(Duration::from_secs(60));
    });
    let t = next(&fresh, &with_node_timeout(60));
    assert_eq!((t.state, t.actions), (Failed, vec![]));
}

#[test]
fn only_a_node_that_stays_in_its_step_times_out() {
    let rules = RolloutRules {
        drain_timeout: Some(Duration::from_secs(3600)),
        ..with_node_timeout(600)
    };
    let late = |recorded: NodeState, f: &dyn Fn(&mut NodeObservation)| {
        let mut o = with(|o| {
            o.recorded = Some(recorded);
            ours(o);
            old(o);
            o.agent = AgentPod::Stale;
            o.in_state_for = Some(Duration::from_secs(700));
        });
        f(&mut o);
        next(&o, &rules)
    };
    // Moving on is progress, however late.
    let drained = late(Draining, &|o| {
        o.drain = DrainProgress::Succeeded { skipped: vec![] }
    });
    assert_eq!(drained.state, Upgrading);
    // A running drain has its own, longer timeout here.
    let draining = late(Draining, &|o| {
        o.drain = DrainProgress::Running {
            message: "evicting 1 pod".into(),
        }
    });
    assert_eq!(draining.state, Draining);
    let stuck_drain = late(Draining, &|o| {
        o.drain = DrainProgress::Running {
            message: "evicting 1 pod".into(),
        };
        o.in_state_for = Some(Duration::from_secs(3600));
    });
    assert_eq!(
        (stuck_drain.state, stuck_drain.reason.as_deref()),
        (Failed, Some(reasons::NODE_TIMEOUT))
    );
    assert!(stuck_drain.message.unwrap_or_default().contains(
        "no progress in Draining for 1h0m0s, past upgradePolicy.nodeTimeoutSeconds (3600s)"
    ));
    // A pause does not hold a cordoned node: it goes on to its drain, it does not time out.
    let paused = late(Cordoning, &|o| o.start = StartGate::Paused);
    assert_eq!(paused.state, Draining);
    // Uncordoning has no deadline: the node already runs the target.
    let uncordoning = late(Uncordoning, &|o| ready_on_target(o));
    assert_eq!(uncordoning.state, Uncordoning);
    // Cordoning that never lands does time out.
    let cordoning = late(Cordoning, &|o| {
        o.cordoned_by_us = false;
        o.gates_closed_by_us = false;
    });
    assert_eq!((cordoning.state, cordoning.actions), (Failed, vec![]));
}

/// The target version loaded with other parameters is not at target: it goes through the
/// cordon and drain like another version (its agent needs a grant to reload), while a template
/// change that keeps version and parameters needs neither.
#[test]
fn other_parameters_at_the_target_version_take_the_drain_path() {
    let at_version = |differ: bool| {
        with(|o| {
            o.recorded = Some(Done);
            o.loaded_version = Some("2.8.0".into());
            o.parameters_differ = differ;
            o.agent = AgentPod::Stale;
        })
    };
    let t = next(&at_version(true), &rules());
    assert_eq!((t.state, t.actions), (Cordoning, vec![Action::Cordon]));
    let t = next(&at_version(false), &rules());
    assert_eq!(t.state, Upgrading);
    assert!(!t.actions.contains(&Action::Grant), "{:?}", t.actions);
    let ready_with_other_parameters = with(|o| {
        o.recorded = Some(Upgrading);
        ours(o);
        o.grant = UpgradeGrant::Target;
        o.loaded_version = Some("2.8.0".into());
        o.parameters_differ = true;
        o.agent = AgentPod::Current(AgentCondition::Ready);
    });
    assert_eq!(
        next(&ready_with_other_parameters, &rules()).state,
        Upgrading,
        "not done until the parameters are loaded"
    );
}

#[test]
fn a_node_failed_for_another_version_is_back_in_line_for_the_new_one() {
    let failed_before = with(|o| {
        o.recorded = Some(Failed);
        o.failed_for_other_target = true;
        o.start = StartGate::NoSlot;
        o.agent = AgentPod::Stale;
        old(o);
    });
    assert_eq!(
        next(&failed_before, &rules()).state,
        Pending,
        "waits for a slot like any node behind, not counted as failed"
    );
    let failed_now = NodeObservation {
        failed_for_other_target: false,
        ..failed_before
    };
    assert_eq!(next(&failed_now, &rules()).state, Failed);
}

#[test]
fn a_loaded_module_without_a_version_goes_through_the_gate_and_is_granted() {
    // The node opted to replace a module that declares no version: the agent waits for a grant.
    let waiting = with(|o| {
        o.agent = AgentPod::Current(AgentCondition::WaitingForGrant);
        o.loaded_version = None;
    });
    assert!(!waiting.is_fresh_install(), "something is loaded");
    assert_eq!(next(&waiting, &rules()).state, Cordoning);
    let drained = with(|o| {
        o.recorded = Some(Draining);
        o.agent = AgentPod::Current(AgentCondition::WaitingForGrant);
        o.loaded_version = None;
        ours(o);
        o.drain = DrainProgress::Succeeded { skipped: vec![] };
    });
    assert!(next(&drained, &rules()).actions.contains(&Action::Grant));
}

#[test]
fn a_node_back_in_line_gives_its_old_grant_back() {
    // Granted 2.7.x before spec.version moved on: waiting for a slot with a stale agent.
    let waiting = with(|o| {
        o.agent = AgentPod::Stale;
        o.grant = UpgradeGrant::OtherVersion;
        o.start = StartGate::NoSlot;
        old(o);
    });
    let mut r = rules();
    r.drain_enabled = false;
    let t = next(&waiting, &r);
    assert_eq!(t.state, Pending);
    assert_eq!(t.actions, vec![Action::Release]);
}

/// A drain that finished before the node's cordon was lifted says nothing about the node now:
/// it is cordoned (and drained) again before any grant.
#[test]
fn a_draining_node_that_lost_its_cordon_is_cordoned_again_not_granted() {
    let t = next(
        &with(|o| {
            o.recorded = Some(Draining);
            old(o);
            o.agent = AgentPod::Stale;
            o.drain = DrainProgress::Succeeded {
                skipped: Vec::new(),
            };
        }),
        &rules(),
    );
    assert_eq!(t.state, Cordoning);
    assert_eq!(t.actions, vec![Action::Cordon]);
}

/// A node no builder image serves is never cordoned nor given a fresh install's agent restart:
/// it waits, saying why; a node already running the target stays Done.
#[test]
fn a_node_whose_compiler_no_image_serves_waits_and_is_never_cordoned() {
    let unsupported = |o: &mut NodeObservation| {
        o.unsupported_compiler = Some("the node's kernel was built by clang-18".into());
    };
    for fresh in [false, true] {
        let t = next(
            &with(|o| {
                unsupported(o);
                o.agent = AgentPod::Stale;
                if !fresh {
                    old(o);
                }
            }),
            &rules(),
        );
        assert_eq!(
            (t.state, t.reason.as_deref()),
            (Pending, Some(reasons::UNSUPPORTED_COMPILER)),
            "fresh: {fresh}"
        );
        assert!(t.actions.is_empty(), "{:?}", t.actions);
        assert!(t.message.unwrap_or_default().contains("clang-18"));
    }
    let done = next(
        &with(|o| {
            unsupported(o);
            ready_on_target(o);
            o.recorded = Some(Done);
        }),
        &rules(),
    );
    assert_eq!(done.state, Done);
}
