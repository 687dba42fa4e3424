//! The supervisor's rules as data-driven specs: inputs in, effects out.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use keel_actors::*;
use keel_harness::{ErrorCategory, HarnessKind, Provider};
use keel_store::{AgentProfile, Budget, RunId, TaskId, TaskKind};
use proptest::prelude::*;

const RUN: RunId = RunId(7);

fn agent(name: &str, harness: &str, model: &str) -> AgentProfile {
    AgentProfile {
        name: name.into(),
        description: String::new(),
        harness: harness.into(),
        model: model.into(),
        account: format!("acct-{name}"),
        tools: Vec::new(),
        system_prompt: String::new(),
        limits: Default::default(),
    }
}

fn config() -> SupervisorConfig {
    SupervisorConfig {
        agents: vec![
            agent("alpha", "claude-code", "model-a"),
            agent("beta", "codex", "model-b"),
        ],
        spawn_burst: 1000,
        spawn_interval_ms: 1,
        ..SupervisorConfig::default()
    }
}

fn attempt(task: u128, n: u32) -> AttemptId {
    AttemptId {
        run: RUN,
        task: TaskId(task),
        attempt: n,
    }
}

fn admit(task: u128, depth: u8, agent: Option<&str>, estimate: u64) -> SupervisorInput {
    SupervisorInput::Msg(SupervisorMsg::Admit(Box::new(SpawnRequest {
        attempt: attempt(task, 1),
        depth,
        kind: TaskKind::Subtask,
        agent: agent.map(String::from),
        account: None,
        estimate_micros: estimate,
        brief: SubtaskBrief::plain(format!("s{task}"), TaskId(task), "b", "g"),
        continuity: Continuity::Fresh,
    })))
}

fn open(limit: Option<u64>) -> SupervisorInput {
    SupervisorInput::Msg(SupervisorMsg::OpenRun {
        run: RUN,
        budget: Budget {
            limit_micros: limit,
            ..Budget::default()
        },
    })
}

fn fail(task: u128, kind: FailureKind, retryable: bool) -> SupervisorInput {
    SupervisorInput::Msg(SupervisorMsg::Settle {
        attempt: attempt(task, 1),
        spent_micros: 0,
        outcome: Err(SubtaskFailure {
            kind,
            attempted: "x".into(),
            partial: Vec::new(),
            retryable,
            retry_after_ms: None,
            detail: "d".into(),
        }),
    })
}

/// Feed `(now, input)` pairs to a fresh supervisor; return it and the effects of the last input.
fn check(
    config: SupervisorConfig,
    inputs: Vec<(Millis, SupervisorInput)>,
) -> (Supervisor, Vec<Effect>) {
    let mut s = Supervisor::new(config);
    let mut rng = SplitMix64(1);
    let mut last = Vec::new();
    for (now, input) in inputs {
        last.clear();
        s.handle(input, now, &mut rng, &mut last);
    }
    (s, last)
}

fn admission_of(effects: &[Effect]) -> Option<Result<Assignment, Refusal>> {
    effects.iter().find_map(|e| match e {
        Effect::Send(Envelope::Coordinator {
            msg: CoordinatorMsg::Admission { answer, .. },
            ..
        }) => Some(answer.clone()),
        _ => None,
    })
}

fn verdict_of(effects: &[Effect]) -> Option<Verdict> {
    effects.iter().find_map(|e| match e {
        Effect::Send(Envelope::Coordinator {
            msg: CoordinatorMsg::Verdict { verdict, .. },
            ..
        }) => Some(verdict.clone()),
        Effect::Send(Envelope::Coordinator {
            msg: CoordinatorMsg::AttemptLost { verdict, .. },
            ..
        }) => Some(verdict.clone()),
        _ => None,
    })
}

#[test]
fn admits_with_the_requested_agents_model_and_sets_a_deadline() {
    let (s, out) = check(
        config(),
        vec![(0, open(None)), (10, admit(1, 1, Some("beta"), 0))],
    );
    let a = admission_of(&out).unwrap().unwrap();
    assert_eq!(
        (a.agent.as_str(), a.harness, a.model.as_str()),
        ("beta", HarnessKind::Codex, "model-b")
    );
    assert!(out.iter().any(|e| matches!(e, Effect::SpawnSpecialist(st) if st.assignment.model == "model-b" && st.reply_to.attempt() == attempt(1, 1))));
    let deadline = 10 + SupervisorConfig::default().subtask_timeout_ms;
    assert!(
        out.iter()
            .any(|e| matches!(e, Effect::SetTimer { at, .. } if *at == deadline))
    );
    assert_eq!(s.live_count(), 1);
}

