//! `conclave-node`: one member of a Conclave cluster on loopback, over UDP or TCP, driven by
//! line commands on stdin and reporting machine-readable lines on stdout. The multi-process
//! tests (`tests/tests/multiprocess.rs`) run several of these.
//!
//! ```text
//! conclave-node <cluster> <member-name> udp <discovery-port> <group> [--majority N] [--data-dir DIR] [--key-file FILE] [--suspect-ms MS] [--founding alone|with-others|never] [--bind IP[:PORT]]
//! conclave-node <cluster> <member-name> tcp [<seed-address>...] [--majority N] [--data-dir DIR] [--key-file FILE] [--suspect-ms MS] [--founding alone|with-others|never] [--bind IP[:PORT]]
//! ```
//!
//! Over `udp`, the node binds its unicast socket on 127.0.0.1 and discovers its peers on the
//! multicast `group:discovery-port` over the loopback interface with TTL 0 (nothing leaves the
//! host). Over `tcp`, it listens on 127.0.0.1 with an ephemeral port (printed in `READY`) and
//! discovers its peers through the seed addresses, which must be loopback addresses; with no
//! seeds it founds the cluster. Either way it uses the fast one-host timings
//! ([`EndpointConfig::local`]). `--raft NAME,NAME,...` runs the member on the Raft engine
//! instead, over the TCP mesh: the names are the members', in the order of the seed addresses
//! (every member's address, its own included), its session timeout the `--suspect-ms`, its log
//! in `--data-dir` (required). `--majority N` selects the `Majority { cluster_size: N }`
//! partition policy (`--handoff` turns the one-hop handoff on); `--data-dir DIR` the member's
//! data directory (where it keeps the grantor
//! term it promised, so fencing tokens never go back across restarts); `--key-file FILE` the
//! cluster key (64 hex digits) that seals its traffic; `--suspect-ms MS` the failure detector's
//! suspect timeout, in milliseconds, instead of the one-host timings'; `--founding` when the
//! node may found a cluster (`conclave::Founding`; default `alone`, as the suite starts members
//! one by one, while the library's default for these transports is `with-others`); `--bind`
//! the loopback address (and port; default 0, any) of the member's socket instead of
//! 127.0.0.1, also the interface of its multicast (the nemesis gives each member its own). The
//! member name is 1 to 64 characters of `[A-Za-z0-9_.-]`. Every transport is wrapped so that
//! `net delay` can hold its sends back.
//!
//! Commands, one per line (whitespace-separated words, lines of at most 4 KiB):
//!
//! | command | effect and answer |
//! |---|---|
//! | `lock <name>` | waits for the lock: `WAITING <name>` if not granted at once, then `GRANTED <name> <token>` |
//! | `try <name>` | `GRANTED <name> <token>` or `BUSY <name>` |
//! | `unlock <name>` | releases and waits for the grantor: `RELEASED <name>` |
//! | `status <name>` | `STATUS <name> held\|suspended\|lost\|none` |
//! | `view` | `VIEW ...` of the current view |
//! | `incr <file> <lock> <n>` | `n` times: lock; append `enter <token> <member>` to `<file>.log`; read the integer in `<file>` (0 if missing); write it plus one; append `exit <token> <member>`; unlock. Then `DONE incr <lock> <n>` |
//! | `work <dir> <hold-ms> <lock>...` | until `stop`, the locks in turn (from one picked by the member name): lock; append `enter <token> <member> <wait-µs>` to `<dir>/<lock>.log` (the wait from asking to the grant); hold for `hold-ms`; append `exit <token> <member>`; unlock. One at a time per node |
//! | `fenced <dir> <hold-ms> <timeout-ms> <lock>...` | as `work`, for the nemesis: each lock with `lock_timeout`, writes through a fencing register and logs every operation to `<dir>/ops-<member>.log` (`conclave_tests::nemesis::client`); errors are logged and retried. `CONCLAVE_NEMESIS_BROKEN=ignore-lost` makes it a broken client that ignores the lock's status |
//! | `stop` | ends `work` or `fenced` after the section in progress: `STOPPED <sections>` |
//! | `net delay <ms> <jitter-ms>` | holds every send back `ms` plus up to `jitter-ms` (so reorders them); `net delay 0 0` stops: `NET <ms> <jitter-ms>` |
//! | `key install\|use\|remove <key-file>` | changes the keyring (install a key, make it the primary, remove it): `KEYS <primary id> <installed ids...>` |
//! | `stats` | `STATS <sealed> <opened> <failed_authentication> <key_mismatch> <replayed> <stale_session> <foreign> <notices_sent> <notices_received> <resident KiB>` |
//! | `quit` (or end of input) | releases everything, leaves the cluster, prints `BYE`, exits |
//!
//! Unprompted lines: `READY <member> <epoch> <members...>` once joined, `VIEW <epoch>
//! <members...>` for each view installed, `LOST <name> <reason>` when a held lock is lost.
//! A member is written `<name>#<incarnation, 32 hex digits>@<address>`; a token is the fencing
//! token as one unsigned integer. Bad input is answered with `ERROR <command> <message>` and
//! otherwise ignored; a fatal error prints `FATAL <message>` and exits with status 1.

