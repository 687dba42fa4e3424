//! keel's session tools on a worker node (issues 11 and 12), with real processes on 127.0.0.1: a
//! `keel node` coordinator daemon, one `keel node` worker, and the scripted model server driving
//! keel's own agent loop on the worker. The session calls the MCP endpoint of ITS node (the
//! worker's, whose address the worker logs); each call crosses the cluster to the coordinator node
//! as the specialist's reply and the answer comes back the same way.
//!
//! - A session on the worker calls `report_findings`: the findings are on the task row in the
//!   coordinator's store, the answer reached the model, and the worker logged the call it sent on.
//! - A live session of another run, holding its own token: asking for the first run's task is
//!   refused (the token scopes the call to its own run); a made-up token is refused with 401; once
//!   the session ended, its token is refused with 401 too.
//! - A brief without a plan, given to the coordinator daemon with `keel run --server`, runs a lead
//!   session (as `keel run` and `keel serve` do) placed on a worker: its `delegate` call on that
//!   worker's endpoint crosses to the coordinator, whose three subtasks run on the workers (one
//!   calls `report_progress` on its own worker's endpoint), and the answer with their reports comes
//!   back to the lead, which ends the run. The coordinator-only node listens on its cluster port
//!   and its API only: no MCP endpoint where no session runs. Once on keel's own loop, once with
//!   the lead on the real Claude Code (its MCP client calling `delegate` on its worker's endpoint;
//!   the parts on keel's loop), skipped only with `KEEL_SKIP_REAL_CLIS=1` when it is not installed.
#![allow(clippy::unwrap_used, clippy::expect_used)] // Tests: a panic is the failure report.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::time::Duration;

use keel_actors::session_tool::reported_findings;
use keel_actors::{Plan, PlanStep};
use keel_harness::tools::mcp::{McpClient, McpError};
use keel_store::{RunStatus, TaskKind, TaskStatus};
use keel_tests::cluster::{COOKIE, NODE_LOG, write_cookie};
use keel_tests::fan_out::{reader, subtasks};
use keel_tests::serve::{Server, worker_command};
use keel_tests::{Reaped, keel, recorded_bodies, wait_for};
use serde_json::{Value, json};

const WAIT: Duration = Duration::from_secs(120);

fn plan(key: &str, brief: String) -> String {
    let plan = Plan {
        steps: vec![PlanStep {
            key: key.into(),
            brief,
            goal: format!("the {key} step"),
            quality_criteria: Vec::new(),
            output_schema: None,
            assignee: None,
            depends_on: Vec::new(),
            estimate_micros: 0,
        }],
        constraints: Vec::new(),
    };
    serde_json::to_string(&plan).unwrap()
}

/// `keel --server URL run --quiet --plan FILE BRIEF` in `work`.
fn run_command(server: &Server, work: &Path, plan_file: &str) -> std::process::Command {
    let mut cmd = server.keel(work);
    cmd.args([
        "run",
        "--quiet",
        "--plan",
        plan_file,
        "a step on the worker",
    ]);
    cmd
}

async fn mcp_client(url: &str, token: &str) -> Result<McpClient, McpError> {
    let http = keel_harness::messages_api::http::model_client().unwrap();
    McpClient::connect(http, url, Some(token.to_string())).await
}

fn assert_unauthorized(result: Result<(String, bool), McpError>) {
    match result {
        Err(McpError::Transport(e)) => assert!(e.contains("401"), "{e}"),
        other => panic!("expected a 401, got {other:?}"),
    }
}

/// Connect (which calls `initialize`) and call `tool`; a refused connection is the call's error.
async fn call(url: &str, token: &str, tool: &str, args: Value) -> Result<(String, bool), McpError> {
    mcp_client(url, token).await?.call_tool(tool, args).await
}

/// A working folder with a keel home, a private cookie file, and a recording scripted model server.
struct Home {
    _dir: tempfile::TempDir,
    work: PathBuf,
    record: PathBuf,
    cookie: PathBuf,
    _model: Reaped,
    model_url: String,
}