/// An attempt that ends (settled, or its run closed) gives back its deadline: the host may drop
/// the timer instead of holding it for the whole timeout. A second settle cancels nothing more.
#[test]
fn an_ended_attempt_cancels_its_deadline() {
    let deadline = TimerKey::Supervisor(SupervisorTimer::Deadline(attempt(1, 1)));
    let cancels = |out: &[Effect]| {
        out.iter()
            .filter(|e| matches!(e, Effect::CancelTimer { key } if *key == deadline))
            .count()
    };
    let settle = || {
        SupervisorInput::Msg(SupervisorMsg::Settle {
            attempt: attempt(1, 1),
            spent_micros: 0,
            outcome: Ok(()),
        })
    };
    let (s, out) = check(
        config(),
        vec![(0, open(None)), (10, admit(1, 1, None, 0)), (20, settle())],
    );
    assert_eq!(cancels(&out), 1, "{out:?}");
    assert_eq!(s.live_count(), 0);
    let (_, out) = check(
        config(),
        vec![
            (0, open(None)),
            (10, admit(1, 1, None, 0)),
            (20, settle()),
            (30, settle()),
        ],
    );
    assert_eq!(cancels(&out), 0, "{out:?}");
    let (_, out) = check(
        config(),
        vec![
            (0, open(None)),
            (10, admit(1, 1, None, 0)),
            (
                20,
                SupervisorInput::Msg(SupervisorMsg::CloseRun { run: RUN }),
            ),
        ],
    );
    assert_eq!(cancels(&out), 1, "{out:?}");
}

/// A dispatch's admissions as one input do what they do one by one (the same answers, spawns and
/// timers, each group in order), with every answer to the coordinator ahead of the spawns: a host
/// then hands the coordinator the answers as one input before any specialist it admitted starts.
#[test]
fn a_batch_of_admissions_answers_first_and_otherwise_acts_as_one_by_one() {
    let msgs = |input: SupervisorInput| match input {
        SupervisorInput::Msg(m) => m,
        other => panic!("not a message: {other:?}"),
    };
    let batch: Vec<SupervisorMsg> = (1..=3).map(|t| msgs(admit(t, 1, None, 10))).collect();
    let mut one_by_one = Supervisor::new(config());
    let mut together = Supervisor::new(config());
    let mut rng = SplitMix64(1);
    let (mut alone, mut batched) = (Vec::new(), Vec::new());
    one_by_one.handle(open(None), 0, &mut rng, &mut Vec::new());
    together.handle(open(None), 0, &mut rng, &mut Vec::new());
    for m in batch.clone() {
        one_by_one.handle(SupervisorInput::Msg(m), 5, &mut SplitMix64(2), &mut alone);
    }
    together.handle(
        SupervisorInput::Msgs(batch),
        5,
        &mut SplitMix64(2),
        &mut batched,
    );

    let answers = |effects: &[Effect]| -> Vec<Effect> {
        effects
            .iter()
            .filter(|e| matches!(e, Effect::Send(Envelope::Coordinator { .. })))
            .cloned()
            .collect()
    };
    let rest = |effects: &[Effect]| -> Vec<Effect> {
        effects
            .iter()
            .filter(|e| !matches!(e, Effect::Send(Envelope::Coordinator { .. })))
            .cloned()
            .collect()
    };
    assert_eq!(answers(&batched).len(), 3, "{batched:?}");
    assert_eq!(answers(&batched), answers(&alone));
    assert_eq!(rest(&batched), rest(&alone));
    // The answers lead; one at a time, the second answer came after the first spawn.
    assert!(
        batched[..3]
            .iter()
            .all(|e| matches!(e, Effect::Send(Envelope::Coordinator { .. })))
    );
    assert!(
        !alone[..3]
            .iter()
            .all(|e| matches!(e, Effect::Send(Envelope::Coordinator { .. })))
    );
    assert_eq!(together.live_count(), 3);
}

