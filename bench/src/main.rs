//! The real-socket benchmark: lock latency and throughput between OS processes on loopback,
//! over the UDP or the TCP backend, printed as a table next to the floor measured in the same
//! run (a raw ping-pong between two processes over the same kind of socket). This machine is
//! shared and noisy: compare ratios within one run only.
//!
//! Run: `cargo run --release -p conclave-bench --bin bench -- udp` (or `tcp`, `seal`, `cache`,
//! `transfer`, `scale`, `redis` or `raft`; the `scale` mode is described in `scale.rs`, the
//! `redis` mode, Conclave beside a Redis lock, in `redis.rs`, the `raft` mode, the Raft engine
//! beside the group backend (and etcd), in `raft.rs`)
//!
//! `CONCLAVE_BENCH_SPIN_US=N` sets every member's `spin_wait` to N µs (default: the library's
//! default), to see the trade-off between spinning and sleeping on this machine.
//!
//! Figures:
//! - floor: round trip of a 100-byte message between two processes (p50, p99): a UDP
//!   datagram, or a length-prefixed message on a TCP connection with `TCP_NODELAY`;
//! - uncontended: `lock().await` from a member whose grantor is another process, the guard
//!   dropped (released without waiting) before the next lock: latency p50/p99, pairs per second,
//!   and the p50 as a ratio of the floor;
//! - contended: four member processes loop lock/unlock on one lock: handoffs per second, this
//!   process's acquire latency, and the CPU time per handoff of the four contending processes
//!   and of the grantor's process; then 16 tasks spread over those four processes (4 each)
//!   on one lock, and 8 tasks of this process on one lock whose grantor is elsewhere, with
//!   node-level caching off and on (see `contend.rs`);
//! - the floors of a contended lock (see `relay.rs`): the same four processes handing a
//!   turn over with raw sockets and no lock library, through a fifth process playing a central
//!   grantor (the relay) and straight from one to the next (the ring), and the contended
//!   handoff rate as a ratio of the relay's;
//! - failover: a lock held by the coordinator process, this process waiting; `kill -9` of the
//!   coordinator until this process is granted the lock.
//!
//! The `cache` mode measures node-level caching over UDP: a lock cached at this process
//! (lock+unlock p50, and the lock-protocol datagrams sent while doing it, counted by a wrapper
//! around the transport), and one lock bouncing between this process and another, with caching
//! off and on, in one run.
//!
//! The `transfer` mode measures `become_grantor` over UDP: lock+unlock (both awaited) of a
//! lock at this process while its grantor is another process, then after this process took
//! the grantor role: p50/p99 and the lock-protocol datagrams this process sent, and how long
//! the transfer took.
//!
//! The `seal` mode measures what the cluster key costs over UDP: lock+unlock (both awaited)
//! from this process, whose grantor is another process, in a cluster without a key and in one
//! with a key, in alternating rounds beside the floor; it prints both and their ratio.
//!
//! The `redis` mode measures each round twice, quiet and beside a child process spinning on
//! one core, and draws its figures as SVG charts (`docs/bench-redis-latency.svg`,
//! `docs/bench-redis-handoffs.svg`, and the same names ending in `-neighbour` for the spinning
//! neighbour; `CONCLAVE_BENCH_CHARTS=DIR` writes them elsewhere).
//!
//! Every child process is killed by its PID when the benchmark ends, also on error. Nothing
//! leaves the host: sockets on 127.0.0.1, multicast with TTL 0.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream, UdpSocket};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use conclave::tcp::TcpMesh;
use conclave::udp::{UdpConfig, UdpMulticast};
use conclave::{EndpointConfig, Node, NodeBuilder, NodeCacheConfig};

use crate::counting::{Counting, SendCounter};

mod chart;
mod contend;
mod counting;
mod neighbour;
mod raft;
mod redis;
mod relay;
mod scale;

type Error = Box<dyn std::error::Error>;

const PINGS: usize = 2_000;
const LOCKS: usize = 2_000;
/// Rounds of alternating floor and lock measurements.
const ROUNDS: usize = 20;
const CONTENDED_FOR: Duration = Duration::from_secs(3);

