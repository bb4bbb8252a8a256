//! The `scale` mode of the benchmark: clusters of 3, 8, 32 and 64 members on loopback, over
//! UDP and over the TCP mesh.
//!
//! The coordinator runs alone in the first process (it starts first, so it founds the
//! cluster); the other members are spread over up to four more processes, each member a
//! whole `Node` with its own driver thread and socket. Per size it prints:
//! - agreement: from the start of the last process until every member is in one view of all
//!   of them;
//! - failover: from `kill -9` of the coordinator's process until every survivor is in one view
//!   without it (the target is the suspect timeout, 400 ms here, plus 500 ms);
//! - idle traffic per member (every datagram or TCP frame sent, heartbeats included, counted
//!   by a wrapper around the transport), averaged over the members, and the coordinator's;
//! - uncontended `lock()` latency (p10, p50, p99) from a member in the last process, the lock
//!   then released and acknowledged before the next; measured in rounds that alternate with
//!   the same measurement in a reference cluster of 3 members running beside it, so both see
//!   the same background load, and printed as the ratios of the two p50s and of the two p10s.
//!   (A wait that is not answered within `spin_wait` pays a thread wake-up on top, so the p50
//!   of a round trip close to `spin_wait` jumps between two modes; the p10 shows the round
//!   trip itself. `CONCLAVE_BENCH_SPIN_US` sets `spin_wait` here as in the other modes.)
//!
//! `CONCLAVE_BENCH_SCALE_SIZES=3,64` picks the sizes, `CONCLAVE_BENCH_SCALE_NETS=tcp` the
//! backends (`udp`, `tcp` or both, the default).
//!
//! Every child process is killed by its PID when its size is done, also on error; every wait
//! in a child is bounded.

use std::io::BufRead;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use conclave::tcp::TcpMesh;
use conclave::udp::{UdpConfig, UdpMulticast};
use conclave::{EndpointConfig, Node};

use crate::counting::{Counting, SendCounter};
use crate::{port, Error, Net, Proc};

const SIZES: [usize; 4] = [3, 8, 32, 64];
/// Processes the members other than the coordinator are spread over, at most.
const PROCESSES: usize = 4;
const IDLE_FOR: Duration = Duration::from_secs(3);
/// Rounds of lock latency, alternating between the measured cluster and the reference cluster
/// of 3 members, and locks per round.
const ROUNDS: usize = 30;
const LOCKS: usize = 40;
/// Bound on every wait for a view in a child.
const VIEW_BOUND: Duration = Duration::from_secs(20);

/// One row of the table.
struct Row {
    members: usize,
    agreed: Duration,
    failover: Option<Duration>,
    datagrams: f64,
    bytes: f64,
    coordinator_datagrams: f64,
    max_other_datagrams: f64,
    p10: Duration,
    p50: Duration,
    p99: Duration,
    /// p10 and p50 of the reference cluster of 3 members in the same rounds.
    reference_p10: Duration,
    reference_p50: Duration,
}

/// A running cluster: the coordinator's process first.
struct Cluster {
    members: usize,
    first: Proc,
    procs: Vec<Proc>,
}

/// The parent: every size over UDP, then over TCP.
pub(crate) fn run() -> Result<(), Error> {
    println!("conclave bench, scale mode (loopback, EndpointConfig::local: heartbeats 50 ms, suspect timeout 400 ms)");
    let sizes: Vec<usize> = std::env::var("CONCLAVE_BENCH_SCALE_SIZES")
        .ok()
        .map(|s| s.split(',').filter_map(|n| n.trim().parse().ok()).collect())
        .unwrap_or_else(|| SIZES.to_vec());
    let nets = std::env::var("CONCLAVE_BENCH_SCALE_NETS").unwrap_or_default();
    for (b, backend) in ["udp", "tcp"].into_iter().enumerate() {
        if !nets.is_empty() && !nets.split(',').any(|n| n.trim() == backend) {
            continue;
        }
        let net = |i: usize| {
            if backend == "udp" {
                Net::Udp(port() + (b * 10 + i) as u16)
            } else {
                Net::Tcp(Vec::new())
            }
        };
        // The reference: 3 members whose lock latency is measured in the same rounds as each
        // size's, so both see the same background load of this shared machine.
        let mut reference = match start(3, &net(9)) {
            Ok((cluster, _)) => cluster,
            Err(e) => {
                println!("{backend}: the reference cluster failed: {e}");
                continue;
            }
        };
        let mut rows = Vec::new();
        for (i, &members) in sizes.iter().enumerate() {
            match size(members, &net(i), &mut reference) {
                Ok(row) => rows.push(row),
                Err(e) => println!("{backend}, {members} members: failed: {e}"),
            }
        }
        print_table(backend, &rows);
    }
    Ok(())
}

