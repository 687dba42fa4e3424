//! Harness processes: spawned detached from our terminal, stopped gracefully, and reaped as a whole
//! tree.
//!
//! The CLIs leave tool processes behind: Claude Code and opencode start each shell tool in a
//! process group (often a session) of its own, and when the CLI dies those processes are re-parented
//! and keep running (harnesses README §1.7, §6.6). `killpg` on the CLI's group misses them. So a
//! session's processes are found three ways, and all of them are killed:
//!
//! 1. **Descendants** of the CLI, by walking the parent links in `/proc`. A watcher records them
//!    (pid and start time, so a reused pid is never mistaken for ours) while the CLI runs, because
//!    once the CLI dies its children are re-parented and the link is gone.
//! 2. **A tag in the environment**: every session's process gets `KEEL_PROCESS_TAG=<unique>`, which
//!    its descendants inherit unless a tool scrubs its environment; `/proc/<pid>/environ` finds them
//!    wherever they were re-parented.
//! 3. **The CLI's process group**, for anything that kept it.
//!
//! On Linux the embedding process makes itself a *child subreaper* (`PR_SET_CHILD_SUBREAPER`) the
//! first time a session is spawned, so orphans re-parent to keel rather than to PID 1. keel then
//! reaps the orphans it killed (by pid, never `waitpid(-1)`, so tokio's own children are left to
//! tokio). This is process-wide and cannot be undone per session; an embedder that spawns other
//! long-lived process trees will see their orphans re-parented to it too.
//!
//! Everything here is bounded: the watcher's record, the kill rounds and every wait.

use std::collections::{BTreeMap, BTreeSet};
use std::ffi::OsString;
use std::path::PathBuf;
use std::process::{ExitStatus, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use tokio::process::{Child, ChildStderr, ChildStdout, Command};
use tokio::task::JoinHandle;

/// The environment variable that tags every process of one session.
pub const PROCESS_TAG_VAR: &str = "KEEL_PROCESS_TAG";

/// How often the watcher records the session's process tree. Short enough to see a tool process
/// before its parent dies in most runs, long enough to cost nothing next to a CLI's own work.
pub const TREE_SCAN_INTERVAL: Duration = Duration::from_millis(200);

/// Most processes remembered per session; past it the oldest entries are forgotten (they are found
/// again through the tag or the group if still alive).
pub const TRACKED_PROCESSES_MAX: usize = 4096;

/// Most kill-and-reap rounds when cleaning up a tree (each round waits [`KILL_ROUND_WAIT`]).
pub const KILL_ROUNDS_MAX: u32 = 50;

/// Pause between kill rounds, giving the kernel time to deliver SIGKILL and re-parent orphans.
pub const KILL_ROUND_WAIT: Duration = Duration::from_millis(20);

/// How long to wait for the root process after SIGKILL before giving up on its status.
pub const KILL_WAIT_MAX: Duration = Duration::from_secs(5);

/// What to run: the program, its arguments, its whole environment and its working directory.
///
/// The environment is given in full (the parent's is not inherited) so a session never leaks the
/// embedder's credentials or a developer's CLI configuration into a harness.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProcessSpec {
    /// The executable.
    pub program: PathBuf,
    /// Arguments, passed without a shell.
    pub args: Vec<OsString>,
    /// The complete environment of the process.
    pub env: BTreeMap<OsString, OsString>,
    /// The working directory.
    pub cwd: PathBuf,
    /// A file whose contents are the process's stdin (opencode reads its prompt there); `None`
    /// gives `/dev/null`. Either way stdin ends: Codex, opencode and pi block on an open pipe.
    pub stdin: Option<PathBuf>,
}

/// One running harness process and everything it starts.
#[derive(Debug)]
pub struct SessionProcess {
    child: Child,
    root_pid: u32,
    tag: String,
    tracked: Arc<Mutex<BTreeMap<u32, u64>>>,
    watcher: JoinHandle<()>,
    status: Option<ExitStatus>,
}

/// How a session's process ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProcessEnd {
    /// The root's exit status, if it could be collected.
    pub status: Option<ExitStatus>,
    /// Leftover processes of the session that were killed after the root ended.
    pub leftovers_killed: u32,
}

static SUBREAPER: OnceLock<bool> = OnceLock::new();
static TAG_SEQ: AtomicU64 = AtomicU64::new(0);

