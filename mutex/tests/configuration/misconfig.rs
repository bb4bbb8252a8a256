//! One test per misconfiguration of the guide's table "When the configuration is wrong".

use std::net::{Ipv4Addr, SocketAddr, TcpListener};
use std::time::Duration;

use conclave::api::{DiscoveryOutcome, DiscoveryPlace};
use conclave::memory::MemoryNetwork;
use conclave::tcp::TcpMesh;
use conclave::udp::{UdpConfig, UdpMulticast};
use conclave::{EndpointConfig, Founding, LockError, Node, NodeError, PartitionPolicy};

use crate::common::{node, within, WAIT};

/// How long a join that hears nobody looks before it fails, in these tests.
const NOBODY: Duration = Duration::from_millis(1500);

/// A discovery group and port of this test process alone.
fn udp_config(test: u16) -> UdpConfig {
    UdpConfig {
        group: Ipv4Addr::new(239, 255, 67, 221),
        port: 20_000 + (std::process::id() % 20_000) as u16 + test,
        ..UdpConfig::loopback()
    }
}

/// A loopback address nobody listens on (a listener bound and closed again).
fn dead_address() -> SocketAddr {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
}

/// The lock `name` on `node` can be taken and is not held by anyone else.
async fn lock_is_free(node: &Node, name: &str) {
    let mutex = node.mutex(name).unwrap();
    let guard = within(WAIT, "lock", mutex.lock()).await.unwrap();
    guard.unlock().await.unwrap();
}

/// Joins cluster `cluster` over `transport` with the one-host timings, expecting it to find
/// nobody: returns the error and the places it names.
async fn join_finding_nobody(
    cluster: &str,
    transport: impl conclave::api::Transport,
) -> (NodeError, Vec<conclave::DiscoveryReport>) {
    let error = within(
        WAIT,
        "join",
        Node::builder(cluster)
            .transport(transport)
            .config(EndpointConfig::local())
            .join_timeout(NOBODY)
            .join(),
    )
    .await
    .unwrap_err();
    let NodeError::NoCluster { places, .. } = &error else {
        panic!("expected NoCluster, got {error:?}");
    };
    let places = places.clone();
    (error, places)
}

#[test]
fn a_udp_node_alone_on_its_group_fails_naming_the_group() {
    smol::block_on(async {
        let (error, places) = join_finding_nobody(
            "misconfig-udp-alone",
            UdpMulticast::bind(&udp_config(0)).unwrap(),
        )
        .await;
        assert!(
            matches!(&error, NodeError::NoCluster { cluster, .. } if cluster == "misconfig-udp-alone")
        );
        assert_eq!(places.len(), 1, "{places:?}");
        assert!(matches!(places[0].place, DiscoveryPlace::Multicast { .. }));
        assert_eq!(places[0].outcome, DiscoveryOutcome::NoAnswer);
        assert!(
            error.to_string().contains("multicast group 239.255.67.221"),
            "{error}"
        );
    });
}

#[test]
fn an_unreachable_seed_fails_the_join_naming_the_seed_and_the_error() {
    smol::block_on(async {
        let dead = dead_address();
        let (error, places) =
            join_finding_nobody("misconfig-dead-seed", TcpMesh::loopback([dead]).unwrap()).await;
        assert_eq!(places.len(), 1);
        assert_eq!(places[0].place, DiscoveryPlace::Seed(dead));
        assert!(
            matches!(&places[0].outcome, DiscoveryOutcome::Unreachable(why) if why.contains("refused")),
            "{places:?}"
        );
        assert!(error.to_string().contains(&dead.to_string()), "{error}");
    });
}

#[test]
fn a_seed_of_another_cluster_fails_the_join() {
    smol::block_on(async {
        let other = Node::builder("misconfig-someone-else")
            .transport(TcpMesh::loopback([]).unwrap())
            .config(EndpointConfig::local())
            .join()
            .await
            .unwrap();
        let seed = other.member_id().addr();
        let (_, places) =
            join_finding_nobody("misconfig-ours", TcpMesh::loopback([seed]).unwrap()).await;
        assert_eq!(places[0].place, DiscoveryPlace::Seed(seed));
        assert_ne!(places[0].outcome, DiscoveryOutcome::Answered, "{places:?}");
        // The other cluster was not joined and still grants its own locks.
        assert_eq!(other.view().map(|v| v.len()), Some(1));
        lock_is_free(&other, "job").await;
        other.leave().await;
    });
}

