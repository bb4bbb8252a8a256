//! The `redis` mode (issue 16): Conclave's lock beside a Redis lock on the same machine, in
//! alternating rounds, so that both see the same load. Needs `redis-server` on `PATH`
//! (Debian: `apt-get install redis-server`); the mode starts its own server on a free loopback
//! port, without persistence, and kills it by its PID when it ends.
//!
//! The Redis lock is the one Redis documents for a single instance: `SET key token NX PX ms`
//! takes it, and a Lua script deletes the key only if it still holds the taker's token
//! (`EVALSHA`). A taker that finds the lock taken asks again, either at once (Redis's best
//! case for handoffs per second: the server is asked all the time) or after a pause of 100 µs.
//! Conclave's contenders wait for their grant instead of asking again.
//!
//! Each round measures, for each system:
//! - uncontended, from this process: lock then unlock, the unlock awaited (acknowledged) before
//!   the next lock: the latency of the lock alone and of the pair;
//! - contended: four child processes loop lock/unlock on one lock for [`ROUND`]: handoffs per
//!   second, and the CPU time per handoff of every process involved (the four contenders and
//!   the grantor's process, or the four takers and the Redis server).
//!
//! Conclave runs over UDP and over the TCP mesh, each cluster a coordinator process (the
//! grantor) and the four contender processes, this process also a member for the uncontended
//! figures.
//!
//! Every round is measured in two regimes ([`Regime`]), one after the other: quiet, and with
//! a child process spinning on one core beside (a busy neighbour; see `neighbour.rs`). The
//! report gives each regime its floor (with its kind, fast or slow, see [`FloorKind`]), its
//! table, its summary lines and its pair of charts. `CONCLAVE_BENCH_REGIMES=quiet` (or
//! `neighbour`) measures one regime only.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use conclave::{DistributedMutex, Node};

use super::chart;
use super::contend::{count_and_cpu, cpu_time, cpu_time_of, per_handoff};
use super::neighbour::{FloorKind, Regime};
use super::{expect, join, load, micros, percentile, start_coordinator, Error, Floor, Mode, Proc};

/// Alternating rounds of every measurement.
const ROUNDS: usize = 5;
/// Length of one contended measurement.
const ROUND: Duration = Duration::from_secs(2);
/// Uncontended samples per round and system.
const SAMPLES: usize = 300;
/// Contending processes, as in the `udp` mode.
const CONTENDERS: usize = 4;
/// Lease of a Redis lock: far longer than any hold here, so that none expires.
const LEASE_MS: &str = "30000";
/// Pause of a backing-off Redis taker before it asks again.
const BACK_OFF: Duration = Duration::from_micros(100);
/// No Redis reply or server start waits longer.
const PATIENCE: Duration = Duration::from_secs(5);
/// Deletes the lock's key if it still holds the caller's token.
const RELEASE_SCRIPT: &str =
    "if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('del', KEYS[1]) else return 0 end";

/// A `redis-server` of this run, killed by its PID when dropped.
struct Server {
    child: Child,
    port: u16,
}