#[test]
fn a_repeated_admit_gets_the_same_answer_and_no_second_spawn() {
    let (s, out) = check(
        config(),
        vec![
            (0, open(None)),
            (1, admit(1, 1, None, 0)),
            (2, admit(1, 1, None, 0)),
        ],
    );
    assert!(admission_of(&out).unwrap().is_ok());
    assert!(!out.iter().any(|e| matches!(e, Effect::SpawnSpecialist(_))));
    assert_eq!(s.live_count(), 1);
}

#[test]
fn refusals_are_typed_answers() {
    let cfg = SupervisorConfig {
        specialists_max: 2,
        ..config()
    };
    let (_, out) = check(
        cfg.clone(),
        vec![
            (0, open(None)),
            (1, admit(1, 1, None, 0)),
            (1, admit(2, 1, None, 0)),
            (1, admit(3, 1, None, 0)),
        ],
    );
    assert_eq!(
        admission_of(&out),
        Some(Err(Refusal::Concurrency {
            limit: 2,
            retry_after_ms: 1000
        }))
    );
    let (_, out) = check(config(), vec![(0, open(None)), (1, admit(1, 4, None, 0))]);
    assert_eq!(
        admission_of(&out),
        Some(Err(Refusal::Depth { depth: 4, limit: 3 }))
    );
    let (_, out) = check(config(), vec![(1, admit(1, 1, None, 0))]);
    assert_eq!(admission_of(&out), Some(Err(Refusal::UnknownRun)));
    let (_, out) = check(
        config(),
        vec![(0, open(None)), (1, admit(1, 1, Some("nobody"), 0))],
    );
    assert!(matches!(
        admission_of(&out),
        Some(Err(Refusal::NoAgent { .. }))
    ));
}

#[test]
fn a_reservation_over_budget_is_refused_and_trips_the_run() {
    let (s, out) = check(
        config(),
        vec![
            (0, open(Some(100))),
            (1, admit(1, 1, None, 60)),
            (2, admit(2, 1, None, 60)),
        ],
    );
    assert_eq!(
        admission_of(&out),
        Some(Err(Refusal::Budget {
            committed_micros: 60,
            requested_micros: 60,
            limit_micros: 100
        }))
    );
    assert!(out.iter().any(|e| matches!(
        e,
        Effect::Send(Envelope::Coordinator {
            msg: CoordinatorMsg::BudgetTripped { .. },
            ..
        })
    )));
    assert!(
        out.iter()
            .any(|e| matches!(e, Effect::StopSpecialist { attempt: a, .. } if *a == attempt(1, 1)))
    );
    assert_eq!(s.live_count(), 0, "the trip stopped the live child");
    assert!(s.ledger(RUN).unwrap().tripped);
}

#[test]
fn spend_reported_by_a_child_trips_the_budget() {
    let spend = SupervisorInput::Msg(SupervisorMsg::Spend {
        attempt: attempt(1, 1),
        spent_micros: 150,
    });
    let (s, out) = check(
        config(),
        vec![
            (0, open(Some(100))),
            (1, admit(1, 1, None, 10)),
            (2, admit(2, 1, None, 10)),
            (3, spend),
        ],
    );
    let stopped: Vec<_> = out
        .iter()
        .filter(|e| matches!(e, Effect::StopSpecialist { .. }))
        .collect();
    assert_eq!(stopped.len(), 2, "every live child of the run is stopped");
    assert!(out.iter().any(|e| matches!(
        e,
        Effect::Send(Envelope::Coordinator {
            msg: CoordinatorMsg::BudgetTripped {
                limit_micros: 100,
                ..
            },
            ..
        })
    )));
    assert_eq!(s.live_count(), 0);
    let (_, out) = check(
        config(),
        vec![
            (0, open(Some(100))),
            (1, admit(1, 1, None, 10)),
            (
                3,
                SupervisorInput::Msg(SupervisorMsg::Spend {
                    attempt: attempt(1, 1),
                    spent_micros: 150,
                }),
            ),
            (4, admit(5, 1, None, 0)),
        ],
    );
    assert!(
        matches!(admission_of(&out), Some(Err(Refusal::Budget { .. }))),
        "no spawn after a trip"
    );
}