#[test]
fn a_node_that_may_never_found_fails_alone_even_where_it_could() {
    smol::block_on(async {
        let network = MemoryNetwork::new();
        let error = within(
            WAIT,
            "join",
            Node::builder("misconfig-never")
                .transport(network.transport())
                .config(EndpointConfig::local())
                .founding(Founding::Never)
                .join_timeout(NOBODY)
                .join(),
        )
        .await
        .unwrap_err();
        assert!(
            matches!(&error, NodeError::NoCluster { places, .. } if places.is_empty()),
            "{error:?}"
        );
    });
}

/// A cluster of one on `network` with `policy`, holding the lock `held`.
async fn cluster_holding(
    network: &MemoryNetwork,
    cluster: &str,
    config: EndpointConfig,
) -> (Node, conclave::MutexGuard) {
    let first = Node::builder(cluster)
        .transport(network.transport())
        .config(config)
        .join()
        .await
        .unwrap();
    first.wait_until_serving().await;
    let guard = within(WAIT, "lock", first.mutex("held").unwrap().lock())
        .await
        .unwrap();
    (first, guard)
}

/// Joins a second member with `config` and returns its error, checking the first member's
/// view and lock are untouched.
async fn refused(
    network: &MemoryNetwork,
    cluster: &str,
    first: EndpointConfig,
    second: EndpointConfig,
) -> NodeError {
    let (node, guard) = cluster_holding(network, cluster, first).await;
    let error = within(
        WAIT,
        "join",
        Node::builder(cluster)
            .transport(network.transport())
            .config(second)
            .join(),
    )
    .await
    .unwrap_err();
    assert_eq!(node.view().map(|v| v.len()), Some(1));
    assert_eq!(guard.status(), conclave::LockStatus::Held);
    guard.unlock().await.unwrap();
    node.leave().await;
    error
}

#[test]
fn a_joiner_with_another_partition_policy_is_refused() {
    smol::block_on(async {
        let network = MemoryNetwork::new();
        let mut majority = EndpointConfig::local();
        majority.locks.policy = PartitionPolicy::Majority { cluster_size: 2 };
        let error = refused(
            &network,
            "misconfig-policy",
            EndpointConfig::local(),
            majority,
        )
        .await;
        let NodeError::SettingMismatch {
            setting,
            cluster_value,
            our_value,
            ..
        } = &error
        else {
            panic!("expected SettingMismatch, got {error:?}");
        };
        assert_eq!(setting, "partition_policy");
        assert_eq!(cluster_value, "Available");
        assert_eq!(our_value, "Majority { cluster_size: 2 }");
        let text = error.to_string();
        assert!(
            text.contains("partition_policy") && text.contains("Available"),
            "{text}"
        );
    });
}

#[test]
fn a_joiner_with_another_cluster_size_is_refused() {
    smol::block_on(async {
        let network = MemoryNetwork::new();
        let mut three = EndpointConfig::local();
        three.locks.policy = PartitionPolicy::Majority { cluster_size: 1 };
        let mut five = EndpointConfig::local();
        five.locks.policy = PartitionPolicy::Majority { cluster_size: 5 };
        let error = refused(&network, "misconfig-size", three, five).await;
        assert!(
            matches!(&error, NodeError::SettingMismatch { setting, our_value, .. }
                if setting == "partition_policy" && our_value == "Majority { cluster_size: 5 }"),
            "{error:?}"
        );
    });
}

#[test]
fn a_joiner_with_another_lease_is_refused() {
    smol::block_on(async {
        let network = MemoryNetwork::new();
        let mut longer = EndpointConfig::local();
        longer.locks.lease = Duration::from_secs(5);
        let error = refused(&network, "misconfig-lease", EndpointConfig::local(), longer).await;
        assert!(
            matches!(&error, NodeError::SettingMismatch { setting, cluster_value, our_value, .. }
                if setting == "lease" && cluster_value == "1.2s" && our_value == "5s"),
            "{error:?}"
        );
    });
}

