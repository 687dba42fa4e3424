//! The supervisor: admission, limits, deadlines, restart, reroute and escalation (docs/DESIGN.md §4).
//!
//! Governance, not execution: it admits or refuses each spawn against the concurrency limit, the depth
//! limit, the run's spend ledger (reserve before, settle after) and a spawn-rate bucket (governor's GCRA on
//! a clock driven by the injected `now`, in `spawn_rate`); it picks the agent, harness and model; it enforces per-subtask deadlines; and
//! after a failure it decides restart (with backoff and a restart-intensity window), a move to another
//! account of the same provider (a rate limit, when one is configured and not cooling down), reroute
//! (rate limit, a harness failing repeatedly, context overflow) or escalation. Every refusal is a
//! typed answer.

use crate::effect::{Effect, Envelope, TimerKey};
use crate::ids::{AttemptId, ReplyTo};
use crate::machine::{Entropy, Machine, Millis, uniform_below};
use crate::message::{
    Assignment, CoordinatorMsg, Refusal, SpawnRequest, SpecialistStart, SupervisorInput,
    SupervisorMsg, SupervisorTimer, Verdict,
};
use crate::report::{FailureKind, SubtaskFailure};
use keel_harness::{ErrorCategory, HarnessKind, Provider};
use keel_store::{AgentProfile, Budget, RunId};
use spawn_rate::SpawnRate;
use std::collections::{BTreeMap, BTreeSet, VecDeque};

mod spawn_rate;

/// How long a concurrency refusal asks the coordinator to wait before asking again.
pub const CONCURRENCY_RETRY_MS: Millis = 1_000;
/// Most settled attempts remembered, to ignore duplicate settles and down events.
pub const SETTLED_REMEMBERED_MAX: usize = 4096;

/// The supervisor's limits and the agents it can assign.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SupervisorConfig {
    /// Most specialists alive at once across all runs (default 20).
    pub specialists_max: u32,
    /// Deepest nesting admitted (default 3).
    pub depth_max: u8,
    /// Spawn-rate bucket size: spawns admitted back to back.
    pub spawn_burst: u32,
    /// Spawn-rate refill: one token every this many milliseconds.
    pub spawn_interval_ms: Millis,
    /// Per-subtask deadline from admission.
    pub subtask_timeout_ms: Millis,
    /// First restart backoff; doubles per restart of the same step, plus up to 50% jitter.
    pub restart_backoff_ms: Millis,
    /// Ceiling of the restart backoff.
    pub restart_backoff_ms_max: Millis,
    /// Most restarts of one step inside `restart_window_ms`; one more escalates (no meaningful progress).
    pub restarts_max: u32,
    /// The restart-intensity window.
    pub restart_window_ms: Millis,
    /// Failures of one harness inside `restart_window_ms` after which it cools down and work is rerouted.
    pub harness_failures_max: u32,
    /// How long a failing or rate-limited harness is avoided.
    pub harness_cooldown_ms: Millis,
    /// The agents that can be assigned, in preference order. The harness is parsed from the profile's
    /// `harness` name; a profile with an unknown harness is never assigned.
    pub agents: Vec<AgentProfile>,
    /// Most runs with an open ledger.
    pub runs_max: u32,
    /// The accounts sessions may bill to, by provider, in preference order (keel.toml's
    /// `[[accounts]]`). An attempt rate-limited on one of them moves to the next healthy account of
    /// the same provider; an account not listed here is never switched from or to.
    pub accounts: Vec<AccountRoute>,
}

/// An account the supervisor may move work to: its name (what [`Assignment::account`] and the
/// node's account table use) and whose keys it holds.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AccountRoute {
    /// The account's name.
    pub name: String,
    /// The provider whose API its key is for; only accounts of the harness's provider can serve a
    /// session of it.
    pub provider: Provider,
}

