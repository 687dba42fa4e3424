//! The chain checked exhaustively: every combination of up to two hook outcomes, a deny, ask and allow
//! rule that matches or not, the policy's and the session's mode, a shell, a read-only and an edit
//! tool, and each `unmatched` decision, against an oracle written as the documented rule list.

use super::*;
use crate::agent::{AgentRules, Caller};
use serde_json::json;

const TOOLS: [&str; 3] = ["Bash", "Read", "Write"];
const MODES: [PermissionMode; 3] = [
    PermissionMode::ReadOnly,
    PermissionMode::AcceptEdits,
    PermissionMode::Bypass,
];
const UNMATCHED: [Unmatched; 3] = [Unmatched::Allow, Unmatched::Deny, Unmatched::Ask];

fn results() -> Vec<(bool, HookResult)> {
    let mut all = Vec::new();
    for mandatory in [false, true] {
        all.push((mandatory, HookResult::NoOpinion));
        all.push((
            mandatory,
            HookResult::Allow {
                reason: "ok".into(),
            },
        ));
        all.push((
            mandatory,
            HookResult::Deny {
                reason: "no".into(),
            },
        ));
        all.push((
            mandatory,
            HookResult::Ask {
                reason: "sure?".into(),
            },
        ));
        all.push((
            mandatory,
            HookResult::Failed {
                error: "crashed".into(),
            },
        ));
        all.push((mandatory, HookResult::TimedOut { after_ms: 5 }));
    }
    all
}

fn hook_sequences() -> Vec<Vec<HookOutcome>> {
    let one: Vec<HookOutcome> = results()
        .into_iter()
        .map(|(mandatory, result)| HookOutcome {
            hook: "h".into(),
            mandatory,
            result,
        })
        .collect();
    let mut all = vec![Vec::new()];
    for a in &one {
        all.push(vec![a.clone()]);
        for b in &one {
            let mut b = b.clone();
            b.hook = "h2".into();
            all.push(vec![a.clone(), b]);
        }
    }
    all
}

fn rules(on: bool) -> Vec<Rule> {
    if on {
        vec!["*".parse().unwrap_or_else(|e| panic!("{e}"))]
    } else {
        Vec::new()
    }
}

/// The documented chain, written as a list, independently of the implementation's control flow.
fn oracle(
    policy: &Policy,
    tool: &str,
    session_mode: PermissionMode,
    hooks: &[HookOutcome],
) -> (Decision, String) {
    // Only the hooks up to the first that ends the hooks ran.
    let ran: Vec<&HookOutcome> = match hooks.iter().position(HookOutcome::ends_hooks) {
        Some(i) => hooks[..=i].iter().collect(),
        None => hooks.iter().collect(),
    };
    let denies = |h: &&HookOutcome| {
        matches!(h.result, HookResult::Deny { .. })
            || (h.mandatory
                && matches!(
                    h.result,
                    HookResult::Failed { .. } | HookResult::TimedOut { .. }
                ))
    };
    if let Some(h) = ran.iter().find(|h| denies(h)) {
        return (Decision::Deny, format!("hook:{}", h.hook));
    }
    if !policy.deny.is_empty() {
        return (Decision::Deny, link::DENY_RULE.into());
    }
    if let Some(h) = ran
        .iter()
        .find(|h| matches!(h.result, HookResult::Ask { .. }))
    {
        return (Decision::Ask, format!("hook:{}", h.hook));
    }
    if let Some(h) = ran
        .iter()
        .find(|h| matches!(h.result, HookResult::Allow { .. }))
    {
        return (Decision::Allow, format!("hook:{}", h.hook));
    }
    if !policy.ask.is_empty() {
        return (Decision::Ask, link::ASK_RULE.into());
    }
    let mode_link = link::PERMISSION_MODE.to_owned();
    match (policy.mode.unwrap_or(session_mode), tool) {
        (PermissionMode::Bypass, _) => return (Decision::Allow, mode_link),
        (PermissionMode::ReadOnly, "Read") => return (Decision::Allow, mode_link),
        (PermissionMode::ReadOnly, _) => return (Decision::Deny, mode_link),
        (PermissionMode::AcceptEdits, "Write") => return (Decision::Allow, mode_link),
        (PermissionMode::AcceptEdits, _) => {}
    }
    if !policy.allow.is_empty() {
        return (Decision::Allow, link::ALLOW_RULE.into());
    }
    let decision = match policy.unmatched {
        Unmatched::Allow => Decision::Allow,
        Unmatched::Deny => Decision::Deny,
        Unmatched::Ask => Decision::Ask,
    };
    (decision, link::UNMATCHED.into())
}

