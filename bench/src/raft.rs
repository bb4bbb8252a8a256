//! The `raft` mode: Conclave's Raft engine (`conclave::raft`) beside the group backend, and
//! beside etcd when `etcd` is on `PATH` (Debian: `apt-get install etcd-server`), on loopback.
//!
//! Every cluster has three members, each a process of its own on a TCP mesh on 127.0.0.1:
//! - the group backend (`PartitionPolicy::Majority { cluster_size: 3 }`, `EndpointConfig::local()`):
//!   a coordinator process (the grantor), another member process, and this process;
//! - the Raft engine, three times, with the data directories of its members on a real disk
//!   (under the build's `target/`, `CONCLAVE_BENCH_DISK_DIR` elsewhere) with `sync: true`, on
//!   tmpfs (`/dev/shm`, `CONCLAVE_BENCH_TMPFS_DIR` elsewhere) with `sync: true`, and on the disk
//!   with `sync: false`: two member processes (`r1`, made the leader, and `r2`) and this process
//!   (`r0`, a follower); the default `RaftConfig` timings (20 ms ticks, elections after
//!   300-600 ms), but no snapshots (`snapshot_every` 10^9: the engine panics when it takes a
//!   snapshot at the last index of its log, which a steady stream of requests reaches; see
//!   `docs/benchmarks.md`, "The Raft engine");
//! - etcd (if installed), with its data directories on the disk and on tmpfs: three `etcd`
//!   processes, and its lock service (`v3lock`, the lock `etcdctl lock` uses, run in the
//!   server) called through etcd's HTTP/JSON gateway by a small blocking client on a kept-alive
//!   connection (`POST /v3/lock/lock` waits in the server until granted, no polling).
//!
//! Measured in [`ROUNDS`] alternating rounds, in one run, beside the floor of the same run (a
//! raw TCP ping-pong between two processes, `TCP_NODELAY`):
//! - uncontended: lock, then unlock, the unlock awaited, on a lock nobody else takes, from a
//!   member that is not the leader (the grantor) and from the leader's (grantor's) process:
//!   p50 / p90 / p99, and the p50 as a ratio of the floor's;
//! - contended: the three members' processes (three etcd clients, one per etcd member) each
//!   loop lock + awaited unlock on one lock for [`ROUND`]: handoffs per second.
//!
//! Then the recovery of a Raft cluster of three child processes after `kill -9` of all three:
//! a log of [`FILL_PAIRS`] lock/unlock pairs written (or none), every member killed, all three
//! restarted at once; the time from the restart until all three joined (`join()` returned)
//! and until a lock asked of every member at the restart is first granted, [`RESTARTS`] times
//! each: without snapshots (the whole log replayed), and with the default `snapshot_every`
//! (10,000 entries, so that the state comes from a snapshot). A writing that dies at a
//! snapshot (the engine's panic, `docs/benchmarks.md`) is reported, and the members are
//! killed and restarted all the same: they recover from that snapshot.
//!
//! Every loop is bounded in count and time, every child process (the members, the `etcd`
//! servers) is killed by its PID when the run ends, also on error, and the data directories
//! are removed.

use std::future::Future;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, TryRecvError};
use std::time::{Duration, Instant};

use conclave::raft::{RaftConfig, RaftPeer};
use conclave::tcp::{TcpConfig, TcpMesh};
use conclave::{DistributedMutex, EndpointConfig, Founding, Node, PartitionPolicy};

use super::{load, micros, percentile, Error, Floor, Mode, Proc};

/// Alternating rounds of every measurement (`CONCLAVE_BENCH_RAFT_ROUNDS` to change).
const ROUNDS: usize = 5;
/// Uncontended samples per round, system and member...
const SAMPLES: usize = 200;
/// ...taken within this long at most.
const SAMPLE_BUDGET: Duration = Duration::from_secs(5);
/// One contended measurement.
const ROUND: Duration = Duration::from_secs(2);
/// No answer (of a child, a lock, an etcd request) waits longer.
const PATIENCE: Duration = Duration::from_secs(30);
/// Lock/unlock pairs written before a full-cluster restart (`CONCLAVE_BENCH_RAFT_PAIRS` to
/// change).
const FILL_PAIRS: usize = 10_000;
/// Concurrent tasks (each on a lock of its own) writing them.
const FILL_TASKS: usize = 8;
/// The longest the writing may take.
const FILL_BUDGET: Duration = Duration::from_secs(300);
/// Full-cluster restarts of each recovery case.
const RESTARTS: usize = 3;
/// A child process exits by itself after this long, whatever happens to this one.
const CHILD_LIFETIME: Duration = Duration::from_secs(30 * 60);
/// `snapshot_every` high enough that no snapshot is taken.
const NO_SNAPSHOTS: u64 = 1_000_000_000;
/// The default `snapshot_every` (`RaftConfig::new`).
const DEFAULT_SNAPSHOTS: u64 = 10_000;
/// Lease of an etcd client's locks: longer than the run.
const ETCD_LEASE_TTL: u64 = 3_600;

/// Where a Raft member keeps its data directory, and whether it syncs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Storage {
    Disk,
    Tmpfs,
    DiskUnsynced,
}

impl Storage {
    fn word(self) -> &'static str {
        match self {
            Storage::Disk => "disk",
            Storage::Tmpfs => "tmpfs",
            Storage::DiskUnsynced => "disk-nosync",
        }
    }

    fn sync(self) -> bool {
        self != Storage::DiskUnsynced
    }

    fn label(self) -> &'static str {
        match self {
            Storage::Disk => "Conclave Raft, disk, `sync: true`",
            Storage::Tmpfs => "Conclave Raft, tmpfs, `sync: true`",
            Storage::DiskUnsynced => "Conclave Raft, disk, `sync: false`",
        }
    }
}

/// The run's scratch directories (one on the disk, one on tmpfs), removed when dropped.
struct Scratch {
    disk: PathBuf,
    tmpfs: PathBuf,
}

impl Scratch {
    fn create() -> Result<Self, Error> {
        let run = format!("conclave-raft-bench-{}", std::process::id());
        let disk = match std::env::var_os("CONCLAVE_BENCH_DISK_DIR") {
            Some(dir) => PathBuf::from(dir),
            // target/release/bench: target/ is on the repository's file system.
            None => std::env::current_exe()?
                .parent()
                .and_then(Path::parent)
                .ok_or("no target directory")?
                .to_path_buf(),
        }
        .join(&run);
        let tmpfs = PathBuf::from(
            std::env::var_os("CONCLAVE_BENCH_TMPFS_DIR").unwrap_or_else(|| "/dev/shm".into()),
        )
        .join(&run);
        std::fs::create_dir_all(&disk)?;
        std::fs::create_dir_all(&tmpfs)?;
        Ok(Self { disk, tmpfs })
    }

