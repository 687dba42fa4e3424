//! keel on several processes: `keel node` coordinator and worker processes over ractor_cluster on
//! 127.0.0.1, running a 16-specialist fan-out against one scripted model server process whose request
//! recordings count every session started.
//!
//! - Undisturbed: the run completes with the reference reports and its specialists ran on both
//!   workers; two parts run on the real Claude Code (one through its Bash tool, one calling keel's
//!   `report_progress` on its worker's MCP endpoint), skipped only with `KEEL_SKIP_REAL_CLIS=1`
//!   when it is not installed.
//! - SIGKILL of one worker mid-run (with the Claude Code sessions it started, as when its machine
//!   dies): its attempts go down when its lease expires and run again on the other worker with
//!   resume preambles; no acknowledged step runs a second session; the reports equal the
//!   undisturbed run's. Two parts run on the real Claude Code, and the worker killed is one that
//!   runs a Claude Code session at that moment: that part's next session, on the other worker, is
//!   Claude Code again and starts with keel's resume preamble.
//! - SIGKILL of the coordinator mid-run, then a restart: it resumes the run from its checkpoint, the
//!   workers reconnect by themselves, and the reports equal the undisturbed run's.
//! - A wrong cookie is refused (both sides log it; the worker never joins), a cookie file others may
//!   read is refused before anything starts, and a message of another protocol version is refused
//!   with a logged error while the session stays up.
#![allow(clippy::unwrap_used, clippy::expect_used)] // Tests: a panic is the failure report.

use keel_cluster::wire::encode_as_version;
use keel_cluster::{ClusterMsg, NodeName, PROTOCOL_VERSION, ToCoordinator, WorkerStatus};
use keel_store::{RunId, RunStatus, TaskStatus};
use keel_tests::cluster::{
    COOKIE, ClusterHome, NODE_LOG, free_port, join_coordinator, write_cookie,
};
use keel_tests::fan_out::{claims, count, expected_claims, openings_of, part, reader, subtasks};
use keel_tests::serve::worker_command;
use keel_tests::{Reaped, keel, recorded_bodies, session_openings, wait_for};
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::time::Duration;

const STEPS: usize = 16;
const RUN_WAIT: Duration = Duration::from_secs(180);
const JOIN_WAIT: Duration = Duration::from_secs(60);
/// The variable holding the scripted model server's made-up key, for runs with [[agents]].
const KEY_ENV: &str = "KEEL_CLUSTER_TEST_KEY";

/// Which harnesses the fan-out's parts run on.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Harnesses {
    /// Every part on keel's own loop (the built-in scripted profile).
    Loop,
    /// Parts 0 and 1 on the real Claude Code ([`claude_part`]), the others on keel's loop: two
    /// profiles of keel.toml, both on the scripted model server.
    WithClaudeCode,
    /// As [`Harnesses::WithClaudeCode`], but parts 0 and 1 both run a slow command through Claude
    /// Code's Bash tool ([`slow_claude_part`]), so that a kill lands inside their sessions.
    SlowClaudeCode,
}

impl Harnesses {
    /// Whether parts 0 and 1 run on Claude Code.
    fn claude(self) -> bool {
        self != Harnesses::Loop
    }
}

/// The parts that run on Claude Code (with [`Harnesses::claude`]).
const CLAUDE_PARTS: [usize; 2] = [0, 1];

/// What part `i` on Claude Code does: part 0 runs `echo part 0 done` through Claude Code's Bash
/// tool and reports its line; part 1 calls keel's `report_progress` tool, on the MCP endpoint of the
/// worker that hosts it, and reports the tool's answer. Both claims are what [`expected`] names.
fn claude_part(i: usize) -> String {
    match i {
        0 => "Part 0 of the fan-out. REPORT_AFTER_TOOL\nRUN_TOOL: echo part 0 done ;;".into(),
        _ => format!(
            "Part {i} of the fan-out. REPORT_AFTER_TOOL\nCALL_TOOL: mcp__keel__report_progress {}",
            serde_json::json!({"note": format!("part {i} on claude code")})
        ),
    }
}

