//! The driver: one thread per node running the protocol over the transport.
//!
//! The thread feeds the endpoint its inputs (datagrams, timer expiries, commands from users'
//! tasks) and sends what comes out. It never waits for users: it completes their futures
//! directly (see [`crate::shared`]). It waits in one of two ways:
//! - **blocked in the transport** ([`Transport::blocking`], the UDP backend): the kernel
//!   wakes this thread directly when a datagram arrives, as it would a plain blocking
//!   `recv_from`; deadlines are the receive's timeout, and commands interrupt it. No other
//!   thread is on the path from the socket to the protocol. While a task spinning for its
//!   answer holds the receive duty ([`crate::duty`]), the thread stands by (parked) instead.
//! - **in the async-io reactor** (every other transport): [`async_io::block_on`] over the
//!   transport's receive, one [`Timer`] re-armed to the endpoint's next deadline, and the
//!   command channel. async-io has its own reactor, so this works next to any runtime.
//!
//! [`Transport::blocking`]: conclave_lock_api::Transport::blocking

use std::future::Future;
use std::pin::{pin, Pin};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use async_channel::{Receiver, TryRecvError};
use async_io::Timer;
use conclave_lock_api::seal::Sealer;
use conclave_lock_api::{BlockingRecv, Datagram, Transport};
use futures::future::{select, Either};
use tracing::{debug, trace, warn};

use crate::shared::{Command, Inner};

/// How long the driver waits before receiving again after a transport error.
const RECV_BACKOFF: Duration = Duration::from_millis(10);

/// The most datagrams the driver takes in one go before it answers them (after the first of a
/// wake-up, which it answers alone).
const BATCH: usize = 32;

/// What the last wait of `transport` found besides the datagram it returned: at most
/// [`BATCH`] datagrams, oldest first.
fn ready_batch(transport: &dyn BlockingRecv) -> Vec<Vec<u8>> {
    let mut batch = Vec::new();
    while batch.len() < BATCH {
        match transport.try_recv_ready() {
            Ok(Some(datagram)) => batch.push(received(datagram)),
            Ok(None) | Err(_) => break,
        }
    }
    batch
}

/// Starts the driver thread `conclave-<name>`; it joins the cluster at once.
///
/// `leave_bound` caps how long a shutdown waits for the leave to be confirmed and every
/// message acknowledged.
pub(crate) fn spawn(
    inner: Arc<Inner>,
    commands: Receiver<Command>,
    leave_bound: Duration,
    sealer: Arc<Sealer>,
) -> std::io::Result<JoinHandle<()>> {
    // Only the metrics read the sealing layer's counters.
    #[cfg(not(feature = "metrics"))]
    drop(sealer);
    let name = format!("conclave-{}", inner.member.name());
    thread::Builder::new().name(name).spawn(move || {
        // Everything the node logs from its driver (the protocol's events included) carries
        // the member it happened on.
        let span = tracing::info_span!("conclave_node", member = %inner.member);
        let _entered = span.enter();
        inner.duty.set_driver(thread::current());
        let transport = inner.transport.clone();
        let mut driver = Driver {
            #[cfg(feature = "metrics")]
            metrics: crate::metrics::Publisher::new(inner.member.name(), sealer),
            inner,
            commands,
            leave_bound,
            deadline: None,
            leaving_until: None,
        };
        match transport.blocking() {
            Some(blocking) => driver.run_blocking(blocking),
            None => async_io::block_on(driver.run_in_reactor(&*transport)),
        }
        async_io::block_on(transport.close());
        driver.inner.lock().close();
        driver.inner.changed.notify(usize::MAX);
        debug!(member = %driver.inner.member, "driver stopped");
    })
}

/// What the driver feeds the endpoint at the top of its loop.
enum Input {
    Join,
    /// Every datagram that was waiting (at most [`BATCH`]), oldest first.
    Datagrams(Vec<Vec<u8>>),
    Timer,
    Shutdown,
    /// The transport is gone for good (see [`is_crash`]): stop at once, telling nobody.
    Crash,
    Nothing,
}