    fn root(&self, storage: Storage) -> &Path {
        match storage {
            Storage::Tmpfs => &self.tmpfs,
            Storage::Disk | Storage::DiskUnsynced => &self.disk,
        }
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.disk);
        let _ = std::fs::remove_dir_all(&self.tmpfs);
    }
}

/// The file system type of the mount holding `path` (from `/proc/mounts`).
fn fs_type(path: &Path) -> String {
    let Ok(mounts) = std::fs::read_to_string("/proc/mounts") else {
        return "?".into();
    };
    let path = path.canonicalize().unwrap_or_else(|_| path.to_path_buf());
    mounts
        .lines()
        .filter_map(|line| {
            let mut fields = line.split_whitespace();
            let (_, point, kind) = (fields.next()?, fields.next()?, fields.next()?);
            path.starts_with(point)
                .then(|| (point.len(), kind.to_owned()))
        })
        .max()
        .map_or_else(|| "?".into(), |(_, kind)| kind)
}

/// Waits for `future` at most `limit`.
async fn within<T, E: Into<Error>>(
    limit: Duration,
    future: impl Future<Output = Result<T, E>>,
) -> Result<T, Error> {
    let timeout = async {
        async_io::Timer::after(limit).await;
    };
    futures::pin_mut!(future, timeout);
    match futures::future::select(future, timeout).await {
        futures::future::Either::Left((result, _)) => result.map_err(Into::into),
        futures::future::Either::Right(((), _)) => {
            Err(format!("no answer within {limit:?}").into())
        }
    }
}

/// Lock, then unlock, the unlock awaited.
async fn pair(mutex: &DistributedMutex) -> Result<(), Error> {
    let guard = within(PATIENCE, mutex.lock()).await?;
    within(PATIENCE, guard.unlock()).await
}

/// Up to `count` timed pairs within `budget`.
async fn timed_pairs(
    mutex: &DistributedMutex,
    count: usize,
    budget: Duration,
    out: &mut Vec<Duration>,
) -> Result<(), Error> {
    let start = Instant::now();
    for _ in 0..count {
        if start.elapsed() > budget {
            break;
        }
        let t = Instant::now();
        pair(mutex).await?;
        out.push(t.elapsed());
    }
    Ok(())
}

/// Pairs in a loop for `run_for`: how many.
async fn hammer(mutex: &DistributedMutex, run_for: Duration) -> Result<u64, Error> {
    let start = Instant::now();
    let mut count = 0;
    while start.elapsed() < run_for {
        pair(mutex).await?;
        count += 1;
    }
    Ok(count)
}

// ---------------------------------------------------------------------------------------
// Child processes.

/// A child process (a member of this program, or an `etcd` server), killed by its PID and
/// reaped when dropped. Its stdout, when piped, is read by a thread into a channel, so that
/// every wait for a line is bounded.
struct Kid {
    name: String,
    child: Child,
    stdin: Option<ChildStdin>,
    lines: Option<Receiver<String>>,
}

impl Kid {
    /// A child of this program: `bench child raft <args>`.
    fn member(name: &str, args: &[&str]) -> Result<Self, Error> {
        let mut command = Command::new(std::env::current_exe()?);
        command.args(["child", "raft"]).args(args);
        Self::start(name, command, true)
    }

    fn start(name: &str, mut command: Command, piped: bool) -> Result<Self, Error> {
        if piped {
            command.stdin(Stdio::piped()).stdout(Stdio::piped());
        } else {
            command
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::null());
        }
        let mut child = command
            .spawn()
            .map_err(|e| format!("cannot start {name}: {e}"))?;
        let stdin = child.stdin.take();
        let lines = match child.stdout.take() {
            Some(stdout) => {
                let (sender, lines) = mpsc::channel();
                std::thread::spawn(move || {
                    for line in BufReader::new(stdout).lines() {
                        let Ok(line) = line else { return };
                        if sender.send(line).is_err() {
                            return;
                        }
                    }
                });
                Some(lines)
            }
            None => None,
        };
        Ok(Self {
            name: name.to_owned(),
            child,
            stdin,
            lines,
        })
    }

    fn send(&mut self, line: &str) -> Result<(), Error> {
        let stdin = self.stdin.as_mut().ok_or("no stdin")?;
        writeln!(stdin, "{line}")?;
        stdin.flush()?;
        Ok(())
    }

    /// The next line, which must start with `prefix`, within `limit`.
    fn expect_within(&mut self, prefix: &str, limit: Duration) -> Result<String, Error> {
        let lines = self.lines.as_ref().ok_or("no stdout")?;
        let line = match lines.recv_timeout(limit) {
            Ok(line) => line,
            Err(RecvTimeoutError::Timeout) => {
                return Err(format!("{}: no {prefix:?} within {limit:?}", self.name).into())
            }
            Err(RecvTimeoutError::Disconnected) => {
                return Err(format!("{}: exited before {prefix:?}", self.name).into())
            }
        };
        if line.starts_with(prefix) {
            Ok(line)
        } else {
            Err(format!("{}: expected {prefix:?}, got {line:?}", self.name).into())
        }
    }

    fn expect(&mut self, prefix: &str) -> Result<String, Error> {
        self.expect_within(prefix, PATIENCE)
    }

    /// A line if one is there.
    fn poll_line(&mut self) -> Result<Option<String>, Error> {
        let lines = self.lines.as_ref().ok_or("no stdout")?;
        match lines.try_recv() {
            Ok(line) if line.starts_with("ERROR") => Err(format!("{}: {line}", self.name).into()),
            Ok(line) => Ok(Some(line)),
            Err(TryRecvError::Empty) => Ok(None),
            Err(TryRecvError::Disconnected) => Err(format!("{}: exited", self.name).into()),
        }
    }

    /// `kill -9` by PID, and reap.
    fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// Asks for `count` timed pairs within `budget` and returns them.
    fn pairs(&mut self, count: usize, budget: Duration) -> Result<Vec<Duration>, Error> {
        self.send(&format!("pairs {count} {}", budget.as_millis()))?;
        let line = self.expect_within("PAIRS", budget + PATIENCE)?;
        line.trim_start_matches("PAIRS")
            .split(',')
            .filter(|s| !s.trim().is_empty())
            .map(|s| Ok(Duration::from_nanos(s.trim().parse()?)))
            .collect()
    }
}

impl Drop for Kid {
    fn drop(&mut self) {
        self.kill();
    }
}