fn print_table(backend: &str, rows: &[Row]) {
    println!();
    println!("{backend}:");
    println!("| members | agreement after last start | kill -9 of the coordinator → new view | idle datagrams/s per member (avg; coordinator; others max) | idle bytes/s per member (avg) | uncontended lock p10 / p50 / p99 (non-coordinator) | p50 / p50 of 3 members in the same rounds | p10 / p10 of 3 members |");
    println!("|---|---|---|---|---|---|---|---|");
    for r in rows {
        let failover = r
            .failover
            .map_or("—".to_owned(), |d| format!("{} ms", d.as_millis()));
        println!(
            "| {} | {} ms | {failover} | {:.0}; {:.0}; {:.0} | {:.0} | {:.0} / {:.0} / {:.0} µs | {:.2}x | {:.2}x |",
            r.members,
            r.agreed.as_millis(),
            r.datagrams,
            r.coordinator_datagrams,
            r.max_other_datagrams,
            r.bytes,
            r.p10.as_secs_f64() * 1e6,
            r.p50.as_secs_f64() * 1e6,
            r.p99.as_secs_f64() * 1e6,
            r.p50.as_secs_f64() / r.reference_p50.as_secs_f64().max(1e-9),
            r.p10.as_secs_f64() / r.reference_p10.as_secs_f64().max(1e-9),
        );
    }
}

/// Starts a cluster of `members` and waits for one view of all of them; the time from the
/// start of the last process to that agreement.
fn start(members: usize, net: &Net) -> Result<(Cluster, Duration), Error> {
    let mut first = Proc::spawn(&["scale", &net.word(), "0", "1", &members.to_string()])?;
    let line = first.line()?;
    let addr = line
        .strip_prefix("JOINED ")
        .ok_or_else(|| format!("first process said {line:?}"))?
        .to_owned();
    let others_net = match net {
        Net::Udp(port) => Net::Udp(*port),
        Net::Tcp(_) => Net::Tcp(vec![addr.parse()?]),
    };
    let rest = members - 1;
    let count = PROCESSES.min(rest).max(1);
    let mut procs = Vec::new();
    let mut start = 1;
    let mut last_start = Instant::now();
    for p in 0..count {
        let n = rest / count + usize::from(p < rest % count);
        last_start = Instant::now();
        procs.push(Proc::spawn(&[
            "scale",
            &others_net.word(),
            &start.to_string(),
            &n.to_string(),
            &members.to_string(),
        ])?);
        start += n;
    }
    for p in &mut procs {
        let line = p.line()?;
        if !line.starts_with("JOINED") {
            return Err(format!("a process said {line:?}").into());
        }
    }
    let mut agreed = Duration::ZERO;
    for p in std::iter::once(&mut first).chain(procs.iter_mut()) {
        let line = p.line()?;
        if !line.starts_with("AGREED") || line.contains("timeout") {
            return Err(format!("no agreement: {line:?}").into());
        }
        agreed = agreed.max(last_start.elapsed());
    }
    Ok((
        Cluster {
            members,
            first,
            procs,
        },
        agreed,
    ))
}

/// `LOCKS` lock latencies from a member of the cluster's last process (never the coordinator).
fn latencies(cluster: &mut Cluster) -> Result<Vec<Duration>, Error> {
    let last = cluster.procs.last_mut().ok_or("no other process")?;
    last.send(&format!("lat {LOCKS}"))?;
    let line = last.line()?;
    let samples = line
        .strip_prefix("LAT ")
        .ok_or_else(|| format!("expected LAT, got {line:?}"))?
        .split(' ')
        .map(|n| n.parse().map(Duration::from_nanos))
        .collect::<Result<_, _>>()?;
    Ok(samples)
}