use std::cell::Cell;
use std::collections::{HashMap, HashSet};
use std::fmt::Display;
use std::future::Future;
use std::io::{BufRead, Read, Write};
use std::net::{Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::process::ExitCode;
use std::rc::Rc;
use std::task::Poll;
use std::time::Duration;

use conclave::seal::ClusterKey;
use conclave::tcp::{TcpConfig, TcpMesh};
use conclave::udp::{UdpConfig, UdpMulticast};
use conclave::{
    DistributedMutex, EndpointConfig, Founding, LockError, LockEvent, LockStatus, MemberId,
    MutexGuard, Node, PartitionPolicy, UnlockError, View,
};
use conclave_tests::nemesis::client::Fenced;
use conclave_tests::nemesis::delay::{DelayControl, Delayed};
use futures::stream::{FuturesUnordered, StreamExt};
use futures::FutureExt;

/// The longest command line accepted, in bytes.
const MAX_LINE: usize = 4096;
/// The most operations (waiting locks, unlocks, increments) in progress at once.
const MAX_PENDING: usize = 256;
/// The most locks held at once through `lock`/`try`.
const MAX_HELD: usize = 4096;
/// The largest `n` of `incr`.
const MAX_INCR: u64 = 100_000;
/// How long joining may take.
const JOIN_TIMEOUT: Duration = Duration::from_secs(20);

const USAGE: &str =
    "usage: conclave-node <cluster> <member-name> udp <discovery-port> <group> [--majority N] [--data-dir DIR] [--key-file FILE] [--suspect-ms MS] [--founding F] [--bind IP[:PORT]]
       conclave-node <cluster> <member-name> tcp [<seed-address>...] [--majority N] [--data-dir DIR] [--key-file FILE] [--suspect-ms MS] [--founding F] [--bind IP[:PORT]]";

/// The most seed addresses accepted.
const MAX_SEEDS: usize = 64;

/// With `CONCLAVE_NODE_LOG=debug` (or `info`, `trace`), the library's `tracing` events go to
/// stderr, one line each (the nemesis keeps stderr in `node-<name>.err`).
mod log {
    use std::fmt::Write as _;
    use std::sync::atomic::{AtomicU64, Ordering};
    use tracing::field::{Field, Visit};
    use tracing::span::{Attributes, Id, Record};
    use tracing::{Event, Level, Metadata, Subscriber};

    pub(super) struct Stderr {
        pub(super) level: Level,
        pub(super) next: AtomicU64,
    }

    struct Line(String);

    impl Visit for Line {
        fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
            let _ = write!(self.0, " {}={value:?}", field.name());
        }
    }

    impl Subscriber for Stderr {
        fn enabled(&self, metadata: &Metadata<'_>) -> bool {
            *metadata.level() <= self.level
        }
        fn new_span(&self, _: &Attributes<'_>) -> Id {
            Id::from_u64(self.next.fetch_add(1, Ordering::Relaxed) + 1)
        }
        fn record(&self, _: &Id, _: &Record<'_>) {}
        fn record_follows_from(&self, _: &Id, _: &Id) {}
        fn event(&self, event: &Event<'_>) {
            let mut line = Line(String::new());
            event.record(&mut line);
            eprintln!(
                "{} {} {}{}",
                conclave_tests::nemesis::now_us(),
                event.metadata().level(),
                event.metadata().target(),
                line.0
            );
        }
        fn enter(&self, _: &Id) {}
        fn exit(&self, _: &Id) {}
    }

    /// Installs the stderr logger if `CONCLAVE_NODE_LOG` names a level.
    pub(super) fn install() {
        let level = match std::env::var("CONCLAVE_NODE_LOG").as_deref() {
            Ok("trace") => Level::TRACE,
            Ok("debug") => Level::DEBUG,
            Ok("info") => Level::INFO,
            _ => return,
        };
        let _ = tracing::subscriber::set_global_default(Stderr {
            level,
            next: AtomicU64::new(0),
        });
    }
}

fn main() -> ExitCode {
    log::install();
    let args = match Args::parse(std::env::args().skip(1)) {
        Ok(args) => args,
        Err(message) => {
            eprintln!("conclave-node: {message}\n{USAGE}");
            return ExitCode::from(2);
        }
    };
    match async_io::block_on(run(args)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(message) => {
            say(format_args!("FATAL {message}"));
            ExitCode::FAILURE
        }
    }
}

/// The command line.
struct Args {
    cluster: String,
    name: String,
    backend: Backend,
    majority: Option<usize>,
    /// `--handoff`: the one-hop handoff on (`LockConfig::one_hop_handoff`).
    handoff: bool,
    data_dir: Option<PathBuf>,
    key_file: Option<PathBuf>,
    suspect: Option<Duration>,
    founding: Founding,
    bind: Option<SocketAddr>,
    /// The Raft engine's member names, in the seeds' order.
    raft: Option<Vec<String>>,
}

/// Which transport, and where.
enum Backend {
    Udp { port: u16, group: Ipv4Addr },
    Tcp { seeds: Vec<SocketAddr> },
}

impl Args {
    fn parse(mut args: impl Iterator<Item = String>) -> Result<Self, String> {
        let mut positional = Vec::new();
        let mut majority = None;
        let mut handoff = false;
        let mut data_dir = None;
        let mut key_file = None;
        let mut suspect = None;
        let mut founding = Founding::Alone;
        let mut bind = None;
        let mut raft = None;
        while let Some(arg) = args.next() {
            if arg == "--raft" {
                let names = args.next().ok_or("--raft needs the members' names")?;
                raft = Some(names.split(',').map(str::to_owned).collect());
            } else if arg == "--bind" {
                let addr = args.next().ok_or("--bind needs an address")?;
                let addr = addr
                    .parse::<SocketAddr>()
                    .or_else(|_| addr.parse::<Ipv4Addr>().map(|ip| SocketAddr::from((ip, 0))))
                    .map_err(|e| format!("--bind {addr}: {e}"))?;
                if !addr.ip().is_loopback() || !addr.is_ipv4() {
                    return Err(format!("--bind {addr} is not an IPv4 loopback address"));
                }
                bind = Some(addr);
            } else if arg == "--founding" {
                founding = match args.next().as_deref() {
                    Some("alone") => Founding::Alone,
                    Some("with-others") => Founding::WithOthers,
                    Some("never") => Founding::Never,
                    other => {
                        return Err(format!("--founding {other:?}: alone, with-others or never"))
                    }
                };
            } else if arg == "--suspect-ms" {
                let ms = args.next().ok_or("--suspect-ms needs milliseconds")?;
                let ms: u64 = ms.parse().map_err(|e| format!("--suspect-ms {ms}: {e}"))?;
                suspect = Some(Duration::from_millis(ms));
            } else if arg == "--key-file" {
                key_file = Some(PathBuf::from(args.next().ok_or("--key-file needs a file")?));
            } else if arg == "--data-dir" {
                data_dir = Some(PathBuf::from(
                    args.next().ok_or("--data-dir needs a directory")?,
                ));
            } else if arg == "--handoff" {
                handoff = true;
            } else if arg == "--majority" {
                let n = args.next().ok_or("--majority needs a cluster size")?;
                let n: usize = n.parse().map_err(|e| format!("--majority {n}: {e}"))?;
                if n == 0 {
                    return Err("--majority needs a cluster size of at least 1".into());
                }
                majority = Some(n);
            } else if positional.len() < 3 + MAX_SEEDS {
                positional.push(arg);
            } else {
                return Err(format!("unexpected argument {arg:?}"));
            }
        }
        let mut positional = positional.into_iter();
        let (Some(cluster), Some(name), Some(kind)) =
            (positional.next(), positional.next(), positional.next())
        else {
            return Err("missing arguments".to_owned());
        };
        let name_ok = !name.is_empty()
            && name.len() <= MemberId::MAX_NAME_LEN
            && name
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"_.-".contains(&b));
        if !name_ok {
            return Err(format!("invalid member name {name:?}"));
        }
        let rest: Vec<String> = positional.collect();
        let backend = match (kind.as_str(), rest.as_slice()) {
            ("udp", [port, group]) => Backend::Udp {
                port: port
                    .parse()
                    .map_err(|e| format!("discovery port {port:?}: {e}"))?,
                group: group.parse().map_err(|e| format!("group {group:?}: {e}"))?,
            },
            ("udp", _) => return Err("udp needs <discovery-port> <group>".to_owned()),
            ("tcp", seeds) => Backend::Tcp {
                seeds: seeds
                    .iter()
                    .map(|seed| {
                        let addr: SocketAddr =
                            seed.parse().map_err(|e| format!("seed {seed:?}: {e}"))?;
                        if addr.ip().is_loopback() {
                            Ok(addr)
                        } else {
                            Err(format!("seed {addr} is not a loopback address"))
                        }
                    })
                    .collect::<Result<_, String>>()?,
            },
            (other, _) => return Err(format!("unknown transport {other:?}; use udp or tcp")),
        };
        Ok(Self {
            cluster,
            name,
            backend,
            majority,
            handoff,
            data_dir,
            key_file,
            suspect,
            founding,
            bind,
            raft,
        })
    }
}

