//! A transport wrapper that holds sends back for a delay plus a random jitter, on a timer
//! thread of its own, so datagrams arrive late and out of order. The kernel of the machines we
//! run on has no `sch_netem`, so the nemesis delays in the process: the `conclave-node`
//! command `net delay <ms> <jitter-ms>` switches it (`net delay 0 0` turns it off).

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::io;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, PoisonError};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use conclave::api::seal::Keyring;
use conclave::api::wire::ClusterId;
use conclave::api::{BlockingRecv, Datagram, DiscoveryReport, Transport};

use super::rng::Rng;

/// The most datagrams held back at once; more are dropped (as a full queue would).
const MAX_HELD: usize = 65_536;

/// Switches the delay of a [`Delayed`] transport from another thread.
#[derive(Clone, Debug, Default)]
pub struct DelayControl {
    /// Delay and jitter in microseconds, packed: delay in the high 32 bits.
    setting: Arc<AtomicU64>,
}

impl DelayControl {
    /// Sets the delay and the jitter (each up to about 71 minutes); zero and zero turn it off.
    pub fn set(&self, delay: Duration, jitter: Duration) {
        let delay = u64::try_from(delay.as_millis())
            .unwrap_or(u64::MAX)
            .min(0xffff_ffff);
        let jitter = u64::try_from(jitter.as_millis())
            .unwrap_or(u64::MAX)
            .min(0xffff_ffff);
        self.setting.store(delay << 32 | jitter, Ordering::Relaxed);
    }

    fn get(&self) -> (u64, u64) {
        let v = self.setting.load(Ordering::Relaxed);
        (v >> 32, v & 0xffff_ffff)
    }
}

/// A datagram waiting for its time.
#[derive(Debug, PartialEq, Eq, PartialOrd, Ord)]
struct Held {
    due: Instant,
    seq: u64,
    to: Option<SocketAddr>,
    bytes: Vec<u8>,
}

#[derive(Debug)]
struct Queue {
    heap: Mutex<(BinaryHeap<Reverse<Held>>, Rng, u64)>,
    wake: Condvar,
    closed: AtomicBool,
}

/// `T` with sends held back as its [`DelayControl`] says.
#[derive(Debug)]
pub struct Delayed<T: Transport> {
    inner: Arc<T>,
    control: DelayControl,
    queue: Arc<Queue>,
}

impl<T: Transport> Delayed<T> {
    /// Wraps `inner`, with no delay until `control` sets one; `seed` drives the jitter.
    ///
    /// # Errors
    /// The timer thread could not be started.
    pub fn new(inner: T, control: DelayControl, seed: u64) -> io::Result<Self> {
        let inner = Arc::new(inner);
        let queue = Arc::new(Queue {
            heap: Mutex::new((BinaryHeap::new(), Rng::new(seed), 0)),
            wake: Condvar::new(),
            closed: AtomicBool::new(false),
        });
        let (sender, held) = (Arc::clone(&inner), Arc::clone(&queue));
        std::thread::Builder::new()
            .name("delay".to_owned())
            .spawn(move || release_due(&*sender, &held))?;
        Ok(Self {
            inner,
            control,
            queue,
        })
    }

    fn send(&self, to: Option<SocketAddr>, bytes: &[u8]) -> io::Result<()> {
        let (delay, jitter) = self.control.get();
        if delay == 0 && jitter == 0 {
            return match to {
                Some(to) => self.inner.send_to(to, bytes),
                None => self.inner.send_discovery(bytes),
            };
        }
        if bytes.len() > self.inner.max_datagram_size() {
            return Err(io::Error::from(io::ErrorKind::InvalidInput));
        }
        let mut guard = self
            .queue
            .heap
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let (heap, rng, seq) = &mut *guard;
        if heap.len() >= MAX_HELD {
            return Err(io::Error::from(io::ErrorKind::WouldBlock));
        }
        let wait = delay + rng.range(0, jitter);
        *seq += 1;
        heap.push(Reverse(Held {
            due: Instant::now() + Duration::from_millis(wait),
            seq: *seq,
            to,
            bytes: bytes.to_vec(),
        }));
        drop(guard);
        self.queue.wake.notify_one();
        Ok(())
    }
}

impl<T: Transport> Drop for Delayed<T> {
    fn drop(&mut self) {
        self.queue.closed.store(true, Ordering::Relaxed);
        self.queue.wake.notify_one();
    }
}

/// The timer thread: sends each held datagram when it is due, until the wrapper is dropped.
fn release_due<T: Transport>(inner: &T, queue: &Queue) {
    let mut guard = queue.heap.lock().unwrap_or_else(PoisonError::into_inner);
    while !queue.closed.load(Ordering::Relaxed) {
        let now = Instant::now();
        let wait = match guard.0.peek() {
            Some(Reverse(first)) if first.due <= now => {
                if let Some(Reverse(held)) = guard.0.pop() {
                    drop(guard);
                    // The send contract: a failure is a lost datagram, the protocol retransmits.
                    let _ = match held.to {
                        Some(to) => inner.send_to(to, &held.bytes),
                        None => inner.send_discovery(&held.bytes),
                    };
                    guard = queue.heap.lock().unwrap_or_else(PoisonError::into_inner);
                }
                continue;
            }
            Some(Reverse(first)) => first.due - now,
            None => Duration::from_millis(100),
        };
        guard = queue
            .wake
            .wait_timeout(guard, wait)
            .unwrap_or_else(PoisonError::into_inner)
            .0;
    }
}

#[async_trait]
impl<T: Transport> Transport for Delayed<T> {
    fn local_addr(&self) -> SocketAddr {
        self.inner.local_addr()
    }

    fn max_datagram_size(&self) -> usize {
        self.inner.max_datagram_size()
    }

    fn send_to(&self, to: SocketAddr, bytes: &[u8]) -> io::Result<()> {
        self.send(Some(to), bytes)
    }

    fn send_discovery(&self, bytes: &[u8]) -> io::Result<()> {
        self.send(None, bytes)
    }

    async fn recv(&self) -> io::Result<Datagram> {
        self.inner.recv().await
    }

    fn blocking(&self) -> Option<&dyn BlockingRecv> {
        self.inner.blocking()
    }

    async fn close(&self) {
        self.inner.close().await;
    }

    fn discovery_report(&self) -> Vec<DiscoveryReport> {
        self.inner.discovery_report()
    }

    fn use_keyring(&self, cluster: ClusterId, keys: &Keyring, session: [u8; 16]) {
        self.inner.use_keyring(cluster, keys, session);
    }
}