fn percentile(samples: &mut [Duration], p: f64) -> Duration {
    samples.sort();
    samples
        .get(((samples.len().max(1) - 1) as f64 * p) as usize)
        .copied()
        .unwrap_or_default()
}

fn size(members: usize, net: &Net, reference: &mut Cluster) -> Result<Row, Error> {
    let (mut cluster, agreed) = start(members, net)?;
    // Idle traffic, once startup's reliable traffic has settled.
    std::thread::sleep(Duration::from_secs(1));
    let idle = format!("idle {}", IDLE_FOR.as_millis());
    let Cluster { first, procs, .. } = &mut cluster;
    for p in std::iter::once(&mut *first).chain(procs.iter_mut()) {
        p.send(&idle)?;
    }
    let (mut datagrams, mut bytes, mut max_other, mut coordinator) = (0u64, 0u64, 0u64, 0u64);
    for (i, p) in std::iter::once(&mut *first)
        .chain(procs.iter_mut())
        .enumerate()
    {
        let line = p.line()?;
        let f: Vec<u64> = line
            .strip_prefix("IDLE ")
            .ok_or_else(|| format!("expected IDLE, got {line:?}"))?
            .split(' ')
            .map(str::parse)
            .collect::<Result<_, _>>()?;
        let [d, b, max] = f[..] else {
            return Err(format!("bad IDLE line {line:?}").into());
        };
        datagrams += d;
        bytes += b;
        if i == 0 {
            coordinator = max;
        } else {
            max_other = max_other.max(max);
        }
    }
    let secs = IDLE_FOR.as_secs_f64();
    let per = |v: u64| v as f64 / secs / members as f64;
    // Lock latency, in rounds alternating with the reference cluster.
    let (mut ours, mut theirs) = (Vec::new(), Vec::new());
    for _ in 0..ROUNDS {
        ours.extend(latencies(&mut cluster)?);
        theirs.extend(latencies(reference)?);
    }
    let failover = failover(&mut cluster)?;
    Ok(Row {
        members,
        agreed,
        failover,
        datagrams: per(datagrams),
        bytes: per(bytes),
        coordinator_datagrams: coordinator as f64 / secs,
        max_other_datagrams: max_other as f64 / secs,
        p10: percentile(&mut ours, 0.1),
        p50: percentile(&mut ours, 0.5),
        p99: percentile(&mut ours, 0.99),
        reference_p10: percentile(&mut theirs, 0.1),
        reference_p50: percentile(&mut theirs, 0.5),
    })
}

/// Kills the coordinator's process (`kill -9`) and waits until every survivor is in one view
/// without it.
fn failover(cluster: &mut Cluster) -> Result<Option<Duration>, Error> {
    if cluster.members < 3 {
        return Ok(None);
    }
    for p in &mut cluster.procs {
        p.send(&format!("watch {}", cluster.members - 1))?;
        super::expect(p, "WATCHING")?;
    }
    cluster.first.kill();
    let killed = Instant::now();
    let mut ok = true;
    for p in &mut cluster.procs {
        let line = p.line()?;
        ok &= line.starts_with("FAILOVER") && !line.contains("timeout");
    }
    Ok(ok.then(|| killed.elapsed()))
}

