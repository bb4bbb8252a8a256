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
