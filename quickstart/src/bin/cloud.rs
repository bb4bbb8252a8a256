//! Quick start, a cloud network without multicast, over the TCP mesh: run it on each machine
//! with the address it listens on and the addresses of one or more members to start from
//! (their listening addresses; any member found through them is found by all).
//!
//! ```text
//! cargo run --release -p conclave-quickstart --bin cloud -- 10.0.1.5:7800 10.0.1.6:7800 10.0.1.7:7800
//! ```

use std::net::SocketAddr;

use conclave::tcp::{TcpConfig, TcpMesh};
use conclave::{Node, PartitionPolicy};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let bind: SocketAddr = args
        .next()
        .ok_or("usage: cloud <listen address:port> <seed address:port>...")?
        .parse()?;
    let seeds = args
        .map(|seed| seed.parse())
        .collect::<Result<Vec<SocketAddr>, _>>()?;
    smol::block_on(async {
        let transport = TcpMesh::bind(&TcpConfig {
            bind,
            seeds,
            ..TcpConfig::loopback()
        })?;
        let node = Node::builder("reports")
            .transport(transport)
            .partition_policy(PartitionPolicy::Majority { cluster_size: 3 })
            .cluster_key_from_env()
            .join()
            .await?;
        let nightly = node.mutex("nightly-report")?;
        let guard = nightly.lock().await?;
        println!("{bind}: holding with token {}", guard.fencing_token());
        guard.unlock().await?;
        node.leave().await;
        Ok(())
    })
}
