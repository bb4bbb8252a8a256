//! The front end over real UDP sockets on loopback (multicast with TTL 0 on 127.0.0.1), with a
//! discovery group and port of this test run alone.

#![allow(clippy::unwrap_used)]

mod common;

use std::net::Ipv4Addr;

use common::{agree, within, WAIT};
use conclave::udp::{UdpConfig, UdpMulticast};
use conclave::{EndpointConfig, LockError, Node};

fn config() -> UdpConfig {
    UdpConfig {
        group: Ipv4Addr::new(239, 255, 67, 201),
        port: 40_000 + (std::process::id() % 20_000) as u16,
        ..UdpConfig::loopback()
    }
}

#[test]
fn two_nodes_exclude_each_other_over_udp() {
    smol::block_on(async {
        let mut nodes = Vec::new();
        for name in ["udp-a", "udp-b"] {
            let transport = UdpMulticast::bind(&config()).unwrap();
            let node = within(
                WAIT,
                "join",
                Node::builder("conclave-front-end-udp-test")
                    .name(name)
                    .transport(transport)
                    .config(EndpointConfig::local())
                    .join(),
            )
            .await
            .unwrap();
            nodes.push(node);
        }
        agree(&[&nodes[0], &nodes[1]]).await;
        let (a, b) = (nodes[0].mutex("m").unwrap(), nodes[1].mutex("m").unwrap());
        let guard = within(WAIT, "lock", b.lock()).await.unwrap();
        assert_eq!(
            within(WAIT, "try_lock", a.try_lock()).await.unwrap_err(),
            LockError::WouldBlock
        );
        let mut waiting = Box::pin(a.lock());
        assert!(futures::poll!(waiting.as_mut()).is_pending());
        within(WAIT, "unlock", guard.unlock()).await.unwrap();
        let guard = within(WAIT, "the waiter is served", waiting).await.unwrap();
        drop(guard);
        for node in nodes {
            within(WAIT, "leave", node.leave()).await;
        }
    });
}
