//! `conclave-tcp`: a Conclave membership backend over a full TCP mesh.
//!
//! For networks without multicast (most clouds): members find each other from a seed list and
//! keep one TCP connection per pair, carrying length-prefixed frames. The backend only moves
//! bytes; views, failure detection and locking live in `conclave-protocol`.
//!
//! Status: the crate is a placeholder until the TCP backend issue lands; it implements nothing yet.
