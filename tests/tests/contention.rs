//! Waits for a lock that is contended at a node, read off the wire: once a wait there was
//! queued behind another owner, later waits that nobody watches ask the grantor not to send
//! `Queued` (one in eight still asks, so the node can learn the contention is over), and
//! every one of them is still granted, in order.

#![allow(clippy::unwrap_used)]

use std::net::SocketAddr;
use std::time::Duration;

use conclave::api::wire::{self, ClusterId, Frame, LockMessage, Message, Segment};
use conclave::memory::MemoryNetwork;
use conclave::{EndpointConfig, LockEvent, Node};
use conclave_tests::attacker::{Direction, Tap};
use conclave_tests::fixtures::agree;
use conclave_tests::{within, WAIT};
use futures::StreamExt;

const CLUSTER: &str = "quiet-waits";

/// Waits made after the lock was marked contended at the client.
const LATER_WAITS: usize = 16;

async fn join(transport: impl conclave::api::Transport, name: &str) -> Node {
    let builder = Node::builder(CLUSTER)
        .name(name)
        .transport(transport)
        .config(EndpointConfig::local())
        .join_timeout(WAIT);
    within(WAIT, "join", builder.join()).await.unwrap()
}

/// The `Queued` messages in the datagrams the tapped member sent to `to`.
fn queued_sent_to(tap: &Tap, to: SocketAddr) -> usize {
    let cluster = ClusterId::from_name(CLUSTER);
    let is_queued = |segment: &Segment| {
        matches!(
            wire::decode_message(&segment.payload.0),
            Ok(Message::Lock(LockMessage::Queued { .. }))
        )
    };
    tap.seen()
        .iter()
        .filter(|t| t.direction == Direction::Sent && t.peer == Some(to))
        .filter_map(|t| wire::decode_packet(cluster, &t.bytes).ok())
        .map(|packet| match packet.frame {
            Frame::Data(segment) => usize::from(is_queued(&segment)),
            Frame::Bundle(segments) => segments.iter().filter(|s| is_queued(s)).count(),
            _ => 0,
        })
        .sum()
}

/// A task that locks `hot` at `node`, lets go at once and returns the grant's token.
fn lock_and_release(node: &Node) -> smol::Task<conclave::FencingToken> {
    let mutex = node.mutex("hot").unwrap();
    smol::spawn(async move {
        let guard = mutex.lock().await.unwrap();
        guard.fencing_token()
    })
}

/// How many requests wait for `name` in the grantor's table, as `node` asks it.
async fn waiters(node: &Node, name: &str) -> usize {
    let table = within(WAIT, "the lock table", node.lock_table())
        .await
        .unwrap();
    table
        .locks
        .iter()
        .find(|l| l.name.as_str() == name)
        .map_or(0, |l| l.waiters.len())
}

#[test]
fn unwatched_waits_of_a_contended_lock_are_queued_without_a_queued_message() {
    smol::block_on(within(Duration::from_secs(60), "the scenario", async {
        let network = MemoryNetwork::new();
        let tap = Tap::new(network.transport());
        // The first member founds the view: it is the grantor.
        let nodes = vec![
            join(tap.clone(), "grantor").await,
            join(network.transport(), "client").await,
        ];
        agree(&nodes).await;
        let (grantor, client) = (&nodes[0], &nodes[1]);
        let to_client = client.member_id().addr();

        let hold = grantor.mutex("hot").unwrap().lock().await.unwrap();
        // The first wait at the client is watched: the grantor says it is queued, which marks
        // the lock contended there.
        let mut events = client.lock_events();
        let first = lock_and_release(client);
        within(WAIT, "Waiting", async {
            while let Some(event) = events.next().await {
                if matches!(event, LockEvent::Waiting { .. }) {
                    return;
                }
            }
            panic!("the event stream ended");
        })
        .await;
        drop(events);
        assert_eq!(queued_sent_to(&tap, to_client), 1);

        // Nobody listens any more: the later waits are quiet but for one in eight.
        let later: Vec<_> = (0..LATER_WAITS).map(|_| lock_and_release(client)).collect();
        within(WAIT, "every wait queued at the grantor", async {
            while waiters(grantor, "hot").await < 1 + LATER_WAITS {
                async_io::Timer::after(Duration::from_millis(5)).await;
            }
        })
        .await;
        assert_eq!(
            queued_sent_to(&tap, to_client),
            1 + LATER_WAITS / 8,
            "the first wait and one probe in eight are told; the others are quiet"
        );

        // Every wait is granted in turn once the holder lets go.
        drop(hold);
        let mut tokens = Vec::new();
        for wait in std::iter::once(first).chain(later) {
            tokens.push(within(WAIT, "a grant", wait).await);
        }
        tokens.sort();
        tokens.dedup();
        assert_eq!(tokens.len(), 1 + LATER_WAITS, "one grant each, none shared");
        for node in nodes {
            node.leave().await;
        }
    }));
}