/// Makes this process a child subreaper once; returns whether it is one. Idempotent and cheap.
pub fn ensure_subreaper() -> bool {
    *SUBREAPER.get_or_init(|| {
        #[cfg(target_os = "linux")]
        {
            nix::sys::prctl::set_child_subreaper(true).is_ok()
        }
        #[cfg(not(target_os = "linux"))]
        {
            false
        }
    })
}

fn fresh_tag() -> String {
    let seq = TAG_SEQ.fetch_add(1, Ordering::Relaxed);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0);
    format!("{}-{}-{}", std::process::id(), nanos, seq)
}

impl SessionProcess {
    /// Spawns `spec` with stdin closed (`/dev/null`, or the spec's stdin file: Codex, opencode and
    /// pi block until EOF on an open pipe), stdout and stderr piped, in a new process group,
    /// tagged, and watched.
    ///
    /// # Errors
    /// The spawn's I/O error (missing program, bad cwd, ...).
    pub fn spawn(
        spec: &ProcessSpec,
    ) -> std::io::Result<(SessionProcess, ChildStdout, ChildStderr)> {
        ensure_subreaper();
        let tag = fresh_tag();
        let stdin = match &spec.stdin {
            Some(path) => Stdio::from(std::fs::File::open(path)?),
            None => Stdio::null(),
        };
        let mut cmd = Command::new(&spec.program);
        cmd.args(&spec.args)
            .env_clear()
            .envs(&spec.env)
            .env(PROCESS_TAG_VAR, &tag)
            .current_dir(&spec.cwd)
            .stdin(stdin)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .process_group(0)
            .kill_on_drop(true);
        let mut child = cmd.spawn()?;
        let root_pid = child
            .id()
            .ok_or_else(|| std::io::Error::other("spawned process has no pid"))?;
        let stdout = child
            .stdout
            .take()
            .ok_or_else(|| std::io::Error::other("stdout was not captured"))?;
        let stderr = child
            .stderr
            .take()
            .ok_or_else(|| std::io::Error::other("stderr was not captured"))?;
        let tracked = Arc::new(Mutex::new(BTreeMap::new()));
        let watcher = tokio::spawn(watch_tree(root_pid, Arc::clone(&tracked)));
        Ok((
            SessionProcess {
                child,
                root_pid,
                tag,
                tracked,
                watcher,
                status: None,
            },
            stdout,
            stderr,
        ))
    }

    /// The pid of the harness process itself.
    pub fn root_pid(&self) -> u32 {
        self.root_pid
    }

    /// The tag its processes carry in [`PROCESS_TAG_VAR`].
    pub fn tag(&self) -> &str {
        &self.tag
    }

    /// Waits for the root process to exit.
    ///
    /// # Cancel safety
    /// Cancel safe: the status is kept once collected.
    pub async fn wait(&mut self) -> std::io::Result<ExitStatus> {
        if let Some(status) = self.status {
            return Ok(status);
        }
        let status = self.child.wait().await?;
        self.status = Some(status);
        Ok(status)
    }

    /// Stops the session: SIGTERM to the process group, up to `grace` for the root to exit, then
    /// SIGKILL, then every remaining process of the session is killed and reaped.
    pub async fn terminate(&mut self, grace: Duration) -> ProcessEnd {
        record_tree(self.root_pid, &self.tracked);
        if self.status.is_none() {
            signal_group(self.root_pid, Sig::Term);
            if let Ok(Ok(status)) = tokio::time::timeout(grace, self.child.wait()).await {
                self.status = Some(status);
            }
        }
        if self.status.is_none() {
            record_tree(self.root_pid, &self.tracked);
            signal_group(self.root_pid, Sig::Kill);
            let _ = self.child.start_kill();
            if let Ok(Ok(status)) = tokio::time::timeout(KILL_WAIT_MAX, self.child.wait()).await {
                self.status = Some(status);
            }
        }
        self.finish().await
    }

    /// After the root exited by itself: kills and reaps whatever it left behind.
    pub async fn finish(&mut self) -> ProcessEnd {
        if self.status.is_none()
            && let Ok(Some(status)) = self.child.try_wait()
        {
            self.status = Some(status);
        }
        self.watcher.abort();
        record_tree(self.root_pid, &self.tracked);
        let leftovers_killed = kill_leftovers(self.root_pid, &self.tag, &self.tracked).await;
        ProcessEnd {
            status: self.status,
            leftovers_killed,
        }
    }
}