impl Default for SupervisorConfig {
    fn default() -> Self {
        Self {
            specialists_max: 20,
            depth_max: 3,
            spawn_burst: 20,
            spawn_interval_ms: 100,
            subtask_timeout_ms: 10 * 60 * 1000,
            restart_backoff_ms: 1_000,
            restart_backoff_ms_max: 60_000,
            restarts_max: 3,
            restart_window_ms: 10 * 60 * 1000,
            harness_failures_max: 3,
            harness_cooldown_ms: 5 * 60 * 1000,
            agents: Vec::new(),
            runs_max: 1024,
            accounts: Vec::new(),
        }
    }
}

/// A run's spend ledger, in micro-dollars.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct Ledger {
    /// The limit; `None` is unlimited.
    pub limit_micros: Option<u64>,
    /// Settled spend.
    pub spent_micros: u64,
    /// Reserved by live attempts and not yet settled.
    pub reserved_micros: u64,
    /// Whether the budget tripped (no more spawns for this run).
    pub tripped: bool,
}

#[derive(Clone, Debug, PartialEq, Eq)]
struct Live {
    step: String,
    agent: String,
    harness: HarnessKind,
    reserved_micros: u64,
    spent_micros: u64,
    deadline_at: Millis,
    assignment: Assignment,
}

#[derive(Clone, Debug, Default, PartialEq, Eq)]
struct HarnessHealth {
    failures: VecDeque<Millis>,
    cooldown_until: Millis,
}

/// The supervisor of a node group.
#[derive(Debug)]
pub struct Supervisor {
    config: SupervisorConfig,
    live: BTreeMap<AttemptId, Live>,
    ledgers: BTreeMap<RunId, Ledger>,
    settled: BTreeSet<AttemptId>,
    settled_order: VecDeque<AttemptId>,
    /// The spawn-rate bucket.
    spawn_rate: SpawnRate,
    restarts: BTreeMap<(RunId, String), VecDeque<Millis>>,
    health: BTreeMap<HarnessKind, HarnessHealth>,
    /// Until when each rate-limited account is avoided (only accounts of `config.accounts`, so
    /// bounded by the configuration).
    account_cooldowns: BTreeMap<String, Millis>,
}

impl Supervisor {
    /// A supervisor with no runs and no live specialists.
    pub fn new(config: SupervisorConfig) -> Self {
        Self {
            spawn_rate: SpawnRate::new(config.spawn_burst, config.spawn_interval_ms),
            config,
            live: BTreeMap::new(),
            ledgers: BTreeMap::new(),
            settled: BTreeSet::new(),
            settled_order: VecDeque::new(),
            restarts: BTreeMap::new(),
            health: BTreeMap::new(),
            account_cooldowns: BTreeMap::new(),
        }
    }

    /// Live specialists right now (never above `specialists_max`).
    pub fn live_count(&self) -> usize {
        self.live.len()
    }

    /// A run's ledger, if open.
    pub fn ledger(&self, run: RunId) -> Option<&Ledger> {
        self.ledgers.get(&run)
    }