#[test]
fn the_chain_matches_the_documented_order_in_every_case() {
    let sequences = hook_sequences();
    let mut cases = 0u32;
    for hooks in &sequences {
        for deny in [false, true] {
            for ask in [false, true] {
                for allow in [false, true] {
                    for policy_mode in [None, Some(MODES[0]), Some(MODES[1]), Some(MODES[2])] {
                        for unmatched in UNMATCHED {
                            let policy = Policy {
                                deny: rules(deny),
                                ask: rules(ask),
                                allow: rules(allow),
                                mode: policy_mode,
                                unmatched,
                                ..Policy::default()
                            };
                            for session_mode in MODES {
                                for tool in TOOLS {
                                    cases += 1;
                                    let call = ToolCall::new(tool, json!({"command": "x"}));
                                    let v = policy.decide(&call, session_mode, hooks);
                                    let (decision, by) = oracle(&policy, tool, session_mode, hooks);
                                    let case = format!(
                                        "hooks {hooks:?} deny {deny} ask {ask} allow {allow} \
                                         mode {policy_mode:?}/{session_mode:?} {tool} {unmatched:?}"
                                    );
                                    assert_eq!(
                                        (v.decision, &v.decided_by),
                                        (decision, &by),
                                        "{case}"
                                    );
                                    check_trail(&v, hooks, &case);
                                }
                            }
                        }
                    }
                }
            }
        }
    }
    assert_eq!(cases, 157 * 2 * 2 * 2 * 4 * 3 * 3 * 3);
}

/// The trail holds every hook that ran, in order, then the deciding link when it was not a hook; a
/// failed hook is an `Error` line; the last line agrees with the verdict.
fn check_trail(v: &Verdict, hooks: &[HookOutcome], case: &str) {
    let ran = match hooks.iter().position(HookOutcome::ends_hooks) {
        Some(i) => i + 1,
        None => hooks.len(),
    };
    let by_hook = v.decided_by.starts_with("hook:");
    assert_eq!(v.trail.len(), ran + usize::from(!by_hook), "{case}");
    for (line, hook) in v.trail.iter().zip(&hooks[..ran]) {
        assert_eq!(line.who, format!("hook:{}", hook.hook), "{case}");
        if matches!(
            hook.result,
            HookResult::Failed { .. } | HookResult::TimedOut { .. }
        ) {
            assert_eq!(line.decision, HookDecision::Error, "{case}");
        }
    }
    if !by_hook {
        let last = v
            .trail
            .last()
            .unwrap_or_else(|| panic!("empty trail: {case}"));
        assert_eq!(last.who, v.decided_by, "{case}");
        assert_eq!(last.decision, v.decision.audited(), "{case}");
    }
}

#[test]
fn a_mandatory_hook_that_fails_or_times_out_denies_whatever_else_allows() {
    for result in [
        HookResult::Failed {
            error: "exit 1".into(),
        },
        HookResult::TimedOut { after_ms: 100 },
    ] {
        let policy = Policy {
            allow: rules(true),
            mode: Some(PermissionMode::Bypass),
            ..Policy::default()
        };
        let hooks = [HookOutcome {
            hook: "guard".into(),
            mandatory: true,
            result,
        }];
        let v = policy.decide(
            &ToolCall::new("Bash", json!({})),
            PermissionMode::Bypass,
            &hooks,
        );
        assert_eq!(v.decision, Decision::Deny);
        assert!(v.reason.contains("failed closed"), "{}", v.reason);
    }
}