fn home() -> Home {
    let dir = tempfile::tempdir().unwrap();
    let work = dir.path().join("work");
    let record = dir.path().join("requests");
    std::fs::create_dir_all(&work).unwrap();
    let init = keel(&work).unwrap().arg("init").output().unwrap();
    assert!(init.status.success(), "{init:?}");
    let cookie = dir.path().join("cookie");
    write_cookie(&cookie, COOKIE, 0o600);
    let (model, model_url) = keel_tests::model_server(&work, &record).unwrap();
    Home {
        _dir: dir,
        work,
        record,
        cookie,
        _model: model,
        model_url,
    }
}

#[test]
fn a_session_on_a_worker_reports_through_its_own_nodes_endpoint_and_tokens_stay_in_their_run() {
    let Home {
        _dir,
        work,
        record,
        cookie,
        _model,
        model_url,
    } = home();
    std::fs::write(work.join("lib.rs"), "pub fn f() {}\n").unwrap();

    // The test reads the store file beside the daemon, so the daemon shares it.
    let (mut server, cluster) =
        Server::start_coordinator_with(&work, &cookie, &["--share-store"], &[]);
    let mut cmd = worker_command(&work, &cluster, "w1", &cookie);
    cmd.env("KEEL_LOG", NODE_LOG)
        .args(["--model-server", &model_url]);
    let mut worker = Reaped::spawn(cmd).unwrap();
    let line = worker
        .stderr_line_containing("MCP endpoint for the sessions hosted here", WAIT)
        .unwrap();
    let endpoint_url = line
        .split("url=")
        .nth(1)
        .and_then(|rest| rest.split_whitespace().next())
        .unwrap_or_else(|| panic!("no url in {line:?}"))
        .to_string();
    assert!(endpoint_url.starts_with("http://127.0.0.1:"), "{line}");
    server
        .process
        .stderr_line_containing("worker joined worker=w1", WAIT)
        .unwrap();

    // Run 1: the session on the worker reports findings through the worker's endpoint.
    let findings = json!({"findings": [{"claim": "lib.rs defines f", "source": "lib.rs", "confidence_permille": 900}]});
    std::fs::write(
        work.join("findings.json"),
        plan(
            "findings",
            format!(
                "Report what lib.rs holds. REPORT_AFTER_TOOL\nCALL_TOOL: mcp__keel__report_findings {findings}"
            ),
        ),
    )
    .unwrap();
    let out = run_command(&server, &work, "findings.json")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let store = reader(&work);
    let run_a = store.catalog().runs(1).unwrap().items[0].clone();
    assert_eq!(run_a.status, RunStatus::Completed, "{run_a:#?}");
    let tasks_a = subtasks(&store, run_a.id);
    assert_eq!(tasks_a.len(), 1, "{tasks_a:#?}");
    assert_eq!(tasks_a[0].status, TaskStatus::Complete);
    // Durable in the coordinator's store: the worker never opens it.
    let reported = reported_findings(&tasks_a[0]);
    assert_eq!(reported.len(), 1, "{tasks_a:#?}");
    assert_eq!(reported[0].claim, "lib.rs defines f");
    assert_eq!(reported[0].source, "lib.rs");
    drop(store);
    let bodies: Vec<String> = recorded_bodies(&record)
        .iter()
        .map(Value::to_string)
        .collect();
    assert!(
        bodies.iter().any(|b| b.contains("recorded: 1 findings")),
        "the answer never reached the model: {bodies:#?}"
    );
    let worker_log = worker.stderr_so_far();
    assert!(
        worker_log.contains("a session tool call, for the coordinator node")
            && worker_log.contains("tool=\"report_findings\""),
        "{worker_log}"
    );
    assert!(
        server
            .process
            .stderr_so_far()
            .contains("specialist placed on a worker"),
        "the session did not run on the worker"
    );

    // Run 2: its session keeps a copy of its token and stays live until the test releases it.
    let hold = json!({"command": "printf %s \"$KEEL_MCP_TOKEN\" > token-b; i=0; while [ ! -f release ] && [ $i -lt 900 ]; do sleep 0.1; i=$((i+1)); done; echo held"});
    std::fs::write(
        work.join("hold.json"),
        plan(
            "hold",
            format!("Hold until released. REPORT_AFTER_TOOL\nCALL_TOOL: bash {hold}"),
        ),
    )
    .unwrap();
    let run_b = Reaped::spawn(run_command(&server, &work, "hold.json")).unwrap();
    let token_file = work.join("token-b");
    let token_b = wait_for(WAIT, "the second session's token", || {
        std::fs::read_to_string(&token_file)
            .ok()
            .filter(|t| t.len() == 64)
    })
    .unwrap();

    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let task_a = tasks_a[0].id.to_string();
    rt.block_on(async {
        // Run 2's live token asks for run 1's task: refused by run 2's coordinator, nothing of
        // run 1 in the answer.
        let (text, is_error) = call(
            &endpoint_url,
            &token_b,
            "get_task_details",
            json!({"task_id": task_a}),
        )
        .await
        .unwrap();
        assert!(is_error, "{text}");
        assert!(
            text.contains("not a task of this session's thread"),
            "{text}"
        );
        assert!(!text.contains("lib.rs defines f"), "{text}");
        // A token no session was given: 401 before MCP sees the request.
        assert_unauthorized(
            call(
                &endpoint_url,
                &"0".repeat(64),
                "report_progress",
                json!({"note": "not mine"}),
            )
            .await,
        );
    });

    std::fs::write(work.join("release"), "").unwrap();
    let (status, out, err) = run_b.wait_output(WAIT).unwrap();
    assert!(status.success(), "{out}\n{err}");
    rt.block_on(async {
        // The session ended: its token was revoked on the worker.
        assert_unauthorized(
            call(
                &endpoint_url,
                &token_b,
                "report_progress",
                json!({"note": "too late"}),
            )
            .await,
        );
    });
    let store = reader(&work);
    let runs = store.catalog().runs(10).unwrap().items;
    assert_eq!(runs.len(), 2);
    for run in &runs {
        assert_eq!(run.status, RunStatus::Completed, "{run:#?}");
        for task in subtasks(&store, run.id) {
            assert!(task.progress_notes.is_empty(), "{task:#?}");
            if run.id != run_a.id {
                assert!(reported_findings(&task).is_empty(), "{task:#?}");
            }
        }
    }
}