#[test]
fn the_spawn_rate_is_a_token_bucket_driven_by_now() {
    let cfg = SupervisorConfig {
        spawn_burst: 2,
        spawn_interval_ms: 1000,
        ..config()
    };
    let (_, out) = check(
        cfg.clone(),
        vec![
            (0, open(None)),
            (5000, admit(1, 1, None, 0)),
            (5000, admit(2, 1, None, 0)),
            (5000, admit(3, 1, None, 0)),
        ],
    );
    assert_eq!(
        admission_of(&out),
        Some(Err(Refusal::Rate {
            retry_after_ms: 1000
        }))
    );
    let (_, out) = check(
        cfg,
        vec![
            (0, open(None)),
            (5000, admit(1, 1, None, 0)),
            (5000, admit(2, 1, None, 0)),
            (6000, admit(3, 1, None, 0)),
        ],
    );
    assert!(admission_of(&out).unwrap().is_ok());
}

#[test]
fn a_missed_deadline_stops_the_attempt_and_answers_with_a_verdict() {
    let cfg = SupervisorConfig {
        subtask_timeout_ms: 500,
        ..config()
    };
    let timer = SupervisorInput::Timer(SupervisorTimer::Deadline(attempt(1, 1)));
    let (s, out) = check(
        cfg,
        vec![(0, open(None)), (0, admit(1, 1, None, 0)), (500, timer)],
    );
    assert!(
        out.iter()
            .any(|e| matches!(e, Effect::StopSpecialist { .. }))
    );
    let lost = out.iter().find_map(|e| match e {
        Effect::Send(Envelope::Coordinator {
            msg: CoordinatorMsg::AttemptLost {
                failure, verdict, ..
            },
            ..
        }) => Some((failure.kind, verdict.clone())),
        _ => None,
    });
    assert!(matches!(
        lost,
        Some((FailureKind::Timeout, Verdict::Restart { .. }))
    ));
    assert_eq!(s.live_count(), 0);
}

#[test]
fn restarts_back_off_and_escalate_past_the_intensity_window() {
    let mut inputs = vec![(0, open(None))];
    let mut afters = Vec::new();
    // Failures of one harness would reroute after three; this spec is about restarts alone.
    let mut s = Supervisor::new(SupervisorConfig {
        harness_failures_max: 100,
        ..config()
    });
    let mut rng = SplitMix64(3);
    let mut out = Vec::new();
    for (now, i) in inputs.drain(..) {
        s.handle(i, now, &mut rng, &mut out);
    }
    for n in 0..4u64 {
        out.clear();
        s.handle(admit(1, 1, Some("alpha"), 0), n * 10, &mut rng, &mut out);
        out.clear();
        s.handle(
            fail(1, FailureKind::Crashed, true),
            n * 10 + 1,
            &mut rng,
            &mut out,
        );
        afters.push(verdict_of(&out).unwrap());
    }
    let ms: Vec<u64> = afters[..3]
        .iter()
        .map(|v| match v {
            Verdict::Restart { after_ms } => *after_ms,
            other => panic!("expected a restart, got {other:?}"),
        })
        .collect();
    assert!(ms[0] >= 1000 && ms[0] <= 1500, "{ms:?}");
    assert!(ms[1] >= 2000 && ms[2] >= 4000, "backoff doubles: {ms:?}");
    assert!(
        matches!(&afters[3], Verdict::Escalate { reason } if reason.starts_with("no meaningful progress"))
    );
}

#[test]
fn a_rate_limit_reroutes_to_another_harness() {
    let (_, out) = check(
        config(),
        vec![
            (0, open(None)),
            (1, admit(1, 1, Some("alpha"), 0)),
            (
                2,
                fail(
                    1,
                    FailureKind::Harness(ErrorCategory::RateLimited {
                        reset_at_unix_ms: Some(60_000),
                    }),
                    true,
                ),
            ),
        ],
    );
    assert_eq!(
        verdict_of(&out),
        Some(Verdict::Reroute {
            agent: "beta".into(),
            after_ms: 0
        })
    );
    // While alpha's harness cools down, a request for alpha is served by beta.
    let (_, out) = check(
        config(),
        vec![
            (0, open(None)),
            (1, admit(1, 1, Some("alpha"), 0)),
            (
                2,
                fail(
                    1,
                    FailureKind::Harness(ErrorCategory::RateLimited {
                        reset_at_unix_ms: Some(60_000),
                    }),
                    true,
                ),
            ),
            (3, admit(2, 1, Some("alpha"), 0)),
        ],
    );
    assert_eq!(admission_of(&out).unwrap().unwrap().agent, "beta");
}

