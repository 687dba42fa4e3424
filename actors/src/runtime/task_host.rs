//! A [`Machine`] hosted on a plain tokio task instead of a ractor actor: the host of a specialist
//! attempt (here and on a cluster worker).
//!
//! A specialist lives for one attempt and a fan-out starts thousands of them, so what a ractor actor
//! costs per instance (its cell and ports, several channels, the registry and the supervision tree)
//! is paid thousands of times: about 2% of `keel bench`'s CPU in ractor's own code, of the fifth
//! the specialist actors took with their sessions (docs/PERFORMANCE.md). This host keeps what those actors gave the runtime, and nothing
//! else: one inbox (a tokio unbounded channel, FIFO as ractor's per-sender order), the [`Role`]'s
//! hooks in the same order as [`crate::runtime::MachineActor`] calls them, a kill that interrupts the
//! current step, and the end of the task (a normal stop, a kill, a panic) reported once to whoever
//! supervises it, as ractor's supervision events reported it.

use crate::machine::Machine;
use crate::message::SpecialistInput;
use crate::runtime::machine_actor::{Flow, MachineActorState, Role, step};
use std::any::Any;
use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::task::Poll;
use tokio::sync::{Notify, mpsc};
use tracing::Instrument;

/// The address of a machine hosted on its own task: what its feeders (timers, tool calls, the
/// node's routing) hold to deliver its inputs, and what stops it hard. A specialist's session
/// events do not come through it: the task reads them itself ([`Role::own_input`]).
pub struct Inbox<I> {
    tx: mpsc::UnboundedSender<I>,
    kill: Arc<Notify>,
}

impl<I> Clone for Inbox<I> {
    fn clone(&self) -> Self {
        Self {
            tx: self.tx.clone(),
            kill: Arc::clone(&self.kill),
        }
    }
}

impl<I> std::fmt::Debug for Inbox<I> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Inbox")
            .field("closed", &self.tx.is_closed())
            .finish_non_exhaustive()
    }
}

impl<I> Inbox<I> {
    /// Queue one input. False once the task has ended: a feeder then knows nobody listens.
    pub fn send(&self, input: I) -> bool {
        self.tx.send(input).is_ok()
    }

    /// End the task now, as a crashed host would die: the current step is abandoned, queued inputs
    /// are dropped and the role's `stopped` is not called; the end is reported as
    /// [`HostedEnd::Killed`]. Idempotent.
    pub fn kill(&self) {
        // A stored permit: a kill before the task first waits is not lost.
        self.kill.notify_one();
    }

    /// Whether its task has ended (tests of the hosts that hold inboxes).
    #[cfg(test)]
    pub(crate) fn ended(&self) -> bool {
        self.tx.is_closed()
    }

    /// Whether both address the same hosted instance (a later attempt's host replaces an earlier
    /// one's entry in a table; the earlier one's end must not remove it).
    pub fn same(&self, other: &Self) -> bool {
        self.tx.same_channel(&other.tx)
    }
}

/// The address of a hosted specialist attempt.
pub type SpecialistInbox = Inbox<SpecialistInput>;

/// How a task-hosted machine ended, as its supervisor hears it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HostedEnd {
    /// Its role stopped it ([`Flow::Stop`]) with this reason; `stopped` ran.
    Stopped(String),
    /// [`Inbox::kill`] ended it.
    Killed,
    /// A step (or `stopped`) panicked, with the panic's message: keel's adapter or the harness
    /// broke, which counts against the harness.
    Panicked(String),
}

impl HostedEnd {
    /// The exit reason, as ractor spelled it for an actor (`"killed"`, `"failed: ..."`), so logs
    /// and the supervisor's failure rows read as before.
    pub fn reason(&self) -> String {
        match self {
            Self::Stopped(reason) => reason.clone(),
            Self::Killed => "killed".into(),
            Self::Panicked(message) => format!("failed: {message}"),
        }
    }