    /// The live attempts, in id order (for invariant checks).
    pub fn live_attempts(&self) -> impl Iterator<Item = AttemptId> + '_ {
        self.live.keys().copied()
    }

    /// The configuration.
    pub fn config(&self) -> &SupervisorConfig {
        &self.config
    }

    fn remember_settled(&mut self, attempt: AttemptId) {
        if self.settled.insert(attempt) {
            self.settled_order.push_back(attempt);
            while self.settled_order.len() > SETTLED_REMEMBERED_MAX {
                if let Some(old) = self.settled_order.pop_front() {
                    self.settled.remove(&old);
                }
            }
        }
    }

    fn healthy(&self, harness: HarnessKind, now: Millis) -> bool {
        self.health
            .get(&harness)
            .is_none_or(|h| h.cooldown_until <= now)
    }

    /// The configured account `name` if it serves `harness`'s provider.
    fn account_route(&self, name: &str, harness: HarnessKind) -> Option<&AccountRoute> {
        let provider = harness.provider()?;
        self.config
            .accounts
            .iter()
            .find(|a| a.name == name && a.provider == provider)
    }

    fn account_healthy(&self, name: &str, now: Millis) -> bool {
        self.account_cooldowns
            .get(name)
            .is_none_or(|until| *until <= now)
    }

    /// The first healthy configured account of `harness`'s provider other than `not`, which must
    /// itself be a configured account of that provider (an account keel.toml does not list is
    /// never switched from).
    fn other_account(&self, not: &str, harness: HarnessKind, now: Millis) -> Option<String> {
        let provider = self.account_route(not, harness)?.provider;
        self.config
            .accounts
            .iter()
            .find(|a| a.provider == provider && a.name != not && self.account_healthy(&a.name, now))
            .map(|a| a.name.clone())
    }

    /// The account an admitted attempt bills to: the one the step asks for (an earlier switch, kept
    /// in the run's checkpoint) when it serves the harness's provider, else the profile's; and if
    /// that one is cooling down after a rate limit, another healthy account of the same provider.
    fn pick_account(
        &self,
        assignment: &Assignment,
        requested: Option<&str>,
        now: Millis,
    ) -> String {
        let base = requested
            .filter(|r| self.account_route(r, assignment.harness).is_some())
            .unwrap_or(&assignment.account);
        if self.account_healthy(base, now) {
            return base.to_string();
        }
        self.other_account(base, assignment.harness, now)
            .unwrap_or_else(|| base.to_string())
    }

    fn profile(&self, name: &str) -> Option<(&AgentProfile, HarnessKind)> {
        self.config
            .agents
            .iter()
            .find(|a| a.name == name)
            .and_then(|a| HarnessKind::parse(&a.harness).map(|h| (a, h)))
    }

    /// Pick the agent for a spawn: the requested one if its harness is healthy, else the first agent on
    /// a healthy harness (a reroute at admission), else the requested one anyway (cooldowns are advice,
    /// not a reason to hang).
    fn pick_agent(&self, requested: Option<&str>, now: Millis) -> Result<Assignment, Refusal> {
        let assignable = || {
            self.config
                .agents
                .iter()
                .filter_map(|a| HarnessKind::parse(&a.harness).map(|h| (a, h)))
        };
        let chosen = match requested {
            Some(name) => {
                let Some((profile, harness)) = self.profile(name) else {
                    return Err(Refusal::NoAgent {
                        reason: format!("no agent profile named {name:?} with a known harness"),
                    });
                };
                if self.healthy(harness, now) {
                    (profile, harness)
                } else {
                    assignable()
                        .find(|(_, h)| self.healthy(*h, now))
                        .unwrap_or((profile, harness))
                }
            }
            None => match assignable()
                .find(|(_, h)| self.healthy(*h, now))
                .or_else(|| assignable().next())
            {
                Some(found) => found,
                None => {
                    return Err(Refusal::NoAgent {
                        reason: "no agent profile with a known harness is configured".into(),
                    });
                }
            },
        };
        Ok(resolve_assignment(chosen.0, chosen.1))
    }

    fn admit(&mut self, req: SpawnRequest, now: Millis, out: &mut Vec<Effect>) {
        let attempt = req.attempt;
        if let Some(live) = self.live.get(&attempt) {
            // A repeated Admit of an admitted attempt gets the same answer and no second spawn.
            let answer = Ok(live.assignment.clone());
            out.push(admission(attempt, answer));
            return;
        }
        let answer = self.decide_admission(&req, now);
        match answer {
            Ok(assignment) => {
                let deadline_at = now.saturating_add(self.config.subtask_timeout_ms);
                if let Some(ledger) = self.ledgers.get_mut(&attempt.run) {
                    ledger.reserved_micros =
                        ledger.reserved_micros.saturating_add(req.estimate_micros);
                }
                self.live.insert(
                    attempt,
                    Live {
                        step: req.brief.step.clone(),
                        agent: assignment.agent.clone(),
                        harness: assignment.harness,
                        reserved_micros: req.estimate_micros,
                        spent_micros: 0,
                        deadline_at,
                        assignment: assignment.clone(),
                    },
                );
                out.push(admission(attempt, Ok(assignment.clone())));
                out.push(Effect::SetTimer {
                    key: TimerKey::Supervisor(SupervisorTimer::Deadline(attempt)),
                    at: deadline_at,
                });
                out.push(Effect::SpawnSpecialist(Box::new(SpecialistStart {
                    attempt,
                    reply_to: ReplyTo::new(attempt),
                    task: attempt.task,
                    brief: req.brief,
                    assignment,
                    continuity: req.continuity,
                    kind: req.kind,
                    deadline_at,
                })));
            }
            Err(refusal) => {
                if let Refusal::Budget { .. } = refusal {
                    self.trip(attempt.run, out);
                }
                out.push(admission(attempt, Err(refusal)));
            }
        }
    }

    fn decide_admission(&mut self, req: &SpawnRequest, now: Millis) -> Result<Assignment, Refusal> {
        let Some(ledger) = self.ledgers.get(&req.attempt.run) else {
            return Err(Refusal::UnknownRun);
        };
        let committed = ledger.spent_micros.saturating_add(ledger.reserved_micros);
        if let Some(limit) = ledger.limit_micros
            && (ledger.tripped || committed.saturating_add(req.estimate_micros) > limit)
        {
            return Err(Refusal::Budget {
                committed_micros: committed,
                requested_micros: req.estimate_micros,
                limit_micros: limit,
            });
        }
        if req.depth > self.config.depth_max {
            return Err(Refusal::Depth {
                depth: req.depth,
                limit: self.config.depth_max,
            });
        }
        if self.live.len() >= self.config.specialists_max as usize {
            return Err(Refusal::Concurrency {
                limit: self.config.specialists_max,
                retry_after_ms: CONCURRENCY_RETRY_MS,
            });
        }
        let mut assignment = self.pick_agent(req.agent.as_deref(), now)?;
        assignment.account = self.pick_account(&assignment, req.account.as_deref(), now);
        // The token is taken only for a spawn that passed every other check.
        self.spawn_rate
            .take(now)
            .map_err(|retry_after_ms| Refusal::Rate { retry_after_ms })?;
        Ok(assignment)
    }

    /// Trip a run's budget: refuse its spawns from now on, stop and settle its live attempts, and tell
    /// its coordinator once.
    fn trip(&mut self, run: RunId, out: &mut Vec<Effect>) {
        let Some(ledger) = self.ledgers.get_mut(&run) else {
            return;
        };
        if ledger.tripped {
            return;
        }
        ledger.tripped = true;
        let doomed: Vec<AttemptId> = self.live.range(run_range(run)).map(|(a, _)| *a).collect();
        for attempt in doomed {
            if let Some(live) = self.live.remove(&attempt) {
                out.push(cancel_deadline(attempt));
                if let Some(ledger) = self.ledgers.get_mut(&run) {
                    ledger.reserved_micros =
                        ledger.reserved_micros.saturating_sub(live.reserved_micros);
                    ledger.spent_micros = ledger.spent_micros.saturating_add(live.spent_micros);
                }
                out.push(Effect::StopSpecialist {
                    attempt,
                    reason: "budget exceeded".into(),
                });
                self.remember_settled(attempt);
            }
        }
        if let Some(ledger) = self.ledgers.get(&run) {
            out.push(Effect::Send(Envelope::Coordinator {
                run,
                msg: CoordinatorMsg::BudgetTripped {
                    committed_micros: ledger.spent_micros.saturating_add(ledger.reserved_micros),
                    limit_micros: ledger.limit_micros.unwrap_or(0),
                },
            }));
        }
    }

    fn over_budget(&self, run: RunId) -> bool {
        let Some(ledger) = self.ledgers.get(&run) else {
            return false;
        };
        let Some(limit) = ledger.limit_micros else {
            return false;
        };
        let live_over: u64 = self
            .live
            .range(run_range(run))
            .map(|(_, l)| l.spent_micros.max(l.reserved_micros))
            .fold(0u64, u64::saturating_add);
        ledger.spent_micros.saturating_add(live_over) > limit
    }

    fn record_harness_failure(&mut self, harness: HarnessKind, now: Millis, until: Option<Millis>) {
        let window = self.config.restart_window_ms;
        let max = self.config.harness_failures_max.max(1) as usize;
        let cooldown = self.config.harness_cooldown_ms;
        let h = self.health.entry(harness).or_default();
        h.failures.push_back(now);
        while h
            .failures
            .front()
            .is_some_and(|&t| t.saturating_add(window) < now)
        {
            h.failures.pop_front();
        }
        while h.failures.len() > max {
            h.failures.pop_front();
        }
        if let Some(until) = until {
            h.cooldown_until = h.cooldown_until.max(until);
        } else if h.failures.len() >= max {
            h.cooldown_until = h.cooldown_until.max(now.saturating_add(cooldown));
        }
    }

    fn alternative(&self, not: HarnessKind, now: Millis) -> Option<String> {
        self.config
            .agents
            .iter()
            .filter_map(|a| HarnessKind::parse(&a.harness).map(|h| (a, h)))
            .find(|(_, h)| *h != not && self.healthy(*h, now))
            .map(|(a, _)| a.name.clone())
    }

    /// Restarts of this step inside the window, after recording one more if `record`.
    fn restart_intensity(&mut self, run: RunId, step: &str, now: Millis) -> usize {
        let window = self.config.restart_window_ms;
        let cap = self.config.restarts_max as usize + 1;
        let q = self.restarts.entry((run, step.to_string())).or_default();
        while q.front().is_some_and(|&t| t.saturating_add(window) < now) {
            q.pop_front();
        }
        q.push_back(now);
        while q.len() > cap {
            q.pop_front();
        }
        q.len()
    }

    fn backoff(&self, restarts: usize, rng: &mut dyn Entropy) -> Millis {
        let exp = u32::try_from(restarts.saturating_sub(1))
            .unwrap_or(u32::MAX)
            .min(20);
        let base = self
            .config
            .restart_backoff_ms
            .saturating_mul(1u64 << exp)
            .min(self.config.restart_backoff_ms_max);
        base.saturating_add(uniform_below(rng, base / 2 + 1))
    }

    /// Decide what happens after `failure` of an attempt of `step` that ran as `agent` on `harness`,
    /// billed to `account`.
    #[allow(clippy::too_many_arguments)]
    fn verdict(
        &mut self,
        run: RunId,
        step: &str,
        agent: Option<&str>,
        harness: Option<HarnessKind>,
        account: Option<&str>,
        failure: &SubtaskFailure,
        now: Millis,
        rng: &mut dyn Entropy,
    ) -> Verdict {
        if self.ledgers.get(&run).is_some_and(|l| l.tripped) {
            return Verdict::GiveUp {
                reason: "the run's budget tripped".into(),
            };
        }
        let after_hint = failure.retry_after_ms.unwrap_or(0);
        match failure.kind {
            FailureKind::Harness(ErrorCategory::Permission | ErrorCategory::Auth) => {
                return Verdict::Escalate {
                    reason: format!(
                        "policy exception: {} failure needs a human ({})",
                        failure.kind.name(),
                        failure.detail
                    ),
                };
            }
            FailureKind::Harness(ErrorCategory::BusinessRule)
            | FailureKind::Harness(ErrorCategory::Cancelled)
            | FailureKind::Cancelled
            | FailureKind::Refused => {
                return Verdict::GiveUp {
                    reason: format!(
                        "{} is not retryable: {}",
                        failure.kind.name(),
                        failure.detail
                    ),
                };
            }
            _ => {}
        }
        if !failure.retryable
            && !matches!(
                failure.kind,
                FailureKind::Harness(ErrorCategory::ContextOverflow)
                    | FailureKind::Timeout
                    | FailureKind::Crashed
            )
        {
            return Verdict::GiveUp {
                reason: format!(
                    "{} is not retryable: {}",
                    failure.kind.name(),
                    failure.detail
                ),
            };
        }
        let restarts = self.restart_intensity(run, step, now);
        if restarts > self.config.restarts_max as usize {
            return Verdict::Escalate {
                reason: format!(
                    "no meaningful progress: {} restarts of step {step:?} within {} ms",
                    restarts, self.config.restart_window_ms
                ),
            };
        }
        if let FailureKind::Harness(ErrorCategory::RateLimited { reset_at_unix_ms }) = failure.kind
        {
            let until = reset_at_unix_ms
                .unwrap_or(now.saturating_add(after_hint.max(self.config.harness_cooldown_ms)));
            // The limit is the account's: another account of the same provider serves the same
            // agent at once, with a resume preamble like any retry (docs/DESIGN.md §4).
            if let (Some(h), Some(account)) = (harness, account)
                && self.account_route(account, h).is_some()
            {
                let cooldown = self
                    .account_cooldowns
                    .entry(account.to_string())
                    .or_insert(0);
                *cooldown = (*cooldown).max(until);
                if let Some(other) = self.other_account(account, h, now) {
                    return Verdict::SwitchAccount {
                        account: other,
                        after_ms: 0,
                    };
                }
            }
            if let Some(h) = harness {
                self.record_harness_failure(h, now, Some(until));
                if let Some(other) = self.alternative(h, now) {
                    return Verdict::Reroute {
                        agent: other,
                        after_ms: 0,
                    };
                }
            }
            return Verdict::Restart {
                after_ms: until.saturating_sub(now).max(after_hint),
            };
        }
        if let FailureKind::Harness(ErrorCategory::ContextOverflow) = failure.kind {
            // A saturated context is not retried with the same growing history: a re-dispatch with a
            // bounded resume preamble, on the same agent unless its harness is cooling down.
            let same = agent.map(str::to_string);
            let target = match (same, harness) {
                (Some(a), Some(h)) if self.healthy(h, now) => Some(a),
                (_, Some(h)) => self.alternative(h, now),
                (a, None) => a,
            };
            if let Some(agent) = target {
                return Verdict::Reroute { agent, after_ms: 0 };
            }
        }
        if let Some(h) = harness {
            // A crash is the specialist's actor or its node dying (a cluster worker lost with all
            // the attempts it hosted, a panic): not the harness failing, so it does not count
            // toward the harness's cooldown, which would reroute the restarts to another agent.
            if !matches!(failure.kind, FailureKind::Crashed) {
                self.record_harness_failure(h, now, None);
            }
            if !self.healthy(h, now)
                && let Some(other) = self.alternative(h, now)
            {
                return Verdict::Reroute {
                    agent: other,
                    after_ms: 0,
                };
            }
        }
        Verdict::Restart {
            after_ms: self.backoff(restarts, rng).max(after_hint),
        }
    }

    /// End a live attempt: release its slot, settle its spend, cancel its deadline. Returns what it
    /// was.
    fn settle_live(
        &mut self,
        attempt: AttemptId,
        spent_micros: u64,
        out: &mut Vec<Effect>,
    ) -> Option<Live> {
        let live = self.live.remove(&attempt)?;
        out.push(cancel_deadline(attempt));
        if let Some(ledger) = self.ledgers.get_mut(&attempt.run) {
            ledger.reserved_micros = ledger.reserved_micros.saturating_sub(live.reserved_micros);
            ledger.spent_micros = ledger
                .spent_micros
                .saturating_add(spent_micros.max(live.spent_micros));
        }
        self.remember_settled(attempt);
        Some(live)
    }

    fn lose(
        &mut self,
        attempt: AttemptId,
        kind: FailureKind,
        detail: String,
        now: Millis,
        rng: &mut dyn Entropy,
        out: &mut Vec<Effect>,
    ) {
        let Some(live) = self.settle_live(attempt, 0, out) else {
            return;
        };
        out.push(Effect::StopSpecialist {
            attempt,
            reason: detail.clone(),
        });
        let failure = SubtaskFailure {
            kind,
            attempted: format!(
                "attempt {} as {} on {}",
                attempt.attempt, live.agent, live.harness
            ),
            partial: Vec::new(),
            retryable: true,
            retry_after_ms: None,
            detail,
        };
        let verdict = self.verdict(
            attempt.run,
            &live.step,
            Some(&live.agent),
            Some(live.harness),
            Some(&live.assignment.account),
            &failure,
            now,
            rng,
        );
        out.push(Effect::Send(Envelope::Coordinator {
            run: attempt.run,
            msg: CoordinatorMsg::AttemptLost {
                attempt,
                failure,
                verdict,
            },
        }));
        if self.over_budget(attempt.run) {
            self.trip(attempt.run, out);
        }
    }
}