/// alpha (claude-code) bills to `acct-alpha`; keel.toml lists a second Anthropic account and an
/// OpenAI one.
fn with_accounts() -> SupervisorConfig {
    let route = |name: &str, provider| AccountRoute {
        name: name.into(),
        provider,
    };
    SupervisorConfig {
        accounts: vec![
            route("acct-beta", Provider::OpenAi),
            route("acct-alpha", Provider::Anthropic),
            route("anthropic-b", Provider::Anthropic),
        ],
        ..config()
    }
}

fn rate_limited(task: u128) -> SupervisorInput {
    fail(
        task,
        FailureKind::Harness(ErrorCategory::RateLimited {
            reset_at_unix_ms: Some(60_000),
        }),
        true,
    )
}

fn admit_on_account(task: u128, account: Option<&str>) -> SupervisorInput {
    let SupervisorInput::Msg(SupervisorMsg::Admit(mut req)) = admit(task, 1, Some("alpha"), 0)
    else {
        unreachable!()
    };
    req.account = account.map(String::from);
    SupervisorInput::Msg(SupervisorMsg::Admit(req))
}

#[test]
fn a_rate_limit_moves_the_task_to_another_account_of_the_same_provider() {
    let (_, out) = check(
        with_accounts(),
        vec![
            (0, open(None)),
            (1, admit(1, 1, Some("alpha"), 0)),
            (2, rate_limited(1)),
        ],
    );
    // Not the OpenAI account, and not another harness: the same agent on the other Anthropic key.
    assert_eq!(
        verdict_of(&out),
        Some(Verdict::SwitchAccount {
            account: "anthropic-b".into(),
            after_ms: 0
        })
    );
    // The next attempt asks for it; a new task of alpha meanwhile avoids the limited account too,
    // until the limit resets.
    let (_, out) = check(
        with_accounts(),
        vec![
            (0, open(None)),
            (1, admit(1, 1, Some("alpha"), 0)),
            (2, rate_limited(1)),
            (3, admit_on_account(2, Some("anthropic-b"))),
        ],
    );
    let a = admission_of(&out).unwrap().unwrap();
    assert_eq!(
        (a.agent.as_str(), a.account.as_str()),
        ("alpha", "anthropic-b")
    );
    let (_, out) = check(
        with_accounts(),
        vec![
            (0, open(None)),
            (1, admit(1, 1, Some("alpha"), 0)),
            (2, rate_limited(1)),
            (3, admit(3, 1, Some("alpha"), 0)),
        ],
    );
    assert_eq!(admission_of(&out).unwrap().unwrap().account, "anthropic-b");
    let (_, out) = check(
        with_accounts(),
        vec![
            (0, open(None)),
            (1, admit(1, 1, Some("alpha"), 0)),
            (2, rate_limited(1)),
            (60_000, admit(3, 1, Some("alpha"), 0)),
        ],
    );
    assert_eq!(admission_of(&out).unwrap().unwrap().account, "acct-alpha");
}

#[test]
fn a_requested_account_of_another_provider_is_ignored() {
    // A checkpoint naming an OpenAI account cannot bill a Claude Code session to it.
    let (_, out) = check(
        with_accounts(),
        vec![(0, open(None)), (1, admit_on_account(1, Some("acct-beta")))],
    );
    assert_eq!(admission_of(&out).unwrap().unwrap().account, "acct-alpha");
}

#[test]
fn with_every_account_limited_the_rate_limit_falls_back_to_another_harness() {
    let (_, out) = check(
        with_accounts(),
        vec![
            (0, open(None)),
            (1, admit(1, 1, Some("alpha"), 0)),
            (2, rate_limited(1)),
            (3, admit_on_account(2, Some("anthropic-b"))),
            (4, rate_limited(2)),
        ],
    );
    assert_eq!(
        verdict_of(&out),
        Some(Verdict::Reroute {
            agent: "beta".into(),
            after_ms: 0
        })
    );
}