/// A child: `scale <net> <first index> <count> <cluster size>`.
pub(crate) fn child(args: &[String]) -> Result<(), Error> {
    let arg = |i: usize| args.get(i).map(String::as_str).ok_or("missing argument");
    let net = Net::parse(arg(0)?)?;
    let first: usize = arg(1)?.parse()?;
    let count: usize = arg(2)?.parse()?;
    let members: usize = arg(3)?.parse()?;
    let meters: Vec<Meter> = (0..count).map(|_| Meter::default()).collect();
    let nodes: Vec<Node> = std::thread::scope(|s| {
        let handles: Vec<_> = meters
            .iter()
            .enumerate()
            .map(|(i, meter)| {
                let net = net.clone();
                let meter = meter.clone();
                s.spawn(move || {
                    smol::block_on(join(&format!("s{}", first + i), &net, meter))
                        .map_err(|e| e.to_string())
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| match h.join() {
                Ok(Ok(node)) => Ok(node),
                Ok(Err(e)) => Err(Error::from(e)),
                Err(_) => Err(Error::from("a join panicked")),
            })
            .collect::<Result<Vec<Node>, Error>>()
    })?;
    println!("JOINED {}", nodes[0].member_id().addr());
    let at = wait_for_view(&nodes, members);
    match at {
        Some(epoch) => println!("AGREED {epoch}"),
        None => println!("AGREED timeout"),
    }
    for line in std::io::stdin().lock().lines() {
        let line = line?;
        let mut words = line.split(' ');
        match (words.next(), words.next().map(str::parse::<u64>)) {
            (Some("idle"), Some(Ok(ms))) => {
                let before: Vec<(u64, u64)> = meters.iter().map(Meter::read).collect();
                std::thread::sleep(Duration::from_millis(ms));
                let after: Vec<(u64, u64)> = meters.iter().map(Meter::read).collect();
                let deltas: Vec<(u64, u64)> = before
                    .iter()
                    .zip(&after)
                    .map(|(b, a)| (a.0 - b.0, a.1 - b.1))
                    .collect();
                let datagrams: u64 = deltas.iter().map(|d| d.0).sum();
                let bytes: u64 = deltas.iter().map(|d| d.1).sum();
                let max = deltas.iter().map(|d| d.0).max().unwrap_or(0);
                println!("IDLE {datagrams} {bytes} {max}");
            }
            (Some("lat"), Some(Ok(n))) => {
                let node = nodes.last().ok_or("no node")?;
                let mutex = node.mutex(format!("lat-{}", std::process::id()))?;
                let samples = smol::block_on(async {
                    let mut samples = Vec::new();
                    for _ in 0..n {
                        let start = Instant::now();
                        let guard = mutex.lock().await?;
                        samples.push(start.elapsed());
                        guard.unlock().await?;
                    }
                    Ok::<_, Error>(samples)
                })?;
                let samples: Vec<String> =
                    samples.iter().map(|d| d.as_nanos().to_string()).collect();
                println!("LAT {}", samples.join(" "));
            }
            (Some("watch"), Some(Ok(n))) => {
                println!("WATCHING");
                match wait_for_view(&nodes, n as usize) {
                    Some(epoch) => println!("FAILOVER {epoch}"),
                    None => println!("FAILOVER timeout"),
                }
            }
            _ => {}
        }
    }
    Ok(())
}

/// Waits (bounded) until every node is in one view of `members` members; its epoch.
fn wait_for_view(nodes: &[Node], members: usize) -> Option<u64> {
    let deadline = Instant::now() + VIEW_BOUND;
    while Instant::now() < deadline {
        let views: Vec<_> = nodes.iter().map(Node::view).collect();
        let epoch = views.first().and_then(|v| v.as_ref()).map(|v| v.epoch());
        if views.iter().all(|v| {
            v.as_ref()
                .is_some_and(|v| v.len() == members && Some(v.epoch()) == epoch)
        }) {
            return epoch;
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    None
}

async fn join(name: &str, net: &Net, meter: Meter) -> Result<Node, Error> {
    let builder = Node::builder("bench-scale")
        .name(name)
        .config(EndpointConfig::local())
        .founding(conclave::Founding::Alone)
        .join_timeout(Duration::from_secs(30));
    let builder = super::spin_from_env(builder)?;
    let builder = match net {
        Net::Udp(port) => builder.transport(Counting {
            inner: UdpMulticast::bind(&UdpConfig {
                port: *port,
                ..UdpConfig::loopback()
            })?,
            counter: meter,
        }),
        Net::Tcp(seeds) => builder.transport(Counting {
            inner: TcpMesh::loopback(seeds.iter().copied())?,
            counter: meter,
        }),
    };
    Ok(builder.join().await?)
}

/// Datagrams and bytes one member sent.
#[derive(Clone, Default)]
struct Meter(Arc<(AtomicU64, AtomicU64)>);

impl Meter {
    fn add(&self, bytes: usize) {
        self.0 .0.fetch_add(1, Ordering::Relaxed);
        self.0 .1.fetch_add(bytes as u64, Ordering::Relaxed);
    }

    fn read(&self) -> (u64, u64) {
        (
            self.0 .0.load(Ordering::Relaxed),
            self.0 .1.load(Ordering::Relaxed),
        )
    }
}

impl SendCounter for Meter {
    fn count(&self, bytes: &[u8], _discovery: bool) {
        self.add(bytes.len());
    }
}