/// What part `i` on Claude Code does in the kill test: it runs `sleep 6; echo part i done` through
/// Claude Code's Bash tool and reports its line (the claim of a part on keel's loop).
fn slow_claude_part(i: usize) -> String {
    format!("Part {i} of the fan-out. REPORT_AFTER_TOOL\nRUN_TOOL: sleep 6; echo part {i} done ;;")
}

/// Whether a recorded request body is Claude Code's (its system prompt names it) for part `i`.
fn claude_request_of(body: &str, i: usize) -> bool {
    body.contains("Claude Code") && body.contains(&format!("Part {i} of the fan-out."))
}

/// Whether a recorded request body carries keel's resume preamble.
fn resumes(body: &str) -> bool {
    body.contains(r#"kind=\"resume\""#)
}

/// The claims of an undisturbed run with `harnesses`, sorted.
fn expected(harnesses: Harnesses) -> Vec<String> {
    let mut claims = expected_claims(STEPS);
    if harnesses == Harnesses::WithClaudeCode {
        claims.retain(|c| c != "part 1 done");
        claims.push("recorded: progress note 1".into());
        claims.sort();
    }
    claims
}

struct Cluster {
    /// The model server's folder (its recordings).
    _models: tempfile::TempDir,
    home: ClusterHome,
    record: PathBuf,
    _server: Reaped,
    url: String,
    port: u16,
    harnesses: Harnesses,
}

/// A working folder with a keel home, a 16-part plan, a private cookie file and a
/// recording model server.
fn cluster(harnesses: Harnesses) -> Cluster {
    let models = tempfile::tempdir().unwrap();
    let record = models.path().join("requests");
    let (server, url) = keel_tests::model_server(models.path(), &record).unwrap();
    let mut keel_toml = "[supervisor]\nmax_concurrent_specialists = 16\n".to_string();
    if harnesses.claude() {
        keel_toml.push_str(&format!(
            "\n[[accounts]]\nname = \"scripted\"\nprovider = \"anthropic\"\nbase_url = \"{url}\"\nkey_env = \"{KEY_ENV}\"\n\
             \n[[agents]]\nname = \"loop\"\nharness = \"messages-api\"\nmodel = \"keel-scripted-1\"\naccount = \"scripted\"\n\
             \n[[agents]]\nname = \"claude\"\nharness = \"claude-code\"\nmodel = \"keel-scripted-1\"\naccount = \"scripted\"\n"
        ));
    }
    // Two waves of 8 (two workers of capacity 4), each part long enough for a kill to land inside it.
    let home = ClusterHome::new(&keel_toml, STEPS, |i| {
        format!("sleep 2; echo part {i} done")
    });
    if harnesses.claude() {
        let path = home.work.join("plan.json");
        let mut plan: keel_actors::Plan =
            serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
        for i in CLAUDE_PARTS {
            let step = &mut plan.steps[i];
            step.brief = if harnesses == Harnesses::SlowClaudeCode {
                slow_claude_part(i)
            } else {
                claude_part(i)
            };
            step.assignee = Some("claude".into());
        }
        std::fs::write(&path, serde_json::to_string(&plan).unwrap()).unwrap();
    }
    Cluster {
        _models: models,
        home,
        record,
        _server: server,
        url,
        port: free_port(),
        harnesses,
    }
}

impl Cluster {
    fn work(&self) -> &Path {
        &self.home.work
    }

    fn coordinator_addr(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    /// `keel node --role coordinator`, with `--run` of the plan when `run` (waiting for 2 workers).
    fn coordinator(&self, run: bool) -> Reaped {
        let mut cmd = keel(self.work()).unwrap();
        cmd.env("KEEL_LOG", NODE_LOG).args([
            "node",
            "--role",
            "coordinator",
            "--listen",
            &self.coordinator_addr(),
            "--lease-ms",
            "1500",
            "--model-server",
            &self.url,
        ]);
        cmd.arg("--cookie-file").arg(&self.home.cookie);
        if run {
            cmd.args([
                "--run",
                "fan out",
                "--plan",
                "plan.json",
                "--wait-workers",
                "2",
            ]);
        } else {
            // A daemon serves the HTTP API: on a free port, so tests can run side by side. These
            // tests read the store file beside it, so it shares the file.
            cmd.args(["--api", "127.0.0.1:0", "--share-store"]);
        }
        let mut c = Reaped::spawn(cmd).unwrap();
        c.line_containing("listening on", JOIN_WAIT).unwrap();
        c
    }

    fn worker(&self, name: &str, cookie: &Path) -> Reaped {
        let mut cmd = worker_command(self.work(), &self.coordinator_addr(), name, cookie);
        cmd.env("KEEL_LOG", NODE_LOG)
            .env(KEY_ENV, "sk-cluster-test-key")
            .args([
                "--capacity",
                "4",
                "--lease-ms",
                "1500",
                "--model-server",
                &self.url,
            ]);
        Reaped::spawn(cmd).unwrap()
    }
}

fn started_run(c: &mut Reaped) -> RunId {
    let line = c
        .line_containing("started on the cluster", RUN_WAIT)
        .unwrap();
    line.split_whitespace().nth(1).unwrap().parse().unwrap()
}

/// The worker each task was placed on last, by the coordinator's log ("specialist placed on a
/// worker attempt=TASK#N worker=NAME").
fn last_placements(log: &str) -> BTreeMap<String, String> {
    let field = |line: &str, name: &str| {
        line.split(name)
            .nth(1)
            .and_then(|rest| rest.split_whitespace().next())
            .map(str::to_string)
    };
    let mut last = BTreeMap::new();
    for line in log
        .lines()
        .filter(|l| l.contains("specialist placed on a worker"))
    {
        if let (Some(attempt), Some(worker)) = (field(line, " attempt="), field(line, " worker=")) {
            let task = attempt.split('#').next().unwrap_or_default().to_string();
            last.insert(task, worker);
        }
    }
    last
}

/// The process ids whose parent is `pid` (Linux: `/proc/*/stat`).
fn children_of(pid: u32) -> Vec<i32> {
    std::fs::read_dir("/proc")
        .unwrap()
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<i32>().ok())
        .filter(|child| {
            std::fs::read_to_string(format!("/proc/{child}/stat"))
                .ok()
                .and_then(|stat| {
                    // pid (comm) state ppid ...: comm may hold spaces, so split after its ')'.
                    let after = stat.rsplit_once(')')?.1;
                    after.split_whitespace().nth(1)?.parse::<u32>().ok()
                })
                == Some(pid)
        })
        .collect()
}

/// SIGKILL every process group led by one of `pids` (a CLI session runs in its own group).
fn kill_groups(pids: &[i32]) {
    use nix::sys::signal::{Signal, kill};
    use nix::unistd::Pid;
    for pid in pids {
        let _ = kill(Pid::from_raw(-pid), Signal::SIGKILL);
    }
}

fn placements_on(log: &str, worker: &str) -> usize {
    log.lines()
        .filter(|l| {
            l.contains("specialist placed on a worker") && l.contains(&format!("worker={worker}"))
        })
        .count()
}

#[test]
fn an_undisturbed_cluster_run_spreads_over_both_workers_with_two_parts_on_claude_code() {
    let harnesses = if keel_tests::claude_code_installed() {
        Harnesses::WithClaudeCode
    } else {
        Harnesses::Loop
    };
    let c = cluster(harnesses);
    let mut coordinator = c.coordinator(true);
    let _w1 = c.worker("w1", &c.home.cookie);
    let _w2 = c.worker("w2", &c.home.cookie);
    let run = started_run(&mut coordinator);
    let (status, out, err) = coordinator.wait_output(RUN_WAIT).unwrap();
    assert!(status.success(), "{status}\n{out}\n{err}");
    assert!(out.contains(": Completed"), "{out}");
    let store = reader(c.work());
    assert_eq!(
        store.catalog().run(run).unwrap().status,
        RunStatus::Completed
    );
    assert_eq!(claims(&store, run), expected(c.harnesses));
    // One session per part on keel's loop (Claude Code's first request is not an opening of that
    // shape: it carries more than the brief's message).
    let openings = session_openings(&recorded_bodies(&c.record));
    let first_loop_part = if c.harnesses == Harnesses::WithClaudeCode {
        2
    } else {
        0
    };
    for i in first_loop_part..STEPS {
        assert_eq!(
            openings_of(&openings, i),
            1,
            "part {i} ran {} sessions",
            openings_of(&openings, i)
        );
    }
    // Capacity 4 each and 16 at once: both workers hosted specialists.
    assert!(placements_on(&err, "w1") >= 1, "{err}");
    assert!(placements_on(&err, "w2") >= 1, "{err}");
    assert_eq!(placements_on(&err, "w1") + placements_on(&err, "w2"), STEPS);
    if c.harnesses == Harnesses::WithClaudeCode {
        let tasks = subtasks(&store, run);
        // Claude Code's requests (its system prompt names it) and its call of keel's tool on its
        // worker's endpoint: the note is durable in the coordinator's store.
        let bodies: Vec<String> = recorded_bodies(&c.record)
            .iter()
            .map(serde_json::Value::to_string)
            .collect();
        assert!(
            bodies
                .iter()
                .any(|b| b.contains("Claude Code") && b.contains("Part 0 of the fan-out.")),
            "part 0 did not run on Claude Code"
        );
        assert!(
            tasks
                .iter()
                .any(|t| t.progress_notes == vec!["part 1 on claude code".to_string()]),
            "{tasks:#?}"
        );
    }
}

#[test]
fn a_sigkilled_workers_tasks_finish_on_the_other_worker() {
    let harnesses = if keel_tests::claude_code_installed() {
        Harnesses::SlowClaudeCode
    } else {
        Harnesses::Loop
    };
    let c = cluster(harnesses);
    let mut coordinator = c.coordinator(true);
    let workers = [
        ("w1", c.worker("w1", &c.home.cookie)),
        ("w2", c.worker("w2", &c.home.cookie)),
    ];
    let run = started_run(&mut coordinator);
    let store = reader(c.work());
    // Kill a worker once reports are durable, while it runs a Claude Code part's session (whichever
    // worker that is), or, on keel's loop only, once w1 runs the second wave.
    let (victim, killed_claude) = wait_for(RUN_WAIT, "reports, and a part to kill", || {
        let tasks = subtasks(&store, run);
        if count(&tasks, TaskStatus::Complete) < 2 {
            return None;
        }
        let log = coordinator.stderr_so_far();
        if !harnesses.claude() {
            return (placements_on(&log, "w1") > 4).then(|| ("w1".to_string(), BTreeSet::new()));
        }
        let placed = last_placements(&log);
        let bodies: Vec<String> = recorded_bodies(&c.record)
            .iter()
            .map(serde_json::Value::to_string)
            .collect();
        let in_flight = |i: usize| {
            let task = tasks.iter().find(|t| part(t) == i)?;
            let worker = placed.get(&task.id.to_string())?;
            let running = task.status != TaskStatus::Complete
                && bodies.iter().any(|b| claude_request_of(b, i));
            running.then(|| worker.clone())
        };
        let victim = CLAUDE_PARTS.into_iter().find_map(in_flight)?;
        let parts: BTreeSet<usize> = CLAUDE_PARTS
            .into_iter()
            .filter(|i| in_flight(*i).as_ref() == Some(&victim))
            .collect();
        Some((victim, parts))
    })
    .unwrap();
    let (_survivor, killed) = workers
        .into_iter()
        .partition::<Vec<_>, _>(|(name, _)| *name != victim);
    for (_, worker) in killed {
        // As when its machine dies: the worker and the CLI sessions it started (each in its own
        // process group, which a SIGKILLed worker cannot take down with it).
        let sessions = children_of(worker.id());
        worker.kill();
        kill_groups(&sessions);
    }
    let at_kill = subtasks(&store, run);
    let acked: BTreeSet<usize> = at_kill
        .iter()
        .filter(|t| t.status == TaskStatus::Complete)
        .map(part)
        .collect();
    let before = session_openings(&recorded_bodies(&c.record)).len();
    drop(store);

    let (status, out, err) = coordinator.wait_output(RUN_WAIT).unwrap();
    assert!(status.success(), "{status}\n{out}\n{err}");
    assert!(out.contains(": Completed"), "{out}");
    let store = reader(c.work());
    // The reports equal an undisturbed run's (Claude Code's parts report their lines too).
    assert_eq!(
        claims(&store, run),
        expected_claims(STEPS),
        "{out}\n{:#?}",
        subtasks(&store, run)
            .iter()
            .map(|t| (part(t), t.status, t.attempt, t.outcome.clone()))
            .collect::<Vec<_>>()
    );
    let lost: Vec<&str> = err
        .lines()
        .filter(|l| l.contains("remote attempt down") && l.contains(&format!("worker {victim}")))
        .collect();
    assert!(
        !lost.is_empty(),
        "{victim}'s attempts never went down: {err}"
    );
    // After the loss every placement went to the other worker.
    let other = if victim == "w1" { "w2" } else { "w1" };
    let after_loss = err
        .split("worker lost: its lease expired")
        .nth(1)
        .unwrap_or_else(|| panic!("{victim} was never declared lost: {err}"));
    assert_eq!(placements_on(after_loss, &victim), 0, "{after_loss}");
    assert!(placements_on(after_loss, other) >= 1, "{after_loss}");
    let bodies: Vec<String> = recorded_bodies(&c.record)
        .iter()
        .map(serde_json::Value::to_string)
        .collect();
    let openings = session_openings(&recorded_bodies(&c.record));
    for i in 0..STEPS {
        if harnesses.claude() && CLAUDE_PARTS.contains(&i) {
            // Claude Code's sessions are not one-message openings: an acknowledged part of
            // Claude Code never ran again (no resumed session of it).
            if acked.contains(&i) {
                assert!(
                    !bodies.iter().any(|b| claude_request_of(b, i) && resumes(b)),
                    "acknowledged part {i} ran again on Claude Code"
                );
            }
            continue;
        }
        let n = openings_of(&openings, i);
        if acked.contains(&i) {
            assert_eq!(n, 1, "acknowledged part {i} ran {n} sessions");
        } else {
            assert!(n >= 1, "part {i} never ran");
        }
    }
    // The steps that ran again continued with keel's resume preamble; the Claude Code part killed
    // mid-session ran again on Claude Code, its first request carrying the preamble.
    let again = openings[before..].iter().filter(|o| resumes(o)).count();
    let claude_again: BTreeSet<usize> = CLAUDE_PARTS
        .into_iter()
        .filter(|i| {
            bodies
                .iter()
                .any(|b| claude_request_of(b, *i) && resumes(b))
        })
        .collect();
    assert!(
        again + claude_again.len() > 0,
        "no session ran again with a resume preamble"
    );
    assert!(
        killed_claude.is_subset(&claude_again),
        "Claude Code parts killed mid-session {killed_claude:?}, resumed on Claude Code {claude_again:?}"
    );
    let tasks = subtasks(&store, run);
    assert!(tasks.iter().any(|t| t.attempt >= 2));
    for i in &killed_claude {
        let task = tasks.iter().find(|t| part(t) == *i).unwrap();
        assert!(task.attempt >= 2, "{task:#?}");
        assert_eq!(task.assignee.as_deref(), Some("claude"), "{task:#?}");
    }
}

#[test]
fn a_sigkilled_coordinator_restarts_resumes_the_run_and_the_workers_come_back() {
    let c = cluster(Harnesses::Loop);
    let mut coordinator = c.coordinator(true);
    let _w1 = c.worker("w1", &c.home.cookie);
    let _w2 = c.worker("w2", &c.home.cookie);
    let run = started_run(&mut coordinator);
    let store = reader(c.work());
    wait_for(RUN_WAIT, "reports before the kill", || {
        (count(&subtasks(&store, run), TaskStatus::Complete) >= 3).then_some(())
    })
    .unwrap();
    coordinator.kill();
    let at_kill = subtasks(&store, run);
    let acked: BTreeSet<usize> = at_kill
        .iter()
        .filter(|t| t.status == TaskStatus::Complete)
        .map(part)
        .collect();
    assert!(
        !store.catalog().run(run).unwrap().status.is_terminal(),
        "the kill came after the end"
    );
    drop(store);

    // The same address, no --run: it resumes the run; the workers reconnect by themselves.
    let mut again = c.coordinator(false);
    again
        .stderr_line_containing("resuming a run", JOIN_WAIT)
        .unwrap();
    again
        .stderr_line_containing("worker joined worker=w1", JOIN_WAIT)
        .unwrap();
    again
        .stderr_line_containing("worker joined worker=w2", JOIN_WAIT)
        .unwrap();
    wait_for(RUN_WAIT, "the resumed run's end", || {
        let store = reader(c.work());
        let status = store.catalog().run(run).ok()?.status;
        status.is_terminal().then_some(status)
    })
    .map(|status| assert_eq!(status, RunStatus::Completed))
    .unwrap();
    let store = reader(c.work());
    assert_eq!(claims(&store, run), expected_claims(STEPS));
    let openings = session_openings(&recorded_bodies(&c.record));
    for i in &acked {
        assert_eq!(
            openings_of(&openings, *i),
            1,
            "acknowledged part {i} ran twice"
        );
    }
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(i32::try_from(again.id()).unwrap()),
        nix::sys::signal::Signal::SIGTERM,
    )
    .unwrap();
    let (status, _, err) = again.wait_output(RUN_WAIT).unwrap();
    assert_eq!(status.code(), Some(6), "a signalled daemon pauses\n{err}");
}

