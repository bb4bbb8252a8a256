//! Helpers shared by the integration tests: clusters on the in-memory transport, bounded waits
//! that work under any runtime, and spawners for each runtime.

#![allow(dead_code, unreachable_pub, clippy::unwrap_used)]

use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

use async_io::Timer;
use conclave::memory::MemoryNetwork;
use conclave::{EndpointConfig, Node, View};
use futures::future::{select, Either};
use futures::StreamExt;

/// The bound on any single wait in these tests.
pub const WAIT: Duration = Duration::from_secs(15);

/// A boxed task.
pub type Task = Pin<Box<dyn Future<Output = ()> + Send + 'static>>;

/// Runs a task on the runtime under test and returns a future of its end.
pub type Spawn = fn(Task) -> Task;

/// `fut`, or a panic naming `what` if it takes longer than `limit`. Uses async-io's timer, so
/// it works under any runtime.
pub async fn within<T>(limit: Duration, what: &str, fut: impl Future<Output = T>) -> T {
    let fut = std::pin::pin!(fut);
    match select(fut, Timer::after(limit)).await {
        Either::Left((value, _)) => value,
        Either::Right(_) => panic!("timed out after {limit:?}: {what}"),
    }
}

/// One node named `name` on `network`, with the fast one-host timings.
pub async fn node(network: &MemoryNetwork, cluster: &str, name: &str) -> Node {
    within(
        WAIT,
        "join",
        Node::builder(cluster)
            .name(name)
            .transport(network.transport())
            .config(EndpointConfig::local())
            .join(),
    )
    .await
    .expect("join")
}

/// `count` nodes named `<prefix>-<i>`, started one after the other, waiting until all of
/// them are in one view.
pub async fn cluster(network: &MemoryNetwork, prefix: &str, count: usize) -> Vec<Node> {
    let mut nodes = Vec::new();
    for i in 0..count {
        nodes.push(node(network, prefix, &format!("{prefix}-{i}")).await);
    }
    let refs: Vec<&Node> = nodes.iter().collect();
    agree(&refs).await;
    nodes
}

/// Waits until every node in `nodes` has installed the same view, made of exactly them.
pub async fn agree(nodes: &[&Node]) -> View {
    let wanted: std::collections::BTreeSet<_> =
        nodes.iter().map(|n| n.member_id().clone()).collect();
    let mut streams: Vec<_> = nodes.iter().map(|n| n.views()).collect();
    within(WAIT, "view agreement", async {
        let mut latest: Vec<Option<View>> = vec![None; nodes.len()];
        loop {
            let (view, i, _) =
                futures::future::select_all(streams.iter_mut().map(|s| Box::pin(s.next()))).await;
            latest[i] = view;
            if let Some(Some(first)) = latest.first() {
                let same = latest.iter().all(|v| v.as_ref() == Some(first));
                let members: std::collections::BTreeSet<_> =
                    first.members().iter().cloned().collect();
                if same && members == wanted {
                    return first.clone();
                }
            }
        }
    })
    .await
}

/// Spawns on smol's global executor.
pub fn smol_spawn(task: Task) -> Task {
    Box::pin(smol::spawn(task))
}

/// Spawns on async-std's global executor.
pub fn async_std_spawn(task: Task) -> Task {
    Box::pin(async_std::task::spawn(task))
}

/// Spawns on the current tokio runtime.
pub fn tokio_spawn(task: Task) -> Task {
    let handle = tokio::spawn(task);
    Box::pin(async move { handle.await.expect("task panicked") })
}

/// Names of this process's threads (Linux), as the kernel keeps them (15 bytes at most).
pub fn thread_names() -> Vec<String> {
    std::fs::read_dir("/proc/self/task")
        .map(|dir| {
            dir.filter_map(Result::ok)
                .filter_map(|e| std::fs::read_to_string(e.path().join("comm")).ok())
                .map(|s| s.trim_end().to_owned())
                .collect()
        })
        .unwrap_or_default()
}
