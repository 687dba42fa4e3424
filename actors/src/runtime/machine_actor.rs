//! Any [`Machine`] as a ractor actor (the async half of hosting; the synchronous half, shared with
//! the simulator, is [`crate::host`]). The coordinator, supervisor and checkpoint writer are hosted
//! so; a specialist attempt is hosted on a plain task with the same [`Role`] hooks
//! ([`crate::runtime::task_host`]).
//!
//! One actor per machine instance. Its mailbox carries the machine's inputs ([`Deliver`]); for each it
//! reads the wall clock (never backwards), lets the machine decide with its own ChaCha8 stream, and
//! hands the effects to the machine's [`Role`], which executes them (awaiting where it must) and may
//! ask the actor to stop. Completions of effects come back later as ordinary inputs through the same
//! mailbox, so a machine still sees one input at a time.

use crate::machine::Machine;
use crate::runtime::clock::{MonotonicMillis, OsEntropy};
use ractor::{Actor, ActorProcessingErr, ActorRef, SupervisionEvent};
use std::future::Future;
use tracing::Instrument;

/// One input of a hosted machine, as a ractor message.
///
/// # Delivery
/// Local cast (ractor's per-sender FIFO). Never crosses a node: remote messages are the cluster
/// issue's typed, versioned wire enums, translated into these at the receiving node.
#[derive(Debug)]
pub struct Deliver<I>(pub I);

// With ractor's `cluster` feature every message type opts in explicitly; these stay local (not
// serializable), which is the trait's default.
impl<I: Send + 'static> ractor::Message for Deliver<I> {}

/// The mailbox address of a hosted machine.
pub type MachineRef<M> = ActorRef<Deliver<<M as Machine>::Input>>;

/// What the actor does after executing one input's effects.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Flow {
    /// Keep running.
    Continue,
    /// Stop with this exit reason (reported to the supervising actor).
    Stop(String),
}

/// How one kind of machine is hosted: how its effects are executed and what its actor does around
/// them. Implemented by the runtime for the coordinator, supervisor, checkpoint and specialist.
pub trait Role: Send + Sync + Sized + 'static {
    /// The machine hosted.
    type M: Machine + Send + 'static;
    /// Per-actor host state (a running session's cancel switch, an unacknowledged result).
    type Local: Send + 'static;
    /// The machine's own address, as its hooks hand it to what feeds it later (timers, tool calls):
    /// a [`MachineRef`] under [`MachineActor`], an [`Inbox`](crate::runtime::Inbox) on a task.
    type Addr: Send + Sync + 'static;

    /// The tracing span every step of this machine runs in (its run's or its task's, see
    /// [`crate::runtime::spans`]); node-wide machines have none.
    fn span(&self) -> tracing::Span {
        tracing::Span::none()
    }

    /// Look at an input before the machine does (observers only; the machine still gets it).
    fn before(&self, _input: &<Self::M as Machine>::Input, _local: &mut Self::Local) {}

    /// Execute the effects of one input, in order.
    fn execute(
        &self,
        me: &Self::Addr,
        local: &mut Self::Local,
        effects: Vec<<Self::M as Machine>::Effect>,
    ) -> impl Future<Output = Flow> + Send;

    /// After the effects: whether the machine is finished with (e.g. its run is terminal).
    fn after(&self, _machine: &Self::M, _local: &mut Self::Local) -> Flow {
        Flow::Continue
    }

    /// The machine stopped by its role's [`Flow::Stop`] (not on a kill or a panic): release what
    /// `local` holds.
    fn stopped(&self, _me: &Self::Addr, _local: &mut Self::Local) {}

    /// The next input that `local` produces itself, between steps: a specialist's running session
    /// and its events. The task host ([`crate::runtime::task_host`]) awaits it beside its inbox,
    /// the inbox first, so a session's events reach the machine without a forwarding task and a
    /// second queue; it must be cancel safe (the host drops it whenever the inbox answers first).
    /// The inbox always goes first: an input queued there while a step ran (a pause's cancel, an
    /// acknowledgement) reaches the machine before session events that were already waiting, where
    /// the forwarding task it replaces gave about arrival order. Never ready by default, and never
    /// polled under [`MachineActor`].
    fn own_input<'a>(
        &'a self,
        _local: &'a mut Self::Local,
    ) -> impl Future<Output = <Self::M as Machine>::Input> + Send + 'a {
        std::future::pending()
    }
}

