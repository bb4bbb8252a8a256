//! The driver: one thread per node running the protocol over the transport.
//!
//! The thread runs [`async_io::block_on`] (async-io has its own reactor, so this works next
//! to any runtime). It owns the transport's receive loop, one [`Timer`] re-armed to the
//! endpoint's next deadline, and the command channel through which users' tasks wake it. It
//! never waits for users: it completes their futures directly (see [`crate::shared`]).

use std::future::Future;
use std::pin::{pin, Pin};
use std::sync::Arc;
use std::thread::{self, JoinHandle};
use std::time::Duration;

use async_channel::Receiver;
use async_io::Timer;
use conclave_lock_api::Datagram;
use futures::future::{select, Either};
use tracing::{debug, trace, warn};

use crate::shared::{Command, Inner};

/// How long the driver waits before receiving again after a transport error.
const RECV_BACKOFF: Duration = Duration::from_millis(10);

/// Starts the driver thread `conclave-<name>`; it joins the cluster at once.
///
/// `leave_bound` caps how long a shutdown waits for the leave to be confirmed and every
/// message acknowledged.
pub(crate) fn spawn(
    inner: Arc<Inner>,
    commands: Receiver<Command>,
    leave_bound: Duration,
) -> std::io::Result<JoinHandle<()>> {
    let name = format!("conclave-{}", inner.member.name());
    thread::Builder::new()
        .name(name)
        .spawn(move || async_io::block_on(run(inner, commands, leave_bound)))
}

/// What woke the driver.
enum Wake {
    Datagram(std::io::Result<Datagram>),
    Timer,
    Command(Option<Command>),
}

async fn run(inner: Arc<Inner>, commands: Receiver<Command>, leave_bound: Duration) {
    let transport = inner.transport.clone();
    let mut recv: Pin<Box<dyn Future<Output = std::io::Result<Datagram>> + Send + '_>> =
        transport.recv();
    let mut timer = Timer::never();
    let mut leaving_until: Option<std::time::Instant> = None;
    let mut input = Input::Join;
    loop {
        // One critical section per wake-up: feed the input, complete the waiters it answers,
        // collect the datagrams, re-arm the timer.
        let (effects, done) = {
            let mut shared = inner.lock();
            let now = inner.now();
            let mut effects = None;
            match std::mem::replace(&mut input, Input::Nothing) {
                Input::Join => shared.endpoint.join(now),
                Input::Datagram(bytes) => shared.endpoint.handle_datagram(now, &bytes),
                Input::Timer => shared.endpoint.handle_timeout(now),
                Input::Shutdown if leaving_until.is_none() => {
                    debug!(member = %inner.member, "shutting down: releasing locks, leaving");
                    leaving_until = Some(std::time::Instant::now() + leave_bound);
                    effects = Some(shared.close_locks(now));
                }
                Input::Shutdown | Input::Nothing => {}
            }
            let effects = match effects {
                Some(mut first) => {
                    first.merge(shared.settle(now));
                    first
                }
                None => shared.settle(now),
            };
            let done = leaving_until.is_some_and(|until| {
                shared.endpoint.is_drained() || std::time::Instant::now() >= until
            });
            shared.armed = shared.endpoint.poll_timeout();
            let deadline = shared
                .armed
                .map(|at| inner.to_std(at))
                .into_iter()
                .chain(leaving_until)
                .min();
            match deadline {
                Some(at) => timer.set_at(at),
                None => timer = Timer::never(),
            }
            (effects, done)
        };
        inner.flush(effects);
        if done {
            break;
        }
        let wake = {
            let command = pin!(commands.recv());
            match select(command, select(&mut recv, &mut timer)).await {
                Either::Left((command, _)) => Wake::Command(command.ok()),
                Either::Right((Either::Left((datagram, _)), _)) => Wake::Datagram(datagram),
                Either::Right((Either::Right(_), _)) => Wake::Timer,
            }
        };
        input = match wake {
            Wake::Datagram(Ok(datagram)) => {
                recv = transport.recv();
                trace!(from = %datagram.from, len = datagram.bytes.len(), "datagram");
                Input::Datagram(datagram.bytes)
            }
            Wake::Datagram(Err(error)) => {
                warn!(%error, "transport receive failed");
                Timer::after(RECV_BACKOFF).await;
                recv = transport.recv();
                Input::Nothing
            }
            Wake::Timer => Input::Timer,
            Wake::Command(Some(Command::Flush)) => Input::Nothing,
            Wake::Command(Some(Command::Send(send))) => {
                send.await;
                Input::Nothing
            }
            // The sender lives in `inner`, which this thread holds: `None` cannot happen, but
            // would mean the same as a shutdown.
            Wake::Command(Some(Command::Shutdown) | None) => Input::Shutdown,
        };
    }
    drop(recv);
    transport.close().await;
    inner.lock().close();
    inner.changed.notify(usize::MAX);
    debug!(member = %inner.member, "driver stopped");
}

/// What the driver feeds the endpoint at the top of its loop.
enum Input {
    Join,
    Datagram(Vec<u8>),
    Timer,
    Shutdown,
    Nothing,
}