/// What an operation in progress ended with.
enum Done {
    Granted(String, Result<MutexGuard, LockError>),
    Released(String, Result<(), UnlockError>),
    Incremented(String, Result<u64, String>),
    Worked(Result<u64, String>),
}

/// Every transport is wrapped, so `net delay` works over both.
fn delayed<T: conclave::api::Transport>(
    transport: std::io::Result<T>,
    control: &DelayControl,
) -> Result<Delayed<T>, String> {
    let seed = u64::from(std::process::id());
    Delayed::new(
        transport.map_err(|e| format!("bind: {e}"))?,
        control.clone(),
        seed,
    )
    .map_err(|e| format!("delay thread: {e}"))
}

type Operation = Pin<Box<dyn Future<Output = Done>>>;

/// What woke the main loop.
enum Input {
    Line(Option<Result<String, String>>),
    View(View),
    Lost(String, String),
    Done(Done),
}

async fn run(args: Args) -> Result<(), String> {
    let builder = Node::builder(args.cluster);
    let delay = DelayControl::default();
    let raft = match (&args.raft, &args.backend) {
        (Some(names), Backend::Tcp { seeds }) if names.len() == seeds.len() => {
            let peers = names
                .iter()
                .zip(seeds)
                .map(|(name, addr)| conclave::raft::RaftPeer::new(name, *addr))
                .collect();
            let mut config = conclave::raft::RaftConfig::new(peers);
            config.tick = Duration::from_millis(10);
            config.session_timeout = args.suspect.unwrap_or(Duration::from_secs(1));
            Some(config)
        }
        (Some(_), _) => {
            return Err("--raft needs tcp and one name per seed address".to_owned());
        }
        (None, _) => None,
    };
    let builder = match (args.backend, args.bind) {
        (Backend::Udp { port, group }, bind) => {
            let mut config = UdpConfig {
                group,
                port,
                ..UdpConfig::loopback()
            };
            if let Some(SocketAddr::V4(bind)) = bind {
                config.bind = bind.into();
                config.interface = *bind.ip();
            }
            builder.transport(delayed(UdpMulticast::bind(&config), &delay)?)
        }
        (Backend::Tcp { seeds }, None) => {
            builder.transport(delayed(TcpMesh::loopback(seeds), &delay)?)
        }
        (Backend::Tcp { seeds }, Some(bind)) => {
            let config = TcpConfig {
                bind,
                seeds,
                ..TcpConfig::loopback()
            };
            builder.transport(delayed(TcpMesh::bind(&config), &delay)?)
        }
    };
    let mut config = EndpointConfig::local();
    if let Some(suspect) = args.suspect {
        config.gms.suspect_timeout = suspect;
    }
    config.locks.one_hop_handoff = args.handoff;
    let mut builder = builder
        .name(args.name)
        .config(config)
        .founding(args.founding)
        .join_timeout(JOIN_TIMEOUT);
    if let Some(cluster_size) = args.majority {
        builder = builder.partition_policy(PartitionPolicy::Majority { cluster_size });
    }
    if let Some(dir) = args.data_dir {
        builder = builder.data_dir(dir);
    }
    if let Some(file) = args.key_file {
        builder = builder.cluster_key_file(file);
    }
    if let Some(config) = raft {
        builder = builder.raft(config);
    }
    let node = builder.join().await.map_err(|e| format!("join: {e}"))?;
    let mut views = node.views();
    let mut events = node.lock_events();
    let view = node.view().ok_or("no view after joining")?;
    say(format_args!(
        "READY {} {}",
        member(node.member_id()),
        view_words(&view)
    ));
    let mut lines = Box::pin(stdin_lines());
    let mut state = State {
        node: &node,
        held: HashMap::new(),
        requested: HashSet::new(),
        pending: FuturesUnordered::new(),
        working: None,
        fenced: None,
        delay,
    };
    loop {
        let input = futures::future::poll_fn(|cx| {
            if let Poll::Ready(Some(done)) = state.pending.poll_next_unpin(cx) {
                return Poll::Ready(Input::Done(done));
            }
            while let Poll::Ready(event) = events.poll_next_unpin(cx) {
                match event {
                    Some(LockEvent::Lost { name, reason, .. }) => {
                        return Poll::Ready(Input::Lost(name.to_string(), format!("{reason:?}")))
                    }
                    Some(_) => {}
                    None => break,
                }
            }
            if let Poll::Ready(Some(view)) = views.poll_next_unpin(cx) {
                return Poll::Ready(Input::View(view));
            }
            lines.poll_next_unpin(cx).map(Input::Line)
        })
        .await;
        match input {
            Input::Done(done) => state.finished(done),
            Input::View(view) => say(format_args!("VIEW {}", view_words(&view))),
            Input::Lost(name, reason) => {
                if let Some(fenced) = &state.fenced {
                    fenced.lost(&name, &reason);
                }
                say(format_args!("LOST {name} {reason}"));
            }
            Input::Line(Some(Err(message))) => say(format_args!("ERROR - {message}")),
            Input::Line(Some(Ok(line))) => {
                if !state.command(&line) {
                    break;
                }
            }
            Input::Line(None) => break,
        }
    }
    drop(state);
    node.leave().await;
    say("BYE");
    Ok(())
}

