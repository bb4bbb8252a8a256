//! `conclave-udp`: a Conclave membership backend over UDP.
//!
//! Members find each other by multicast on a configurable group and port, and talk by unicast
//! datagrams. By default the group is used on the loopback interface with TTL 0 and multicast
//! loop on, so **nothing leaves the host** unless the caller configures an interface and a
//! TTL. The backend only moves bytes: reliability, ordering and fragmentation come from
//! `conclave-protocol`, which cuts messages to
//! [`Transport::max_datagram_size`](conclave_lock_api::Transport::max_datagram_size).
//!
//! Two clusters with different names may share a group and port: every datagram carries its
//! cluster's id and the protocol drops foreign ones.
//!
//! ```no_run
//! use conclave_lock_api::Transport;
//! use conclave_udp::{UdpConfig, UdpMulticast};
//!
//! # fn main() -> std::io::Result<()> {
//! let transport = UdpMulticast::bind(&UdpConfig::loopback())?;
//! println!("members reach me at {}", transport.local_addr());
//! # Ok(())
//! # }
//! ```

mod config;
mod transport;

pub use config::{UdpConfig, UdpConfigError};
pub use transport::UdpMulticast;
