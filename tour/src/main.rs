//! A narrated tour of Conclave over real UDP sockets on loopback (multicast discovery on
//! 127.0.0.1, TTL 0: nothing leaves the host): four nodes contend for a lock, the coordinator
//! (which is also the grantor) vanishes, the survivors rebuild the lock table and keep their
//! locks, and a partition heals with two holders of one lock, one of which is told it lost it.
//! Crashes and partitions are made with a fault table in front of each socket
//! ([`conclave::faults`]).
//!
//! Run: `cargo run --release -p conclave-tour`

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use conclave::faults::Faults;
use conclave::udp::UdpMulticast;
use conclave::{EndpointConfig, Founding, Node, View};
use futures::future::{select, Either};
use futures::StreamExt;

type Error = Box<dyn std::error::Error>;

fn main() -> Result<(), Error> {
    smol::block_on(demo())
}

async fn demo() -> Result<(), Error> {
    let start = Instant::now();
    let say = |text: String| println!("[{:>6.3} s] {text}", start.elapsed().as_secs_f64());
    let faults = Faults::new();

    println!("== four nodes join the cluster \"orders\" over UDP on loopback");
    let mut nodes = Vec::new();
    for name in ["alice", "bob", "carol", "dave"] {
        // The first member founds the cluster; the others must find it (a node that finds
        // nobody fails to join instead of founding a second cluster: see `Founding`).
        let founding = if nodes.is_empty() {
            Founding::Alone
        } else {
            Founding::WithOthers
        };
        let node = bounded(
            Node::builder("orders")
                .name(name)
                .transport(faults.wrap(UdpMulticast::loopback()?))
                .config(EndpointConfig::local())
                .founding(founding)
                .join(),
        )
        .await??;
        say(format!("{name} joined: {}", node.view().ok_or("no view")?));
        for other in &nodes {
            node_agrees(other, nodes.len() + 1).await?;
        }
        nodes.push(node);
    }
    node_agrees(&nodes[0], 4).await?;
    let view = nodes[0].view().ok_or("no view")?;
    say(format!(
        "everyone agrees on {view}; the grantor is its coordinator, {}",
        view.coordinator()
    ));

    println!("\n== three tasks on each node add 1 to a shared counter 5 times, under \"counter\"");
    let counter = Arc::new(AtomicU64::new(0));
    let mut tasks = Vec::new();
    for node in &nodes {
        let mutex = node.mutex("counter")?;
        for _ in 0..3 {
            let (mutex, counter) = (mutex.clone(), counter.clone());
            tasks.push(smol::spawn(async move {
                let mut last = None;
                for _ in 0..5 {
                    let guard = mutex.lock().await?;
                    let seen = counter.load(Ordering::SeqCst);
                    async_io::Timer::after(Duration::from_micros(100)).await;
                    counter.store(seen + 1, Ordering::SeqCst);
                    last = Some(guard.fencing_token());
                }
                Ok::<_, conclave::LockError>(last)
            }));
        }
    }
    let mut highest = None;
    for task in tasks {
        highest = highest.max(bounded(task).await??);
    }
    say(format!(
        "counter = {} (expected 60); last fencing token {}",
        counter.load(Ordering::SeqCst),
        highest.ok_or("no grant")?
    ));

    let grantor = nodes
        .iter()
        .position(|n| n.member_id() == view.coordinator())
        .ok_or("grantor not found")?;
    let dead = nodes.remove(grantor);
    let (holder, waiter) = (&nodes[0], &nodes[1]);
    println!(
        "\n== {} holds \"invoice-42\", {} waits for it; then {} (the grantor) crashes",
        holder.member_id().name(),
        waiter.member_id().name(),
        dead.member_id().name()
    );
    let held = bounded(holder.mutex("invoice-42")?.lock()).await??;
    say(format!(
        "{} holds invoice-42 with token {}",
        holder.member_id().name(),
        held.fencing_token()
    ));
    let waiter_mutex = waiter.mutex("invoice-42")?;
    let mut waiting = Box::pin(waiter_mutex.lock());
    assert!(futures::poll!(waiting.as_mut()).is_pending());
    faults.isolate(dead.member_id().addr());
    say(format!("{} no longer answers", dead.member_id().name()));
    let new_view = nodes_agree(&nodes).await?;
    say(format!("survivors installed {new_view}; {} is the new grantor and rebuilt the lock table from every member's report", new_view.coordinator()));
    say(format!(
        "{}'s lock is {:?}",
        holder.member_id().name(),
        held.status()
    ));
    drop(held);
    let served = bounded(waiting).await??;
    say(format!(
        "{} released it; {} was served from the rebuilt queue, token {}",
        holder.member_id().name(),
        waiter.member_id().name(),
        served.fencing_token()
    ));
    drop(served);
    drop(dead);

    println!(
        "\n== a partition splits {} from the others; both sides take \"report\"",
        nodes[0].member_id().name()
    );
    for node in &nodes {
        let name = node.member_id().name().to_owned();
        node.on_lock_lost(move |lost| {
            println!(
                "           handler on {name}: lost {} (token {}): {}",
                lost.name, lost.token, lost.reason
            );
        });
    }
    let addrs: Vec<_> = nodes.iter().map(|n| n.member_id().addr()).collect();
    faults.partition(&[&addrs[..1], &addrs[1..]]);
    nodes_agree(&nodes[..1]).await?;
    nodes_agree(&nodes[1..]).await?;
    let left = bounded(nodes[0].mutex("report")?.lock()).await??;
    let right = bounded(nodes[1].mutex("report")?.lock()).await??;
    say(format!(
        "{} holds report with token {}; {} holds it too, token {} (policy Available)",
        nodes[0].member_id().name(),
        left.fencing_token(),
        nodes[1].member_id().name(),
        right.fencing_token()
    ));
    faults.heal();
    let merged = nodes_agree(&nodes).await?;
    say(format!(
        "the partition healed; the coordinators merged into {merged}"
    ));
    let reason = bounded(async {
        match select(left.lost(), right.lost()).await {
            Either::Left((reason, _)) | Either::Right((reason, _)) => reason,
        }
    })
    .await?;
    say(format!(
        "one duplicate holder was kept; the other's guard says: {reason}; statuses now {:?} / {:?}",
        left.status(),
        right.status()
    ));
    drop((left, right));

    println!("\n== shutting down");
    for node in nodes {
        node.leave().await;
    }
    say("every node left and its thread ended".to_owned());
    Ok(())
}