/// The node's handles and the operations in progress.
struct State<'a> {
    node: &'a Node,
    held: HashMap<String, MutexGuard>,
    /// Locks asked for with `lock` and not answered yet.
    requested: HashSet<String>,
    pending: FuturesUnordered<Operation>,
    /// `work` in progress: set to ask it to stop.
    working: Option<Rc<Cell<bool>>>,
    /// The nemesis client's settings, once `fenced` started (for its `LOST` lines).
    fenced: Option<Rc<Fenced>>,
    /// The delay of every send (`net delay`).
    delay: DelayControl,
}

impl State<'_> {
    /// Runs one command line; false on `quit`.
    fn command(&mut self, line: &str) -> bool {
        let words: Vec<&str> = line.split_whitespace().collect();
        let Some((&command, args)) = words.split_first() else {
            return true;
        };
        let result = match (command, args) {
            ("quit", []) => return false,
            ("lock", [name]) => self.lock(name, true),
            ("try", [name]) => self.lock(name, false),
            ("unlock", [name]) => self.unlock(name),
            ("status", [name]) => {
                let status = match self.held.get(*name).map(MutexGuard::status) {
                    Some(LockStatus::Held) => "held",
                    Some(LockStatus::Suspended) => "suspended",
                    Some(_) => "lost",
                    None => "none",
                };
                say(format_args!("STATUS {name} {status}"));
                Ok(())
            }
            ("view", []) => {
                match self.node.view() {
                    Some(view) => say(format_args!("VIEW {}", view_words(&view))),
                    None => say("VIEW none"),
                }
                Ok(())
            }
            ("incr", [file, name, n]) => self.incr(file, name, n),
            ("work", [dir, hold, locks @ ..]) if !locks.is_empty() => self.work(dir, hold, locks),
            ("fenced", [dir, hold, timeout, locks @ ..]) if !locks.is_empty() => {
                self.fenced(dir, hold, timeout, locks)
            }
            ("net", ["delay", ms, jitter]) => self.net_delay(ms, jitter),
            ("stop", []) => match &self.working {
                Some(stop) => {
                    stop.set(true);
                    Ok(())
                }
                None => Err("no work in progress".to_owned()),
            },
            ("key", [action, file]) => self.key(action, file),
            ("stats", []) => {
                self.stats();
                Ok(())
            }
            (
                "quit" | "lock" | "try" | "unlock" | "status" | "view" | "incr" | "work" | "fenced"
                | "stop" | "net" | "key" | "stats",
                _,
            ) => Err("wrong number of arguments".to_owned()),
            _ => Err("unknown command".to_owned()),
        };
        if let Err(message) = result {
            say(format_args!("ERROR {command} {message}"));
        }
        true
    }

    fn lock(&mut self, name: &str, wait: bool) -> Result<(), String> {
        if self.held.contains_key(name) || self.requested.contains(name) {
            return Err(format!("{name} is already held or requested here"));
        }
        if self.held.len() >= MAX_HELD {
            return Err("too many locks held".to_owned());
        }
        let mutex = self.mutex(name)?;
        let mut future = if wait { mutex.lock() } else { mutex.try_lock() };
        // The first poll registers and sends the request; a free lock at a local grantor is
        // granted right away.
        match (&mut future).now_or_never() {
            Some(result) => self.finished(Done::Granted(name.to_owned(), result)),
            None => {
                if wait {
                    say(format_args!("WAITING {name}"));
                }
                self.requested.insert(name.to_owned());
                let name = name.to_owned();
                self.pending
                    .push(Box::pin(async move { Done::Granted(name, future.await) }));
            }
        }
        Ok(())
    }

    fn unlock(&mut self, name: &str) -> Result<(), String> {
        let guard = self
            .held
            .remove(name)
            .ok_or_else(|| format!("{name} is not held here"))?;
        let name = name.to_owned();
        self.pending.push(Box::pin(async move {
            Done::Released(name, guard.unlock().await)
        }));
        Ok(())
    }

    fn incr(&mut self, file: &str, name: &str, n: &str) -> Result<(), String> {
        let n: u64 = n.parse().map_err(|e| format!("count {n:?}: {e}"))?;
        if n > MAX_INCR {
            return Err(format!("count {n} is above {MAX_INCR}"));
        }
        let mutex = self.mutex(name)?;
        let file = PathBuf::from(file);
        let member = self.node.member_id().name().to_owned();
        let name = name.to_owned();
        self.pending.push(Box::pin(async move {
            let result = increment(&mutex, &file, n, &member).await;
            Done::Incremented(name, result.map(|()| n))
        }));
        Ok(())
    }

    fn work(&mut self, dir: &str, hold: &str, locks: &[&str]) -> Result<(), String> {
        if self.working.is_some() {
            return Err("work is in progress already".to_owned());
        }
        let hold = Duration::from_millis(hold.parse().map_err(|e| format!("hold {hold:?}: {e}"))?);
        let mutexes = locks
            .iter()
            .map(|name| Ok(((*name).to_owned(), self.mutex(name)?)))
            .collect::<Result<Vec<_>, String>>()?;
        let member = self.node.member_id().name().to_owned();
        let stop = Rc::new(Cell::new(false));
        self.working = Some(Rc::clone(&stop));
        let dir = PathBuf::from(dir);
        self.pending.push(Box::pin(async move {
            Done::Worked(work(&mutexes, &dir, hold, &member, &stop).await)
        }));
        Ok(())
    }

    fn fenced(
        &mut self,
        dir: &str,
        hold: &str,
        timeout: &str,
        locks: &[&str],
    ) -> Result<(), String> {
        if self.working.is_some() {
            return Err("work is in progress already".to_owned());
        }
        let ms = |w: &str| {
            w.parse()
                .map(Duration::from_millis)
                .map_err(|e| format!("{w:?}: {e}"))
        };
        let mutexes = locks
            .iter()
            .map(|name| Ok(((*name).to_owned(), self.mutex(name)?)))
            .collect::<Result<Vec<_>, String>>()?;
        let fenced = Rc::new(Fenced {
            dir: PathBuf::from(dir),
            node: self.node.member_id().name().to_owned(),
            hold: ms(hold)?,
            timeout: ms(timeout)?,
            broken: std::env::var("CONCLAVE_NEMESIS_BROKEN").as_deref() == Ok("ignore-lost"),
        });
        let stop = Rc::new(Cell::new(false));
        self.working = Some(Rc::clone(&stop));
        self.fenced = Some(Rc::clone(&fenced));
        self.pending.push(Box::pin(async move {
            Done::Worked(Ok(fenced.run(&mutexes, &stop).await))
        }));
        Ok(())
    }

    fn net_delay(&mut self, ms: &str, jitter: &str) -> Result<(), String> {
        let parse = |w: &str| w.parse::<u64>().map_err(|e| format!("{w:?}: {e}"));
        let (ms, jitter) = (parse(ms)?, parse(jitter)?);
        self.delay
            .set(Duration::from_millis(ms), Duration::from_millis(jitter));
        say(format_args!("NET {ms} {jitter}"));
        Ok(())
    }

    fn key(&mut self, action: &str, file: &str) -> Result<(), String> {
        let ring = self.node.keyring().ok_or("this node has no cluster key")?;
        let key = ClusterKey::from_file(file).map_err(|e| e.to_string())?;
        match action {
            "install" => ring.install(key).map(drop),
            "use" => ring.use_key(key.id()),
            "remove" => ring.remove(key.id()),
            _ => {
                return Err(format!(
                    "unknown key action {action:?}: install, use or remove"
                ))
            }
        }
        .map_err(|e| e.to_string())?;
        let ids: Vec<String> = ring.ids().iter().map(ToString::to_string).collect();
        say(format_args!("KEYS {} {}", ring.primary(), ids.join(" ")));
        Ok(())
    }

    fn stats(&self) {
        let s = self.node.seal_stats().unwrap_or_default();
        say(format_args!(
            "STATS {} {} {} {} {} {} {} {} {} {}",
            s.sealed,
            s.opened,
            s.failed_authentication,
            s.key_mismatch,
            s.replayed,
            s.stale_session,
            s.foreign,
            s.notices_sent,
            s.notices_received,
            resident_kib()
        ));
    }

    fn mutex(&self, name: &str) -> Result<DistributedMutex, String> {
        if self.pending.len() >= MAX_PENDING {
            return Err("too many operations in progress".to_owned());
        }
        self.node.mutex(name).map_err(|e| e.to_string())
    }

    /// Reports an operation that ended.
    fn finished(&mut self, done: Done) {
        match done {
            Done::Granted(name, result) => {
                self.requested.remove(&name);
                match result {
                    Ok(guard) => {
                        say(format_args!("GRANTED {name} {}", guard.fencing_token().0));
                        self.held.insert(name, guard);
                    }
                    Err(LockError::WouldBlock) => say(format_args!("BUSY {name}")),
                    Err(e) => say(format_args!("ERROR lock {name} {e}")),
                }
            }
            Done::Released(name, Ok(())) => say(format_args!("RELEASED {name}")),
            Done::Released(name, Err(e)) => say(format_args!("ERROR unlock {name} {e}")),
            Done::Incremented(name, Ok(n)) => say(format_args!("DONE incr {name} {n}")),
            Done::Incremented(name, Err(e)) => say(format_args!("ERROR incr {name} {e}")),
            Done::Worked(result) => {
                self.working = None;
                match result {
                    Ok(sections) => say(format_args!("STOPPED {sections}")),
                    Err(e) => say(format_args!("ERROR work {e}")),
                }
            }
        }
    }
}

