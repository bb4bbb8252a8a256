//! The blocking receive (Unix): threads waiting in `recv_blocking` get frames from members that
//! connect while they wait, time out, are interrupted, keep the mesh's own deadlines, share a
//! burst with `try_recv` on other threads, take turns with the async `recv`, and carry whole
//! protocol endpoints. Every wait is bounded.

#![cfg(unix)]

mod common;

use std::collections::HashSet;
use std::future::Future;
use std::io::Write;
use std::net::{SocketAddr, TcpStream};
use std::pin::pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc};
use std::task::Context;
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use async_io::block_on;
use conclave_lock_api::{BlockingRecv, Datagram, MemberId, Transport};
use conclave_protocol::{Destination, Endpoint, EndpointConfig};
use conclave_tcp::{TcpConfig, TcpMesh};

use common::{eventually, frame, frames, hello, read_until_closed, run, within, Pump, LIMIT};

/// The mesh's blocking receive, as the node's driver finds it.
fn blocking(mesh: &TcpMesh) -> &dyn BlockingRecv {
    mesh.blocking()
        .expect("the TCP mesh has a blocking receive on Unix")
}

fn send(mesh: &TcpMesh, to: SocketAddr, bytes: &[u8]) {
    mesh.send_to(to, bytes).expect("send_to");
}

/// Runs `f` on a thread of its own and returns its result, or `None` if it takes longer than
/// `limit` (the thread is then left behind).
fn on_thread<T: Send + 'static>(
    limit: Duration,
    f: impl FnOnce() -> T + Send + 'static,
) -> Option<T> {
    let (tx, rx) = mpsc::channel();
    thread::spawn(move || {
        let _ = tx.send(f());
    });
    rx.recv_timeout(limit).ok()
}

/// Says when its thread ends, even by a panic.
struct Ended(mpsc::Sender<()>);

impl Drop for Ended {
    fn drop(&mut self) {
        let _ = self.0.send(());
    }
}

/// Waits (bounded) for a thread that says when it ends, then joins it.
fn join_within<T>(thread: JoinHandle<T>, ended: &mpsc::Receiver<()>, what: &str) -> T {
    ended
        .recv_timeout(LIMIT)
        .unwrap_or_else(|_| panic!("{what}: did not stop within {LIMIT:?}"));
    thread.join().expect(what)
}

/// A mesh driven as the node's driver does it: a thread blocked in `recv_blocking(None)`,
/// which drains what else is waiting with `try_recv`. Received datagrams come out of
/// [`Driven::recv`]; sends run on the caller's thread.
struct Driven {
    mesh: Arc<TcpMesh>,
    received: mpsc::Receiver<Datagram>,
    stop: Arc<AtomicBool>,
    ended: mpsc::Receiver<()>,
    thread: Option<JoinHandle<()>>,
}

impl Driven {
    fn new(mesh: TcpMesh) -> Self {
        let mesh = Arc::new(mesh);
        let stop = Arc::new(AtomicBool::new(false));
        let (tx, received) = mpsc::channel();
        let (ended_tx, ended) = mpsc::channel();
        let (started_tx, started) = mpsc::channel();
        let thread = {
            let (mesh, stop) = (Arc::clone(&mesh), Arc::clone(&stop));
            thread::spawn(move || {
                let _ended = Ended(ended_tx);
                let _ = started_tx.send(());
                let receiver = blocking(&mesh);
                while !stop.load(Ordering::SeqCst) {
                    match receiver.recv_blocking(None) {
                        Ok(Some(datagram)) => {
                            let _ = tx.send(datagram);
                            for _ in 0..32 {
                                match receiver.try_recv() {
                                    Ok(Some(datagram)) => {
                                        let _ = tx.send(datagram);
                                    }
                                    Ok(None) | Err(_) => break,
                                }
                            }
                        }
                        Ok(None) => {}
                        Err(_) => break,
                    }
                }
            })
        };
        started.recv_timeout(LIMIT).expect("driver thread started");
        Self {
            mesh,
            received,
            stop,
            ended,
            thread: Some(thread),
        }
    }