/// `fut`, or an error after 20 s.
async fn bounded<T>(fut: impl std::future::Future<Output = T>) -> Result<T, Error> {
    let fut = std::pin::pin!(fut);
    match select(fut, async_io::Timer::after(Duration::from_secs(20))).await {
        Either::Left((value, _)) => Ok(value),
        Either::Right(_) => Err("timed out after 20 s".into()),
    }
}

/// Waits until `node` is in a view of `size` members.
async fn node_agrees(node: &Node, size: usize) -> Result<View, Error> {
    let mut views = node.views();
    bounded(async {
        while let Some(view) = views.next().await {
            if view.len() == size {
                return Ok(view);
            }
        }
        Err("node stopped".into())
    })
    .await?
}

/// Waits until all of `nodes` are in one view made of exactly them.
async fn nodes_agree(nodes: &[Node]) -> Result<View, Error> {
    bounded(async {
        loop {
            let views: Vec<Option<View>> = nodes.iter().map(Node::view).collect();
            if let Some(Some(first)) = views.first() {
                if first.len() == nodes.len() && views.iter().all(|v| v.as_ref() == Some(first)) {
                    return first.clone();
                }
            }
            let mut streams: Vec<_> = nodes.iter().map(Node::views).collect();
            let nexts = streams.iter_mut().map(|s| Box::pin(s.next()));
            let _ = futures::future::select_all(nexts).await;
        }
    })
    .await
}