fn run_range(run: RunId) -> std::ops::RangeInclusive<AttemptId> {
    let lo = AttemptId {
        run,
        task: keel_store::TaskId(0),
        attempt: 0,
    };
    let hi = AttemptId {
        run,
        task: keel_store::TaskId(u128::MAX),
        attempt: u32::MAX,
    };
    lo..=hi
}

fn admission(attempt: AttemptId, answer: Result<Assignment, Refusal>) -> Effect {
    Effect::Send(Envelope::Coordinator {
        run: attempt.run,
        msg: CoordinatorMsg::Admission { attempt, answer },
    })
}

/// The assignment of a profile: the model always comes from the assignee's own profile
/// (docs/DESIGN.md §12, invariant 6); nothing about a parent task is an input here.
pub fn resolve_assignment(profile: &AgentProfile, harness: HarnessKind) -> Assignment {
    Assignment {
        agent: profile.name.clone(),
        harness,
        model: crate::routing::model_for(profile).to_string(),
        account: profile.account.clone(),
        // The profile's session settings reach every session it runs (issue 11): its spec's
        // allowed tools, appended system prompt and turn ceiling (0 in a profile: not set).
        tools: profile.tools.clone(),
        system_prompt: profile.system_prompt.clone(),
        turns_max: (profile.limits.turns_max > 0).then_some(profile.limits.turns_max),
    }
}