    fn loopback() -> Self {
        Self::new(TcpMesh::loopback([]).expect("bind"))
    }

    fn addr(&self) -> SocketAddr {
        self.mesh.local_addr()
    }

    fn send(&self, to: SocketAddr, bytes: &[u8]) {
        send(&self.mesh, to, bytes);
    }

    fn recv(&self, limit: Duration) -> Option<Datagram> {
        self.received.recv_timeout(limit).ok()
    }
}

impl Drop for Driven {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        blocking(&self.mesh).interrupt();
        if let Some(thread) = self.thread.take() {
            if self.ended.recv_timeout(LIMIT).is_err() && !thread::panicking() {
                panic!("driver thread did not stop after an interrupt");
            }
            let _ = thread.join();
        }
    }
}

#[test]
fn the_mesh_offers_a_blocking_receive() {
    let mesh = TcpMesh::loopback([]).unwrap();
    assert!(mesh.blocking().is_some());
}

#[test]
fn a_thread_blocked_in_recv_blocking_gets_a_frame_with_its_senders_address() {
    let a = Driven::loopback();
    let b = Driven::loopback();
    // `b`'s own thread is blocked too: the send must wake it to complete the connect and
    // write the frame.
    b.send(a.addr(), b"b to a");
    let got = a.recv(LIMIT).expect("a received");
    assert_eq!((got.from, &got.bytes[..]), (b.addr(), &b"b to a"[..]));

    // And back, on the connection `a` accepted while blocked.
    a.send(b.addr(), b"a to b");
    let got = b.recv(LIMIT).expect("b received");
    assert_eq!((got.from, &got.bytes[..]), (a.addr(), &b"a to b"[..]));

    // Frames too big for one write are queued and flushed by the blocked thread.
    let sizes = [0, 1, 65_535, 65_535, 65_535, 65_535, 3];
    for (i, size) in sizes.iter().enumerate() {
        b.send(a.addr(), &vec![i as u8; *size]);
    }
    for (i, size) in sizes.iter().enumerate() {
        let got = a.recv(LIMIT).expect("frame");
        assert_eq!((got.from, got.bytes.len()), (b.addr(), *size));
        assert!(
            got.bytes.iter().all(|byte| *byte == i as u8),
            "frame {i} in order"
        );
    }
    let (sa, sb) = (a.mesh.stats(), b.mesh.stats());
    assert_eq!((sa.connections, sb.connections), (1, 1), "{sa:?} {sb:?}");
    assert_eq!(sa.violations + sb.violations, 0);
}

#[test]
fn recv_blocking_with_nothing_to_receive_returns_none_after_its_timeout() {
    let a = TcpMesh::loopback([]).unwrap();
    let receiver = blocking(&a);
    for timeout in [Duration::from_millis(20), Duration::from_millis(35)] {
        let start = Instant::now();
        assert_eq!(receiver.recv_blocking(Some(timeout)).unwrap(), None);
        let waited = start.elapsed();
        assert!(
            waited >= timeout,
            "returned after {waited:?}, before {timeout:?}"
        );
        assert!(waited < LIMIT, "returned after {waited:?}");
    }
    assert_eq!(receiver.recv_blocking(Some(Duration::ZERO)).unwrap(), None);
    assert_eq!(receiver.try_recv().unwrap(), None);

    // Also with a member connected and idle.
    let b = Pump::loopback(&[]);
    b.send(a.local_addr(), b"hi");
    let got = on_thread(LIMIT, move || {
        let got = blocking(&a).recv_blocking(Some(LIMIT));
        (a, got)
    });
    let (a, got) = got.expect("recv_blocking returned within its timeout");
    assert_eq!(got.unwrap().expect("frame").bytes, b"hi");
    let start = Instant::now();
    assert_eq!(
        blocking(&a)
            .recv_blocking(Some(Duration::from_millis(20)))
            .unwrap(),
        None
    );
    assert!(start.elapsed() >= Duration::from_millis(20));
}