/// The TCP ports process `pid` listens on (Linux: its sockets' inodes, looked up in
/// `/proc/net/tcp` and `/proc/net/tcp6`).
fn listening_ports(pid: u32) -> BTreeSet<u16> {
    let inodes: BTreeSet<String> = std::fs::read_dir(format!("/proc/{pid}/fd"))
        .unwrap()
        .filter_map(|fd| std::fs::read_link(fd.ok()?.path()).ok())
        .filter_map(|link| {
            let link = link.to_string_lossy().to_string();
            Some(
                link.strip_prefix("socket:[")?
                    .strip_suffix(']')?
                    .to_string(),
            )
        })
        .collect();
    let mut ports = BTreeSet::new();
    for table in ["/proc/net/tcp", "/proc/net/tcp6"] {
        let Ok(text) = std::fs::read_to_string(table) else {
            continue;
        };
        for row in text.lines().skip(1) {
            let cols: Vec<&str> = row.split_whitespace().collect();
            // local_address is IP:PORT in hex, st 0A is LISTEN, the inode is the tenth column.
            if cols.len() > 9 && cols[3] == "0A" && inodes.contains(cols[9]) {
                let port = cols[1].rsplit(':').next().unwrap();
                ports.insert(u16::from_str_radix(port, 16).unwrap());
            }
        }
    }
    ports
}

/// The port of `addr` (`IP:PORT` or `http://IP:PORT...`).
fn port_of(addr: &str) -> u16 {
    let hostport = addr.trim_start_matches("http://");
    let hostport = hostport.split('/').next().unwrap();
    hostport.rsplit(':').next().unwrap().parse().unwrap()
}