fn main() -> Result<(), Error> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match args.first().map(String::as_str) {
        Some("child") if args.get(1).is_some_and(|a| a == "scale") => scale::child(&args[2..]),
        Some("child") if args.get(1).is_some_and(|a| a == "raft") => raft::child(&args[2..]),
        Some("child") => child(&args[1..]),
        Some("scale") => scale::run(),
        None | Some("udp") => smol::block_on(parent(Mode::Udp)),
        Some("tcp") => smol::block_on(parent(Mode::Tcp)),
        Some("seal") => smol::block_on(seal()),
        Some("cache") => smol::block_on(cache()),
        Some("transfer") => smol::block_on(transfer()),
        Some("redis") => smol::block_on(redis::run()),
        Some("raft") => raft::run(),
        Some(other) => Err(format!(
            "unknown mode {other:?}; use `udp`, `tcp`, `seal`, `cache`, `transfer`, `scale`, `redis` or `raft`"
        )
        .into()),
    }
}

/// A child process, killed (by PID) and reaped when dropped.
struct Proc {
    child: Child,
    stdin: Option<ChildStdin>,
    stdout: BufReader<ChildStdout>,
}

impl Proc {
    fn spawn(args: &[&str]) -> Result<Self, Error> {
        let mut child = Command::new(std::env::current_exe()?)
            .arg("child")
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()?;
        let stdin = child.stdin.take();
        let stdout = BufReader::new(child.stdout.take().ok_or("no stdout")?);
        Ok(Self {
            child,
            stdin,
            stdout,
        })
    }

    /// The next line the child prints (it prints only a few, each promptly).
    fn line(&mut self) -> Result<String, Error> {
        let mut line = String::new();
        if self.stdout.read_line(&mut line)? == 0 {
            return Err("child exited".into());
        }
        Ok(line.trim().to_owned())
    }

    fn send(&mut self, line: &str) -> Result<(), Error> {
        let stdin = self.stdin.as_mut().ok_or("stdin closed")?;
        writeln!(stdin, "{line}")?;
        stdin.flush()?;
        Ok(())
    }

    fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        self.kill();
    }
}

/// Which backend the run measures.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Mode {
    Udp,
    Tcp,
}

/// How a member finds the cluster, as one command-line word: `udp:<discovery port>` or
/// `tcp:<seed>,<seed>...` (no seeds: it founds the cluster).
#[derive(Clone, Debug)]
enum Net {
    Udp(u16),
    Tcp(Vec<SocketAddr>),
}

impl Net {
    fn word(&self) -> String {
        match self {
            Net::Udp(port) => format!("udp:{port}"),
            Net::Tcp(seeds) => {
                let seeds: Vec<String> = seeds.iter().map(SocketAddr::to_string).collect();
                format!("tcp:{}", seeds.join(","))
            }
        }
    }

    fn parse(word: &str) -> Result<Self, Error> {
        if let Some(port) = word.strip_prefix("udp:") {
            return Ok(Net::Udp(port.parse()?));
        }
        let seeds = word.strip_prefix("tcp:").ok_or("bad network word")?;
        let seeds = seeds
            .split(',')
            .filter(|s| !s.is_empty())
            .map(str::parse)
            .collect::<Result<_, _>>()?;
        Ok(Net::Tcp(seeds))
    }
}

/// A UDP discovery port of this run alone.
fn port() -> u16 {
    30_000 + (std::process::id() % 20_000) as u16
}

/// The one-host timings; the one-hop handoff with `CONCLAVE_BENCH_HANDOFF=1` (`=0`: off),
/// inherited by the child processes.
fn endpoint_config() -> EndpointConfig {
    let mut config = EndpointConfig::local();
    if let Ok(v) = std::env::var("CONCLAVE_BENCH_HANDOFF") {
        config.locks.one_hop_handoff = v == "1";
    }
    config
}

async fn join(name: &str, net: &Net) -> Result<Node, Error> {
    join_counted(name, net, None).await
}

/// Joins over `net`; with `sent`, through a transport that counts the lock-protocol datagrams
/// (reliable data: not heartbeats, discovery or lone acknowledgements) it sends. The `cache`
/// mode switches node caching on with `CONCLAVE_BENCH_CACHE=1`.
async fn join_counted(name: &str, net: &Net, sent: Option<Arc<AtomicU64>>) -> Result<Node, Error> {
    let builder = Node::builder("bench").name(name);
    let builder = match (net, sent) {
        (Net::Udp(port), Some(sent)) => builder.transport(Counting {
            inner: UdpMulticast::bind(&UdpConfig {
                port: *port,
                ..UdpConfig::loopback()
            })?,
            counter: LockDatagrams(sent),
        }),
        (Net::Udp(port), None) => builder.transport(UdpMulticast::bind(&UdpConfig {
            port: *port,
            ..UdpConfig::loopback()
        })?),
        (Net::Tcp(seeds), _) => builder.transport(TcpMesh::loopback(seeds.iter().copied())?),
    };
    let builder = builder
        .config(endpoint_config())
        .founding(conclave::Founding::Alone);
    let builder = if std::env::var("CONCLAVE_BENCH_CACHE").is_ok_and(|v| v == "1") {
        builder.node_cache(NodeCacheConfig {
            enabled: true,
            delegate_reads: true,
            ..NodeCacheConfig::default()
        })
    } else {
        builder
    };
    let builder = spin_from_env(builder)?;
    // The `seal` mode gives its keyed members the key in the environment.
    Ok(builder.cluster_key_from_env().join().await?)
}