struct Driver {
    inner: Arc<Inner>,
    commands: Receiver<Command>,
    leave_bound: Duration,
    /// When the endpoint (or the leave bound) next needs the driver.
    deadline: Option<Instant>,
    leaving_until: Option<Instant>,
    /// When the counters go to the metrics recorder next.
    #[cfg(feature = "metrics")]
    metrics: crate::metrics::Publisher,
}

impl Driver {
    /// The loop over a blocking receive: until the node has left.
    fn run_blocking(&mut self, transport: &dyn BlockingRecv) {
        let mut input = Input::Join;
        // Whether datagrams the last wait found may still be waiting: they are taken
        // (`try_recv_ready`) before the next wait.
        let mut found_more = false;
        while !self.step(input) {
            input = match self.commands.try_recv() {
                Ok(command) => command_input(Some(command)),
                Err(TryRecvError::Closed) => command_input(None),
                Err(TryRecvError::Empty) => {
                    let now = Instant::now();
                    let lent = match self.leaving_until {
                        None => self.inner.duty.lent_until(now),
                        Some(_) => None,
                    };
                    match self.deadline {
                        Some(at) if at <= now => Input::Timer,
                        deadline if lent.is_some() => {
                            // A task spinning for its answer reads the transport: stand by
                            // without polling the sockets (see `crate::duty`).
                            let until = lent.unwrap_or(now);
                            let wake_at = deadline.map_or(until, |at| at.min(until));
                            thread::park_timeout(wake_at.saturating_duration_since(now));
                            Input::Nothing
                        }
                        deadline => {
                            Self::receive(transport, deadline.map(|at| at - now), &mut found_more)
                        }
                    }
                }
            };
        }
    }

    /// The next datagrams from `transport`: what its last wait found besides the datagram it
    /// returned, if `found_more`; else the next datagram, waiting up to `timeout` for it.
    /// That first datagram of a wake-up is answered alone, at once: it is most often the one
    /// somebody waits on (a release that the next holder's grant follows, a grant its task
    /// waits for), so what else arrived with it is read after that answer is out.
    fn receive(
        transport: &dyn BlockingRecv,
        timeout: Option<Duration>,
        found_more: &mut bool,
    ) -> Input {
        if std::mem::take(found_more) {
            let more = ready_batch(transport);
            if !more.is_empty() {
                *found_more = more.len() == BATCH;
                return Input::Datagrams(more);
            }
        }
        match transport.recv_blocking(timeout) {
            Ok(Some(datagram)) => {
                *found_more = true;
                Input::Datagrams(vec![received(datagram)])
            }
            Ok(None) => Input::Nothing,
            Err(error) if is_crash(&error) => Input::Crash,
            Err(error) => {
                warn!(%error, "transport receive failed");
                thread::sleep(RECV_BACKOFF);
                Input::Nothing
            }
        }
    }

    /// The loop on the async-io reactor: until the node has left.
    async fn run_in_reactor(&mut self, transport: &dyn Transport) {
        let mut recv: Pin<Box<dyn Future<Output = std::io::Result<Datagram>> + Send + '_>> =
            transport.recv();
        let mut timer = Timer::never();
        let mut input = Input::Join;
        while !self.step(input) {
            match self.deadline {
                Some(at) => timer.set_at(at),
                None => timer = Timer::never(),
            }
            let command = pin!(self.commands.recv());
            input = match select(command, select(&mut recv, &mut timer)).await {
                Either::Left((command, _)) => command_input(command.ok()),
                Either::Right((Either::Left((result, _)), _)) => {
                    recv = transport.recv();
                    match result {
                        Ok(datagram) => {
                            // Take what else is waiting without sleeping.
                            let mut batch = vec![received(datagram)];
                            let mut cx = Context::from_waker(futures::task::noop_waker_ref());
                            while batch.len() < BATCH {
                                match recv.as_mut().poll(&mut cx) {
                                    Poll::Ready(Ok(datagram)) => {
                                        batch.push(received(datagram));
                                        recv = transport.recv();
                                    }
                                    Poll::Ready(Err(_)) => {
                                        recv = transport.recv();
                                        break;
                                    }
                                    Poll::Pending => break,
                                }
                            }
                            Input::Datagrams(batch)
                        }
                        Err(error) if is_crash(&error) => Input::Crash,
                        Err(error) => {
                            warn!(%error, "transport receive failed");
                            Timer::after(RECV_BACKOFF).await;
                            Input::Nothing
                        }
                    }
                }
                Either::Right((Either::Right(_), _)) => Input::Timer,
            };
        }
    }