#[test]
fn interrupt_ends_a_blocked_receive_promptly() {
    let a = Arc::new(TcpMesh::loopback([]).unwrap());
    let (started_tx, started) = mpsc::channel();
    let (done_tx, done) = mpsc::channel();
    let receiver = Arc::clone(&a);
    thread::spawn(move || {
        let _ = started_tx.send(());
        let start = Instant::now();
        let got = blocking(&receiver).recv_blocking(None);
        let _ = done_tx.send((got.map_err(|e| e.kind()), start.elapsed()));
    });
    started.recv_timeout(LIMIT).expect("started");
    blocking(&a).interrupt();
    let (got, waited) = done
        .recv_timeout(Duration::from_secs(2))
        .expect("the interrupt ended recv_blocking(None)");
    assert_eq!(got, Ok(None));
    assert!(waited < Duration::from_secs(2));

    // With no receive in progress, the next one returns at once; the one after waits again.
    blocking(&a).interrupt();
    let mesh = Arc::clone(&a);
    let got = on_thread(Duration::from_secs(2), move || {
        blocking(&mesh).recv_blocking(None).map_err(|e| e.kind())
    });
    assert_eq!(got, Some(Ok(None)), "the earlier interrupt ended it");
    let start = Instant::now();
    assert_eq!(
        blocking(&a)
            .recv_blocking(Some(Duration::from_millis(20)))
            .unwrap(),
        None
    );
    assert!(
        start.elapsed() >= Duration::from_millis(20),
        "the interrupt was used up"
    );

    // Closing the mesh ends a blocked receive with an error.
    let mesh = Arc::clone(&a);
    let (started_tx, started) = mpsc::channel();
    let (done_tx, done) = mpsc::channel();
    thread::spawn(move || {
        let _ = started_tx.send(());
        let _ = done_tx.send(blocking(&mesh).recv_blocking(None).map_err(|e| e.kind()));
    });
    started.recv_timeout(LIMIT).expect("started");
    run(LIMIT, "close", a.close());
    assert_eq!(
        done.recv_timeout(LIMIT).expect("close ended recv_blocking"),
        Err(std::io::ErrorKind::NotConnected)
    );
}

#[test]
fn frames_reach_a_receiver_blocked_before_their_connections_existed() {
    let a = Driven::loopback();

    // A raw client, which nothing needs to drive: accepted while `a` is blocked.
    let claimed: SocketAddr = "127.0.0.1:9".parse().unwrap();
    let mut raw = TcpStream::connect(a.addr()).expect("connect");
    let mut bytes = hello(1, 7, claimed);
    bytes.extend_from_slice(&frame(b"raw"));
    raw.write_all(&bytes).expect("write");
    let got = a.recv(LIMIT).expect("the raw client's frame");
    assert_eq!((got.from, &got.bytes[..]), (claimed, &b"raw"[..]));

    // A member driven by the async receive, then one driven like `a`.
    let b = Pump::loopback(&[]);
    b.send(a.addr(), b"from b");
    let got = a.recv(LIMIT).expect("b's frame");
    assert_eq!((got.from, &got.bytes[..]), (b.addr(), &b"from b"[..]));
    let c = Driven::loopback();
    c.send(a.addr(), b"from c");
    let got = a.recv(LIMIT).expect("c's frame");
    assert_eq!((got.from, &got.bytes[..]), (c.addr(), &b"from c"[..]));

    // A frame in two writes: the blocked thread waits for the rest.
    let mut split = frame(b"in two parts");
    let rest = split.split_off(6);
    raw.write_all(&split).expect("write");
    assert!(a.recv(Duration::from_millis(50)).is_none(), "half a frame");
    raw.write_all(&rest).expect("write");
    assert_eq!(a.recv(LIMIT).expect("whole frame").bytes, b"in two parts");
    assert_eq!(a.mesh.stats().connections, 3);
}