impl Server {
    fn start() -> Result<Self, Error> {
        // A free loopback port: bound, read, released.
        let port = TcpListener::bind("127.0.0.1:0")?.local_addr()?.port();
        let child = Command::new("redis-server")
            .args(["--bind", "127.0.0.1", "--port", &port.to_string()])
            .args(["--save", "", "--appendonly", "no", "--protected-mode", "yes"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| {
                format!("cannot start redis-server ({e}); install it, e.g. `apt-get install redis-server`")
            })?;
        let server = Self { child, port };
        let start = Instant::now();
        loop {
            if let Ok(mut client) = Redis::connect(port) {
                if client.command(&[b"PING"])? == Reply::Simple("PONG".into()) {
                    return Ok(server);
                }
            }
            if start.elapsed() > PATIENCE {
                return Err("redis-server did not answer within 5 s".into());
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A Redis reply (the kinds these commands get).
#[derive(Debug, PartialEq, Eq)]
enum Reply {
    Simple(String),
    Integer(i64),
    Bulk(Option<Vec<u8>>),
}

/// A blocking RESP client on one loopback connection with `TCP_NODELAY`.
struct Redis {
    writer: TcpStream,
    reader: BufReader<TcpStream>,
    request: Vec<u8>,
}

impl Redis {
    fn connect(port: u16) -> Result<Self, Error> {
        let stream = TcpStream::connect(("127.0.0.1", port))?;
        stream.set_nodelay(true)?;
        stream.set_read_timeout(Some(PATIENCE))?;
        Ok(Self {
            reader: BufReader::new(stream.try_clone()?),
            writer: stream,
            request: Vec::with_capacity(128),
        })
    }

    /// Sends one command and reads its reply; an error reply is an error.
    fn command(&mut self, args: &[&[u8]]) -> Result<Reply, Error> {
        self.request.clear();
        write!(self.request, "*{}\r\n", args.len())?;
        for arg in args {
            write!(self.request, "${}\r\n", arg.len())?;
            self.request.extend_from_slice(arg);
            self.request.extend_from_slice(b"\r\n");
        }
        self.writer.write_all(&self.request)?;
        let mut line = String::new();
        if self.reader.read_line(&mut line)? == 0 {
            return Err("redis closed the connection".into());
        }
        let line = line.trim_end();
        let (kind, rest) = line.split_at(1.min(line.len()));
        match kind {
            "+" => Ok(Reply::Simple(rest.to_owned())),
            ":" => Ok(Reply::Integer(rest.parse()?)),
            "$" => {
                let len: i64 = rest.parse()?;
                if len < 0 {
                    return Ok(Reply::Bulk(None));
                }
                let mut body = vec![0; usize::try_from(len)? + 2];
                self.reader.read_exact(&mut body)?;
                body.truncate(body.len() - 2);
                Ok(Reply::Bulk(Some(body)))
            }
            "-" => Err(format!("redis error: {rest}").into()),
            _ => Err(format!("unexpected redis reply {line:?}").into()),
        }
    }
}

/// One taker of the Redis lock: its connection, the release script's digest, its tokens.
struct RedisLock {
    client: Redis,
    script: Vec<u8>,
    token: u64,
    prefix: String,
}

impl RedisLock {
    fn connect(port: u16) -> Result<Self, Error> {
        let mut client = Redis::connect(port)?;
        let Reply::Bulk(Some(script)) =
            client.command(&[b"SCRIPT", b"LOAD", RELEASE_SCRIPT.as_bytes()])?
        else {
            return Err("SCRIPT LOAD gave no digest".into());
        };
        Ok(Self {
            client,
            script,
            token: 0,
            prefix: std::process::id().to_string(),
        })
    }

    /// One attempt to take `key`: its token if taken.
    fn try_lock(&mut self, key: &str) -> Result<Option<String>, Error> {
        self.token += 1;
        let token = format!("{}-{}", self.prefix, self.token);
        let reply = self.client.command(&[
            b"SET",
            key.as_bytes(),
            token.as_bytes(),
            b"NX",
            b"PX",
            LEASE_MS.as_bytes(),
        ])?;
        Ok((reply == Reply::Simple("OK".into())).then_some(token))
    }

    /// Releases `key` if it still holds `token`; an error if it did not (a lease ran out).
    fn unlock(&mut self, key: &str, token: &str) -> Result<(), Error> {
        let reply = self.client.command(&[
            b"EVALSHA",
            &self.script,
            b"1",
            key.as_bytes(),
            token.as_bytes(),
        ])?;
        match reply {
            Reply::Integer(1) => Ok(()),
            other => Err(format!("the lock was not ours at release: {other:?}").into()),
        }
    }
}

/// How a Redis taker that finds the lock taken asks again.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Retry {
    AtOnce,
    BackOff,
}

impl Retry {
    fn word(self) -> &'static str {
        match self {
            Retry::AtOnce => "at-once",
            Retry::BackOff => "back-off",
        }
    }
}

/// The child role `redis-taker <port> <at-once|back-off>`: says READY, then for every line
/// `go <ms>` loops lock/unlock on the key `hot` for `ms` and prints `COUNT <n> CPU <µs>`;
/// any other line ends it.
pub(crate) fn taker(port: &str, retry: &str) -> Result<(), Error> {
    let mut lock = RedisLock::connect(port.parse()?)?;
    let back_off = retry == Retry::BackOff.word();
    println!("READY");
    for line in std::io::stdin().lock().lines() {
        let Some(ms) = line?.strip_prefix("go ").map(str::parse::<u64>) else {
            break;
        };
        let run_for = Duration::from_millis(ms?);
        let start = Instant::now();
        let cpu = cpu_time();
        let mut count = 0u64;
        while start.elapsed() < run_for {
            match lock.try_lock("hot")? {
                Some(token) => {
                    lock.unlock("hot", &token)?;
                    count += 1;
                }
                None if back_off => std::thread::sleep(BACK_OFF),
                None => {}
            }
        }
        let cpu = cpu_time().saturating_sub(cpu).as_micros();
        println!("COUNT {count} CPU {cpu}");
    }
    Ok(())
}

/// One contended measurement's figures.
#[derive(Clone, Copy, Default)]
struct Contended {
    handoffs_per_sec: f64,
    cpu_per_handoff: Duration,
}

/// Four contender processes and whoever grants: a Conclave cluster's coordinator, or the
/// Redis server.
struct Contenders {
    procs: Vec<Proc>,
    grantor: Grantor,
}

enum Grantor {
    Member(Proc),
    Redis(u32),
}

impl Grantor {
    fn cpu(&mut self) -> Result<Duration, Error> {
        match self {
            Grantor::Member(p) => super::contend::child_cpu(p),
            Grantor::Redis(pid) => Ok(cpu_time_of(&pid.to_string())),
        }
    }
}

impl Contenders {
    /// One contended measurement of [`ROUND`].
    fn run(&mut self) -> Result<Contended, Error> {
        let grantor_cpu = self.grantor.cpu()?;
        let start = Instant::now();
        for p in &mut self.procs {
            p.send(&format!("go {}", ROUND.as_millis()))?;
        }
        let mut handoffs = 0;
        let mut cpu = Duration::ZERO;
        for p in &mut self.procs {
            let (count, used) = count_and_cpu(&p.line()?)?;
            handoffs += count;
            cpu += used;
        }
        let elapsed = start.elapsed();
        cpu += self.grantor.cpu()?.saturating_sub(grantor_cpu);
        Ok(Contended {
            handoffs_per_sec: handoffs as f64 / elapsed.as_secs_f64(),
            cpu_per_handoff: per_handoff(cpu, handoffs),
        })
    }

    fn stop(mut self) {
        for p in &mut self.procs {
            let _ = p.send("stop");
        }
    }
}

/// A Conclave cluster of this run: its coordinator, four hammers, and this process's member.
struct Cluster {
    contenders: Contenders,
    node: Node,
    mutex: DistributedMutex,
}

impl Cluster {
    async fn start(mode: Mode) -> Result<Self, Error> {
        let (coordinator, net) = start_coordinator(mode)?;
        let mut procs = Vec::new();
        for i in 0..CONTENDERS {
            // No run length of its own ("0"): each `go <ms>` line gives one.
            let mut p = Proc::spawn(&["hammer", &format!("h{i}"), &net.word(), "0"])?;
            expect(&mut p, "READY")?;
            procs.push(p);
        }
        let node = join("bench", &net).await?;
        let mutex = node.mutex("uncontended")?;
        for _ in 0..100 {
            drop(mutex.lock().await?); // warm-up
        }
        Ok(Self {
            contenders: Contenders {
                procs,
                grantor: Grantor::Member(coordinator),
            },
            node,
            mutex,
        })
    }

    /// Uncontended latencies: the lock alone, and lock plus awaited unlock (each lock starts
    /// after the previous unlock was acknowledged, as a Redis lock's does).
    async fn uncontended(
        &self,
        lock: &mut Vec<Duration>,
        pair: &mut Vec<Duration>,
    ) -> Result<(), Error> {
        for _ in 0..SAMPLES {
            let t = Instant::now();
            let guard = self.mutex.lock().await?;
            lock.push(t.elapsed());
            guard.unlock().await?;
            pair.push(t.elapsed());
        }
        Ok(())
    }
}

/// The Redis side: the server, this process's client, and the takers of each retry policy.
struct RedisSide {
    lock: RedisLock,
    at_once: Contenders,
    back_off: Contenders,
    _server: Server,
}

impl RedisSide {
    fn start() -> Result<Self, Error> {
        let server = Server::start()?;
        let pid = server.child.id();
        let port = server.port.to_string();
        let takers = |retry: Retry| -> Result<Contenders, Error> {
            let mut procs = Vec::new();
            for _ in 0..CONTENDERS {
                let mut p = Proc::spawn(&["redis-taker", &port, retry.word()])?;
                expect(&mut p, "READY")?;
                procs.push(p);
            }
            Ok(Contenders {
                procs,
                grantor: Grantor::Redis(pid),
            })
        };
        Ok(Self {
            lock: RedisLock::connect(server.port)?,
            at_once: takers(Retry::AtOnce)?,
            back_off: takers(Retry::BackOff)?,
            _server: server,
        })
    }

    fn uncontended(
        &mut self,
        lock: &mut Vec<Duration>,
        pair: &mut Vec<Duration>,
    ) -> Result<(), Error> {
        for _ in 0..SAMPLES {
            let t = Instant::now();
            let token = self
                .lock
                .try_lock("uncontended")?
                .ok_or("uncontended lock taken")?;
            lock.push(t.elapsed());
            self.lock.unlock("uncontended", &token)?;
            pair.push(t.elapsed());
        }
        Ok(())
    }
}

/// Figures of one system over all rounds.
#[derive(Default)]
struct Figures {
    lock: Vec<Duration>,
    pair: Vec<Duration>,
    contended: Vec<Contended>,
}

impl Figures {
    fn row(&mut self, name: &str, floor: Duration) {
        self.lock.sort();
        self.pair.sort();
        self.contended
            .sort_by(|a, b| a.handoffs_per_sec.total_cmp(&b.handoffs_per_sec));
        let median = self
            .contended
            .get(self.contended.len() / 2)
            .copied()
            .unwrap_or_default();
        let rates: Vec<String> = self
            .contended
            .iter()
            .map(|c| format!("{:.0}", c.handoffs_per_sec))
            .collect();
        println!(
            "| {name} | {:.1} µs | {:.1} µs | {:.0} ({}) | {:.2} | {:.1} µs |",
            micros(percentile(&self.lock, 0.5)),
            micros(percentile(&self.pair, 0.5)),
            median.handoffs_per_sec,
            rates.join(", "),
            median.handoffs_per_sec * floor.as_secs_f64(),
            micros(median.cpu_per_handoff),
        );
    }

    fn median_rate(&self) -> f64 {
        let mut rates: Vec<f64> = self.contended.iter().map(|c| c.handoffs_per_sec).collect();
        rates.sort_by(f64::total_cmp);
        rates.get(rates.len() / 2).copied().unwrap_or_default()
    }
}

/// Every system's figures in one [`Regime`], and the floor's.
struct RegimeFigures {
    regime: Regime,
    /// Every floor round trip of every round.
    rtts: Vec<Duration>,
    /// Each round's floor p50.
    round_floors: Vec<Duration>,
    conclave_udp: Figures,
    conclave_tcp: Figures,
    redis_at_once: Figures,
    redis_back_off: Figures,
}

impl RegimeFigures {
    fn new(regime: Regime) -> Self {
        Self {
            regime,
            rtts: Vec::new(),
            round_floors: Vec::new(),
            conclave_udp: Figures::default(),
            conclave_tcp: Figures::default(),
            redis_at_once: Figures::default(),
            redis_back_off: Figures::default(),
        }
    }

    /// One round of every measurement, with the regime's neighbour (if any) running beside.
    async fn round(
        &mut self,
        floor: &mut Floor,
        udp: &mut Cluster,
        tcp: &mut Cluster,
        redis: &mut RedisSide,
    ) -> Result<(), Error> {
        let _neighbour = self.regime.start()?;
        let mut rtts = Vec::with_capacity(SAMPLES);
        for _ in 0..SAMPLES {
            rtts.push(floor.round_trip()?);
        }
        rtts.sort();
        self.round_floors.push(percentile(&rtts, 0.5));
        self.rtts.extend(rtts);
        udp.uncontended(&mut self.conclave_udp.lock, &mut self.conclave_udp.pair)
            .await?;
        tcp.uncontended(&mut self.conclave_tcp.lock, &mut self.conclave_tcp.pair)
            .await?;
        redis.uncontended(&mut self.redis_at_once.lock, &mut self.redis_at_once.pair)?;
        self.conclave_udp.contended.push(udp.contenders.run()?);
        self.conclave_tcp.contended.push(tcp.contenders.run()?);
        self.redis_at_once.contended.push(redis.at_once.run()?);
        self.redis_back_off.contended.push(redis.back_off.run()?);
        Ok(())
    }

    /// Prints the regime's floor, table and summary, and writes its charts.
    fn report(&mut self) -> Result<(), Error> {
        self.rtts.sort();
        let floor_p50 = percentile(&self.rtts, 0.5);
        let rounds: Vec<String> = self
            .round_floors
            .iter()
            .map(|f| format!("{:.1}", micros(*f)))
            .collect();
        let name = self.regime.name();
        println!();
        println!("## {name}");
        println!(
            "floor: raw UDP ping-pong between two processes, p50 {:.1} µs (1/RTT ≈ {:.0}/s), regime {}; per round p50 (µs): {}",
            micros(floor_p50),
            1.0 / floor_p50.as_secs_f64(),
            FloorKind::of(floor_p50),
            rounds.join(" ")
        );
        println!();
        println!("| system | uncontended lock p50 | lock + unlock (awaited) p50 | contended, 4 processes: handoffs/s, median (each round) | ÷ (1/RTT) | CPU per handoff, all processes |");
        println!("|---|---|---|---|---|---|");
        self.conclave_udp.row("Conclave over UDP", floor_p50);
        self.conclave_tcp.row("Conclave over TCP", floor_p50);
        self.redis_at_once
            .row("Redis, takers ask again at once", floor_p50);
        // The backing-off takers share the uncontended figures of the same server.
        self.redis_back_off
            .lock
            .clone_from(&self.redis_at_once.lock);
        self.redis_back_off
            .pair
            .clone_from(&self.redis_at_once.pair);
        self.redis_back_off
            .row("Redis, takers pause 100 µs", floor_p50);
        self.charts()?;
        let redis = self.redis_at_once.median_rate();
        println!();
        println!(
            "{name}: contended handoffs/s, Conclave over UDP ÷ Redis (at once): {:.2}",
            self.conclave_udp.median_rate() / redis
        );
        println!(
            "{name}: contended handoffs/s, Conclave over TCP ÷ Redis (at once): {:.2}",
            self.conclave_tcp.median_rate() / redis
        );
        Ok(())
    }

    /// The regime's latency and handoff charts.
    fn charts(&self) -> Result<(), Error> {
        let systems = [
            ("Conclave over UDP", &self.conclave_udp),
            ("Conclave over TCP", &self.conclave_tcp),
            ("Redis, takers ask again at once", &self.redis_at_once),
            ("Redis, takers pause 100 µs", &self.redis_back_off),
        ];
        let (name, suffix) = (self.regime.name(), self.regime.chart_suffix());
        let pairs: Vec<(&str, &[Duration])> = systems[..3]
            .iter()
            .map(|(system, f)| (*system, f.pair.as_slice()))
            .collect();
        chart::write(
            &format!("bench-redis-latency{suffix}.svg"),
            &chart::latency(
                &format!("uncontended lock + unlock (awaited), loopback, {name}: min to p99, marks at p50 and p90"),
                &pairs,
            ),
        )?;
        let rates: Vec<(&str, f64)> = systems
            .iter()
            .map(|(system, f)| (*system, f.median_rate()))
            .collect();
        chart::write(
            &format!("bench-redis-handoffs{suffix}.svg"),
            &chart::rates(
                &format!(
                    "contended handoffs per second, 4 processes, {name} (median of the rounds)"
                ),
                "/s",
                &rates,
            ),
        )?;
        Ok(())
    }
}

/// The `redis` mode.
pub(crate) async fn run() -> Result<(), Error> {
    let regimes = Regime::from_env()?;
    let names: Vec<&str> = regimes.iter().map(|r| r.name()).collect();
    println!(
        "conclave bench, redis mode: Conclave (UDP and TCP) beside Redis on loopback, {ROUNDS} alternating rounds, each in every regime ({})",
        names.join(", ")
    );
    let mut redis = RedisSide::start()?;
    let version = Command::new("redis-server").arg("--version").output()?;
    let version = String::from_utf8_lossy(&version.stdout);
    let mut udp = Cluster::start(Mode::Udp).await?;
    let mut tcp = Cluster::start(Mode::Tcp).await?;
    let mut pong = Proc::spawn(&["pong", "UDP"])?;
    let mut floor = Floor::connect(Mode::Udp, &mut pong)?;

    let mut figures: Vec<RegimeFigures> = regimes.into_iter().map(RegimeFigures::new).collect();
    for round in 1..=ROUNDS {
        for regime in &mut figures {
            regime
                .round(&mut floor, &mut udp, &mut tcp, &mut redis)
                .await?;
        }
        println!("round {round} done, {}", load());
    }
    for cluster in [udp, tcp] {
        cluster.contenders.stop();
        cluster.node.leave().await;
    }

    println!("{}", version.trim());
    for regime in &mut figures {
        regime.report()?;
    }
    Ok(())
}