impl Machine for Supervisor {
    type Input = SupervisorInput;
    type Effect = Effect;

    fn handle(
        &mut self,
        input: SupervisorInput,
        now: Millis,
        rng: &mut dyn Entropy,
        out: &mut Vec<Effect>,
    ) {
        match input {
            SupervisorInput::Msgs(msgs) => {
                let first = out.len();
                for msg in msgs {
                    self.handle(SupervisorInput::Msg(msg), now, rng, out);
                }
                answers_first(&mut out[first..]);
            }
            SupervisorInput::Msg(SupervisorMsg::OpenRun { run, budget }) => {
                self.open_run(run, budget);
            }
            SupervisorInput::Msg(SupervisorMsg::Admit(req)) => self.admit(*req, now, out),
            SupervisorInput::Msg(SupervisorMsg::Spend {
                attempt,
                spent_micros,
            }) => {
                if let Some(live) = self.live.get_mut(&attempt) {
                    live.spent_micros = live.spent_micros.max(spent_micros);
                    if self.over_budget(attempt.run) {
                        self.trip(attempt.run, out);
                    }
                }
            }
            SupervisorInput::Msg(SupervisorMsg::Settle {
                attempt,
                spent_micros,
                outcome,
            }) => {
                let live = self.settle_live(attempt, spent_micros, out);
                if let Err(failure) = outcome {
                    // Even for an attempt already lost or settled, a failure gets an answer: the
                    // coordinator must never wait for a verdict that does not come.
                    let (step, agent, harness, account) = match &live {
                        Some(l) => (
                            l.step.clone(),
                            Some(l.agent.clone()),
                            Some(l.harness),
                            Some(l.assignment.account.clone()),
                        ),
                        None => (format!("{}", attempt.task), None, None, None),
                    };
                    let verdict = self.verdict(
                        attempt.run,
                        &step,
                        agent.as_deref(),
                        harness,
                        account.as_deref(),
                        &failure,
                        now,
                        rng,
                    );
                    out.push(Effect::Send(Envelope::Coordinator {
                        run: attempt.run,
                        msg: CoordinatorMsg::Verdict { attempt, verdict },
                    }));
                }
                if live.is_some() && self.over_budget(attempt.run) {
                    self.trip(attempt.run, out);
                }
            }
            SupervisorInput::Msg(SupervisorMsg::SpecialistDown {
                attempt,
                reason,
                panicked,
            }) => {
                let kind = if panicked {
                    FailureKind::Harness(ErrorCategory::System)
                } else {
                    FailureKind::Crashed
                };
                self.lose(attempt, kind, reason, now, rng, out);
            }
            SupervisorInput::Msg(SupervisorMsg::CloseRun { run }) => {
                let doomed: Vec<AttemptId> =
                    self.live.range(run_range(run)).map(|(a, _)| *a).collect();
                for attempt in doomed {
                    self.settle_live(attempt, 0, out);
                    out.push(Effect::StopSpecialist {
                        attempt,
                        reason: "run closed".into(),
                    });
                }
                self.ledgers.remove(&run);
                self.restarts.retain(|(r, _), _| *r != run);
            }
            SupervisorInput::Timer(SupervisorTimer::Deadline(attempt)) => {
                if self
                    .live
                    .get(&attempt)
                    .is_some_and(|l| l.deadline_at <= now)
                {
                    let detail = format!(
                        "no report within the per-subtask timeout of {} ms",
                        self.config.subtask_timeout_ms
                    );
                    self.lose(attempt, FailureKind::Timeout, detail, now, rng, out);
                }
            }
        }
    }
}