/// The counts of kids told `go <ms>`, in their order.
fn collect_counts(kids: &mut [Kid]) -> Result<Vec<u64>, Error> {
    kids.iter_mut()
        .map(|kid| {
            let line = kid.expect_within("COUNT", ROUND + PATIENCE)?;
            Ok(line.trim_start_matches("COUNT ").trim().parse::<u64>()?)
        })
        .collect()
}

/// `n` free loopback addresses (bound, read, released).
fn free_addrs(n: usize) -> Result<Vec<SocketAddr>, Error> {
    let listeners = (0..n)
        .map(|_| TcpListener::bind("127.0.0.1:0"))
        .collect::<Result<Vec<_>, _>>()?;
    Ok(listeners
        .iter()
        .map(TcpListener::local_addr)
        .collect::<Result<_, _>>()?)
}

/// The peers word `r0=addr,r1=addr,r2=addr`.
fn peers_word(addrs: &[SocketAddr]) -> String {
    addrs
        .iter()
        .enumerate()
        .map(|(i, a)| format!("r{i}={a}"))
        .collect::<Vec<_>>()
        .join(",")
}

/// Joins a Raft cluster as `name`.
async fn raft_join(
    cluster: &str,
    name: &str,
    dir: &Path,
    peers: &str,
    sync: bool,
    snapshot_every: u64,
) -> Result<Node, Error> {
    let peers: Vec<RaftPeer> = peers
        .split(',')
        .map(|p| {
            let (n, a) = p.split_once('=').ok_or("peer is not name=addr")?;
            Ok(RaftPeer::new(n, a.parse()?))
        })
        .collect::<Result<_, Error>>()?;
    let addr = peers
        .iter()
        .find(|p| p.name == name)
        .ok_or("not among the peers")?
        .addr;
    let mesh = TcpMesh::bind(&TcpConfig {
        bind: addr,
        ..TcpConfig::loopback()
    })?;
    let mut config = RaftConfig::new(peers);
    config.sync = sync;
    config.snapshot_every = snapshot_every;
    Ok(Node::builder(cluster)
        .name(name)
        .transport(mesh)
        .data_dir(dir)
        .raft(config)
        .join_timeout(PATIENCE)
        .join()
        .await?)
}

/// Joins the group backend's cluster (`Majority` of 3, TCP mesh) as `name`.
async fn group_join(name: &str, seeds: Vec<SocketAddr>) -> Result<Node, Error> {
    let node = Node::builder("bench-group")
        .name(name)
        .transport(TcpMesh::loopback(seeds)?)
        .config(EndpointConfig::local())
        .founding(Founding::Alone)
        .partition_policy(PartitionPolicy::Majority { cluster_size: 3 })
        .join_timeout(PATIENCE)
        .join()
        .await?;
    Ok(node)
}

/// The child roles, `bench child raft <role> ...`:
/// - `raft-member <cluster> <name> <dir> <peers> <sync 0|1> <snapshot_every>`;
/// - `group-member <name> <seed or ->`;
/// - `etcd-taker <client port>`.
///
/// Each prints `READY <addr>` once joined (connected), then answers lines: `pairs <n> <ms>`
/// (`PAIRS <ns>,...`: timed lock + awaited unlock of its own lock), `go <ms>` (`COUNT <n>`:
/// pairs on the lock `hot`), `lead` (`LEADER`: `become_grantor`), `fill <n>` (`FILLED <n>`:
/// pairs over [`FILL_TASKS`] locks), `lock <name>` (`LOCKED <token>`, then unlocked). An
/// error answers `ERROR <what>`; end of input or `stop` ends it.
pub(crate) fn child(args: &[String]) -> Result<(), Error> {
    std::thread::spawn(|| {
        std::thread::sleep(CHILD_LIFETIME);
        std::process::exit(3);
    });
    let arg = |i: usize| args.get(i).map(String::as_str).ok_or("missing argument");
    smol::block_on(async {
        let mut taker = match arg(0)? {
            "raft-member" => Taker::Node(
                raft_join(
                    arg(1)?,
                    arg(2)?,
                    Path::new(arg(3)?),
                    arg(4)?,
                    arg(5)? == "1",
                    arg(6)?.parse()?,
                )
                .await?,
            ),
            "group-member" => {
                let seeds = match arg(2)? {
                    "-" => Vec::new(),
                    seed => vec![seed.parse()?],
                };
                Taker::Node(group_join(arg(1)?, seeds).await?)
            }
            "etcd-taker" => Taker::Etcd(Etcd::connect(arg(1)?.parse()?)?),
            other => return Err(format!("unknown raft-mode child role {other:?}").into()),
        };
        match &taker {
            Taker::Node(node) => println!("READY {}", node.member_id().addr()),
            Taker::Etcd(_) => println!("READY"),
        }
        let own = format!("solo-{}", std::process::id());
        for line in std::io::stdin().lock().lines() {
            let line = line?;
            let words: Vec<&str> = line.split_whitespace().collect();
            let answer = match words.as_slice() {
                ["stop"] => break,
                ["pairs", n, ms] => taker
                    .pairs(&own, n.parse()?, Duration::from_millis(ms.parse()?))
                    .await
                    .map(|v| {
                        let ns: Vec<String> = v.iter().map(|d| d.as_nanos().to_string()).collect();
                        format!("PAIRS {}", ns.join(","))
                    }),
                ["go", ms] => taker
                    .hammer("hot", Duration::from_millis(ms.parse()?))
                    .await
                    .map(|n| format!("COUNT {n}")),
                ["lead"] => taker.lead().await.map(|()| "LEADER".to_owned()),
                ["fill", n] => taker.fill(n.parse()?).await.map(|n| format!("FILLED {n}")),
                ["lock", name] => taker.lock(name).await.map(|t| format!("LOCKED {t}")),
                _ => Err(format!("unknown command {line:?}").into()),
            };
            match answer {
                Ok(answer) => println!("{answer}"),
                Err(e) => println!("ERROR {e}"),
            }
        }
        if let Taker::Node(node) = taker {
            let _ = within(Duration::from_secs(5), async {
                node.leave().await;
                Ok::<(), Error>(())
            })
            .await;
        }
        Ok(())
    })
}

/// What a child locks with.
enum Taker {
    Node(Node),
    Etcd(Etcd),
}

impl Taker {
    fn node(&self) -> Result<&Node, Error> {
        match self {
            Taker::Node(node) => Ok(node),
            Taker::Etcd(_) => Err("not a Conclave member".into()),
        }
    }

