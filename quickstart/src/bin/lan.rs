//! Quick start, one LAN over UDP multicast: run it on each machine with that machine's own
//! address on the LAN. The members find each other on the multicast group, elect a
//! coordinator and take turns at the lock. Set `CONCLAVE_CLUSTER_KEY_FILE` to seal the traffic.
//!
//! ```text
//! cargo run --release -p conclave-quickstart --bin lan -- 192.168.1.20
//! ```

use std::net::Ipv4Addr;

use conclave::udp::{UdpConfig, UdpMulticast};
use conclave::{Node, PartitionPolicy};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let address: Ipv4Addr = std::env::args()
        .nth(1)
        .ok_or("usage: lan <this machine's address on the LAN>")?
        .parse()?;
    smol::block_on(async {
        let transport = UdpMulticast::bind(&UdpConfig::lan(address))?;
        let node = Node::builder("reports")
            .transport(transport)
            // Three machines: a lock is granted only with two of them in one view.
            .partition_policy(PartitionPolicy::Majority { cluster_size: 3 })
            .cluster_key_from_env()
            .join()
            .await?;
        let nightly = node.mutex("nightly-report")?;
        let guard = nightly.lock().await?;
        // Pass the token to whatever you write: it refuses writes from an older holder.
        println!("{address}: holding with token {}", guard.fencing_token());
        guard.unlock().await?;
        node.leave().await;
        Ok(())
    })
}