/// A subtask the lead delegates, carried out by the scripted model on keel's loop: part 1 calls
/// `report_progress`, the others run `echo part N done`; each reports what it got.
fn lead_part(i: usize, assignee: Option<&str>) -> Value {
    let brief = if i == 1 {
        format!(
            "Part {i}. REPORT_AFTER_TOOL\nCALL_TOOL: mcp__keel__report_progress {}",
            json!({"note": "part 1 on a worker"})
        )
    } else {
        format!("Part {i}. REPORT_AFTER_TOOL\nRUN_TOOL: echo part {i} done ;;")
    };
    let mut part = json!({"id": format!("part-{i}"), "brief": brief, "goal": format!("part {i}")});
    if let Some(agent) = assignee {
        part["assignee"] = json!(agent);
    }
    part
}

/// Where a lead runs in [`lead_on_a_worker_of_a_coordinator_daemon`].
#[derive(Clone, Copy, PartialEq, Eq)]
enum LeadOn {
    /// keel's own loop (`--harness messages-api` on every node), as are its parts.
    Loop,
    /// The real Claude Code (the `claude` profile of keel.toml); its parts on the `loop` profile.
    ClaudeCode,
}

/// The variable holding the scripted model server's made-up key, for the profiles of keel.toml.
const KEY_ENV: &str = "KEEL_CLUSTER_LEAD_TEST_KEY";

#[test]
fn a_brief_without_a_plan_runs_a_lead_on_a_worker_of_a_coordinator_daemon() {
    lead_on_a_worker_of_a_coordinator_daemon(LeadOn::Loop);
}

#[test]
fn a_lead_on_claude_code_delegates_through_its_workers_endpoint() {
    if keel_tests::claude_code_installed() {
        lead_on_a_worker_of_a_coordinator_daemon(LeadOn::ClaudeCode);
    }
}

