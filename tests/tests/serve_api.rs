//! `keel serve` and the HTTP API, on real processes over 127.0.0.1: tokens, refused requests that
//! change nothing, `keel run --server` printing what a local run prints, local commands going to
//! the server that holds their home, two runs at once, and a run's event stream to its end.
#![allow(clippy::unwrap_used, clippy::expect_used)] // Tests: a panic is the failure report.

use std::path::Path;
use std::time::Duration;

use keel_tests::serve::{Server, normalized, quiet_survey, survey_files};
use keel_tests::{Reaped, keel};

/// How long a stopped server may take to exit.
const START_WAIT: Duration = Duration::from_secs(120);
/// How long a scripted run may take.
const RUN_WAIT: Duration = Duration::from_secs(180);

/// A folder with a few files for the scripted survey plan to find.
fn folder() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    survey_files(dir.path());
    dir
}

fn runs_in(body: &str) -> usize {
    let v: serde_json::Value = serde_json::from_str(body).unwrap_or_else(|e| panic!("{e}: {body}"));
    v["runs"].as_array().unwrap().len()
}

#[test]
fn requests_need_a_token_and_bad_requests_get_4xx_and_change_nothing() {
    let dir = folder();
    std::fs::create_dir_all(dir.path().join(".keel")).unwrap();
    std::fs::write(
        dir.path().join(".keel/keel.toml"),
        "[server]\nbody_bytes_max = 4096\n",
    )
    .unwrap();
    let server = Server::start(dir.path());
    let token = server.token();

    // Health needs no token; everything else does.
    assert_eq!(server.request("GET", "/healthz", None, None).0, 200);
    assert_eq!(server.request("GET", "/readyz", None, None).0, 200);
    let (status, body) = server.request("GET", "/v1/runs", None, None);
    assert_eq!(status, 401, "{body}");
    assert!(body.contains("\"unauthorized\""), "{body}");
    assert_eq!(
        server
            .request("GET", "/v1/runs", Some("not-the-token-0123456789"), None)
            .0,
        401
    );
    assert_eq!(
        server
            .request("POST", "/v1/runs", None, Some(br#"{"brief":"b"}"#))
            .0,
        401
    );
    assert_eq!(server.request("GET", "/metrics", None, None).0, 401);

    // Refused bodies, each with a message naming the problem.
    let big = format!(r#"{{"brief":"{}"}}"#, "x".repeat(8_192));
    let (status, body) = server.request("POST", "/v1/runs", Some(&token), Some(big.as_bytes()));
    assert_eq!(status, 413, "{body}");
    let (status, body) = server.request("POST", "/v1/runs", Some(&token), Some(b"{\"brief\": "));
    assert_eq!(status, 400, "{body}");
    let (status, body) = server.request(
        "POST",
        "/v1/runs",
        Some(&token),
        Some(br#"{"brief":"b","brif":1}"#),
    );
    assert_eq!(status, 400, "{body}");
    assert!(body.contains("brif"), "{body}");
    let (status, body) = server.request(
        "POST",
        "/v1/runs",
        Some(&token),
        Some(br#"{"brief":"   "}"#),
    );
    assert_eq!(status, 400, "{body}");
    assert!(body.contains("brief"), "{body}");
    let cyclic = br#"{"brief":"b","plan":{"steps":[
        {"key":"a","brief":"a","goal":"a","depends_on":["b"]},
        {"key":"b","brief":"b","goal":"b","depends_on":["a"]}]}}"#;
    let (status, body) = server.request("POST", "/v1/runs", Some(&token), Some(cyclic));
    assert_eq!(status, 400, "{body}");
    assert!(body.contains("plan"), "{body}");
    let (status, body) = server.request(
        "POST",
        "/v1/runs",
        Some(&token),
        Some(br#"{"brief":"b","agent":"nobody"}"#),
    );
    assert_eq!(status, 400, "{body}");
    assert!(body.contains("nobody"), "{body}");
    let (status, body) = server.request("GET", "/v1/runs/not-a-ulid/tree", Some(&token), None);
    assert_eq!(status, 400, "{body}");
    let (status, body) = server.request("GET", "/v1/runs?limit=10001", Some(&token), None);
    assert_eq!(status, 400, "{body}");
    // An empty page is a page, as `keel runs --limit 0` prints it locally.
    let (status, body) = server.request("GET", "/v1/runs?limit=0", Some(&token), None);
    assert_eq!(status, 200, "{body}");
    let (status, body) = server.request("GET", "/v1/runs?lmit=3", Some(&token), None);
    assert_eq!(status, 400, "{body}");
    let missing = "01ARZ3NDEKTSV4RRFFQ69G5FAV";
    assert_eq!(
        server
            .request("GET", &format!("/v1/runs/{missing}"), Some(&token), None)
            .0,
        404
    );
    assert_eq!(
        server
            .request(
                "POST",
                &format!("/v1/runs/{missing}/cancel"),
                Some(&token),
                None
            )
            .0,
        404
    );
    let (status, body) = server.request(
        "POST",
        &format!("/v1/tasks/{missing}/follow-ups"),
        Some(&token),
        Some(br#"{"message":""}"#),
    );
    assert_eq!(status, 400, "{body}");

    // Nothing was written.
    let (status, body) = server.request("GET", "/v1/runs", Some(&token), None);
    assert_eq!(status, 200, "{body}");
    assert_eq!(runs_in(&body), 0, "{body}");
    let (status, body) = server.request("GET", "/metrics", Some(&token), None);
    assert_eq!(status, 200, "{body}");
    assert!(body.contains("keel_runs{state=\"running\"} 0"), "{body}");
    assert!(
        body.contains("keel_checkpoint_commit_seconds_bucket"),
        "{body}"
    );

    // The same refusals through the command line, with the local commands' exit codes.
    let out = server
        .keel(dir.path())
        .args(["tree", missing])
        .output()
        .unwrap();
    assert_eq!(
        out.status.code(),
        Some(3),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let wrong = dir.path().join("wrong-token");
    std::fs::write(&wrong, "wrong-token-0123456789\n").unwrap();
    let mut perms = std::fs::metadata(&wrong).unwrap().permissions();
    std::os::unix::fs::PermissionsExt::set_mode(&mut perms, 0o644);
    std::fs::set_permissions(&wrong, perms).unwrap();
    let out = keel(dir.path())
        .unwrap()
        .args(["--server", &server.url, "--token-file"])
        .arg(&wrong)
        .args(["runs"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("chmod 600"),
        "a token file others can read is refused"
    );
    server.process.kill();
}

#[test]
fn keel_run_against_a_server_prints_what_a_local_run_prints() {
    let local = folder();
    let expected = quiet_survey(keel(local.path()).unwrap(), local.path());
    assert!(expected.contains("failures: none"), "{expected}");

    let remote = folder();
    let server = Server::start(remote.path());
    let client = tempfile::tempdir().unwrap();
    let got = quiet_survey(server.keel(client.path()), remote.path());
    assert_eq!(got, expected);

    // A local `keel run` on the home the server holds goes to the server instead of failing to
    // open the store.
    let got = quiet_survey(keel(remote.path()).unwrap(), remote.path());
    assert_eq!(got, expected);

    // Reads through the server print what the same reads of the store print.
    let status = keel(remote.path())
        .unwrap()
        .args(["--json", "status"])
        .output()
        .unwrap();
    let run: serde_json::Value = serde_json::from_slice(&status.stdout).unwrap();
    let run = run["run"].as_str().unwrap().to_string();
    server.assert_reads_match(
        remote.path(),
        client.path(),
        &[
            vec!["tree", run.as_str()],
            vec!["status", run.as_str()],
            vec!["--json", "runs"],
        ],
    );
    server.process.kill();
}

#[test]
fn two_runs_at_once_complete_and_the_event_stream_shows_a_run_to_its_end() {
    let dir = folder();
    let server = Server::start(dir.path());
    // Two local `keel run`s on the home the server holds, at once: both go to the server (its
    // `server.json`), and the one without --quiet shows the live view a local run shows.
    let mut one = keel(dir.path()).unwrap();
    one.args(["run", "--quiet", "survey this folder"]);
    let mut two = keel(dir.path()).unwrap();
    two.args(["run", "survey this folder again"]);
    let (one, two) = (Reaped::spawn(one).unwrap(), Reaped::spawn(two).unwrap());
    for (run, live) in [(one, false), (two, true)] {
        let (status, out, err) = run.wait_output(RUN_WAIT).unwrap();
        assert!(status.success(), "{status}\n{out}\n{err}");
        assert!(out.contains(": Completed"), "{out}");
        // (A local run beside the server would have failed: the store is the server's.)
        assert_eq!(out.contains("started  "), live, "{out}");
    }

    let token = server.token();
    let (status, body) = server.request(
        "POST",
        "/v1/runs",
        Some(&token),
        Some(br#"{"brief":"survey once more"}"#),
    );
    assert_eq!(status, 201, "{body}");
    let submitted: serde_json::Value = serde_json::from_str(&body).unwrap();
    let run = submitted["run"].as_str().unwrap();
    // The stream replays from the run's first event and ends after `finished`.
    let (status, stream) =
        server.request("GET", &format!("/v1/runs/{run}/events"), Some(&token), None);
    assert_eq!(status, 200, "{stream}");
    let names: Vec<&str> = stream
        .lines()
        .filter_map(|l| l.strip_prefix("event: "))
        .collect();
    assert_eq!(
        names.iter().filter(|n| **n == "task_started").count(),
        4,
        "{stream}"
    );
    assert_eq!(
        names.iter().filter(|n| **n == "report").count(),
        4,
        "{stream}"
    );
    assert_eq!(names.last(), Some(&"finished"), "{stream}");
    assert!(stream.contains("\"status\":\"Completed\""), "{stream}");
    let ids: Vec<u64> = stream
        .lines()
        .filter_map(|l| l.strip_prefix("id: ")?.parse().ok())
        .collect();
    assert!(ids.windows(2).all(|w| w[0] < w[1]), "{ids:?}");
    let (status, body) = server.request("GET", "/v1/runs", Some(&token), None);
    assert_eq!(status, 200);
    assert_eq!(runs_in(&body), 3, "{body}");
    server.process.kill();
}

/// `keel run --quiet --plan plan.json` of a one-step plan, then `keel follow-up` on its step, by
/// the commands `keel_in` makes; the follow-up's output, normalized.
fn run_and_follow_up(keel_in: impl Fn() -> std::process::Command, dir: &Path) -> String {
    let plan = keel_actors::runtime::scripted::fan_out_plan(1, |_| "ls".into()).unwrap();
    std::fs::write(dir.join("plan.json"), serde_json::to_string(&plan).unwrap()).unwrap();
    let out = keel_in()
        .args(["run", "--quiet", "--plan", "plan.json", "list the folder"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let tasks = keel_in().args(["--json", "tasks"]).output().unwrap();
    let tasks: serde_json::Value = serde_json::from_slice(&tasks.stdout).unwrap();
    let step = tasks["tasks"]
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["kind"] == "Subtask")
        .and_then(|t| t["id"].as_str())
        .unwrap()
        .to_string();
    let out = keel_in()
        .args(["follow-up", &step, "What is in the folder?"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    normalized(&String::from_utf8_lossy(&out.stdout), dir)
}

#[test]
fn follow_up_and_cancel_go_to_the_server_that_holds_the_home() {
    let local = folder();
    let expected = run_and_follow_up(|| keel(local.path()).unwrap(), local.path());
    assert!(expected.contains("follow-up ID: Complete"), "{expected}");

    let served = folder();
    let server = Server::start(served.path());
    let got = run_and_follow_up(|| keel(served.path()).unwrap(), served.path());
    assert_eq!(got, expected);

    // A slow run started in the background on the server, then cancelled through it.
    let plan =
        keel_actors::runtime::scripted::fan_out_plan(2, |i| format!("sleep 30; echo {i}")).unwrap();
    let started = keel_tests::run_detached(served.path(), "wait", &plan).unwrap();
    let text = String::from_utf8_lossy(&started.stdout).to_string();
    assert!(started.status.success(), "{text}");
    assert!(text.contains(&server.url), "started on the server: {text}");
    let run = text.split_whitespace().nth(1).unwrap().to_string();
    let cancel = keel(served.path())
        .unwrap()
        .args(["cancel", &run])
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&cancel.stdout);
    assert!(cancel.status.success(), "{said}");
    assert!(said.contains("cancel sent"), "{said}");
    keel_tests::wait_cancelled(served.path(), &run, RUN_WAIT).unwrap();
    server.process.kill();
}

#[test]
fn a_server_stopped_mid_run_pauses_it_and_its_client_ends_as_a_paused_run() {
    let dir = folder();
    let server = Server::start(dir.path());
    let plan =
        keel_actors::runtime::scripted::fan_out_plan(1, |_| "sleep 30; echo late".into()).unwrap();
    std::fs::write(
        dir.path().join("slow.json"),
        serde_json::to_string(&plan).unwrap(),
    )
    .unwrap();
    let mut client = server.keel(dir.path());
    client.args(["run", "--plan", "slow.json", "wait"]);
    let mut client = Reaped::spawn(client).unwrap();
    client
        .line_containing("started  part-000", RUN_WAIT)
        .unwrap();
    let pid = nix::unistd::Pid::from_raw(i32::try_from(server.process.id()).unwrap());
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM).unwrap();
    let (status, out, err) = client.wait_output(RUN_WAIT).unwrap();
    assert_eq!(status.code(), Some(6), "{out}\n{err}");
    let line = out
        .lines()
        .find(|l| l.starts_with("paused run "))
        .unwrap_or_else(|| panic!("{out}"));
    assert!(line.contains("the keel server stopped"), "{line}");
    let run = line
        .split_whitespace()
        .nth(2)
        .unwrap()
        .trim_end_matches(':');
    let (status, _, _) = server.process.wait_output(START_WAIT).unwrap();
    assert!(status.success(), "the server stops cleanly: {status}");
    assert!(!dir.path().join(".keel/server.json").exists());
    let shown = keel(dir.path())
        .unwrap()
        .args(["--json", "status", run])
        .output()
        .unwrap();
    assert!(String::from_utf8_lossy(&shown.stdout).contains("\"Paused\""));
}
