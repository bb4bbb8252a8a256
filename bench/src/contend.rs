//! Contention beyond one task per process (issue 16): 16 tasks spread over four member
//! processes on one lock, and 8 tasks of one process on one lock whose grantor is another
//! process, with node-level caching off and on. Each is a handoff rate over
//! [`CONTENDED_FOR`], printed beside `1 / floor RTT` of the same run.

use std::time::{Duration, Instant};

use conclave::{DistributedMutex, Node};

use super::{expect, join, Error, Net, Proc, CONTENDED_FOR};

/// Tasks per member in the spread measurement.
const SPREAD_TASKS: usize = 4;
/// Child processes in the spread measurement (this process is the fourth member).
const SPREAD_CHILDREN: usize = 3;
/// Tasks of one process in the local measurement.
const LOCAL_TASKS: usize = 8;

/// The handoff rates measured.
pub(crate) struct Spread {
    handoffs_per_sec: f64,
}

/// The local measurement, caching off and on.
pub(crate) struct Local {
    plain: f64,
    cached: f64,
}

/// 16 tasks on one lock: [`SPREAD_TASKS`] in each of [`SPREAD_CHILDREN`] children and in this
/// process.
pub(crate) async fn spread(net: &Net, node: &Node) -> Result<Spread, Error> {
    let mut children = Vec::new();
    for i in 0..SPREAD_CHILDREN {
        let mut p = Proc::spawn(&[
            "tasks",
            &format!("s{i}"),
            &net.word(),
            &CONTENDED_FOR.as_millis().to_string(),
            &SPREAD_TASKS.to_string(),
            "spread",
        ])?;
        expect(&mut p, "READY")?;
        children.push(p);
    }
    let mutex = node.mutex("spread")?;
    for p in &mut children {
        p.send("go")?;
    }
    let start = Instant::now();
    let mut handoffs = hammer(&mutex, SPREAD_TASKS, CONTENDED_FOR).await?;
    for p in &mut children {
        handoffs += count(p)?;
    }
    let handoffs_per_sec = handoffs as f64 / start.elapsed().as_secs_f64();
    Ok(Spread { handoffs_per_sec })
}

/// [`LOCAL_TASKS`] tasks of this process on one lock, its grantor elsewhere: on `node`
/// (caching off), then on a second node of this process with node-level caching on.
pub(crate) async fn local(net: &Net, node: &Node) -> Result<Local, Error> {
    let plain = local_rate(node, "local-plain").await?;
    std::env::set_var("CONCLAVE_BENCH_CACHE", "1");
    let cached_node = join("bench-cached", net).await;
    std::env::remove_var("CONCLAVE_BENCH_CACHE");
    let cached_node = cached_node?;
    let cached = local_rate(&cached_node, "local-cached").await?;
    cached_node.leave().await;
    Ok(Local { plain, cached })
}

async fn local_rate(node: &Node, name: &str) -> Result<f64, Error> {
    let mutex = node.mutex(name)?;
    for _ in 0..100 {
        drop(mutex.lock().await?); // warm-up (and, with caching, the node grant)
    }
    let start = Instant::now();
    let handoffs = hammer(&mutex, LOCAL_TASKS, CONTENDED_FOR).await?;
    Ok(handoffs as f64 / start.elapsed().as_secs_f64())
}

/// `tasks` tasks on this thread, each looping lock/unlock for `run_for`; the acquisitions.
async fn hammer(mutex: &DistributedMutex, tasks: usize, run_for: Duration) -> Result<u64, Error> {
    let start = Instant::now();
    let loops = (0..tasks).map(|_| async {
        let mut count = 0u64;
        while start.elapsed() < run_for {
            drop(mutex.lock().await?);
            count += 1;
        }
        Ok::<u64, Error>(count)
    });
    let mut total = 0;
    for count in futures::future::join_all(loops).await {
        total += count?;
    }
    Ok(total)
}

fn count(p: &mut Proc) -> Result<u64, Error> {
    let line = p.line()?;
    Ok(line
        .strip_prefix("COUNT ")
        .ok_or("bad count")?
        .parse::<u64>()?)
}