impl Drop for SessionProcess {
    fn drop(&mut self) {
        // A session dropped without `terminate`/`finish` (a panic, an aborted task) still must not
        // leave its tree running: kill synchronously, without waiting for the reaping.
        self.watcher.abort();
        if self.status.is_none() {
            signal_group(self.root_pid, Sig::Kill);
        }
        let members = session_members(self.root_pid, &self.tag, &self.tracked);
        for pid in members {
            kill_pid(pid);
        }
    }
}

async fn watch_tree(root_pid: u32, tracked: Arc<Mutex<BTreeMap<u32, u64>>>) {
    let mut interval = tokio::time::interval(TREE_SCAN_INTERVAL);
    interval.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        interval.tick().await;
        record_tree(root_pid, &tracked);
    }
}

fn record_tree(root_pid: u32, tracked: &Mutex<BTreeMap<u32, u64>>) {
    let table = proc_table();
    let descendants = descendants(&table, &[root_pid]);
    let Ok(mut map) = tracked.lock() else { return };
    for pid in descendants {
        if let Some(entry) = table.get(&pid) {
            map.insert(pid, entry.start_ticks);
        }
    }
    while map.len() > TRACKED_PROCESSES_MAX {
        let Some(first) = map.keys().next().copied() else {
            break;
        };
        map.remove(&first);
    }
}

/// The session's live processes other than the root, by all three identifications.
fn session_members(root_pid: u32, tag: &str, tracked: &Mutex<BTreeMap<u32, u64>>) -> BTreeSet<u32> {
    let table = proc_table();
    let own = std::process::id();
    let mut seeds: Vec<u32> = vec![root_pid];
    if let Ok(map) = tracked.lock() {
        for (pid, start) in map.iter() {
            if table.get(pid).is_some_and(|e| e.start_ticks == *start) {
                seeds.push(*pid);
            }
        }
    }
    let needle = format!("{PROCESS_TAG_VAR}={tag}");
    for (pid, entry) in &table {
        if entry.pgid == root_pid || environ_has(*pid, needle.as_bytes()) {
            seeds.push(*pid);
        }
    }
    let mut members = descendants(&table, &seeds);
    members.extend(seeds.iter().copied().filter(|p| table.contains_key(p)));
    members.remove(&root_pid);
    members.remove(&own);
    members.remove(&1);
    members
}

async fn kill_leftovers(root_pid: u32, tag: &str, tracked: &Mutex<BTreeMap<u32, u64>>) -> u32 {
    let own = std::process::id();
    // pid -> start ticks of everything killed: a killed orphan turns into a zombie with an empty
    // environ and no parent link to the root, so only this record still identifies it for reaping.
    let mut killed: BTreeMap<u32, u64> = BTreeMap::new();
    for _round in 0..KILL_ROUNDS_MAX {
        let table = proc_table();
        let mut candidates = session_members(root_pid, tag, tracked);
        candidates.extend(
            killed
                .iter()
                .filter(|(pid, start)| table.get(pid).is_some_and(|e| e.start_ticks == **start))
                .map(|(pid, _)| *pid),
        );
        let mut pending = false;
        for pid in &candidates {
            let Some(entry) = table.get(pid) else {
                continue;
            };
            if entry.state == 'Z' {
                // A zombie is dead; it only needs its parent to reap it. Ours we reap by pid.
                if entry.ppid == own {
                    reap_pid(*pid);
                    pending = true;
                }
                continue;
            }
            kill_pid(*pid);
            killed.insert(*pid, entry.start_ticks);
            pending = true;
        }
        if !pending {
            break;
        }
        tokio::time::sleep(KILL_ROUND_WAIT).await;
    }
    u32::try_from(killed.len()).unwrap_or(u32::MAX)
}

/// One row of the process table, as much as the tree walk needs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProcEntry {
    /// Parent pid.
    pub ppid: u32,
    /// Process group id.
    pub pgid: u32,
    /// Start time in clock ticks since boot: with the pid, a unique identity.
    pub start_ticks: u64,
    /// State letter (`R`, `S`, `Z`, ...).
    pub state: char,
}