/// Puts the effects that answer a coordinator ahead of the others, each group in its order: one
/// step's admissions then reach their coordinator as one input, before the specialists they
/// admitted are spawned (as a lone admission's answer is sent before its spawn).
fn answers_first(effects: &mut [Effect]) {
    // A stable sort on one key: the answers keep their order, and so does the rest.
    effects.sort_by_key(|e| !matches!(e, Effect::Send(Envelope::Coordinator { .. })));
}

impl Supervisor {
    fn open_run(&mut self, run: RunId, budget: Budget) {
        if let Some(l) = self.ledgers.get_mut(&run) {
            l.spent_micros = l.spent_micros.max(budget.spent_micros);
            l.limit_micros = budget.limit_micros;
            return;
        }
        if self.ledgers.len() >= self.config.runs_max as usize {
            // Bounded: the run's admissions will be refused with `UnknownRun`, a typed answer.
            return;
        }
        self.ledgers.insert(
            run,
            Ledger {
                limit_micros: budget.limit_micros,
                spent_micros: budget.spent_micros,
                reserved_micros: 0,
                tripped: false,
            },
        );
    }
}

/// The effect that drops `attempt`'s pending deadline at the host (see [`Effect::CancelTimer`]).
fn cancel_deadline(attempt: AttemptId) -> Effect {
    Effect::CancelTimer {
        key: TimerKey::Supervisor(SupervisorTimer::Deadline(attempt)),
    }
}