/// `spin_wait` from `CONCLAVE_BENCH_SPIN_US`, if set.
fn spin_from_env(builder: NodeBuilder) -> Result<NodeBuilder, Error> {
    Ok(match std::env::var("CONCLAVE_BENCH_SPIN_US") {
        Ok(us) => builder.spin_wait(Duration::from_micros(us.parse()?)),
        Err(_) => builder,
    })
}

/// The key of the `seal` mode's keyed cluster, as hex (a benchmark's key: never use a fixed
/// key in a deployment).
fn bench_key() -> String {
    "be".repeat(32)
}

/// The `seal` mode: lock+unlock without and with a cluster key, alternating rounds.
async fn seal() -> Result<(), Error> {
    println!("conclave bench, seal mode (UDP, loopback)");
    let mut pong = Proc::spawn(&["pong", "UDP"])?;
    let mut floor = Floor::connect(Mode::Udp, &mut pong)?;
    let plain_net = Net::Udp(port());
    let keyed_net = Net::Udp(port() + 1);
    let mut plain_coordinator = Proc::spawn(&["member", "coordinator", &plain_net.word()])?;
    expect(&mut plain_coordinator, "READY")?;
    std::env::set_var(conclave::seal::KEY_ENV, bench_key());
    let mut keyed_coordinator = Proc::spawn(&["member", "coordinator", &keyed_net.word()])?;
    expect(&mut keyed_coordinator, "READY")?;
    let keyed = join("bench", &keyed_net).await?;
    std::env::remove_var(conclave::seal::KEY_ENV);
    let plain = join("bench", &plain_net).await?;
    assert!(plain.keyring().is_none() && keyed.keyring().is_some());
    let plain_mutex = plain.mutex("pair")?;
    let keyed_mutex = keyed.mutex("pair")?;
    for _ in 0..100 {
        plain_mutex.lock().await?.unlock().await?;
        keyed_mutex.lock().await?.unlock().await?;
    }
    let (mut rtts, mut plain_pairs, mut keyed_pairs, mut ratios) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for _ in 0..ROUNDS {
        for _ in 0..PINGS / ROUNDS {
            rtts.push(floor.round_trip()?);
        }
        let mut round = [Vec::new(), Vec::new()];
        for _ in 0..LOCKS / ROUNDS {
            for (i, mutex) in [&plain_mutex, &keyed_mutex].into_iter().enumerate() {
                let t = Instant::now();
                mutex.lock().await?.unlock().await?;
                round[i].push(t.elapsed());
            }
        }
        for r in &mut round {
            r.sort();
        }
        ratios.push(
            percentile(&round[1], 0.5).as_secs_f64() / percentile(&round[0], 0.5).as_secs_f64(),
        );
        let [p, k] = round;
        plain_pairs.extend(p);
        keyed_pairs.extend(k);
    }
    let stats = keyed.seal_stats().unwrap_or_default();
    plain.leave().await;
    keyed.leave().await;
    for v in [&mut rtts, &mut plain_pairs, &mut keyed_pairs] {
        v.sort();
    }
    ratios.sort_by(f64::total_cmp);
    let floor = percentile(&rtts, 0.5);
    println!();
    println!("| figure | value |");
    println!("|---|---|");
    println!(
        "| floor: raw UDP ping-pong between two processes, p50 / p99 | {:.1} µs / {:.1} µs |",
        micros(floor),
        micros(percentile(&rtts, 0.99))
    );
    for (label, pairs) in [
        ("without a key", &plain_pairs),
        ("with a key", &keyed_pairs),
    ] {
        println!(
            "| lock+unlock {label} (grantor in another process), p50 / p99 | {:.1} µs / {:.1} µs ({:.2}x the floor) |",
            micros(percentile(pairs, 0.5)),
            micros(percentile(pairs, 0.99)),
            percentile(pairs, 0.5).as_secs_f64() / floor.as_secs_f64()
        );
    }
    println!(
        "| lock+unlock with a key / without, p50 | {:.3}x (median of {ROUNDS} alternating rounds: {:.3}x) |",
        percentile(&keyed_pairs, 0.5).as_secs_f64() / percentile(&plain_pairs, 0.5).as_secs_f64(),
        ratios[ratios.len() / 2]
    );
    println!(
        "| keyed member's seal counters | sealed {}, opened {}, dropped {} |",
        stats.sealed,
        stats.opened,
        stats.failed_authentication
            + stats.key_mismatch
            + stats.replayed
            + stats.stale_session
            + stats.foreign
    );
    Ok(())
}