/// What the driver relies on to drain a wake-up: after `recv_blocking` returns the first of
/// a burst, `try_recv_ready` returns the rest of it, in order, then nothing; and a frame it
/// does not report is still there for the next `recv_blocking`.
#[test]
fn try_recv_ready_drains_the_burst_a_wait_found() {
    let a = TcpMesh::loopback([]).unwrap();
    let claimed: SocketAddr = "127.0.0.1:9".parse().unwrap();
    let mut raw = TcpStream::connect(a.local_addr()).expect("connect");
    let mut bytes = hello(1, 7, claimed);
    for payload in [&b"one"[..], b"two", b"three"] {
        bytes.extend_from_slice(&frame(payload));
    }
    raw.write_all(&bytes).expect("write");
    let receiver = blocking(&a);
    let first = receiver
        .recv_blocking(Some(LIMIT))
        .unwrap()
        .expect("a frame");
    assert_eq!((first.from, &first.bytes[..]), (claimed, &b"one"[..]));
    for expected in [&b"two"[..], b"three"] {
        let got = receiver
            .try_recv_ready()
            .unwrap()
            .expect("the rest of the burst");
        assert_eq!((got.from, &got.bytes[..]), (claimed, expected));
    }
    assert_eq!(receiver.try_recv_ready().unwrap(), None);

    // A frame that arrives after the wait: whatever `try_recv_ready` says of it, it is not
    // lost, and it is not delivered twice.
    raw.write_all(&frame(b"later")).expect("write");
    let mut got = Vec::new();
    let deadline = Instant::now() + LIMIT;
    while got.is_empty() && Instant::now() < deadline {
        if let Some(d) = receiver.try_recv_ready().unwrap() {
            got.push(d.bytes);
        } else if let Some(d) = receiver.recv_blocking(Some(LIMIT)).unwrap() {
            got.push(d.bytes);
        }
    }
    assert_eq!(got, vec![b"later".to_vec()]);
    assert_eq!(receiver.try_recv_ready().unwrap(), None);
    assert_eq!(receiver.try_recv().unwrap(), None);
}

#[test]
fn the_meshs_deadlines_are_kept_while_its_thread_is_blocked() {
    // Nothing but the handshake timeout can end the silent connection: the blocked
    // `recv_blocking(None)` must wake for it.
    let a = Driven::new(
        TcpMesh::bind(&TcpConfig {
            handshake_timeout: Duration::from_millis(200),
            ..TcpConfig::loopback()
        })
        .expect("bind"),
    );
    let start = Instant::now();
    let mut silent = TcpStream::connect(a.addr()).expect("connect");
    let bytes = read_until_closed(&mut silent, LIMIT).expect("closed for want of a hello");
    assert!(start.elapsed() >= Duration::from_millis(200));
    assert_eq!(
        &frames(&bytes)[0][..5],
        b"CNCL\x01",
        "only our hello was sent"
    );
    assert!(eventually(LIMIT, || a.mesh.stats().handshake_failures == 1));
    assert_eq!(a.mesh.stats().connections, 0);
}

