//! A running keel server for tests that go through the HTTP API (`keel serve`, or a cluster's
//! `keel node` coordinator): started on a free port of 127.0.0.1, raw requests with or without its
//! token, and `keel` commands pointed at it; and the scripted survey whose summary a remote run
//! must print as a local run does.
#![allow(clippy::unwrap_used, clippy::expect_used)] // Test helpers: a panic is the failure report.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::{Reaped, keel};

/// How long a server may take to start (a cold binary on a loaded machine).
const START_WAIT: Duration = Duration::from_secs(120);
/// How long one request may take.
const RUN_WAIT: Duration = Duration::from_secs(180);

/// A running `keel serve` in a folder, on a free port.
pub struct Server {
    /// The server process (killed when dropped).
    pub process: Reaped,
    /// Its address, `127.0.0.1:PORT`.
    pub addr: String,
    /// Its base URL.
    pub url: String,
    /// The file holding its bearer token.
    pub token_file: PathBuf,
}

/// The first whitespace-separated word after `marker` in `line`.
fn word_after<'a>(line: &'a str, marker: &str) -> &'a str {
    line.split(marker)
        .nth(1)
        .and_then(|rest| rest.split_whitespace().next())
        .unwrap_or_else(|| panic!("no {marker:?} in {line:?}"))
}

impl Server {
    /// Start `keel serve` in `dir` on a free port and wait until it listens.
    ///
    /// # Panics
    /// When it cannot start or does not listen within two minutes.
    pub fn start(dir: &Path) -> Self {
        Self::start_with(dir, &[], &[])
    }

    /// [`Server::start`] with more arguments for `keel serve` (`--harness`, `--model`, ...) and
    /// more environment variables.
    ///
    /// # Panics
    /// As [`Server::start`].
    pub fn start_with(dir: &Path, args: &[&str], env: &[(&str, &str)]) -> Self {
        let mut cmd = keel(dir).unwrap();
        cmd.args(["serve", "--listen", "127.0.0.1:0"]).args(args);
        for (name, value) in env {
            cmd.env(name, value);
        }
        let mut process = Reaped::spawn(cmd).unwrap();
        let line = process.line_containing("listening on", START_WAIT).unwrap();
        let url = word_after(&line, "listening on ").to_string();
        Self::of(process, url, dir)
    }

    /// Start `keel node --role coordinator` in `dir` with its cluster port and its HTTP API on
    /// free ports of 127.0.0.1 and the cookie in `cookie_file`; the server and the cluster
    /// address workers join. Its log (stderr) has keel's cluster and node lines at info.
    ///
    /// # Panics
    /// When it cannot start or does not listen within two minutes.
    pub fn start_coordinator(dir: &Path, cookie_file: &Path) -> (Self, String) {
        Self::start_coordinator_with(dir, cookie_file, &[], &[])
    }

    /// [`Server::start_coordinator`] with more arguments for `keel node` (`--harness`, `--model`,
    /// ...) and more environment variables.
    ///
    /// # Panics
    /// As [`Server::start_coordinator`].
    pub fn start_coordinator_with(
        dir: &Path,
        cookie_file: &Path,
        args: &[&str],
        env: &[(&str, &str)],
    ) -> (Self, String) {
        let mut cmd = keel(dir).unwrap();
        for (name, value) in env {
            cmd.env(name, value);
        }
        cmd.env("KEEL_LOG", crate::cluster::NODE_LOG)
            .args([
                "node",
                "--role",
                "coordinator",
                "--listen",
                "127.0.0.1:0",
                "--api",
                "127.0.0.1:0",
                "--cookie-file",
            ])
            .arg(cookie_file)
            .args(args);
        let mut process = Reaped::spawn(cmd).unwrap();
        let line = process.line_containing("listening on", START_WAIT).unwrap();
        let cluster = word_after(&line, "listening on ").to_string();
        let line = process.line_containing("HTTP API on", START_WAIT).unwrap();
        let url = word_after(&line, "HTTP API on ").to_string();
        (Self::of(process, url, dir), cluster)
    }

    /// Each read command of `reads`, run on the home in `home` (beside the server) and through
    /// the server from `client`: both succeed and print the same.
    ///
    /// # Panics
    /// When one fails or they differ.
    pub fn assert_reads_match(&self, home: &Path, client: &Path, reads: &[Vec<&str>]) {
        for args in reads {
            let here = keel(home).unwrap().args(args).output().unwrap();
            let there = self.keel(client).args(args).output().unwrap();
            assert!(here.status.success() && there.status.success(), "{args:?}");
            assert_eq!(
                String::from_utf8_lossy(&there.stdout),
                String::from_utf8_lossy(&here.stdout),
                "{args:?}"
            );
        }
    }

