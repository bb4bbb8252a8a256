//! `conclave-udp`: a Conclave membership backend over UDP.
//!
//! Members find each other by multicast on a configurable group (by default on the loopback
//! interface with TTL 0, so nothing leaves the host) and talk by unicast datagrams. The
//! backend only moves bytes: reliability, ordering and fragmentation come from
//! `conclave-protocol`, which sizes fragments by [`conclave_lock_api::Transport::max_datagram_size`].
//!
//! Status: the crate is a placeholder until the UDP backend issue lands; it implements nothing yet.