/// The ractor actor hosting one machine under a [`Role`].
pub struct MachineActor<R: Role> {
    role: R,
}

impl<R: Role> MachineActor<R> {
    /// A host for one machine instance.
    pub fn new(role: R) -> Self {
        Self { role }
    }
}

/// The state of a hosted machine's actor: the machine itself, its injected clock and stream, and the
/// role's local state.
pub struct MachineActorState<R: Role> {
    machine: R::M,
    clock: MonotonicMillis,
    rng: OsEntropy,
    pub(crate) local: R::Local,
}

impl<R: Role> MachineActorState<R> {
    /// The starting state.
    pub fn new(machine: R::M, rng: OsEntropy, local: R::Local) -> Self {
        Self {
            machine,
            clock: MonotonicMillis::default(),
            rng,
            local,
        }
    }
}

impl<M, R> Actor for MachineActor<R>
where
    M: Machine + Send + 'static,
    R: Role<M = M, Addr = MachineRef<M>>,
    <R::M as Machine>::Input: Send + 'static,
    <R::M as Machine>::Effect: Send + 'static,
{
    type Msg = Deliver<<R::M as Machine>::Input>;
    type State = MachineActorState<R>;
    type Arguments = MachineActorState<R>;

    async fn pre_start(
        &self,
        _myself: ActorRef<Self::Msg>,
        args: Self::Arguments,
    ) -> Result<Self::State, ActorProcessingErr> {
        Ok(args)
    }

    async fn handle(
        &self,
        myself: ActorRef<Self::Msg>,
        message: Self::Msg,
        state: &mut Self::State,
    ) -> Result<(), ActorProcessingErr> {
        if let Flow::Stop(reason) = step(&self.role, &myself, state, message.0).await {
            myself.stop(Some(reason));
        }
        Ok(())
    }

    async fn handle_supervisor_evt(
        &self,
        _myself: ActorRef<Self::Msg>,
        _event: SupervisionEvent,
        _state: &mut Self::State,
    ) -> Result<(), ActorProcessingErr> {
        // Overridden on purpose: ractor's default stops an actor when a linked child exits. These
        // actors link no children (specialists report their end as a message, see `task_host`).
        Ok(())
    }

    async fn post_stop(
        &self,
        myself: ActorRef<Self::Msg>,
        state: &mut Self::State,
    ) -> Result<(), ActorProcessingErr> {
        self.role.stopped(&myself, &mut state.local);
        Ok(())
    }
}

/// One input through a hosted machine, whichever host: the role looks first, the machine decides with
/// the host's clock (never backwards) and stream, the role executes the effects (in the machine's
/// span), then looks at the machine after them. The host stops the machine on [`Flow::Stop`].
pub(crate) async fn step<R: Role>(
    role: &R,
    me: &R::Addr,
    state: &mut MachineActorState<R>,
    input: <R::M as Machine>::Input,
) -> Flow {
    let span = role.span();
    let out = span.in_scope(|| {
        role.before(&input, &mut state.local);
        let now = state.clock.now();
        let mut out = Vec::new();
        state.machine.handle(input, now, &mut state.rng, &mut out);
        out
    });
    let flow = role
        .execute(me, &mut state.local, out)
        .instrument(span)
        .await;
    if flow == Flow::Continue {
        role.after(&state.machine, &mut state.local)
    } else {
        flow
    }
}