/// The floor: a raw ping-pong between this process and a child, over the mode's socket kind.
enum Floor {
    Udp(UdpSocket, SocketAddr),
    Tcp(TcpStream),
}

impl Floor {
    fn connect(mode: Mode, pong: &mut Proc) -> Result<Self, Error> {
        let addr: SocketAddr = pong.line()?.parse()?;
        Ok(match mode {
            Mode::Udp => {
                let socket = UdpSocket::bind("127.0.0.1:0")?;
                socket.set_read_timeout(Some(Duration::from_secs(5)))?;
                Floor::Udp(socket, addr)
            }
            Mode::Tcp => {
                let stream = TcpStream::connect_timeout(&addr, Duration::from_secs(5))?;
                stream.set_nodelay(true)?;
                stream.set_read_timeout(Some(Duration::from_secs(5)))?;
                Floor::Tcp(stream)
            }
        })
    }

    /// One round trip of a 100-byte message.
    fn round_trip(&mut self) -> Result<Duration, Error> {
        let mut message = [7u8; 104];
        message[..4].copy_from_slice(&100u32.to_be_bytes());
        let start = Instant::now();
        match self {
            Floor::Udp(socket, to) => {
                let mut buf = [0u8; 256];
                socket.send_to(&message[4..], *to)?;
                socket.recv_from(&mut buf)?;
            }
            Floor::Tcp(stream) => {
                stream.write_all(&message)?;
                stream.read_exact(&mut message)?;
            }
        }
        Ok(start.elapsed())
    }
}

/// The load averages, as `uptime` prints them.
fn load() -> String {
    let avg = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    let fields: Vec<&str> = avg.split_whitespace().take(3).collect();
    format!("load average: {}", fields.join(", "))
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    let index = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted.get(index).copied().unwrap_or_default()
}

fn micros(d: Duration) -> f64 {
    d.as_secs_f64() * 1e6
}