/// `n` critical sections under `mutex`, each adding one to the integer in `file` and logging
/// its entry and exit with the fencing token to `<file>.log`.
async fn increment(
    mutex: &DistributedMutex,
    file: &Path,
    n: u64,
    member: &str,
) -> Result<(), String> {
    let mut log = file.as_os_str().to_owned();
    log.push(".log");
    let log = PathBuf::from(log);
    for _ in 0..n {
        let guard = mutex.lock().await.map_err(|e| format!("lock: {e}"))?;
        let token = guard.fencing_token().0;
        append(&log, &format!("enter {token} {member}\n"))?;
        let value = match std::fs::read_to_string(file) {
            Ok(text) => text
                .trim()
                .parse::<u64>()
                .map_err(|e| format!("counter {text:?}: {e}"))?,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => 0,
            Err(e) => return Err(format!("read {}: {e}", file.display())),
        };
        std::fs::write(file, format!("{}\n", value + 1))
            .map_err(|e| format!("write {}: {e}", file.display()))?;
        append(&log, &format!("exit {token} {member}\n"))?;
        guard.unlock().await.map_err(|e| format!("unlock: {e}"))?;
    }
    Ok(())
}

/// Critical sections on `mutexes` in turn (from one picked by the member name) until `stop`,
/// each logged to `<dir>/<lock>.log` with its token, its member and how long the grant took.
/// Returns how many it ran.
async fn work(
    mutexes: &[(String, DistributedMutex)],
    dir: &Path,
    hold: Duration,
    member: &str,
    stop: &Cell<bool>,
) -> Result<u64, String> {
    let mut next = member.bytes().map(usize::from).sum::<usize>();
    let mut sections = 0;
    while !stop.get() {
        let (name, mutex) = &mutexes[next % mutexes.len()];
        next += 1;
        let asked = std::time::Instant::now();
        let guard = mutex
            .lock()
            .await
            .map_err(|e| format!("lock {name}: {e}"))?;
        let waited = asked.elapsed().as_micros();
        let token = guard.fencing_token().0;
        let log = dir.join(format!("{name}.log"));
        append(&log, &format!("enter {token} {member} {waited}\n"))?;
        async_io::Timer::after(hold).await;
        append(&log, &format!("exit {token} {member}\n"))?;
        guard
            .unlock()
            .await
            .map_err(|e| format!("unlock {name}: {e}"))?;
        sections += 1;
    }
    Ok(sections)
}