/// The child role `tasks <name> <net> <ms> <tasks> <lock>`: joins, says READY, waits for a
/// line, runs `tasks` tasks on `lock` for `ms`, prints `COUNT <acquisitions>`.
pub(crate) fn child(args: &[String]) -> Result<(), Error> {
    let arg = |i: usize| args.get(i).map(String::as_str).ok_or("missing argument");
    smol::block_on(async {
        let node = join(arg(1)?, &Net::parse(arg(2)?)?).await?;
        let run_for = Duration::from_millis(arg(3)?.parse()?);
        let tasks: usize = arg(4)?.parse()?;
        let mutex = node.mutex(arg(5)?)?;
        println!("READY");
        let mut line = String::new();
        std::io::BufRead::read_line(&mut std::io::stdin().lock(), &mut line)?;
        let count = hammer(&mutex, tasks, run_for).await?;
        println!("COUNT {count}");
        node.leave().await;
        Ok(())
    })
}

/// CPU time this process has used (user and system, all threads), from `/proc/self/stat`
/// (zero where it cannot be read).
pub(crate) fn cpu_time() -> Duration {
    cpu_time_of("self")
}

/// CPU time process `pid` (a number, or `self`) has used, as [`cpu_time`].
pub(crate) fn cpu_time_of(pid: &str) -> Duration {
    let ticks = std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|stat| {
            // The fields after the command name (in parentheses, which may hold spaces).
            let rest = stat.rsplit_once(')')?.1;
            let fields: Vec<&str> = rest.split_whitespace().collect();
            let utime: u64 = fields.get(11)?.parse().ok()?;
            let stime: u64 = fields.get(12)?.parse().ok()?;
            Some(utime + stime)
        })
        .unwrap_or(0);
    // Linux reports these in clock ticks of 100 per second on every common configuration.
    Duration::from_millis(ticks * 10)
}

/// Parses a hammer's `COUNT <n> CPU <µs>` line.
pub(crate) fn count_and_cpu(line: &str) -> Result<(u64, Duration), Error> {
    let mut words = line.split_whitespace();
    let (Some("COUNT"), Some(count), Some("CPU"), Some(cpu)) =
        (words.next(), words.next(), words.next(), words.next())
    else {
        return Err(format!("bad count line {line:?}").into());
    };
    Ok((count.parse()?, Duration::from_micros(cpu.parse()?)))
}

/// Asks a `member` child for its CPU time so far.
pub(crate) fn child_cpu(p: &mut Proc) -> Result<Duration, Error> {
    p.send("cpu")?;
    let line = p.line()?;
    let micros = line
        .strip_prefix("CPU ")
        .ok_or_else(|| format!("expected CPU, child said {line:?}"))?;
    Ok(Duration::from_micros(micros.parse()?))
}

/// `total` spread over `handoffs` (none counts as one).
pub(crate) fn per_handoff(total: Duration, handoffs: u64) -> Duration {
    total / u32::try_from(handoffs.max(1)).unwrap_or(u32::MAX)
}

/// CPU time per handoff in the contended phase: all four contending processes together, and
/// the grantor's process. On a machine this small the handoff rate is bounded by CPU, so these
/// say more than the rate when other work shares the machine.
pub(crate) struct Cpu {
    contenders: Duration,
    grantor: Duration,
}

impl Cpu {
    pub(crate) fn per_handoff(contenders: Duration, grantor: Duration, handoffs: u64) -> Self {
        Self {
            contenders: per_handoff(contenders, handoffs),
            grantor: per_handoff(grantor, handoffs),
        }
    }

    pub(crate) fn print(&self) {
        println!(
            "| contended: CPU per handoff, 4 contending processes together / grantor process | {:.1} µs / {:.1} µs |",
            self.contenders.as_secs_f64() * 1e6,
            self.grantor.as_secs_f64() * 1e6
        );
    }
}

/// Prints the rows, with each rate as a ratio of `1 / floor`.
pub(crate) fn print(spread: &Spread, local: &Local, floor: Duration) {
    let per_rtt = |rate: f64| rate * floor.as_secs_f64();
    println!(
        "| 16 tasks over 4 processes on one lock: handoffs per second (÷ 1/RTT) | {:.0} ({:.2}) |",
        spread.handoffs_per_sec,
        per_rtt(spread.handoffs_per_sec)
    );
    println!(
        "| 8 local tasks on one lock, grantor elsewhere, caching off: handoffs per second (÷ 1/RTT) | {:.0} ({:.2}) |",
        local.plain,
        per_rtt(local.plain)
    );
    println!(
        "| 8 local tasks on one lock, grantor elsewhere, caching on: handoffs per second (÷ 1/RTT) | {:.0} ({:.2}) |",
        local.cached,
        per_rtt(local.cached)
    );
}