async fn parent(mode: Mode) -> Result<(), Error> {
    let kind = format!("{mode:?}").to_uppercase();
    match mode {
        Mode::Udp => println!(
            "conclave bench, udp mode, loopback; discovery port {}",
            port()
        ),
        Mode::Tcp => println!("conclave bench, tcp mode, loopback"),
    }

    // The floor (a raw UDP ping-pong between two processes) and the uncontended lock (the
    // grantor is another process), measured in alternating rounds so that both see the same
    // machine: on a shared machine the floor alone drifts by several times between runs.
    let mut pong = Proc::spawn(&["pong", &kind])?;
    let mut floor = Floor::connect(mode, &mut pong)?;

    let (mut coordinator, net) = start_coordinator(mode)?;
    let node = join("bench", &net).await?;
    let mutex = node.mutex("uncontended")?;
    for _ in 0..100 {
        drop(mutex.lock().await?); // warm-up
    }

    let mut rtts = Vec::with_capacity(PINGS);
    let mut latencies = Vec::with_capacity(LOCKS);
    let mut ratios = Vec::with_capacity(ROUNDS);
    let mut round_medians = Vec::with_capacity(ROUNDS);
    let mut locking_time = Duration::ZERO;
    for _ in 0..ROUNDS {
        let mut round_rtts = Vec::with_capacity(PINGS / ROUNDS);
        for _ in 0..PINGS / ROUNDS {
            round_rtts.push(floor.round_trip()?);
        }
        let mut round_locks = Vec::with_capacity(LOCKS / ROUNDS);
        let start = Instant::now();
        for _ in 0..LOCKS / ROUNDS {
            let t = Instant::now();
            let guard = mutex.lock().await?;
            round_locks.push(t.elapsed());
            drop(guard);
        }
        locking_time += start.elapsed();
        round_rtts.sort();
        round_locks.sort();
        ratios.push(
            percentile(&round_locks, 0.5).as_secs_f64()
                / percentile(&round_rtts, 0.5).as_secs_f64(),
        );
        round_medians.push((percentile(&round_rtts, 0.5), percentile(&round_locks, 0.5)));
        rtts.extend(round_rtts);
        latencies.extend(round_locks);
    }
    drop(floor);
    drop(pong);
    rtts.sort();
    latencies.sort();
    ratios.sort_by(f64::total_cmp);
    let floor = percentile(&rtts, 0.5);
    let pairs_per_sec = latencies.len() as f64 / locking_time.as_secs_f64();

    // Contended: four processes (three children and this one) on one lock.
    let mut hammers = Vec::new();
    for i in 0..3 {
        let mut p = Proc::spawn(&[
            "hammer",
            &format!("h{i}"),
            &net.word(),
            &CONTENDED_FOR.as_millis().to_string(),
        ])?;
        expect(&mut p, "READY")?;
        hammers.push(p);
    }
    let hot = node.mutex("hot")?;
    let grantor_cpu = contend::child_cpu(&mut coordinator)?;
    let cpu_here = contend::cpu_time();
    for p in &mut hammers {
        p.send("go")?;
    }
    let mut contended = Vec::new();
    let start = Instant::now();
    while start.elapsed() < CONTENDED_FOR {
        let t = Instant::now();
        let guard = hot.lock().await?;
        contended.push(t.elapsed());
        drop(guard);
    }
    let mut handoffs = contended.len() as u64;
    let mut contenders_cpu = contend::cpu_time().saturating_sub(cpu_here);
    for p in &mut hammers {
        let (count, cpu) = contend::count_and_cpu(&p.line()?)?;
        handoffs += count;
        contenders_cpu += cpu;
    }
    let elapsed = start.elapsed().as_secs_f64();
    let grantor_cpu = contend::child_cpu(&mut coordinator)?.saturating_sub(grantor_cpu);
    let cpu_rows = contend::Cpu::per_handoff(contenders_cpu, grantor_cpu, handoffs);
    contended.sort();
    for p in &mut hammers {
        p.send("stop")?;
    }
    drop(hammers);
    let floors = relay::measure(mode)?;
    let spread = contend::spread(&net, &node).await?;
    let local = contend::local(&net, &node).await?;

    // Failover: the coordinator holds a lock; this process waits; kill -9 the coordinator.
    coordinator.send("hold failover")?;
    expect(&mut coordinator, "HELD")?;
    let waiting = node.mutex("failover")?;
    let mut wait = Box::pin(waiting.lock());
    assert!(
        futures::poll!(wait.as_mut()).is_pending(),
        "the coordinator holds it"
    );
    let killed = Instant::now();
    coordinator.kill();
    let guard = wait.await?;
    let failover = killed.elapsed();
    drop(guard);
    node.leave().await;

    println!();
    println!("| figure | value |");
    println!("|---|---|");
    println!(
        "| floor: raw {kind} ping-pong between two processes, p50 / p99 | {:.1} µs / {:.1} µs |",
        micros(floor),
        micros(percentile(&rtts, 0.99))
    );
    println!(
        "| uncontended lock (grantor in another process), p50 / p99 | {:.1} µs / {:.1} µs |",
        micros(percentile(&latencies, 0.5)),
        micros(percentile(&latencies, 0.99))
    );
    println!(
        "| uncontended lock p50 / floor p50 | {:.2}x (median of {ROUNDS} alternating rounds: {:.2}x) |",
        percentile(&latencies, 0.5).as_secs_f64() / floor.as_secs_f64(),
        ratios[ratios.len() / 2]
    );
    println!("| uncontended lock+release pairs per second | {pairs_per_sec:.0} |");
    let rounds: Vec<String> = round_medians
        .iter()
        .map(|(floor, lock)| format!("{:.0}/{:.0}", micros(*floor), micros(*lock)))
        .collect();
    println!(
        "| per round, floor p50 / lock p50 (µs) | {} |",
        rounds.join(" ")
    );
    println!(
        "| contended: handoffs per second, 4 processes on one lock | {:.0} |",
        handoffs as f64 / elapsed
    );
    println!(
        "| contended handoffs/s ÷ (1/RTT) | {:.2} (RTT: the floor p50) |",
        handoffs as f64 / elapsed * floor.as_secs_f64()
    );
    let rate = handoffs as f64 / elapsed;
    println!(
        "| raw relay: 4 processes through a fifth, no lock library: handoffs per second (÷ 1/RTT) | {:.0} ({:.2}) |",
        floors.relay,
        floors.relay * floor.as_secs_f64()
    );
    println!(
        "| raw relay: CPU per handoff, its 5 processes together | {:.1} µs |",
        floors.relay_cpu.as_secs_f64() * 1e6
    );
    println!(
        "| raw ring: 4 processes passing a token, no lock library: handoffs per second (÷ 1/RTT) | {:.0} ({:.2}) |",
        floors.ring,
        floors.ring * floor.as_secs_f64()
    );
    println!(
        "| contended handoffs/s ÷ raw relay | {:.2} |",
        rate / floors.relay
    );
    println!(
        "| contended acquire latency here, p50 / p99 | {:.1} µs / {:.1} µs |",
        micros(percentile(&contended, 0.5)),
        micros(percentile(&contended, 0.99))
    );
    cpu_rows.print();
    contend::print(&spread, &local, floor);
    println!("| failover: kill -9 of the coordinator to the next grant | {:.0} ms (suspect timeout of `EndpointConfig::local()`: 400 ms) |", failover.as_secs_f64() * 1e3);
    Ok(())
}