#[test]
fn try_recv_on_another_thread_shares_a_burst_with_the_blocked_receiver() {
    let a = Arc::new(TcpMesh::loopback([]).unwrap());
    let b = Driven::loopback();
    let stop = Arc::new(AtomicBool::new(false));
    let (tx, rx) = mpsc::channel::<(&'static str, Datagram)>();
    let (ended_tx, ended) = mpsc::channel();
    let spawn = |name: &'static str, blocks: bool| {
        let (a, stop, tx, ended_tx) = (
            Arc::clone(&a),
            Arc::clone(&stop),
            tx.clone(),
            ended_tx.clone(),
        );
        thread::spawn(move || {
            let _ended = Ended(ended_tx);
            let receiver = blocking(&a);
            while !stop.load(Ordering::SeqCst) {
                let got = if blocks {
                    receiver.recv_blocking(None)
                } else {
                    receiver.try_recv()
                };
                match got {
                    Ok(Some(datagram)) => {
                        let _ = tx.send((name, datagram));
                    }
                    Ok(None) if !blocks => thread::yield_now(),
                    Ok(None) => {}
                    Err(error) => panic!("{name}: {error}"),
                }
            }
        })
    };
    let threads = [spawn("recv_blocking", true), spawn("try_recv", false)];

    let count = 200;
    let expected: HashSet<Vec<u8>> = (0..count)
        .map(|i| format!("frame {i}").into_bytes())
        .collect();
    for i in 0..count {
        b.send(a.local_addr(), format!("frame {i}").as_bytes());
    }
    let mut seen = HashSet::new();
    let mut by = std::collections::HashMap::new();
    let deadline = Instant::now() + LIMIT;
    while seen.len() < count {
        let left = deadline.saturating_duration_since(Instant::now());
        let (name, got) = rx
            .recv_timeout(left)
            .unwrap_or_else(|_| panic!("{} of {count} frames arrived", seen.len()));
        assert_eq!(got.from, b.addr());
        assert!(
            seen.insert(got.bytes.clone()),
            "delivered twice: {:?}",
            String::from_utf8_lossy(&got.bytes)
        );
        *by.entry(name).or_insert(0) += 1;
    }
    assert_eq!(seen, expected);
    assert!(
        rx.recv_timeout(Duration::from_millis(50)).is_err(),
        "nothing more"
    );
    eprintln!("received by: {by:?}");

    stop.store(true, Ordering::SeqCst);
    blocking(&a).interrupt();
    for thread in threads {
        join_within(thread, &ended, "receiver thread");
    }
    assert_eq!(a.stats().frames_received, count as u64);
}

#[test]
fn async_and_blocking_receives_take_turns_on_one_mesh() {
    let a = TcpMesh::loopback([]).unwrap();
    let b = Pump::loopback(&[]);
    for round in 0..3 {
        // Async: the reactor is told about the connection ...
        b.send(a.local_addr(), format!("{round} async").as_bytes());
        let got = run(LIMIT, "recv", a.recv()).expect("recv");
        assert_eq!(got.bytes, format!("{round} async").as_bytes());
        // ... blocking: it is not, and the drain leaves the socket blocked unregistered ...
        b.send(a.local_addr(), format!("{round} blocking").as_bytes());
        let got = blocking(&a)
            .recv_blocking(Some(LIMIT))
            .expect("recv_blocking");
        assert_eq!(
            got.expect("frame").bytes,
            format!("{round} blocking").as_bytes()
        );
        assert_eq!(blocking(&a).try_recv().expect("try_recv"), None);
        // ... and async again, for a frame that arrives before and one after it waits.
        b.send(a.local_addr(), format!("{round} before").as_bytes());
        let got = run(LIMIT, "recv", a.recv()).expect("recv");
        assert_eq!(got.bytes, format!("{round} before").as_bytes());
        let mesh = &a;
        let got = block_on(async {
            let mut recv = pin!(within(LIMIT, mesh.recv()));
            // Let it register before the frame is sent.
            let mut cx = Context::from_waker(futures::task::noop_waker_ref());
            assert!(recv.as_mut().poll(&mut cx).is_pending());
            b.send(mesh.local_addr(), format!("{round} after").as_bytes());
            recv.await
        });
        let got = got.expect("async recv after a blocking one").expect("recv");
        assert_eq!(got.bytes, format!("{round} after").as_bytes());
    }
}