#[test]
fn a_wrong_cookie_is_refused_and_a_readable_cookie_file_never_starts_a_node() {
    let c = cluster(Harnesses::Loop);
    let mut coordinator = c.coordinator(false);
    let wrong = c.work().join("wrong-cookie");
    write_cookie(&wrong, "a-different-cookie-of-enough-length", 0o600);
    let mut intruder = c.worker("intruder", &wrong);
    intruder
        .stderr_line_containing("closed before it authenticated", JOIN_WAIT)
        .unwrap();
    coordinator
        .stderr_line_containing("closed before it authenticated", JOIN_WAIT)
        .unwrap();
    // A worker with the right cookie joins the same coordinator.
    let _good = c.worker("good", &c.home.cookie);
    coordinator
        .stderr_line_containing("worker joined worker=good", JOIN_WAIT)
        .unwrap();
    assert!(
        !coordinator
            .stderr_so_far()
            .contains("worker joined worker=intruder")
    );

    // A cookie file other users may read: refused before the node starts, naming the fix.
    let open = c.work().join("open-cookie");
    write_cookie(&open, COOKIE, 0o644);
    let cmd = worker_command(c.work(), &c.coordinator_addr(), "careless", &open);
    let (status, out, err) = Reaped::spawn(cmd).unwrap().wait_output(JOIN_WAIT).unwrap();
    assert!(!status.success(), "{out}");
    assert!(err.contains("accessible to other users"), "{err}");
    assert!(err.contains("chmod 600"), "{err}");
}