    /// Whether it panicked.
    pub fn panicked(&self) -> bool {
        matches!(self, Self::Panicked(_))
    }
}

/// Host `state`'s machine under `role` on a new task; `ended` is called once on that task when it
/// ends, with the task's own address. Nothing runs until the first input is sent, so the caller can
/// record the address (in its routing table) before the machine starts.
pub fn host_on_task<M, R, F>(role: R, state: MachineActorState<R>, ended: F) -> Inbox<M::Input>
where
    M: Machine + Send + 'static,
    M::Input: Send + 'static,
    M::Effect: Send + 'static,
    R: Role<M = M, Addr = Inbox<M::Input>>,
    F: FnOnce(&Inbox<M::Input>, HostedEnd) + Send + 'static,
{
    let (tx, rx) = mpsc::unbounded_channel();
    let me = Inbox {
        tx,
        kill: Arc::new(Notify::new()),
    };
    let kill = Arc::clone(&me.kill);
    let span = role.span();
    let guard = EndGuard {
        me: me.clone(),
        ended: Some(ended),
    };
    let task = async move {
        // A local declared first: dropped after the body's (its inbox's receiver among them), so
        // the end is reported once nothing can receive.
        let mut guard = guard;
        let end = run(&role, state, &guard.me, rx, &kill).await;
        guard.report(end);
    };
    crate::runtime::node::spawn(task.instrument(span));
    me
}

/// Reports a hosted task's end exactly once: with how `run` ended when it returns, or, when the
/// task is torn down without returning (a panic outside the caught step, such as its state's drop
/// or the abandoned step's; tokio dropping the task as its runtime shuts down), as a panic when
/// the guard is dropped. Without it the supervisor would never hear of the attempt and its
/// concurrency slot would leak.
struct EndGuard<I, F: FnOnce(&Inbox<I>, HostedEnd)> {
    /// The task's own address (it keeps the inbox open while the task lives).
    me: Inbox<I>,
    /// Taken by the first report.
    ended: Option<F>,
}

impl<I, F: FnOnce(&Inbox<I>, HostedEnd)> EndGuard<I, F> {
    fn report(&mut self, end: HostedEnd) {
        if let Some(ended) = self.ended.take() {
            ended(&self.me, end);
        }
    }
}

impl<I, F: FnOnce(&Inbox<I>, HostedEnd)> Drop for EndGuard<I, F> {
    fn drop(&mut self) {
        self.report(HostedEnd::Panicked("the task was dropped".into()));
    }
}

/// The task's body: one input at a time until the role stops it, a kill, or a panic.
async fn run<R>(
    role: &R,
    mut state: MachineActorState<R>,
    me: &R::Addr,
    mut rx: mpsc::UnboundedReceiver<<R::M as Machine>::Input>,
    kill: &Notify,
) -> HostedEnd
where
    R: Role,
    <R::M as Machine>::Effect: Send + 'static,
{
    let end = {
        let work = async {
            loop {
                let input = tokio::select! {
                    biased;
                    // The task holds its own address, so the channel never closes under it.
                    input = rx.recv() => match input {
                        Some(input) => input,
                        None => return HostedEnd::Stopped("inbox closed".into()),
                    },
                    input = role.own_input(&mut state.local) => input,
                };
                if let Flow::Stop(reason) = step(role, me, &mut state, input).await {
                    return HostedEnd::Stopped(reason);
                }
            }
        };
        let mut work = std::pin::pin!(work);
        // A panic in a step ends the task as ractor ended a failed actor (no `stopped`).
        let caught = std::future::poll_fn(|cx| {
            match std::panic::catch_unwind(AssertUnwindSafe(|| work.as_mut().poll(cx))) {
                Ok(Poll::Pending) => Poll::Pending,
                Ok(Poll::Ready(end)) => Poll::Ready(end),
                Err(panic) => Poll::Ready(HostedEnd::Panicked(panic_text(panic.as_ref()))),
            }
        });
        tokio::select! {
            biased;
            () = kill.notified() => HostedEnd::Killed,
            end = caught => end,
        }
    };
    if let HostedEnd::Stopped(_) = end {
        let local = &mut state.local;
        if let Err(panic) = std::panic::catch_unwind(AssertUnwindSafe(|| role.stopped(me, local))) {
            return HostedEnd::Panicked(panic_text(panic.as_ref()));
        }
    }
    end
}

