//! The file in a keel home that names the server holding it (`server.json`: its URL and process
//! id), so a local `keel run`, `follow-up`, `resume` or `cancel` on that home goes to the server
//! instead of failing to open a store another process holds, and so do the read commands when
//! the store is held (`keel serve` has it alone). Written when the server starts listening (mode
//! 0600), removed when it stops; a file left by a killed server names a process that is gone and
//! is ignored (and the reads, which open the store first, never depend on it while it is free).

use std::io::Write;
use std::net::SocketAddr;
use std::os::unix::fs::OpenOptionsExt;
use std::path::PathBuf;

use anyhow::Context;
use serde::{Deserialize, Serialize};

use crate::home::Home;

/// The file's name in the home.
pub(crate) const SERVER_FILE: &str = "server.json";
/// The largest discovery file read.
const SERVER_FILE_BYTES_MAX: u64 = 4 * 1024;

/// What the file says.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Announced {
    /// The server's base URL (`http://127.0.0.1:7777`).
    pub(crate) url: String,
    /// The server's process id.
    pub(crate) pid: u32,
}

impl std::fmt::Display for Announced {
    /// How the server is named wherever keel says who holds a store: "the keel server at URL (pid N)".
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "the keel server at {} (pid {})", self.url, self.pid)
    }
}

fn path(home: &Home) -> PathBuf {
    home.dir().join(SERVER_FILE)
}

/// The URL a client on this machine reaches a server bound to `addr` at (an unspecified address
/// is reached on loopback), `https` when it serves TLS.
pub(crate) fn local_url(addr: SocketAddr, tls: bool) -> String {
    let ip = if addr.ip().is_unspecified() {
        match addr {
            SocketAddr::V4(_) => std::net::IpAddr::from([127, 0, 0, 1]),
            SocketAddr::V6(_) => std::net::IpAddr::from(std::net::Ipv6Addr::LOCALHOST),
        }
    } else {
        addr.ip()
    };
    let scheme = if tls { "https" } else { "http" };
    format!("{scheme}://{}", SocketAddr::new(ip, addr.port()))
}

/// Announce this process as the home's server.
///
/// # Errors
/// When the file cannot be written.
pub(crate) fn write(home: &Home, addr: SocketAddr, tls: bool) -> anyhow::Result<()> {
    let path = path(home);
    let text = serde_json::to_string(&Announced {
        url: local_url(addr, tls),
        pid: std::process::id(),
    })?;
    // Written whole under another name (this process's) and renamed over the file (one left by
    // a killed server is replaced), so a reader never sees half of it.
    let partial = home
        .dir()
        .join(format!("{SERVER_FILE}.{}.partial", std::process::id()));
    let _ = std::fs::remove_file(&partial);
    let written = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&partial)
        .and_then(|mut file| file.write_all(text.as_bytes()))
        .and_then(|()| std::fs::rename(&partial, &path));
    if written.is_err() {
        let _ = std::fs::remove_file(&partial);
    }
    written.with_context(|| format!("writing {}", path.display()))
}

/// Withdraw the announcement, if it is this process's.
pub(crate) fn remove(home: &Home) {
    if read(home).is_some_and(|a| a.pid == std::process::id()) {
        let _ = std::fs::remove_file(path(home));
    }
}

/// The home's server, if the file names a process that is alive.
pub(crate) fn read(home: &Home) -> Option<Announced> {
    let path = path(home);
    let meta = std::fs::metadata(&path).ok()?;
    if meta.len() > SERVER_FILE_BYTES_MAX {
        return None;
    }
    let text = std::fs::read_to_string(&path).ok()?;
    let announced: Announced = serde_json::from_str(&text).ok()?;
    let pid = nix::unistd::Pid::from_raw(i32::try_from(announced.pid).ok()?);
    // Signal 0 checks that the process exists without touching it. EPERM (a process of another
    // user) means the file is stale: this user could read it, so this user's server wrote it (a file
    // another account's server wrote is 0600 and its own), and that pid is now someone else's.
    alive(nix::sys::signal::kill(pid, None)).then_some(announced)
}

/// Whether a signal-0 probe's outcome says the announcing server still runs.
fn alive(probe: nix::Result<()>) -> bool {
    probe.is_ok()
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    #[test]
    fn a_pid_now_of_another_user_or_of_no_process_is_a_stale_file() {
        assert!(alive(Ok(())));
        assert!(!alive(Err(nix::errno::Errno::EPERM)));
        assert!(!alive(Err(nix::errno::Errno::ESRCH)));
    }

    #[test]
    fn the_announcement_replaces_a_stale_file_whole_and_leaves_no_partial_file() {
        let dir = tempfile::tempdir().unwrap();
        let home = Home::locate(Some(dir.path().to_path_buf())).unwrap();
        std::fs::write(path(&home), "{\"url\": \"http://127.0.0.1:1\", \"pid\": 1}").unwrap();
        write(&home, SocketAddr::from(([127, 0, 0, 1], 7777)), false).unwrap();
        assert_eq!(
            read(&home),
            Some(Announced {
                url: "http://127.0.0.1:7777".into(),
                pid: std::process::id(),
            })
        );
        let names: Vec<String> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        assert_eq!(names, vec![SERVER_FILE.to_owned()]);
        let mode = std::os::unix::fs::PermissionsExt::mode(
            &std::fs::metadata(path(&home)).unwrap().permissions(),
        );
        assert_eq!(mode & 0o777, 0o600);
    }
}