/// A protocol endpoint over a mesh, driven by a thread as the node's driver does in blocking
/// mode: `recv_blocking` until the endpoint's next deadline, then `try_recv` for the rest.
/// Reports on `formed` once its view has `size` members; returns the endpoint when `stop`.
fn drive_endpoint(
    mut endpoint: Endpoint,
    mesh: Arc<TcpMesh>,
    size: usize,
    origin: Instant,
    stop: Arc<AtomicBool>,
    formed: mpsc::Sender<()>,
    ended: mpsc::Sender<()>,
) -> JoinHandle<Endpoint> {
    thread::spawn(move || {
        let _ended = Ended(ended);
        let now = || conclave_protocol::Instant::from_duration(origin.elapsed());
        let receiver = blocking(&mesh);
        let mut reported = false;
        endpoint.join(now());
        while !stop.load(Ordering::SeqCst) {
            while let Some(t) = endpoint.poll_transmit() {
                let _ = match t.destination {
                    Destination::Member(addr) => mesh.send_to(addr, &t.bytes),
                    Destination::Discovery => mesh.send_discovery(&t.bytes),
                };
            }
            while endpoint.poll_event().is_some() {}
            if !reported && endpoint.view().is_some_and(|v| v.len() == size) {
                reported = true;
                let _ = formed.send(());
            }
            let timeout = endpoint
                .poll_timeout()
                .map(|at| at.saturating_duration_since(now()));
            match receiver.recv_blocking(timeout) {
                Ok(Some(datagram)) => {
                    endpoint.handle_datagram(now(), &datagram.bytes);
                    for _ in 0..32 {
                        match receiver.try_recv() {
                            Ok(Some(datagram)) => endpoint.handle_datagram(now(), &datagram.bytes),
                            Ok(None) | Err(_) => break,
                        }
                    }
                }
                Ok(None) => {}
                Err(error) => panic!("recv_blocking: {error}"),
            }
            endpoint.handle_timeout(now());
        }
        endpoint
    })
}

#[test]
fn endpoints_form_one_view_over_blocking_receives() {
    let origin = Instant::now();
    let stop = Arc::new(AtomicBool::new(false));
    let (formed_tx, formed) = mpsc::channel();
    let (ended_tx, ended) = mpsc::channel();
    let mut meshes = Vec::new();
    let mut threads = Vec::new();
    let mut seed = None;
    for (i, name) in ["a", "b"].into_iter().enumerate() {
        let mesh = Arc::new(TcpMesh::loopback(seed).expect("bind"));
        seed.get_or_insert(mesh.local_addr());
        let id = MemberId::new(
            (i as u128 + 1) << 64 | u128::from(std::process::id()),
            name,
            mesh.local_addr(),
        )
        .expect("valid member");
        let endpoint = Endpoint::new(
            "blocking",
            id,
            EndpointConfig::local(),
            mesh.max_datagram_size(),
        );
        threads.push(drive_endpoint(
            endpoint,
            Arc::clone(&mesh),
            2,
            origin,
            Arc::clone(&stop),
            formed_tx.clone(),
            ended_tx.clone(),
        ));
        meshes.push(mesh);
    }
    let limit = Duration::from_secs(20);
    let deadline = Instant::now() + limit;
    let mut both = true;
    for _ in 0..2 {
        let left = deadline.saturating_duration_since(Instant::now());
        both &= formed.recv_timeout(left).is_ok();
    }
    stop.store(true, Ordering::SeqCst);
    for mesh in &meshes {
        blocking(mesh).interrupt();
    }
    let endpoints: Vec<Endpoint> = threads
        .into_iter()
        .map(|thread| join_within(thread, &ended, "endpoint thread"))
        .collect();
    assert!(both, "both members saw a view of two within {limit:?}");
    let views: Vec<_> = endpoints
        .iter()
        .map(|e| e.view().expect("a view"))
        .collect();
    assert_eq!(views[0], views[1], "one view");
    assert_eq!(views[0].len(), 2);
    for mesh in &meshes {
        assert_eq!(mesh.stats().violations, 0);
        assert_eq!(mesh.stats().peers, 1, "{:?}", mesh.stats());
    }
}