    fn of(process: Reaped, url: String, dir: &Path) -> Self {
        let addr = url
            .trim_start_matches("http://")
            .trim_start_matches("https://")
            .to_string();
        Server {
            process,
            addr,
            url,
            token_file: dir.join(".keel/api-token"),
        }
    }

    /// Its bearer token, as written in the home.
    ///
    /// # Panics
    /// When the token file cannot be read.
    pub fn token(&self) -> String {
        std::fs::read_to_string(&self.token_file)
            .unwrap()
            .trim()
            .to_string()
    }

    /// One request over a fresh connection; the status and the body.
    ///
    /// # Panics
    /// When the connection fails or the answer has no status line.
    pub fn request(
        &self,
        method: &str,
        path: &str,
        token: Option<&str>,
        body: Option<&[u8]>,
    ) -> (u16, String) {
        let mut stream = TcpStream::connect(&self.addr).unwrap();
        stream.set_read_timeout(Some(RUN_WAIT)).unwrap();
        let mut head = format!(
            "{method} {path} HTTP/1.1\r\nHost: {}\r\nConnection: close\r\n",
            self.addr
        );
        if let Some(token) = token {
            head.push_str(&format!("Authorization: Bearer {token}\r\n"));
        }
        if let Some(body) = body {
            head.push_str(&format!(
                "Content-Type: application/json\r\nContent-Length: {}\r\n",
                body.len()
            ));
        }
        head.push_str("\r\n");
        stream.write_all(head.as_bytes()).unwrap();
        if let Some(body) = body {
            // The server may answer (413) and close before it has read all of a large body.
            let _ = stream.write_all(body);
        }
        let mut raw = Vec::new();
        let _ = stream.read_to_end(&mut raw);
        let text = String::from_utf8_lossy(&raw).to_string();
        let status = text
            .split_whitespace()
            .nth(1)
            .and_then(|s| s.parse().ok())
            .unwrap_or_else(|| panic!("no status line in {text:?}"));
        let body = text
            .split_once("\r\n\r\n")
            .map(|(_, b)| b.to_string())
            .unwrap_or_default();
        (status, body)
    }

    /// A `keel` command against this server.
    ///
    /// # Panics
    /// When the `keel` binary cannot be built.
    pub fn keel(&self, dir: &Path) -> std::process::Command {
        let mut cmd = keel(dir).unwrap();
        cmd.args(["--server", &self.url, "--token-file"])
            .arg(&self.token_file);
        cmd
    }
}

/// `keel node --role worker` in `dir` (where its sessions work), named `name`, joining the
/// coordinator node at `cluster` with the cookie in `cookie_file`, its cluster port on a free port
/// of 127.0.0.1; more flags can be added.
///
/// # Panics
/// When the `keel` binary cannot be built.
pub fn worker_command(
    dir: &Path,
    cluster: &str,
    name: &str,
    cookie_file: &Path,
) -> std::process::Command {
    let mut cmd = keel(dir).unwrap();
    cmd.args([
        "node",
        "--role",
        "worker",
        "--listen",
        "127.0.0.1:0",
        "--join",
        cluster,
        "--name",
        name,
        "--cookie-file",
    ])
    .arg(cookie_file);
    cmd
}

/// Put a few files in `dir` for the scripted survey plan to find.
///
/// # Panics
/// When a file cannot be written.
pub fn survey_files(dir: &Path) {
    std::fs::write(dir.join("main.rs"), "// TODO: everything\nfn main() {}\n").unwrap();
    std::fs::write(dir.join("lib.rs"), "pub fn f() {}\n").unwrap();
    std::fs::write(dir.join("notes.md"), "# notes\n").unwrap();
}

/// `text` with `dir` and run or task ids (26 upper-case letters and digits) replaced: they differ
/// between two runs; everything else of a summary must not.
pub fn normalized(text: &str, dir: &Path) -> String {
    let mut out = text.replace(&dir.display().to_string(), "DIR");
    for word in text.split(|c: char| !c.is_ascii_alphanumeric()) {
        if word.len() == 26
            && word
                .chars()
                .all(|c| c.is_ascii_uppercase() || c.is_ascii_digit())
        {
            out = out.replace(word, "ID");
        }
    }
    out
}

/// `keel run --quiet "survey this folder"` by `cmd`: its summary, [`normalized`] for `dir`, once
/// it succeeded.
///
/// # Panics
/// When it cannot run or fails.
pub fn quiet_survey(mut cmd: std::process::Command, dir: &Path) -> String {
    let out = cmd
        .args(["run", "--quiet", "survey this folder"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    normalized(&String::from_utf8_lossy(&out.stdout), dir)
}