/// A panic's message (a `String` or `&str` payload, as `panic!` makes them).
fn panic_text(panic: &(dyn Any + Send)) -> String {
    if let Some(s) = panic.downcast_ref::<String>() {
        s.clone()
    } else if let Some(s) = panic.downcast_ref::<&str>() {
        (*s).to_owned()
    } else {
        "a panic without a message".into()
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)] // Tests: a panic is the failure report.

    use super::*;
    use crate::machine::{Entropy, Millis};
    use crate::runtime::clock::OsEntropy;
    use std::sync::Mutex;
    use std::time::Duration;
    use tokio::sync::oneshot;

    /// Echoes each input as its one effect, and counts them.
    struct Echo(u32);

    impl Machine for Echo {
        type Input = &'static str;
        type Effect = &'static str;
        fn handle(
            &mut self,
            input: &'static str,
            _: Millis,
            _: &mut dyn Entropy,
            out: &mut Vec<&'static str>,
        ) {
            self.0 += 1;
            out.push(input);
        }
    }

    /// What the role saw, for the test to check.
    #[derive(Default)]
    struct Seen {
        executed: Vec<&'static str>,
        stopped: bool,
        /// Told when a "hang" step has started.
        hanging: Option<oneshot::Sender<()>>,
    }

    /// The role's local state: once armed, dropping it panics (outside any step).
    #[derive(Default)]
    struct Fuse(bool);

    impl Drop for Fuse {
        fn drop(&mut self) {
            assert!(!self.0, "the state's drop broke");
        }
    }

    /// "stop" stops, "panic" panics, "hang" never finishes its step, "arm" makes the state's drop
    /// panic; anything else is recorded.
    struct Script(Arc<Mutex<Seen>>);

    impl Role for Script {
        type M = Echo;
        type Local = Fuse;
        type Addr = Inbox<&'static str>;

        async fn execute(
            &self,
            _me: &Self::Addr,
            local: &mut Fuse,
            effects: Vec<&'static str>,
        ) -> Flow {
            for effect in effects {
                match effect {
                    "stop" => return Flow::Stop("done".into()),
                    "panic" => panic!("the adapter broke"),
                    "arm" => local.0 = true,
                    "hang" => {
                        let started = self.0.lock().unwrap().hanging.take();
                        if let Some(started) = started {
                            let _ = started.send(());
                        }
                        std::future::pending::<()>().await;
                    }
                    other => self.0.lock().unwrap().executed.push(other),
                }
            }
            Flow::Continue
        }

        fn stopped(&self, _me: &Self::Addr, _local: &mut Fuse) {
            self.0.lock().unwrap().stopped = true;
        }
    }

    /// A hosted `Echo`, what its role saw, and how it ended (once it has).
    type Hosting = (
        Inbox<&'static str>,
        Arc<Mutex<Seen>>,
        oneshot::Receiver<HostedEnd>,
    );

    fn hosted() -> Hosting {
        let seen = Arc::new(Mutex::new(Seen::default()));
        let (tx, rx) = oneshot::channel();
        let state = MachineActorState::new(Echo(0), OsEntropy::from_seed(1), Fuse::default());
        let inbox = host_on_task(Script(Arc::clone(&seen)), state, move |me, end| {
            assert!(!me.send("late"), "the inbox is closed once the task ended");
            let _ = tx.send(end);
        });
        (inbox, seen, rx)
    }

    async fn end_of(rx: oneshot::Receiver<HostedEnd>) -> HostedEnd {
        tokio::time::timeout(Duration::from_secs(10), rx)
            .await
            .expect("the task ends")
            .expect("the end is reported")
    }

    #[tokio::test]
    async fn inputs_run_in_order_and_a_stop_calls_stopped() {
        let (inbox, seen, rx) = hosted();
        for input in ["a", "b", "stop", "never"] {
            assert!(inbox.send(input));
        }
        assert_eq!(end_of(rx).await, HostedEnd::Stopped("done".into()));
        let seen = seen.lock().unwrap();
        assert_eq!(seen.executed, ["a", "b"], "nothing after the stop");
        assert!(seen.stopped);
        assert!(!inbox.send("after"));
    }

    #[tokio::test]
    async fn a_panicking_step_is_reported_as_a_panic_without_stopped() {
        let (inbox, seen, rx) = hosted();
        inbox.send("a");
        inbox.send("panic");
        let end = end_of(rx).await;
        assert_eq!(end, HostedEnd::Panicked("the adapter broke".into()));
        assert!(end.panicked());
        assert_eq!(end.reason(), "failed: the adapter broke");
        assert!(!seen.lock().unwrap().stopped);
    }

    /// A hosted `Echo` whose "hang" step says when it has started.
    fn hosted_hanging() -> (Hosting, oneshot::Receiver<()>) {
        let hosting = hosted();
        let (started_tx, started) = oneshot::channel();
        hosting.1.lock().unwrap().hanging = Some(started_tx);
        (hosting, started)
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_kill_interrupts_a_step_that_never_finishes() {
        let ((inbox, seen, rx), started) = hosted_hanging();
        inbox.send("hang");
        inbox.send("queued");
        // The step is under way (not merely queued) when the kill comes.
        tokio::time::timeout(Duration::from_secs(10), started)
            .await
            .expect("the step starts")
            .expect("the step says so");
        inbox.kill();
        let end = end_of(rx).await;
        assert_eq!(end, HostedEnd::Killed);
        assert_eq!(end.reason(), "killed");
        assert!(!end.panicked());
        let seen = seen.lock().unwrap();
        assert!(seen.executed.is_empty(), "{:?}", seen.executed);
        assert!(!seen.stopped, "a kill skips the role's cleanup");
    }

    #[tokio::test]
    async fn a_kill_before_the_first_poll_ends_the_task_before_any_step() {
        let (inbox, seen, rx) = hosted();
        inbox.send("a");
        inbox.kill();
        assert_eq!(end_of(rx).await, HostedEnd::Killed);
        let seen = seen.lock().unwrap();
        assert!(seen.executed.is_empty(), "{:?}", seen.executed);
        assert!(!seen.stopped);
    }

    #[tokio::test]
    async fn a_panic_outside_the_steps_is_still_reported() {
        let (inbox, seen, rx) = hosted();
        inbox.send("arm");
        inbox.send("stop");
        // The state's drop panics after `stopped`, outside the caught step.
        assert_eq!(
            end_of(rx).await,
            HostedEnd::Panicked("the task was dropped".into())
        );
        assert!(seen.lock().unwrap().stopped);
    }

    #[test]
    fn a_task_its_runtime_drops_is_reported_dropped() {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let (inbox, mut rx) = rt.block_on(async {
            let ((inbox, _seen, rx), started) = hosted_hanging();
            inbox.send("hang");
            started.await.expect("the step starts");
            (inbox, rx)
        });
        drop(rt);
        assert_eq!(
            rx.try_recv(),
            Ok(HostedEnd::Panicked("the task was dropped".into()))
        );
        assert!(!inbox.send("after"));
    }

    #[tokio::test]
    async fn clones_address_the_same_task_and_another_task_is_another() {
        let (a, _, _rx) = hosted();
        let (b, _, _rx2) = hosted();
        assert!(a.same(&a.clone()));
        assert!(!a.same(&b));
        a.kill();
        b.kill();
    }
}