#[test]
fn repeated_failures_of_one_harness_reroute() {
    let cfg = SupervisorConfig {
        restarts_max: 10,
        harness_failures_max: 3,
        ..config()
    };
    let mut inputs = vec![(0, open(None))];
    for t in 1..=3u128 {
        inputs.push((t as u64, admit(t, 1, Some("alpha"), 0)));
        inputs.push((
            t as u64,
            fail(t, FailureKind::Harness(ErrorCategory::Transient), true),
        ));
    }
    let (_, out) = check(cfg, inputs);
    assert_eq!(
        verdict_of(&out),
        Some(Verdict::Reroute {
            agent: "beta".into(),
            after_ms: 0
        })
    );
}

#[test]
fn a_lost_node_restarts_its_attempts_on_the_same_agent() {
    // A worker node dies with several attempts of one harness: each goes down as a crash, and
    // each restarts on its own agent (the harness did not fail; no cooldown, no reroute).
    let cfg = SupervisorConfig {
        restarts_max: 10,
        harness_failures_max: 3,
        ..config()
    };
    let mut inputs = vec![(0, open(None))];
    for t in 1..=5u128 {
        inputs.push((1, admit(t, 1, Some("alpha"), 0)));
    }
    let mut s = Supervisor::new(cfg);
    let mut rng = SplitMix64(1);
    let mut out = Vec::new();
    for (now, input) in inputs {
        s.handle(input, now, &mut rng, &mut out);
    }
    for t in 1..=5u128 {
        out.clear();
        let down = SupervisorMsg::SpecialistDown {
            attempt: attempt(t, 1),
            reason: "worker w1 missed its heartbeats: its lease expired".into(),
            panicked: false,
        };
        s.handle(SupervisorInput::Msg(down), 2, &mut rng, &mut out);
        assert!(
            matches!(verdict_of(&out), Some(Verdict::Restart { .. })),
            "attempt {t}: {:?}",
            verdict_of(&out)
        );
    }
    // The harness stays healthy: a new request for alpha is served by alpha.
    out.clear();
    s.handle(admit(9, 1, Some("alpha"), 0), 3, &mut rng, &mut out);
    assert_eq!(admission_of(&out).unwrap().unwrap().agent, "alpha");
}

#[test]
fn repeated_panics_of_one_harness_reroute() {
    // A specialist actor that panics is keel's adapter or the harness breaking: unlike a lost node,
    // it counts toward the harness's cooldown, so the third panic in the window reroutes.
    let cfg = SupervisorConfig {
        restarts_max: 10,
        harness_failures_max: 3,
        ..config()
    };
    let mut s = Supervisor::new(cfg);
    let mut rng = SplitMix64(1);
    let mut out = Vec::new();
    s.handle(open(None), 0, &mut rng, &mut out);
    let mut verdicts = Vec::new();
    for t in 1..=3u128 {
        s.handle(admit(t, 1, Some("alpha"), 0), t as u64, &mut rng, &mut out);
        out.clear();
        let down = SupervisorMsg::SpecialistDown {
            attempt: attempt(t, 1),
            reason: "failed: the adapter panicked".into(),
            panicked: true,
        };
        s.handle(SupervisorInput::Msg(down), t as u64, &mut rng, &mut out);
        verdicts.push(verdict_of(&out));
    }
    assert!(
        matches!(verdicts[0], Some(Verdict::Restart { .. })),
        "{verdicts:?}"
    );
    assert_eq!(
        verdicts[2],
        Some(Verdict::Reroute {
            agent: "beta".into(),
            after_ms: 0
        }),
        "{verdicts:?}"
    );
}

#[test]
fn policy_failures_escalate_and_business_rules_give_up() {
    let (_, out) = check(
        config(),
        vec![
            (0, open(None)),
            (1, admit(1, 1, None, 0)),
            (
                2,
                fail(1, FailureKind::Harness(ErrorCategory::Permission), false),
            ),
        ],
    );
    assert!(matches!(verdict_of(&out), Some(Verdict::Escalate { .. })));
    let (_, out) = check(
        config(),
        vec![
            (0, open(None)),
            (1, admit(1, 1, None, 0)),
            (
                2,
                fail(1, FailureKind::Harness(ErrorCategory::BusinessRule), false),
            ),
        ],
    );
    assert!(matches!(verdict_of(&out), Some(Verdict::GiveUp { .. })));
    // A failure of an attempt the supervisor no longer knows still gets an answer: nothing waits forever.
    let (_, out) = check(
        config(),
        vec![(0, open(None)), (2, fail(9, FailureKind::Crashed, true))],
    );
    assert!(verdict_of(&out).is_some());
}