#[test]
fn audit_entries_carry_the_trail_and_a_digest_not_the_input() {
    let policy = Policy {
        deny: vec!["Bash(touch *)".parse().unwrap_or_else(|e| panic!("{e}"))],
        ..Policy::default()
    };
    let call = ToolCall::new("Bash", json!({"command": "touch secret-file"}));
    let hooks = [HookOutcome {
        hook: "logger".into(),
        mandatory: false,
        result: HookResult::NoOpinion,
    }];
    let v = policy.decide(&call, PermissionMode::AcceptEdits, &hooks);
    let rows = v.audit_entries(7, None, &call);
    let summary: Vec<(&str, HookDecision)> =
        rows.iter().map(|r| (r.hook.as_str(), r.decision)).collect();
    assert_eq!(
        summary,
        vec![
            ("hook:logger", HookDecision::Defer),
            (link::DENY_RULE, HookDecision::Deny)
        ]
    );
    assert!(rows.iter().all(|r| r.tool == "Bash" && r.ts_ms == 7));
    assert!(rows.iter().all(|r| !r.input_digest.contains("secret")));
    assert_eq!(rows[1].reason, "denied by rule Bash(touch *)");
}

#[test]
fn an_empty_policy_is_empty_and_allows() {
    let policy = Policy::default();
    assert!(policy.is_empty());
    let v = policy.decide(
        &ToolCall::new("Bash", json!({})),
        PermissionMode::AcceptEdits,
        &[],
    );
    assert_eq!(v.decision, Decision::Allow);
    let strict = Policy {
        unmatched: Unmatched::Deny,
        ..Policy::default()
    };
    assert!(!strict.is_empty());
}

/// The documented chain with an agent's rules and a session tool list, as a list: each of the
/// policy's links comes before the agent's of the same kind; the tool list is a deny; the agent's
/// mode is over the policy's, which is over the session's.
fn agent_oracle(
    policy: &Policy,
    tool: &str,
    tools: &[String],
    agent: &AgentRules,
    hook: Option<&HookResult>,
) -> (Decision, String) {
    let hook_by = "hook:h".to_owned();
    if matches!(hook, Some(HookResult::Deny { .. })) {
        return (Decision::Deny, hook_by);
    }
    if !policy.deny.is_empty() {
        return (Decision::Deny, link::DENY_RULE.into());
    }
    if !agent.deny.is_empty() {
        return (Decision::Deny, link::AGENT_DENY_RULE.into());
    }
    if !tools.is_empty() && !tools.iter().any(|t| t == tool) {
        return (Decision::Deny, link::AGENT_TOOLS.into());
    }
    match hook {
        Some(HookResult::Ask { .. }) => return (Decision::Ask, hook_by),
        Some(HookResult::Allow { .. }) => return (Decision::Allow, hook_by),
        _ => {}
    }
    if !policy.ask.is_empty() {
        return (Decision::Ask, link::ASK_RULE.into());
    }
    if !agent.ask.is_empty() {
        return (Decision::Ask, link::AGENT_ASK_RULE.into());
    }
    let mode_link = link::PERMISSION_MODE.to_owned();
    match (
        agent
            .mode
            .or(policy.mode)
            .unwrap_or(PermissionMode::AcceptEdits),
        tool,
    ) {
        (PermissionMode::Bypass, _) => return (Decision::Allow, mode_link),
        (PermissionMode::ReadOnly, "Read") => return (Decision::Allow, mode_link),
        (PermissionMode::ReadOnly, _) => return (Decision::Deny, mode_link),
        (PermissionMode::AcceptEdits, "Write") => return (Decision::Allow, mode_link),
        (PermissionMode::AcceptEdits, _) => {}
    }
    if !policy.allow.is_empty() {
        return (Decision::Allow, link::ALLOW_RULE.into());
    }
    if !agent.allow.is_empty() {
        return (Decision::Allow, link::AGENT_ALLOW_RULE.into());
    }
    let decision = match policy.unmatched {
        Unmatched::Allow => Decision::Allow,
        Unmatched::Deny => Decision::Deny,
        Unmatched::Ask => Decision::Ask,
    };
    (decision, link::UNMATCHED.into())
}