/// Appends `line` to `path` with one write.
fn append(path: &Path, line: &str) -> Result<(), String> {
    std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .and_then(|mut f| f.write_all(line.as_bytes()))
        .map_err(|e| format!("append to {}: {e}", path.display()))
}

/// Lines of stdin, read on a thread of their own; a line longer than [`MAX_LINE`] is
/// reported as an error and skipped. The stream ends with the input.
fn stdin_lines() -> async_channel::Receiver<Result<String, String>> {
    let (sender, receiver) = async_channel::bounded(64);
    let spawned = std::thread::Builder::new()
        .name("stdin".to_owned())
        .spawn(move || {
            let mut stdin = std::io::stdin().lock();
            loop {
                let mut buf = Vec::new();
                let limit = MAX_LINE as u64 + 1;
                match (&mut stdin).take(limit).read_until(b'\n', &mut buf) {
                    Ok(0) | Err(_) => return,
                    Ok(_) => {}
                }
                let line = if buf.last() == Some(&b'\n') || buf.len() <= MAX_LINE {
                    Ok(String::from_utf8_lossy(&buf).into_owned())
                } else {
                    if skip_line(&mut stdin).is_err() {
                        return;
                    }
                    Err(format!("line longer than {MAX_LINE} bytes ignored"))
                };
                if sender.send_blocking(line).is_err() {
                    return;
                }
            }
        });
    if spawned.is_err() {
        say("ERROR - could not start the stdin reader");
    }
    receiver
}