/// Parses `/proc/<pid>/stat`. The command name sits in parentheses and may itself contain spaces
/// and parentheses, so fields are counted from the last `)`.
pub fn parse_stat(stat: &str) -> Option<ProcEntry> {
    let close = stat.rfind(')')?;
    let mut fields = stat.get(close + 1..)?.split_ascii_whitespace();
    let state = fields.next()?.chars().next()?;
    let ppid = fields.next()?.parse().ok()?;
    let pgid = fields.next()?.parse().ok()?;
    // Fields after pgid: session(6) tty_nr(7) tpgid(8) flags(9) minflt(10) cminflt(11) majflt(12)
    // cmajflt(13) utime(14) stime(15) cutime(16) cstime(17) priority(18) nice(19) num_threads(20)
    // itrealvalue(21) starttime(22). We consumed 3..=5, so starttime is 17 fields further.
    let start_ticks = fields.nth(16)?.parse().ok()?;
    Some(ProcEntry {
        ppid,
        pgid,
        start_ticks,
        state,
    })
}

/// A snapshot of the process table (pid to entry); empty where `/proc` is unavailable.
pub fn proc_table() -> BTreeMap<u32, ProcEntry> {
    let mut table = BTreeMap::new();
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return table;
    };
    for entry in dir.flatten() {
        let name = entry.file_name();
        let Some(pid) = name.to_str().and_then(|s| s.parse::<u32>().ok()) else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
            continue;
        };
        if let Some(e) = parse_stat(&stat) {
            table.insert(pid, e);
        }
    }
    table
}

/// Every process below `roots` in the parent tree (the roots themselves excluded unless they
/// descend from another root). Pure, for tests.
pub fn descendants(table: &BTreeMap<u32, ProcEntry>, roots: &[u32]) -> BTreeSet<u32> {
    let mut children: BTreeMap<u32, Vec<u32>> = BTreeMap::new();
    for (pid, e) in table {
        children.entry(e.ppid).or_default().push(*pid);
    }
    let mut out = BTreeSet::new();
    let mut stack: Vec<u32> = roots.to_vec();
    // Bounded by the table size: each pid is pushed at most once.
    while let Some(pid) = stack.pop() {
        if let Some(kids) = children.get(&pid) {
            for kid in kids {
                if out.insert(*kid) {
                    stack.push(*kid);
                }
            }
        }
    }
    out
}

fn environ_has(pid: u32, needle: &[u8]) -> bool {
    let Ok(env) = std::fs::read(format!("/proc/{pid}/environ")) else {
        return false;
    };
    env.split(|b| *b == 0).any(|kv| kv == needle)
}

#[derive(Debug, Clone, Copy)]
enum Sig {
    Term,
    Kill,
}

fn signal_group(pgid: u32, sig: Sig) {
    let Ok(raw) = i32::try_from(pgid) else { return };
    let signal = match sig {
        Sig::Term => nix::sys::signal::Signal::SIGTERM,
        Sig::Kill => nix::sys::signal::Signal::SIGKILL,
    };
    let _ = nix::sys::signal::killpg(nix::unistd::Pid::from_raw(raw), signal);
}

fn kill_pid(pid: u32) {
    let Ok(raw) = i32::try_from(pid) else { return };
    if raw <= 1 {
        return;
    }
    let _ = nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(raw),
        nix::sys::signal::Signal::SIGKILL,
    );
}

fn reap_pid(pid: u32) {
    let Ok(raw) = i32::try_from(pid) else { return };
    let _ = nix::sys::wait::waitpid(
        nix::unistd::Pid::from_raw(raw),
        Some(nix::sys::wait::WaitPidFlag::WNOHANG),
    );
}