/// Starts a cluster's first member (its coordinator, and the grantor of its locks) in a child
/// process; returns it and how the others find the cluster (over TCP, it is their seed).
fn start_coordinator(mode: Mode) -> Result<(Proc, Net), Error> {
    let first = match mode {
        Mode::Udp => Net::Udp(port()),
        Mode::Tcp => Net::Tcp(Vec::new()),
    };
    let mut coordinator = Proc::spawn(&["member", "coordinator", &first.word()])?;
    let ready = coordinator.line()?;
    let net = match mode {
        Mode::Udp => first,
        Mode::Tcp => Net::Tcp(vec![ready
            .strip_prefix("READY ")
            .ok_or("no READY")?
            .parse()?]),
    };
    Ok((coordinator, net))
}

fn expect(p: &mut Proc, word: &str) -> Result<(), Error> {
    let line = p.line()?;
    if line.starts_with(word) {
        Ok(())
    } else {
        Err(format!("expected {word}, child said {line:?}").into())
    }
}

/// The roles of child processes.
fn child(args: &[String]) -> Result<(), Error> {
    let arg = |i: usize| args.get(i).map(String::as_str).ok_or("missing argument");
    match arg(0)? {
        "pong" if arg(1)? == "UDP" => {
            let socket = UdpSocket::bind("127.0.0.1:0")?;
            println!("{}", socket.local_addr()?);
            let mut buf = [0u8; 2048];
            loop {
                let (len, from) = socket.recv_from(&mut buf)?;
                socket.send_to(&buf[..len], from)?;
            }
        }
        "pong" => {
            let listener = TcpListener::bind("127.0.0.1:0")?;
            println!("{}", listener.local_addr()?);
            let (mut stream, _) = listener.accept()?;
            stream.set_nodelay(true)?;
            let mut message = [0u8; 104];
            loop {
                stream.read_exact(&mut message)?;
                stream.write_all(&message)?;
            }
        }
        "member" => smol::block_on(async {
            let node = join(arg(1)?, &Net::parse(arg(2)?)?).await?;
            println!("READY {}", node.member_id().addr());
            let mut held = Vec::new();
            for line in std::io::stdin().lock().lines() {
                let line = line?;
                if line == "cpu" {
                    println!("CPU {}", contend::cpu_time().as_micros());
                }
                if let Some(name) = line.strip_prefix("hold ") {
                    held.push(node.mutex(name)?.lock().await?);
                    println!("HELD");
                }
            }
            drop(held);
            node.leave().await;
            Ok(())
        }),
        "bouncer" => smol::block_on(async {
            let node = join(arg(1)?, &Net::parse(arg(2)?)?).await?;
            let run_for = Duration::from_millis(arg(3)?.parse()?);
            let ball = node.mutex("ball")?;
            println!("READY");
            let mut line = String::new();
            std::io::stdin().lock().read_line(&mut line)?;
            let start = Instant::now();
            let mut count = 0u64;
            while start.elapsed() < run_for {
                ball.lock().await?.unlock().await?;
                count += 1;
            }
            println!("COUNT {count}");
            node.leave().await;
            Ok(())
        }),
        // `hammer <name> <net> <ms>`: says READY, then loops lock/unlock on `hot` for every
        // line `go` (for `ms`) or `go <ms>`, printing `COUNT <n> CPU <µs>`; another line ends it.
        "hammer" => smol::block_on(async {
            let node = join(arg(1)?, &Net::parse(arg(2)?)?).await?;
            let default_run: u64 = arg(3)?.parse()?;
            let hot = node.mutex("hot")?;
            println!("READY");
            for line in std::io::stdin().lock().lines() {
                let run_for = match line?.as_str() {
                    "go" => default_run,
                    other => match other.strip_prefix("go ") {
                        Some(ms) => ms.parse()?,
                        None => break,
                    },
                };
                let run_for = Duration::from_millis(run_for);
                let start = Instant::now();
                let cpu = contend::cpu_time();
                let mut count = 0u64;
                while start.elapsed() < run_for {
                    drop(hot.lock().await?);
                    count += 1;
                }
                let cpu = contend::cpu_time().saturating_sub(cpu).as_micros();
                println!("COUNT {count} CPU {cpu}");
            }
            node.leave().await;
            Ok(())
        }),
        "redis-taker" => redis::taker(arg(1)?, arg(2)?),
        "spin" => neighbour::spin(arg(1)?),
        "tasks" => contend::child(args),
        "relay-grantor" => relay::grantor(arg(1)?, arg(2)?),
        "relay-taker" => relay::taker(arg(1)?, arg(2)?),
        "ring-member" => relay::ring_member(arg(1)?, arg(2)?),
        other => Err(format!("unknown child role {other:?}").into()),
    }
}