/// Discards input up to and including the next newline, a buffer at a time.
fn skip_line(input: &mut impl BufRead) -> std::io::Result<()> {
    loop {
        let buf = input.fill_buf()?;
        if buf.is_empty() {
            return Ok(());
        }
        match buf.iter().position(|&b| b == b'\n') {
            Some(i) => {
                input.consume(i + 1);
                return Ok(());
            }
            None => {
                let n = buf.len();
                input.consume(n);
            }
        }
    }
}

/// This process's resident memory in KiB (Linux; 0 where unknown).
fn resident_kib() -> u64 {
    std::fs::read_to_string("/proc/self/statm")
        .ok()
        .and_then(|t| t.split_whitespace().nth(1)?.parse::<u64>().ok())
        .map_or(0, |pages| pages * 4)
}

/// `<name>#<incarnation>@<address>`.
fn member(id: &MemberId) -> String {
    format!("{}#{:032x}@{}", id.name(), id.incarnation(), id.addr())
}

/// `<epoch> <members...>`.
fn view_words(view: &View) -> String {
    let mut words = view.epoch().to_string();
    for m in view.members() {
        words.push(' ');
        words.push_str(&member(m));
    }
    words
}

/// Prints one line to stdout and flushes it; a closed stdout is ignored (the node quits at
/// the end of its input).
fn say(line: impl Display) {
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "{line}").and_then(|()| out.flush());
}