    async fn pairs(
        &mut self,
        name: &str,
        count: usize,
        budget: Duration,
    ) -> Result<Vec<Duration>, Error> {
        let mut out = Vec::with_capacity(count);
        match self {
            Taker::Node(node) => timed_pairs(&node.mutex(name)?, count, budget, &mut out).await?,
            Taker::Etcd(etcd) => {
                let start = Instant::now();
                for _ in 0..count {
                    if start.elapsed() > budget {
                        break;
                    }
                    let t = Instant::now();
                    etcd.pair(name)?;
                    out.push(t.elapsed());
                }
            }
        }
        Ok(out)
    }

    async fn hammer(&mut self, name: &str, run_for: Duration) -> Result<u64, Error> {
        match self {
            Taker::Node(node) => hammer(&node.mutex(name)?, run_for).await,
            Taker::Etcd(etcd) => {
                let start = Instant::now();
                let mut count = 0;
                while start.elapsed() < run_for {
                    etcd.pair(name)?;
                    count += 1;
                }
                Ok(count)
            }
        }
    }

    async fn lead(&self) -> Result<(), Error> {
        let node = self.node()?;
        let mut last = None;
        for _ in 0..5 {
            match within(PATIENCE, node.become_grantor()).await {
                Ok(()) => return Ok(()),
                Err(e) => last = Some(e),
            }
        }
        Err(last.unwrap_or_else(|| "no leadership".into()))
    }

    async fn fill(&self, pairs: usize) -> Result<usize, Error> {
        let node = self.node()?;
        let start = Instant::now();
        let per_task = pairs.div_ceil(FILL_TASKS);
        let tasks = (0..FILL_TASKS)
            .map(|i| {
                let mutex = node.mutex(format!("fill-{i}"));
                async move {
                    let mutex = mutex?;
                    let mut done = 0;
                    while done < per_task && start.elapsed() < FILL_BUDGET {
                        pair(&mutex).await?;
                        done += 1;
                    }
                    Ok::<usize, Error>(done)
                }
            })
            .collect::<Vec<_>>();
        let done = futures::future::try_join_all(tasks).await?;
        Ok(done.into_iter().sum())
    }

    async fn lock(&self, name: &str) -> Result<u64, Error> {
        let mutex = self.node()?.mutex(name)?;
        let guard = within(PATIENCE, mutex.lock()).await?;
        let token = guard.fencing_token().0;
        within(PATIENCE, guard.unlock()).await?;
        Ok(token)
    }
}

// ---------------------------------------------------------------------------------------
// etcd.

/// A blocking client of etcd's HTTP/JSON gateway on one kept-alive loopback connection
/// (`TCP_NODELAY`), with a lease of its own for its locks.
struct Etcd {
    writer: TcpStream,
    reader: BufReader<TcpStream>,
    lease: String,
    request: Vec<u8>,
}