/// Counts the lock-protocol datagrams a member sends: reliable data, not heartbeats,
/// discovery or lone acknowledgements.
struct LockDatagrams(Arc<AtomicU64>);

impl SendCounter for LockDatagrams {
    fn count(&self, bytes: &[u8], discovery: bool) {
        if discovery {
            return;
        }
        let cluster = conclave::api::wire::ClusterId::from_name("bench");
        if let Ok(packet) = conclave::api::wire::decode_packet(cluster, bytes) {
            if matches!(
                packet.frame,
                conclave::api::wire::Frame::Data(_) | conclave::api::wire::Frame::Bundle(_)
            ) {
                self.0.fetch_add(1, Ordering::Relaxed);
            }
        }
    }
}

/// The `transfer` mode: lock+unlock here with the grantor in another process, then with the
/// grantor role moved here by `become_grantor`.
async fn transfer() -> Result<(), Error> {
    println!("conclave bench, transfer mode (UDP, loopback)");
    const PAIRS: usize = 20_000;
    let net = Net::Udp(port());
    let mut coordinator = Proc::spawn(&["member", "coordinator", &net.word()])?;
    expect(&mut coordinator, "READY")?;
    let sent = Arc::new(AtomicU64::new(0));
    let node = join_counted("bench", &net, Some(sent.clone())).await?;
    let mutex = node.mutex("hot")?;
    let mut rows = Vec::new();
    let mut took = Duration::ZERO;
    for moved in [false, true] {
        if moved {
            let t = Instant::now();
            node.become_grantor().await?;
            took = t.elapsed();
        }
        for _ in 0..100 {
            mutex.lock().await?.unlock().await?;
        }
        let before = sent.load(Ordering::Relaxed);
        let mut pairs = Vec::with_capacity(PAIRS);
        for _ in 0..PAIRS {
            let t = Instant::now();
            mutex.lock().await?.unlock().await?;
            pairs.push(t.elapsed());
        }
        let datagrams = sent.load(Ordering::Relaxed) - before;
        pairs.sort();
        rows.push((percentile(&pairs, 0.5), percentile(&pairs, 0.99), datagrams));
    }
    node.leave().await;
    drop(coordinator);
    println!();
    println!("| figure | grantor in another process | after `become_grantor` here |");
    println!("|---|---|---|");
    let (before, after) = (&rows[0], &rows[1]);
    println!(
        "| lock+unlock (both awaited), p50 / p99 | {:.2} µs / {:.2} µs | {:.2} µs / {:.2} µs |",
        micros(before.0),
        micros(before.1),
        micros(after.0),
        micros(after.1)
    );
    println!(
        "| lock-protocol datagrams sent for {PAIRS} pairs | {} | {} |",
        before.2, after.2
    );
    println!(
        "| `become_grantor` until this process served | | {:.2} ms |",
        took.as_secs_f64() * 1e3
    );
    Ok(())
}