#[test]
fn the_policy_survives_a_config_given_after_it() {
    smol::block_on(async {
        let network = MemoryNetwork::new();
        let node = Node::builder("misconfig-order")
            .transport(network.transport())
            .partition_policy(PartitionPolicy::Majority { cluster_size: 3 })
            .config(EndpointConfig::local())
            .join()
            .await
            .unwrap();
        // One member of three: no majority, so nothing is granted and no member may take the
        // grantor role (under `Available` both would succeed).
        let mutex = node.mutex("job").unwrap();
        assert_eq!(mutex.try_lock().await.err(), Some(LockError::NotMember));
        assert!(node.become_grantor().await.is_err());
        node.leave().await;
    });
}

#[test]
fn a_setting_given_twice_with_different_values_is_refused() {
    smol::block_on(async {
        let network = MemoryNetwork::new();
        let mut majority = EndpointConfig::local();
        majority.locks.policy = PartitionPolicy::Majority { cluster_size: 3 };
        let error = Node::builder("misconfig-twice")
            .transport(network.transport())
            .config(majority)
            .partition_policy(PartitionPolicy::Majority { cluster_size: 5 })
            .join()
            .await
            .unwrap_err();
        assert!(
            matches!(
                error,
                NodeError::ConflictingSettings {
                    setting: "partition_policy",
                    ..
                }
            ),
            "{error:?}"
        );
    });
}

#[test]
fn a_member_of_a_matching_cluster_still_joins() {
    smol::block_on(async {
        let network = MemoryNetwork::new();
        let a = node(&network, "misconfig-match", "a").await;
        let b = node(&network, "misconfig-match", "b").await;
        assert_eq!(b.view().map(|v| v.len()), Some(2));
        b.leave().await;
        a.leave().await;
    });
}

#[test]
fn an_empty_or_unprintable_cluster_name_is_refused() {
    smol::block_on(async {
        let network = MemoryNetwork::new();
        for name in ["", "orders\nprod"] {
            let error = Node::builder(name)
                .transport(network.transport())
                .config(EndpointConfig::local())
                .join()
                .await
                .unwrap_err();
            assert!(
                matches!(error, NodeError::InvalidClusterName(_)),
                "{name:?}: {error:?}"
            );
        }
        let long = "c".repeat(65);
        let error = Node::builder(long)
            .transport(network.transport())
            .join()
            .await
            .unwrap_err();
        assert!(
            matches!(error, NodeError::InvalidClusterName(_)),
            "{error:?}"
        );
    });
}

#[test]
fn an_unprintable_lock_name_is_refused_and_nothing_is_granted() {
    smol::block_on(async {
        let network = MemoryNetwork::new();
        let node = node(&network, "misconfig-lock-name", "a").await;
        assert!(matches!(
            node.mutex("a\nb").err(),
            Some(conclave::LockNameError::ControlCharacter)
        ));
        assert!(node.mutex("").is_err());
        assert!(node.mutex("x".repeat(256)).is_err());
        assert!(node.held_locks().is_empty());
        node.leave().await;
    });
}

#[test]
fn udp_refuses_an_unspecified_bind_address_naming_the_setting() {
    let config = UdpConfig {
        bind: "0.0.0.0:0".parse().unwrap(),
        ..udp_config(1)
    };
    let error = UdpMulticast::bind(&config).unwrap_err();
    assert!(error.to_string().contains("UdpConfig::bind"), "{error}");
}

#[test]
fn a_tcp_bind_to_an_address_in_use_names_the_setting_and_the_address() {
    let taken = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = taken.local_addr().unwrap();
    let config = conclave::tcp::TcpConfig {
        bind: addr,
        ..conclave::tcp::TcpConfig::loopback()
    };
    let error = TcpMesh::bind(&config).unwrap_err();
    let text = error.to_string();
    assert!(
        text.contains("TcpConfig::bind") && text.contains(&addr.to_string()),
        "{text}"
    );
}