/// Live (non-zombie) processes carrying `tag` in their environment; for tests and diagnostics that
/// check a session left nothing behind.
pub fn processes_tagged(tag: &str) -> Vec<u32> {
    let needle = format!("{PROCESS_TAG_VAR}={tag}");
    proc_table()
        .into_iter()
        .filter(|(pid, e)| e.state != 'Z' && environ_has(*pid, needle.as_bytes()))
        .map(|(pid, _)| pid)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stat_with_odd_command_names_parses() {
        let stat = "4242 (a (weird) name) S 17 4242 4242 0 -1 4194560 100 0 0 0 1 2 0 0 20 0 1 0 987654 1000 10";
        let e = parse_stat(stat).unwrap();
        assert_eq!(e.ppid, 17);
        assert_eq!(e.pgid, 4242);
        assert_eq!(e.state, 'S');
        assert_eq!(e.start_ticks, 987654);
        assert_eq!(parse_stat("garbage"), None);
        assert_eq!(parse_stat("1 (x) S 0"), None);
    }

    #[test]
    fn descendants_walk_the_whole_tree_only() {
        let e = |ppid| ProcEntry {
            ppid,
            pgid: 0,
            start_ticks: 0,
            state: 'S',
        };
        let table: BTreeMap<u32, ProcEntry> = [
            (10, e(1)),
            (11, e(10)),
            (12, e(11)),
            (13, e(12)),
            (20, e(1)),
            (21, e(20)),
        ]
        .into_iter()
        .collect();
        assert_eq!(
            descendants(&table, &[10]),
            [11, 12, 13].into_iter().collect()
        );
        assert_eq!(descendants(&table, &[99]), BTreeSet::new());
    }

    #[test]
    fn own_process_is_in_the_table() {
        let table = proc_table();
        let me = table.get(&std::process::id()).unwrap();
        assert_ne!(me.start_ticks, 0);
    }

    fn shell(script: &str) -> ProcessSpec {
        ProcessSpec {
            program: "/bin/sh".into(),
            args: vec!["-c".into(), script.into()],
            env: [("PATH".into(), "/usr/bin:/bin".into())]
                .into_iter()
                .collect(),
            cwd: std::env::temp_dir(),
            stdin: None,
        }
    }

    #[tokio::test]
    async fn terminate_kills_tools_in_their_own_session() {
        // The shell starts a "tool" in a new session (as Claude Code and opencode do), then ignores
        // SIGTERM and waits: only the tree walk or the tag finds the tool.
        let spec = shell("trap '' TERM; setsid sleep 30 & sleep 30; wait");
        let (mut proc, _out, _err) = SessionProcess::spawn(&spec).unwrap();
        let tag = proc.tag().to_owned();
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        while processes_tagged(&tag).len() < 3 && std::time::Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        assert_eq!(
            processes_tagged(&tag).len(),
            3,
            "sh, the setsid sleep and the plain sleep"
        );
        let end = proc.terminate(Duration::from_millis(200)).await;
        assert!(end.status.is_some());
        assert!(
            processes_tagged(&tag).is_empty(),
            "left: {:?}",
            processes_tagged(&tag)
        );
    }

    #[tokio::test]
    async fn finish_kills_what_a_clean_exit_left_behind() {
        let spec = shell("setsid sleep 30 >/dev/null 2>&1 & exit 0");
        let (mut proc, _out, _err) = SessionProcess::spawn(&spec).unwrap();
        let tag = proc.tag().to_owned();
        let status = proc.wait().await.unwrap();
        assert!(status.success());
        // `setsid` may still be between its fork and its exec when the shell has exited, so the
        // leftover is looked for a few times (bounded) rather than once, until it runs `sleep`
        // (in the middle of its exec its environment, which carries the tag, cannot be read).
        let exec_done = |pids: &[u32]| {
            !pids.is_empty()
                && pids.iter().all(|pid| {
                    std::fs::read_to_string(format!("/proc/{pid}/comm"))
                        .is_ok_and(|comm| comm.trim() == "sleep")
                })
        };
        let mut left = processes_tagged(&tag);
        for _ in 0..150 {
            if exec_done(&left) {
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
            left = processes_tagged(&tag);
        }
        let before = proc_table();
        assert!(!left.is_empty(), "the setsid sleep outlives its shell");
        let end = proc.finish().await;
        assert!(end.leftovers_killed >= 1);
        assert!(processes_tagged(&tag).is_empty());
        // The orphan re-parented to us (subreaper) and was reaped: not even a zombie is left. The
        // reaping follows the kill by a scheduling delay on a loaded machine, so the table is
        // looked at a few times (bounded) before a process still in it counts as left behind.
        if ensure_subreaper() {
            let still = |after: &BTreeMap<u32, ProcEntry>| {
                left.iter()
                    .copied()
                    .filter(|pid| {
                        after
                            .get(pid)
                            .is_some_and(|e| e.start_ticks == before[pid].start_ticks)
                    })
                    .collect::<Vec<u32>>()
            };
            let mut after = proc_table();
            for _ in 0..100 {
                if still(&after).is_empty() {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
                after = proc_table();
            }
            let kept = still(&after);
            assert!(
                kept.is_empty(),
                "processes {kept:?} still in the table: {:?}",
                kept.iter().map(|pid| after.get(pid)).collect::<Vec<_>>()
            );
        }
    }
}