/// The `cache` mode: a cached lock, and one lock bouncing between two processes with caching
/// off and on.
async fn cache() -> Result<(), Error> {
    println!("conclave bench, cache mode (UDP, loopback)");
    const PAIRS: usize = 20_000;
    const BOUNCE_FOR: Duration = Duration::from_secs(3);
    let mut rows = Vec::new();
    let mut bounce = [0f64; 2];
    let mut read_rows = Vec::new();
    for (i, cached) in [false, true].into_iter().enumerate() {
        let net = Net::Udp(port() + i as u16);
        std::env::set_var("CONCLAVE_BENCH_CACHE", if cached { "1" } else { "0" });
        let mut coordinator = Proc::spawn(&["member", "coordinator", &net.word()])?;
        expect(&mut coordinator, "READY")?;
        let sent = Arc::new(AtomicU64::new(0));
        let node = join_counted("bench", &net, Some(sent.clone())).await?;
        // A lock only this process takes.
        let mutex = node.mutex("mine")?;
        for _ in 0..100 {
            mutex.lock().await?.unlock().await?;
        }
        let before = sent.load(Ordering::Relaxed);
        let mut pairs = Vec::with_capacity(PAIRS);
        let mut locks = Vec::with_capacity(PAIRS);
        for _ in 0..PAIRS {
            let t = Instant::now();
            let guard = mutex.lock().await?;
            locks.push(t.elapsed());
            guard.unlock().await?;
            pairs.push(t.elapsed());
        }
        let datagrams = sent.load(Ordering::Relaxed) - before;
        pairs.sort();
        locks.sort();
        // A lock only this process reads: under a read delegation when caching is on.
        let rw = node.rw_lock("mine-to-read")?;
        for _ in 0..100 {
            rw.read().await?.unlock().await?;
        }
        let before_reads = sent.load(Ordering::Relaxed);
        let mut reads = Vec::with_capacity(PAIRS);
        for _ in 0..PAIRS {
            let t = Instant::now();
            let guard = rw.read().await?;
            reads.push(t.elapsed());
            guard.unlock().await?;
        }
        let read_datagrams = sent.load(Ordering::Relaxed) - before_reads;
        reads.sort();
        read_rows.push((percentile(&reads, 0.5), read_datagrams));
        rows.push((
            cached,
            percentile(&pairs, 0.5),
            percentile(&pairs, 0.99),
            datagrams,
            percentile(&locks, 0.5),
        ));
        // One lock bouncing between this process and a bouncer process.
        let mut bouncer = Proc::spawn(&[
            "bouncer",
            "bouncer",
            &net.word(),
            &BOUNCE_FOR.as_millis().to_string(),
        ])?;
        expect(&mut bouncer, "READY")?;
        let ball = node.mutex("ball")?;
        bouncer.send("go")?;
        let start = Instant::now();
        let mut count = 0u64;
        while start.elapsed() < BOUNCE_FOR {
            ball.lock().await?.unlock().await?;
            count += 1;
        }
        let line = bouncer.line()?;
        count += line
            .strip_prefix("COUNT ")
            .ok_or("bad count")?
            .parse::<u64>()?;
        bounce[i] = count as f64 / start.elapsed().as_secs_f64();
        node.leave().await;
        drop(bouncer);
        drop(coordinator);
    }
    std::env::remove_var("CONCLAVE_BENCH_CACHE");
    println!();
    println!("| figure | caching off | caching on |");
    println!("|---|---|---|");
    let (off, on) = (&rows[0], &rows[1]);
    println!(
        "| lock+unlock of a lock only this process takes (grantor elsewhere), p50 / p99 | {:.2} µs / {:.2} µs | {:.2} µs / {:.2} µs |",
        micros(off.1), micros(off.2), micros(on.1), micros(on.2)
    );
    println!(
        "| lock() alone of that lock, p50 | {:.2} µs | {:.2} µs |",
        micros(off.4),
        micros(on.4)
    );
    println!(
        "| lock-protocol datagrams sent for {PAIRS} lock+unlock pairs | {} | {} |",
        off.3, on.3
    );
    println!(
        "| read() alone of a lock only this process reads, p50 | {:.2} µs | {:.2} µs |",
        micros(read_rows[0].0),
        micros(read_rows[1].0)
    );
    println!(
        "| lock-protocol datagrams sent for {PAIRS} read+unlock pairs | {} | {} |",
        read_rows[0].1, read_rows[1].1
    );
    println!(
        "| one lock bouncing between two processes: acquisitions per second | {:.0} | {:.0} |",
        bounce[0], bounce[1]
    );
    println!(
        "| bouncing, caching on / off | | {:.2}x |",
        bounce[1] / bounce[0]
    );
    Ok(())
}