    /// One critical section per wake-up: feeds the input, completes the waiters it answers,
    /// collects the datagrams, computes the next deadline; then sends. Returns whether the
    /// driver is done.
    fn step(&mut self, input: Input) -> bool {
        if let Input::Crash = input {
            warn!(member = %self.inner.member, "the transport crashed; the node stops without leaving");
            return true;
        }
        let (effects, done) = {
            let mut shared = self.inner.lock();
            let now = self.inner.now();
            let mut effects = None;
            match input {
                Input::Join => shared.endpoint.join(now),
                Input::Datagrams(batch) => {
                    for bytes in batch {
                        shared.endpoint.handle_datagram(now, &bytes);
                    }
                }
                Input::Timer => shared.endpoint.handle_timeout(now),
                Input::Shutdown if self.leaving_until.is_none() => {
                    debug!(member = %self.inner.member, "shutting down: releasing locks, leaving");
                    self.leaving_until = Some(Instant::now() + self.leave_bound);
                    effects = Some(shared.close_locks(now));
                }
                Input::Shutdown | Input::Crash | Input::Nothing => {}
            }
            let effects = match effects {
                Some(mut first) => {
                    first.merge(shared.settle(now));
                    first
                }
                None => shared.settle(now),
            };
            let done = self
                .leaving_until
                .is_some_and(|until| shared.endpoint.is_drained() || Instant::now() >= until);
            #[cfg(feature = "metrics")]
            if self.metrics.due(done) {
                let gauges = crate::metrics::Gauges {
                    view_members: shared.view.as_ref().map_or(0, |v| v.members().len()),
                    held_locks: shared.endpoint.holds(now).len(),
                    pending_requests: shared.endpoint.locks().pending_requests().len(),
                };
                self.metrics.publish(&shared.endpoint.stats(), gauges);
            }
            shared.armed = shared.endpoint.poll_timeout();
            self.deadline = shared
                .armed
                .map(|at| self.inner.to_std(at))
                .into_iter()
                .chain(self.leaving_until)
                .min();
            (effects, done)
        };
        // This thread re-arms itself before it waits: no need to wake it.
        self.inner.flush(effects.without_driver_wake());
        done
    }
}

/// Whether a receive error means the transport is gone for good, as if the process had been
/// killed (`ConnectionAborted`, e.g. [`crate::memory::MemoryNetwork::crash`]): the node stops at
/// once, without leaving, releasing or calling its own handlers.
fn is_crash(error: &std::io::Error) -> bool {
    error.kind() == std::io::ErrorKind::ConnectionAborted
}

fn received(datagram: Datagram) -> Vec<u8> {
    trace!(from = %datagram.from, len = datagram.bytes.len(), "datagram");
    datagram.bytes
}

/// The input a command makes.
fn command_input(command: Option<Command>) -> Input {
    match command {
        Some(Command::Flush) => Input::Nothing,
        // The sender lives in `inner`, which this thread holds: `None` cannot happen, but
        // would mean the same as a shutdown.
        Some(Command::Shutdown) | None => Input::Shutdown,
    }
}