#[derive(Clone, Debug)]
enum Op {
    Admit { task: u8, depth: u8, estimate: u16 },
    SettleOk { task: u8, spent: u16 },
    SettleErr { task: u8 },
    Spend { task: u8, spent: u16 },
    Down { task: u8 },
    Deadline { task: u8 },
    Tick { ms: u16 },
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (0u8..40, 0u8..5, 0u16..300).prop_map(|(task, depth, estimate)| Op::Admit { task, depth, estimate }),
        2 => (0u8..40, 0u16..300).prop_map(|(task, spent)| Op::SettleOk { task, spent }),
        1 => (0u8..40).prop_map(|task| Op::SettleErr { task }),
        1 => (0u8..40, 0u16..400).prop_map(|(task, spent)| Op::Spend { task, spent }),
        1 => (0u8..40).prop_map(|task| Op::Down { task }),
        1 => (0u8..40).prop_map(|task| Op::Deadline { task }),
        2 => (0u16..2000).prop_map(|ms| Op::Tick { ms }),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(128))]
    #[test]
    fn limits_hold_under_random_admit_and_settle(ops in proptest::collection::vec(op(), 1..200), limit in prop::option::of(100u64..3000)) {
        let cfg = SupervisorConfig { specialists_max: 5, depth_max: 3, spawn_burst: 4, spawn_interval_ms: 100, subtask_timeout_ms: 1000, ..config() };
        let mut s = Supervisor::new(cfg);
        let mut rng = SplitMix64(9);
        let mut now = 0u64;
        let mut out = Vec::new();
        s.handle(open(limit), now, &mut rng, &mut out);
        let mut admitted_times: Vec<u64> = Vec::new();
        let mut tripped_at: Option<usize> = None;
        for (k, op) in ops.into_iter().enumerate() {
            out.clear();
            let input = match op {
                Op::Admit { task, depth, estimate } => admit(task.into(), depth, None, estimate.into()),
                Op::SettleOk { task, spent } => SupervisorInput::Msg(SupervisorMsg::Settle { attempt: attempt(task.into(), 1), spent_micros: spent.into(), outcome: Ok(()) }),
                Op::SettleErr { task } => fail(task.into(), FailureKind::Crashed, true),
                Op::Spend { task, spent } => SupervisorInput::Msg(SupervisorMsg::Spend { attempt: attempt(task.into(), 1), spent_micros: spent.into() }),
                Op::Down { task } => SupervisorInput::Msg(SupervisorMsg::SpecialistDown { attempt: attempt(task.into(), 1), reason: "gone".into(), panicked: task % 2 == 0 }),
                Op::Deadline { task } => SupervisorInput::Timer(SupervisorTimer::Deadline(attempt(task.into(), 1))),
                Op::Tick { ms } => { now += u64::from(ms); continue; }
            };
            let depth = match &input { SupervisorInput::Msg(SupervisorMsg::Admit(r)) => Some(r.depth), _ => None };
            s.handle(input, now, &mut rng, &mut out);
            prop_assert!(s.live_count() <= 5, "concurrency limit exceeded");
            for e in &out {
                if let Effect::SpawnSpecialist(_) = e {
                    prop_assert!(depth.unwrap_or(0) <= 3, "depth limit exceeded");
                    prop_assert!(tripped_at.is_none(), "a spawn after the budget tripped");
                    admitted_times.push(now);
                }
                if let Effect::Send(Envelope::Coordinator { msg: CoordinatorMsg::BudgetTripped { .. }, .. }) = e {
                    prop_assert!(tripped_at.is_none(), "the trip is reported once");
                    tripped_at = Some(k);
                }
            }
            let ledger = s.ledger(RUN).unwrap();
            if let Some(limit) = limit
                && !ledger.tripped
            {
                prop_assert!(ledger.reserved_micros <= limit, "reservations beyond the budget");
            }
            // Spawn rate: never more than the burst plus one per interval since the first spawn.
            if let Some(&first) = admitted_times.first() {
                let allowed = 4 + (now - first) / 100;
                prop_assert!(admitted_times.len() as u64 <= allowed, "spawn rate exceeded");
            }
        }
    }
}