impl Etcd {
    fn connect(port: u16) -> Result<Self, Error> {
        let stream = TcpStream::connect(("127.0.0.1", port))?;
        stream.set_nodelay(true)?;
        stream.set_read_timeout(Some(PATIENCE))?;
        let mut etcd = Self {
            reader: BufReader::new(stream.try_clone()?),
            writer: stream,
            lease: String::new(),
            request: Vec::with_capacity(512),
        };
        let granted = etcd.post("/v3/lease/grant", &format!(r#"{{"TTL":{ETCD_LEASE_TTL}}}"#))?;
        etcd.lease = json_str(&granted, "ID")?;
        Ok(etcd)
    }

    /// One request; its answer's body (an error unless the status is 200).
    fn post(&mut self, path: &str, body: &str) -> Result<String, Error> {
        self.request.clear();
        write!(
            self.request,
            "POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
            body.len()
        )?;
        self.writer.write_all(&self.request)?;
        let mut status = String::new();
        if self.reader.read_line(&mut status)? == 0 {
            return Err("etcd closed the connection".into());
        }
        let mut length = None;
        loop {
            let mut header = String::new();
            if self.reader.read_line(&mut header)? == 0 {
                return Err("etcd closed the connection".into());
            }
            let header = header.trim_end();
            if header.is_empty() {
                break;
            }
            if let Some((name, value)) = header.split_once(':') {
                if name.eq_ignore_ascii_case("content-length") {
                    length = Some(value.trim().parse::<usize>()?);
                } else if name.eq_ignore_ascii_case("transfer-encoding") {
                    return Err(format!("etcd answered with {header:?}").into());
                }
            }
        }
        let mut answer = vec![0; length.ok_or("no Content-Length")?];
        self.reader.read_exact(&mut answer)?;
        let answer = String::from_utf8(answer)?;
        if status.split_whitespace().nth(1) != Some("200") {
            return Err(format!("etcd {path}: {} {answer}", status.trim()).into());
        }
        Ok(answer)
    }

    /// Lock `name` (waiting in the server until granted), then unlock.
    fn pair(&mut self, name: &str) -> Result<(), Error> {
        let body = format!(r#"{{"name":"{}","lease":"{}"}}"#, base64(name), self.lease);
        let locked = self.post("/v3/lock/lock", &body)?;
        let key = json_str(&locked, "key")?;
        self.post("/v3/lock/unlock", &format!(r#"{{"key":"{key}"}}"#))?;
        Ok(())
    }

    /// A serializable read of one key, answered by the member alone (no consensus): what a
    /// request through the gateway costs by itself.
    fn read(&mut self) -> Result<(), Error> {
        self.post(
            "/v3/kv/range",
            &format!(r#"{{"key":"{}","serializable":true}}"#, base64("floor")),
        )?;
        Ok(())
    }

    /// This member's id and the leader's, as it knows them.
    fn status(&mut self) -> Result<(String, String), Error> {
        let status = self.post("/v3/maintenance/status", "{}")?;
        Ok((
            json_str(&status, "member_id")?,
            json_str(&status, "leader")?,
        ))
    }
}

/// The string value of `"field":"..."` in a JSON text (the answers here hold no escapes).
fn json_str(json: &str, field: &str) -> Result<String, Error> {
    let pattern = format!("\"{field}\":\"");
    let start = json
        .find(&pattern)
        .ok_or_else(|| format!("no {field} in {json}"))?
        + pattern.len();
    let end = json[start..].find('"').ok_or("unterminated string")? + start;
    Ok(json[start..end].to_owned())
}

fn base64(text: &str) -> String {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::new();
    for chunk in text.as_bytes().chunks(3) {
        let b = [
            chunk[0],
            chunk.get(1).copied().unwrap_or(0),
            chunk.get(2).copied().unwrap_or(0),
        ];
        let n = u32::from(b[0]) << 16 | u32::from(b[1]) << 8 | u32::from(b[2]);
        for i in 0..4 {
            if i <= chunk.len() {
                out.push(char::from(ALPHABET[(n >> (18 - 6 * i)) as usize & 63]));
            } else {
                out.push('=');
            }
        }
    }
    out
}

/// A three-member etcd cluster of this run, and a client per member for the contended
/// measurement (in child processes), and this process's clients of a follower and the leader.
struct EtcdCluster {
    label: String,
    takers: Vec<Kid>,
    follower: Etcd,
    leader: Etcd,
    leader_at: usize,
    // Last: the servers are killed after the clients.
    _servers: Vec<Kid>,
}

impl EtcdCluster {
    fn start(label: &str, root: &Path, kind: &str) -> Result<Self, Error> {
        let ports: Vec<u16> = free_addrs(6)?.iter().map(SocketAddr::port).collect();
        let (clients, peers) = ports.split_at(3);
        let initial: Vec<String> = peers
            .iter()
            .enumerate()
            .map(|(i, p)| format!("e{i}=http://127.0.0.1:{p}"))
            .collect();
        let initial = initial.join(",");
        let mut servers = Vec::new();
        for i in 0..3 {
            let mut command = Command::new("etcd");
            let client = format!("http://127.0.0.1:{}", clients[i]);
            let peer = format!("http://127.0.0.1:{}", peers[i]);
            command
                .args(["--name", &format!("e{i}")])
                .arg("--data-dir")
                .arg(root.join(format!("etcd-{kind}-e{i}")))
                .args(["--listen-client-urls", &client])
                .args(["--advertise-client-urls", &client])
                .args(["--listen-peer-urls", &peer])
                .args(["--initial-advertise-peer-urls", &peer])
                .args(["--initial-cluster", &initial])
                .args([
                    "--initial-cluster-token",
                    &format!("bench-{kind}-{}", std::process::id()),
                ])
                .args(["--initial-cluster-state", "new"])
                .args(["--logger", "zap", "--log-level", "error"]);
            servers.push(Kid::start(&format!("etcd e{i}"), command, false)?);
        }
        // Until every member answers and knows a leader.
        let start = Instant::now();
        let mut ids = Vec::new();
        let mut leader = String::new();
        while ids.len() < 3 {
            if start.elapsed() > PATIENCE {
                return Err("the etcd cluster did not form within 30 s".into());
            }
            ids.clear();
            for port in clients {
                let status = Etcd::connect(*port).and_then(|mut e| e.status());
                match status {
                    Ok((id, known)) if known != "0" => {
                        leader = known;
                        ids.push(id);
                    }
                    _ => break,
                }
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        let leader_at = ids
            .iter()
            .position(|id| *id == leader)
            .ok_or("the etcd leader is none of the members")?;
        let follower_at = (leader_at + 1) % 3;
        let mut takers = Vec::new();
        for (i, port) in clients.iter().enumerate() {
            let mut kid = Kid::member(
                &format!("etcd taker {i}"),
                &["etcd-taker", &port.to_string()],
            )?;
            kid.expect("READY")?;
            takers.push(kid);
        }
        Ok(Self {
            label: label.to_owned(),
            takers,
            follower: Etcd::connect(clients[follower_at])?,
            leader: Etcd::connect(clients[leader_at])?,
            leader_at,
            _servers: servers,
        })
    }

    /// Handoffs per second, and the share of the leader's client.
    fn contended(&mut self) -> Result<(f64, f64), Error> {
        let start = Instant::now();
        for kid in &mut self.takers {
            kid.send(&format!("go {}", ROUND.as_millis()))?;
        }
        let counts = collect_counts(&mut self.takers)?;
        let total: u64 = counts.iter().sum();
        Ok((
            total as f64 / start.elapsed().as_secs_f64(),
            counts[self.leader_at] as f64 / total.max(1) as f64,
        ))
    }
}

fn etcd_pairs(etcd: &mut Etcd, out: &mut Vec<Duration>) -> Result<(), Error> {
    let start = Instant::now();
    for _ in 0..SAMPLES {
        if start.elapsed() > SAMPLE_BUDGET {
            break;
        }
        let t = Instant::now();
        etcd.pair("uncontended")?;
        out.push(t.elapsed());
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------
// Conclave clusters with this process as a member.

/// A cluster in which this process is a member beside two child processes: the first child
/// is the leader (the grantor).
struct Cluster {
    label: String,
    node: Node,
    solo: DistributedMutex,
    hot: DistributedMutex,
    kids: Vec<Kid>,
    leader_name: String,
    leader_moves: usize,
}

impl Cluster {
    async fn group() -> Result<Self, Error> {
        let mut coordinator = Kid::member("group coordinator", &["group-member", "g0", "-"])?;
        let seed: SocketAddr = coordinator
            .expect("READY ")?
            .trim_start_matches("READY ")
            .parse()?;
        let other = Kid::member("group member", &["group-member", "g1", &seed.to_string()])?;
        let node = group_join("g2", vec![seed]).await?;
        let mut kids = vec![coordinator, other];
        kids[1].expect("READY")?;
        let grantor = within(PATIENCE, async {
            node.wait_until_serving()
                .await
                .ok_or_else(|| Error::from("stopped"))
        })
        .await?;
        if grantor.name() != "g0" {
            return Err(format!("the group's grantor is {grantor}, not g0").into());
        }
        Self::new(
            "Conclave group backend, TCP, `Majority` of 3",
            node,
            kids,
            "g0",
        )
    }

    async fn raft(storage: Storage, scratch: &Scratch) -> Result<Self, Error> {
        let addrs = free_addrs(3)?;
        let peers = peers_word(&addrs);
        let cluster = format!("bench-raft-{}-{}", storage.word(), std::process::id());
        let dir = |i: usize| {
            scratch
                .root(storage)
                .join(format!("{}-r{i}", storage.word()))
        };
        let sync = if storage.sync() { "1" } else { "0" };
        // No snapshots: the engine panics when a snapshot is taken at the last index of its
        // log (see the recovery cases), which a steady stream of requests reaches at once.
        let snapshots = NO_SNAPSHOTS.to_string();
        let mut kids = Vec::new();
        for i in 1..3 {
            let dir = dir(i);
            kids.push(Kid::member(
                &format!("{} r{i}", storage.word()),
                &[
                    "raft-member",
                    &cluster,
                    &format!("r{i}"),
                    dir.to_str().ok_or("path")?,
                    &peers,
                    sync,
                    &snapshots,
                ],
            )?);
        }
        let node = raft_join(
            &cluster,
            "r0",
            &dir(0),
            &peers,
            storage.sync(),
            NO_SNAPSHOTS,
        )
        .await?;
        for kid in &mut kids {
            kid.expect("READY")?;
        }
        let mut cluster = Self::new(storage.label(), node, kids, "r1")?;
        cluster.ensure_leader().await?;
        cluster.leader_moves = 0;
        Ok(cluster)
    }

    fn new(label: &str, node: Node, kids: Vec<Kid>, leader: &str) -> Result<Self, Error> {
        Ok(Self {
            label: label.to_owned(),
            solo: node.mutex(format!("solo-{}", std::process::id()))?,
            hot: node.mutex("hot")?,
            node,
            kids,
            leader_name: leader.to_owned(),
            leader_moves: 0,
        })
    }

    /// Makes the first child the leader again if it is not (a Raft cluster).
    async fn ensure_leader(&mut self) -> Result<(), Error> {
        if self.leads() {
            return Ok(());
        }
        self.leader_moves += 1;
        self.kids[0].send("lead")?;
        self.kids[0].expect("LEADER")?;
        let start = Instant::now();
        while !self.leads() {
            if start.elapsed() > PATIENCE {
                return Err(format!(
                    "{}: {} did not become the leader",
                    self.label, self.leader_name
                )
                .into());
            }
            async_io::Timer::after(Duration::from_millis(10)).await;
        }
        Ok(())
    }

    fn leads(&self) -> bool {
        self.node
            .grantor()
            .is_some_and(|g| g.name() == self.leader_name)
    }

    /// The three members loop on `hot` for [`ROUND`]: handoffs per second, and the share
    /// of the leader's (grantor's) process.
    async fn contended(&mut self) -> Result<(f64, f64), Error> {
        let start = Instant::now();
        for kid in &mut self.kids {
            kid.send(&format!("go {}", ROUND.as_millis()))?;
        }
        let here = hammer(&self.hot, ROUND).await?;
        let there = collect_counts(&mut self.kids)?;
        let total = here + there.iter().sum::<u64>();
        Ok((
            total as f64 / start.elapsed().as_secs_f64(),
            there[0] as f64 / total.max(1) as f64,
        ))
    }

    async fn stop(self) {
        let _ = within(Duration::from_secs(5), async {
            self.node.leave().await;
            Ok::<(), Error>(())
        })
        .await;
    }
}

/// One system's figures over all rounds.
#[derive(Default)]
struct Figures {
    follower: Vec<Duration>,
    leader: Vec<Duration>,
    rates: Vec<f64>,
    /// The leader's (grantor's) process's share of the handoffs, each round.
    shares: Vec<f64>,
}

impl Figures {
    fn row(&mut self, label: &str, floor: Duration) {
        self.follower.sort();
        self.leader.sort();
        let mut sorted = self.rates.clone();
        sorted.sort_by(f64::total_cmp);
        let median = sorted.get(sorted.len() / 2).copied().unwrap_or_default();
        let rates: Vec<String> = self.rates.iter().map(|r| format!("{r:.0}")).collect();
        let cell = |v: &[Duration]| {
            if v.is_empty() {
                return "– | –".to_owned();
            }
            format!(
                "{:.0} / {:.0} / {:.0} µs ({}) | {:.1}x",
                micros(percentile(v, 0.5)),
                micros(percentile(v, 0.9)),
                micros(percentile(v, 0.99)),
                v.len(),
                percentile(v, 0.5).as_secs_f64() / floor.as_secs_f64()
            )
        };
        let share = self.shares.iter().sum::<f64>() / self.shares.len().max(1) as f64;
        let contended = if self.rates.is_empty() {
            "– | – | –".to_owned()
        } else {
            format!(
                "{median:.0} ({}) | {:.3} | {:.0}%",
                rates.join(", "),
                median * floor.as_secs_f64(),
                share * 100.0
            )
        };
        println!(
            "| {label} | {} | {} | {contended} |",
            cell(&self.follower),
            cell(&self.leader)
        );
    }
}

// ---------------------------------------------------------------------------------------
// Recovery after a full-cluster restart.

/// One recovery case's figures.
struct Recovery {
    label: String,
    /// The pairs written and how long it took, or how long until the writing failed.
    fill: Option<Result<(usize, Duration), (Duration, String)>>,
    log: String,
    restarts: Vec<(Duration, Duration)>,
}

/// A cluster of three child members, killed and restarted.
struct RaftKids {
    cluster: String,
    dirs: Vec<PathBuf>,
    peers: String,
    sync: bool,
    snapshot_every: u64,
    kids: Vec<Kid>,
}

impl RaftKids {
    fn spawn(&mut self) -> Result<(), Error> {
        self.kids.clear();
        let sync = if self.sync { "1" } else { "0" };
        let snapshots = self.snapshot_every.to_string();
        for (i, dir) in self.dirs.iter().enumerate() {
            self.kids.push(Kid::member(
                &format!("{} r{i}", self.cluster),
                &[
                    "raft-member",
                    &self.cluster,
                    &format!("r{i}"),
                    dir.to_str().ok_or("path")?,
                    &self.peers,
                    sync,
                    &snapshots,
                ],
            )?);
        }
        Ok(())
    }

    /// `kill -9` of every member.
    fn kill(&mut self) {
        for kid in &mut self.kids {
            kid.kill();
        }
        self.kids.clear();
    }

    /// Restarts all three at once and asks each for a lock at once: the time until all three
    /// joined, and until the first grant.
    fn restart(&mut self, lock: &str) -> Result<(Duration, Duration), Error> {
        let start = Instant::now();
        self.spawn()?;
        for kid in &mut self.kids {
            kid.send(&format!("lock {lock}"))?;
        }
        let mut ready = [None; 3];
        let mut locked = [None; 3];
        while locked.iter().any(Option::is_none) {
            if start.elapsed() > PATIENCE * 2 {
                return Err(format!("{}: no lock within 60 s of the restart", self.cluster).into());
            }
            for (i, kid) in self.kids.iter_mut().enumerate() {
                while let Some(line) = kid.poll_line()? {
                    if line.starts_with("READY") {
                        ready[i] = Some(start.elapsed());
                    } else if line.starts_with("LOCKED") {
                        locked[i] = Some(start.elapsed());
                    }
                }
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        let all_ready = ready.iter().flatten().max().copied().ok_or("no READY")?;
        let first_lock = locked.iter().flatten().min().copied().ok_or("no LOCKED")?;
        Ok((all_ready, first_lock))
    }
}

/// Bytes of the files under `dir`, recursively.
fn bytes_under(dir: &Path) -> u64 {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return 0;
    };
    entries
        .flatten()
        .map(|e| match e.metadata() {
            Ok(m) if m.is_dir() => bytes_under(&e.path()),
            Ok(m) => m.len(),
            Err(_) => 0,
        })
        .sum()
}

/// The log's size and the newest snapshot's `<index>-<term>` of a member's directory.
fn log_state(dir: &Path) -> String {
    let wal = bytes_under(&dir.join("wal"));
    let mut snaps: Vec<String> = std::fs::read_dir(dir.join("snap"))
        .map(|entries| {
            entries
                .flatten()
                .filter_map(|e| e.file_name().to_str().map(str::to_owned))
                .filter(|n| n.ends_with(".snap"))
                .collect()
        })
        .unwrap_or_default();
    snaps.sort();
    let snap = snaps.last().map_or_else(
        || "no snapshot".to_owned(),
        |s| {
            let s = s.trim_end_matches(".snap");
            let (index, term) = s.split_once('-').unwrap_or((s, "?"));
            format!(
                "snapshot at index {}, term {}",
                index.trim_start_matches('0'),
                term.trim_start_matches('0')
            )
        },
    );
    format!("log {:.1} MiB, {snap}", wal as f64 / (1 << 20) as f64)
}

fn recovery(
    scratch: &Scratch,
    storage: Storage,
    pairs: usize,
    snapshot_every: u64,
    label: &str,
) -> Result<Recovery, Error> {
    let tag = format!("recovery-{}-{pairs}-{snapshot_every}", storage.word());
    let mut kids = RaftKids {
        cluster: format!("bench-{tag}-{}", std::process::id()),
        dirs: (0..3)
            .map(|i| scratch.root(storage).join(format!("{tag}-r{i}")))
            .collect(),
        peers: peers_word(&free_addrs(3)?),
        sync: storage.sync(),
        snapshot_every,
        kids: Vec::new(),
    };
    kids.spawn()?;
    for kid in &mut kids.kids {
        kid.expect("READY")?;
    }
    // The writing may fail: the engine panics when it takes a snapshot at the last index
    // of its log. The members are killed and restarted all the same: their directories
    // then hold that snapshot, which is what a recovery after a snapshot reads.
    let fill = if pairs > 0 {
        let start = Instant::now();
        kids.kids[0].send(&format!("fill {pairs}"))?;
        let filled = kids.kids[0]
            .expect_within("FILLED", FILL_BUDGET + PATIENCE)
            .and_then(|line| Ok(line.trim_start_matches("FILLED ").trim().parse::<usize>()?));
        Some(match filled {
            Ok(done) => Ok((done, start.elapsed())),
            Err(e) => Err((start.elapsed(), e.to_string())),
        })
    } else {
        None
    };
    // Let the followers apply (and snapshot) what the leader committed.
    std::thread::sleep(Duration::from_millis(500));
    let log = log_state(&kids.dirs[0]);
    let mut restarts = Vec::new();
    for i in 0..RESTARTS {
        kids.kill();
        restarts.push(kids.restart(&format!("after-restart-{i}"))?);
    }
    kids.kill();
    Ok(Recovery {
        label: label.to_owned(),
        fill,
        log,
        restarts,
    })
}

// ---------------------------------------------------------------------------------------
// The mode.

/// The `raft` mode.
pub(crate) fn run() -> Result<(), Error> {
    smol::block_on(measure())
}

fn machine() -> String {
    let cpu = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let model = cpu
        .lines()
        .find_map(|l| {
            l.strip_prefix("model name")
                .map(|m| m.trim_start_matches([' ', '\t', ':']))
        })
        .unwrap_or("?")
        .to_owned();
    let cores = std::thread::available_parallelism().map_or(0, usize::from);
    let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
    format!("{model}, {cores} cores, Linux {}", kernel.trim())
}

/// A count from the environment, or its default.
fn from_env(name: &str, default: usize) -> Result<usize, Error> {
    match std::env::var(name) {
        Ok(n) => Ok(n.parse()?),
        Err(_) => Ok(default),
    }
}

async fn measure() -> Result<(), Error> {
    let rounds = from_env("CONCLAVE_BENCH_RAFT_ROUNDS", ROUNDS)?;
    let fill_pairs = from_env("CONCLAVE_BENCH_RAFT_PAIRS", FILL_PAIRS)?;
    let scratch = Scratch::create()?;
    println!("conclave bench, raft mode: the Raft engine beside the group backend (TCP, loopback), {rounds} alternating rounds");
    println!("machine: {}", machine());
    println!(
        "data directories: disk {} ({}), tmpfs {} ({})",
        scratch.disk.display(),
        fs_type(&scratch.disk),
        scratch.tmpfs.display(),
        fs_type(&scratch.tmpfs)
    );
    println!("at the start: {}", load());

    let etcd_version = Command::new("etcd")
        .arg("--version")
        .output()
        .ok()
        .and_then(|o| {
            String::from_utf8_lossy(&o.stdout)
                .lines()
                .next()
                .map(str::to_owned)
        });
    let mut pong = Proc::spawn(&["pong", "TCP"])?;
    let mut floor = Floor::connect(Mode::Tcp, &mut pong)?;
    let mut group = Cluster::group().await?;
    let mut rafts = Vec::new();
    for storage in [Storage::Disk, Storage::Tmpfs, Storage::DiskUnsynced] {
        rafts.push(Cluster::raft(storage, &scratch).await?);
    }
    let mut etcds = Vec::new();
    match &etcd_version {
        Some(version) => {
            println!("{version}");
            etcds.push(EtcdCluster::start("etcd, disk", &scratch.disk, "disk")?);
            etcds.push(EtcdCluster::start("etcd, tmpfs", &scratch.tmpfs, "tmpfs")?);
        }
        None => println!("etcd: not on PATH, not measured"),
    }
    // Warm-up.
    for cluster in std::iter::once(&group).chain(&rafts) {
        for _ in 0..20 {
            pair(&cluster.solo).await?;
        }
    }
    for etcd in &mut etcds {
        for _ in 0..20 {
            etcd.follower.pair("uncontended")?;
            etcd.leader.pair("uncontended")?;
        }
    }

    let mut rtts = Vec::new();
    let mut group_figures = Figures::default();
    let mut raft_figures: Vec<Figures> = rafts.iter().map(|_| Figures::default()).collect();
    let mut etcd_figures: Vec<Figures> = etcds.iter().map(|_| Figures::default()).collect();
    let mut gateway = Vec::new();
    let mut loads = Vec::new();
    for round in 0..rounds {
        for _ in 0..SAMPLES {
            rtts.push(floor.round_trip()?);
        }
        timed_pairs(
            &group.solo,
            SAMPLES,
            SAMPLE_BUDGET,
            &mut group_figures.follower,
        )
        .await?;
        group_figures
            .leader
            .extend(group.kids[0].pairs(SAMPLES, SAMPLE_BUDGET)?);
        for (cluster, figures) in rafts.iter_mut().zip(&mut raft_figures) {
            cluster.ensure_leader().await?;
            timed_pairs(&cluster.solo, SAMPLES, SAMPLE_BUDGET, &mut figures.follower).await?;
            figures
                .leader
                .extend(cluster.kids[0].pairs(SAMPLES, SAMPLE_BUDGET)?);
        }
        for (etcd, figures) in etcds.iter_mut().zip(&mut etcd_figures) {
            etcd_pairs(&mut etcd.follower, &mut figures.follower)?;
            etcd_pairs(&mut etcd.leader, &mut figures.leader)?;
        }
        if let Some(etcd) = etcds.first_mut() {
            for _ in 0..SAMPLES {
                let t = Instant::now();
                etcd.follower.read()?;
                gateway.push(t.elapsed());
            }
        }
        let (rate, share) = group.contended().await?;
        group_figures.rates.push(rate);
        group_figures.shares.push(share);
        for (cluster, figures) in rafts.iter_mut().zip(&mut raft_figures) {
            cluster.ensure_leader().await?;
            let (rate, share) = cluster.contended().await?;
            figures.rates.push(rate);
            figures.shares.push(share);
        }
        for (etcd, figures) in etcds.iter_mut().zip(&mut etcd_figures) {
            let (rate, share) = etcd.contended()?;
            figures.rates.push(rate);
            figures.shares.push(share);
        }
        loads.push(load());
        println!("round {} of {rounds} done, {}", round + 1, load());
    }
    rtts.sort();
    gateway.sort();
    let floor_p50 = percentile(&rtts, 0.5);
    let leader_moves: Vec<String> = rafts
        .iter()
        .map(|c| format!("{}: {}", c.label, c.leader_moves))
        .collect();
    let group_label = group.label.clone();
    group.stop().await;
    for cluster in rafts {
        cluster.stop().await;
    }
    let etcd_labels: Vec<String> = etcds.iter().map(|e| e.label.clone()).collect();
    drop(etcds);
    // The pong process first: it would complain of the closed connection.
    drop(pong);
    drop(floor);

    println!();
    println!(
        "floor: raw TCP ping-pong between two processes, p50 {:.1} µs, p99 {:.1} µs (1/RTT ≈ {:.0}/s)",
        micros(floor_p50),
        micros(percentile(&rtts, 0.99)),
        1.0 / floor_p50.as_secs_f64()
    );
    println!();
    println!("| system | lock + unlock (awaited) from a member that is not the leader (grantor): p50 / p90 / p99 (samples) | p50 ÷ floor | from the leader's (grantor's) process: p50 / p90 / p99 (samples) | p50 ÷ floor | contended, 3 processes, lock + awaited unlock: handoffs/s, median (each round) | ÷ (1/RTT) | of which the leader's (grantor's) process |");
    println!("|---|---|---|---|---|---|---|---|");
    group_figures.row(&group_label, floor_p50);
    for (label, figures) in [Storage::Disk, Storage::Tmpfs, Storage::DiskUnsynced]
        .iter()
        .zip(&mut raft_figures)
    {
        figures.row(label.label(), floor_p50);
    }
    if let Some(version) = &etcd_version {
        let version = version.trim_start_matches("etcd Version: ");
        for (label, figures) in etcd_labels.iter().zip(&mut etcd_figures) {
            figures.row(
                &format!("{label} ({version}), v3lock through the HTTP gateway"),
                floor_p50,
            );
        }
        if !gateway.is_empty() {
            println!(
                "| etcd: a serializable read through the gateway (no consensus: the gateway's own cost) | {:.0} / {:.0} / {:.0} µs ({}) | {:.1}x | | | | | |",
                micros(percentile(&gateway, 0.5)),
                micros(percentile(&gateway, 0.9)),
                micros(percentile(&gateway, 0.99)),
                gateway.len(),
                percentile(&gateway, 0.5).as_secs_f64() / floor_p50.as_secs_f64()
            );
        }
    }
    println!();
    println!(
        "Raft leader moved back during the rounds: {}",
        leader_moves.join("; ")
    );
    println!("load after each round: {}", loads.join(" | "));

    // Recovery.
    println!();
    println!("recovery, at the start: {}", load());
    let cases = [
        (
            Storage::Disk,
            0,
            NO_SNAPSHOTS,
            "disk, `sync: true`, empty log (the members' arrivals only)".to_owned(),
        ),
        (
            Storage::Disk,
            fill_pairs,
            NO_SNAPSHOTS,
            format!("disk, `sync: true`, {fill_pairs} pairs, no snapshot"),
        ),
        (
            Storage::Disk,
            fill_pairs,
            DEFAULT_SNAPSHOTS,
            format!("disk, `sync: true`, {fill_pairs} pairs, `snapshot_every` {DEFAULT_SNAPSHOTS}"),
        ),
        (
            Storage::Tmpfs,
            fill_pairs,
            NO_SNAPSHOTS,
            format!("tmpfs, `sync: true`, {fill_pairs} pairs, no snapshot"),
        ),
    ];
    let mut recoveries = Vec::new();
    for (storage, pairs, snapshots, label) in cases {
        match recovery(&scratch, storage, pairs, snapshots, &label) {
            Ok(r) => {
                println!("recovery case done: {label}, {}", load());
                recoveries.push(Ok(r));
            }
            Err(e) => {
                println!("recovery case FAILED: {label}: {e}, {}", load());
                recoveries.push(Err((label, e.to_string())));
            }
        }
    }
    println!();
    println!("| recovery case | writing the log (8 tasks of one member) | at the kill, member r0 | restart → all 3 joined (each restart) | restart → first lock granted (each restart) |");
    println!("|---|---|---|---|---|");
    for r in &recoveries {
        let r = match r {
            Ok(r) => r,
            Err((label, e)) => {
                println!("| {label} | failed: {e} | | | |");
                continue;
            }
        };
        let fill = match &r.fill {
            None => "–".to_owned(),
            Some(Ok((n, d))) => format!(
                "{n} pairs in {:.1} s ({:.0} pairs/s)",
                d.as_secs_f64(),
                *n as f64 / d.as_secs_f64()
            ),
            Some(Err((d, e))) => format!("**failed** after {:.1} s: {e}", d.as_secs_f64()),
        };
        let ms = |f: fn(&(Duration, Duration)) -> Duration| {
            r.restarts
                .iter()
                .map(|x| format!("{:.0}", f(x).as_secs_f64() * 1e3))
                .collect::<Vec<_>>()
                .join(", ")
        };
        println!(
            "| {} | {fill} | {} | {} ms | {} ms |",
            r.label,
            r.log,
            ms(|x| x.0),
            ms(|x| x.1)
        );
    }
    println!();
    println!("at the end: {}", load());
    drop(scratch);
    Ok(())
}