#[test]
fn agent_rules_and_tool_lists_follow_the_documented_order_in_every_case() {
    let hooks: [Option<HookResult>; 4] = [
        None,
        Some(HookResult::Allow {
            reason: "ok".into(),
        }),
        Some(HookResult::Ask { reason: "?".into() }),
        Some(HookResult::Deny {
            reason: "no".into(),
        }),
    ];
    let tool_lists: [Vec<String>; 3] = [
        Vec::new(),
        vec!["Bash".into(), "Read".into(), "Write".into()],
        vec!["Read".into()],
    ];
    let modes = [None, Some(MODES[0]), Some(MODES[1]), Some(MODES[2])];
    let mut cases = 0u32;
    for hook in &hooks {
        let outcomes: Vec<HookOutcome> = hook
            .iter()
            .map(|result| HookOutcome {
                hook: "h".into(),
                mandatory: true,
                result: result.clone(),
            })
            .collect();
        for bits in 0u8..64 {
            let on = |i: u8| bits & (1 << i) != 0;
            for policy_mode in modes {
                for agent_mode in modes {
                    for unmatched in UNMATCHED {
                        let policy = Policy {
                            deny: rules(on(0)),
                            ask: rules(on(1)),
                            allow: rules(on(2)),
                            mode: policy_mode,
                            unmatched,
                            ..Policy::default()
                        };
                        let agent = AgentRules {
                            agent: "a".into(),
                            mode: agent_mode,
                            deny: rules(on(3)),
                            ask: rules(on(4)),
                            allow: rules(on(5)),
                        };
                        for tools in &tool_lists {
                            for tool in TOOLS {
                                cases += 1;
                                let call = ToolCall::new(tool, json!({"command": "x"}));
                                let caller = Caller {
                                    mode: PermissionMode::AcceptEdits,
                                    tools,
                                    agent: Some(&agent),
                                };
                                let v = policy.decide_for(&call, caller, &outcomes);
                                let want =
                                    agent_oracle(&policy, tool, tools, &agent, hook.as_ref());
                                let case = format!(
                                    "hook {hook:?} bits {bits:06b} modes {policy_mode:?}/\
                                     {agent_mode:?} {unmatched:?} tools {tools:?} {tool}"
                                );
                                assert_eq!((v.decision, v.decided_by.clone()), want, "{case}");
                                check_trail(&v, &outcomes, &case);
                            }
                        }
                    }
                }
            }
        }
    }
    assert_eq!(cases, 4 * 64 * 4 * 4 * 3 * 3 * 3);
}

#[test]
fn a_session_without_agent_rules_is_decided_as_before() {
    let policy = Policy {
        ask: rules(true),
        ..Policy::default()
    };
    let call = ToolCall::new("Bash", json!({"command": "x"}));
    let plain = policy.decide(&call, PermissionMode::AcceptEdits, &[]);
    let empty = AgentRules::default();
    assert!(empty.is_empty());
    let with_empty = policy.decide_for(
        &call,
        Caller {
            mode: PermissionMode::AcceptEdits,
            tools: &[],
            agent: Some(&empty),
        },
        &[],
    );
    assert_eq!(plain, with_empty);
    let denied = policy.decide_for(
        &call,
        Caller {
            mode: PermissionMode::AcceptEdits,
            tools: &["Read".to_owned()],
            agent: None,
        },
        &[],
    );
    assert_eq!(
        denied.reason,
        "this session may use only Read; Bash is not one of them"
    );
}