#[test]
fn a_version_skewed_message_is_refused_with_a_logged_error() {
    let c = cluster(Harnesses::Loop);
    let mut coordinator = c.coordinator(false);
    // This test process joins as a node with the right cookie and speaks another protocol version.
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let name = NodeName::new("skewed").unwrap();
        let coordinator_ref = join_coordinator(&name, &c.coordinator_addr(), JOIN_WAIT).await;
        let heartbeat = ToCoordinator::Heartbeat(WorkerStatus {
            incarnation: 1,
            harnesses: vec![keel_harness::HarnessKind::MessagesApi],
            capacity: 1,
            hosting: Vec::new(),
        });
        let skewed = encode_as_version(PROTOCOL_VERSION + 41, &name, &heartbeat).unwrap();
        coordinator_ref.cast(ClusterMsg::Frame(skewed)).unwrap();
        // This build's version header, then a body no decoder accepts.
        let mut malformed = PROTOCOL_VERSION.to_be_bytes().to_vec();
        malformed.extend([0xff, 0xfe, 0x00]);
        coordinator_ref.cast(ClusterMsg::Frame(malformed)).unwrap();
        // The session survives both: a message of this version is still heard.
        let current = keel_cluster::wire::encode(&name, &heartbeat).unwrap();
        coordinator_ref.cast(ClusterMsg::Frame(current)).unwrap();
    });
    let refused = coordinator
        .stderr_line_containing(
            &format!("protocol version {}", PROTOCOL_VERSION + 41),
            JOIN_WAIT,
        )
        .unwrap();
    assert!(refused.contains("ERROR"), "{refused}");
    coordinator
        .stderr_line_containing("a malformed message", JOIN_WAIT)
        .unwrap();
    coordinator
        .stderr_line_containing("worker joined worker=skewed", JOIN_WAIT)
        .unwrap();
    drop(rt);
}