fn lead_on_a_worker_of_a_coordinator_daemon(lead_on: LeadOn) {
    let Home {
        _dir,
        work,
        record,
        cookie,
        _model,
        model_url,
    } = home();
    // keel's own loop on the scripted model server, as an Anthropic endpoint: not the built-in
    // scripted profile, whose briefs get the scripted survey plan instead of a lead.
    let mut harness: Vec<&str> = vec!["--harness", "messages-api", "--model", "keel-scripted-1"];
    let env = [
        ("ANTHROPIC_BASE_URL", model_url.as_str()),
        ("ANTHROPIC_API_KEY", "sk-cluster-lead-test"),
        (KEY_ENV, "sk-cluster-lead-test"),
    ];
    let (parts_on, lead_agent) = match lead_on {
        LeadOn::Loop => (None, None),
        LeadOn::ClaudeCode => {
            // Two profiles of keel.toml on the scripted model server, read by every node.
            harness.clear();
            std::fs::write(
                work.join(".keel/keel.toml"),
                format!(
                    "[[accounts]]\nname = \"scripted\"\nprovider = \"anthropic\"\nbase_url = \"{model_url}\"\nkey_env = \"{KEY_ENV}\"\n\
                     \n[[agents]]\nname = \"claude\"\nharness = \"claude-code\"\nmodel = \"keel-scripted-1\"\naccount = \"scripted\"\n\
                     \n[[agents]]\nname = \"loop\"\nharness = \"messages-api\"\nmodel = \"keel-scripted-1\"\naccount = \"scripted\"\n"
                ),
            )
            .unwrap();
            (Some("loop"), Some("claude"))
        }
    };
    let mut args = harness.clone();
    args.push("--share-store");
    let (mut server, cluster) = Server::start_coordinator_with(&work, &cookie, &args, &env);
    let mut workers = Vec::new();
    for name in ["w1", "w2"] {
        let mut cmd = worker_command(&work, &cluster, name, &cookie);
        cmd.env("KEEL_LOG", NODE_LOG).args(&harness).envs(env);
        let mut worker = Reaped::spawn(cmd).unwrap();
        let line = worker
            .stderr_line_containing("MCP endpoint for the sessions hosted here", WAIT)
            .unwrap();
        server
            .process
            .stderr_line_containing(&format!("worker joined worker={name}"), WAIT)
            .unwrap();
        // A worker listens on its endpoint (and its cluster port).
        let endpoint = line.split("url=").nth(1).unwrap();
        assert!(
            listening_ports(worker.id()).contains(&port_of(endpoint)),
            "{line}"
        );
        workers.push(worker);
    }
    // The coordinator-only node runs no session: its cluster port and its API, nothing else.
    assert_eq!(
        listening_ports(server.process.id()),
        BTreeSet::from([port_of(&cluster), port_of(&server.url)]),
    );

    let brief = format!(
        "Lead the three parts. REPORT_AFTER_TOOL\nCALL_TOOL: mcp__keel__delegate {}",
        json!({"subtasks": [lead_part(1, parts_on), lead_part(2, parts_on), lead_part(3, parts_on)]})
    );
    let client = tempfile::tempdir().unwrap();
    let mut run = server.keel(client.path());
    run.args(["run", "--quiet"]);
    if let Some(agent) = lead_agent {
        run.args(["--agent", agent]);
    }
    let out = run.arg(&brief).output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let store = reader(&work);
    let run = store.catalog().runs(1).unwrap().items[0].clone();
    assert_eq!(run.status, RunStatus::Completed, "{run:#?}");
    assert!(stdout.contains(&run.id.to_string()), "{stdout}");
    let tasks = subtasks(&store, run.id);
    assert_eq!(tasks.len(), 3, "{tasks:#?}");
    assert!(
        tasks
            .iter()
            .all(|t| t.kind == TaskKind::Subtask && t.status == TaskStatus::Complete),
        "{tasks:#?}"
    );
    // A delegated part's tool call on its worker's endpoint: durable in the coordinator's store.
    assert!(
        tasks
            .iter()
            .any(|t| t.progress_notes == vec!["part 1 on a worker".to_string()]),
        "{tasks:#?}"
    );
    let root = store
        .run(run.id)
        .tasks(None, 100)
        .unwrap()
        .items
        .into_iter()
        .find(|t| t.kind == TaskKind::Root)
        .unwrap();
    assert!(root.outcome.is_some(), "{root:#?}");
    let log = store.run(run.id).last_log_rows(root.id, 500).unwrap();
    assert!(
        log.iter().any(|r| r
            .value
            .summary
            .contains("dispatch delegation turn 1: 3 calls in parallel")),
        "{log:#?}"
    );
    drop(store);
    // The lead ran as a lead (keel's lead instructions in its system prompt), and its `delegate`
    // call was answered with the three reports: the model read them in the lead's next request.
    let bodies: Vec<String> = recorded_bodies(&record)
        .iter()
        .map(Value::to_string)
        .collect();
    assert!(
        bodies
            .iter()
            .any(|b| b.contains("You are the lead of a keel run")
                && b.contains("Lead the three parts")
                && (lead_on == LeadOn::Loop || b.contains("Claude Code"))),
        "no lead session: {bodies:#?}"
    );
    assert!(
        bodies.iter().any(|b| b.contains("tool_result")
            && ["part-1", "part-2", "part-3"].iter().all(|p| b.contains(p))
            && b.contains("part 2 done")),
        "the delegate answer never reached the lead's model: {bodies:#?}"
    );
    // Every session ran on a worker: the lead and its three parts were placed there, and the
    // lead's `delegate` went through a worker's endpoint.
    let log = server.process.stderr_so_far();
    assert_eq!(
        log.matches("specialist placed on a worker").count(),
        4,
        "{log}"
    );
    let worker_logs: String = workers.iter().map(Reaped::stderr_so_far).collect();
    assert!(worker_logs.contains("tool=\"delegate\""), "{worker_logs}");
}
