//! A running `keel serve` for tests that go through the HTTP API: started on a free port of
//! 127.0.0.1, raw requests with or without its token, and `keel` commands pointed at it.
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

impl Server {
    /// Start `keel serve` in `dir` on a free port and wait until it listens.
    ///
    /// # Panics
    /// When it cannot start or does not listen within two minutes.
    pub fn start(dir: &Path) -> Self {
        let mut cmd = keel(dir).unwrap();
        cmd.args(["serve", "--listen", "127.0.0.1:0"]);
        let mut process = Reaped::spawn(cmd).unwrap();
        let line = process.line_containing("listening on", START_WAIT).unwrap();
        let url = line
            .split("listening on ")
            .nth(1)
            .and_then(|rest| rest.split_whitespace().next())
            .unwrap()
            .to_string();
        let addr = url.trim_start_matches("http://").to_string();
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
