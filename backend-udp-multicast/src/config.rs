//! Settings of the UDP backend.

use std::net::{Ipv4Addr, SocketAddr};

use thiserror::Error;

/// Where the UDP backend binds and multicasts.
///
/// The defaults ([`UdpConfig::loopback`]) keep everything on this host: unicast on
/// `127.0.0.1` with an ephemeral port, discovery on group `239.255.67.76:45588` over the
/// loopback interface with TTL 0. To span the machines of one network, start from
/// [`UdpConfig::lan`] with the interface's address: it sets [`UdpConfig::bind`] and
/// [`UdpConfig::interface`] to it, [`UdpConfig::ttl`] to 1 and [`UdpConfig::max_datagram`] to
/// an Ethernet frame's worth.
///
/// # The member's address
/// The unicast socket's address ([`UdpConfig::bind`], with the real port once bound) is where
/// other members send to this one and becomes part of its id
/// ([`MemberId`](conclave_lock_api::MemberId)). So it must be one concrete address: an
/// unspecified IP (`0.0.0.0`) is refused ([`UdpConfigError::UnspecifiedBind`]) rather than
/// advertised, and rather than guessed from [`UdpConfig::interface`] (a socket bound to all
/// addresses sends from whichever the route picks, which need not be the one advertised).
/// Bind to the address of the interface the members share, usually the same as `interface`.
///
/// ```
/// use conclave_udp::{UdpConfig, UdpConfigError};
///
/// let config = UdpConfig { bind: "0.0.0.0:7800".parse().unwrap(), ..UdpConfig::loopback() };
/// assert_eq!(config.validate(), Err(UdpConfigError::UnspecifiedBind(config.bind)));
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct UdpConfig {
    /// The unicast socket's address: where other members send to this one, and part of its id.
    /// IPv4, not unspecified (see [the member's address](UdpConfig#the-members-address)); the
    /// port may be 0 (the system picks one). Default `127.0.0.1:0`.
    pub bind: SocketAddr,
    /// The multicast group of discovery. Default `239.255.67.76` (IPv4 local scope).
    pub group: Ipv4Addr,
    /// The discovery port, shared by every member of the cluster. Default 45588.
    pub port: u16,
    /// The interface multicast is sent and received on. Default `127.0.0.1`.
    pub interface: Ipv4Addr,
    /// Multicast TTL: 0 keeps datagrams on this host, 1 on the local network. Default 0.
    pub ttl: u32,
    /// Whether this host's own members receive its multicast (needed for several members per
    /// host). Default true.
    pub multicast_loop: bool,
    /// The largest datagram sent, in bytes. Default 65,000 (loopback carries 64 KiB); use
    /// about 1,400 on Ethernet so datagrams are not fragmented by IP.
    pub max_datagram: usize,
}

impl Default for UdpConfig {
    fn default() -> Self {
        Self::loopback()
    }
}

impl UdpConfig {
    /// Everything on the loopback interface, TTL 0: a cluster of processes on this host.
    pub fn loopback() -> Self {
        Self {
            bind: SocketAddr::from(([127, 0, 0, 1], 0)),
            group: Ipv4Addr::new(239, 255, 67, 76),
            port: 45588,
            interface: Ipv4Addr::LOCALHOST,
            ttl: 0,
            multicast_loop: true,
            max_datagram: 65_000,
        }
    }

    /// A cluster on one local network: the unicast socket on `interface` (its address,
    /// an ephemeral port), discovery on the default group and port over `interface`, TTL 1
    /// (one hop: multicast stays on the LAN, routers do not forward it), datagrams of at
    /// most 1,400 bytes so that Ethernet (MTU 1,500) carries each in one frame. Give every
    /// member its own interface address; the group and port must be the same on all.
    ///
    /// ```
    /// use std::net::Ipv4Addr;
    /// use conclave_udp::UdpConfig;
    ///
    /// let config = UdpConfig::lan(Ipv4Addr::new(192, 168, 1, 20));
    /// assert_eq!(config.bind, "192.168.1.20:0".parse().unwrap());
    /// assert_eq!((config.ttl, config.max_datagram), (1, 1_400));
    /// assert!(config.validate().is_ok());
    /// ```
    pub fn lan(interface: Ipv4Addr) -> Self {
        Self {
            bind: SocketAddr::from((interface, 0)),
            interface,
            ttl: 1,
            max_datagram: 1_400,
            ..Self::loopback()
        }
    }

    /// Checks the settings.
    ///
    /// # Errors
    /// [`UdpConfigError`] naming the first problem.
    pub fn validate(&self) -> Result<(), UdpConfigError> {
        if !self.group.is_multicast() {
            return Err(UdpConfigError::NotMulticast(self.group));
        }
        if self.port == 0 {
            return Err(UdpConfigError::ZeroPort);
        }
        if !(512..=65_507).contains(&self.max_datagram) {
            return Err(UdpConfigError::DatagramSize(self.max_datagram));
        }
        if !self.bind.is_ipv4() {
            return Err(UdpConfigError::NotIpv4(self.bind));
        }
        if self.bind.ip().is_unspecified() {
            return Err(UdpConfigError::UnspecifiedBind(self.bind));
        }
        Ok(())
    }
}

/// A [`UdpConfig`] was rejected.
#[derive(Clone, Debug, PartialEq, Eq, Error)]
#[non_exhaustive]
pub enum UdpConfigError {
    /// The group is not a multicast address (224.0.0.0/4).
    #[error("UdpConfig::group {0} is not a multicast address (224.0.0.0/4)")]
    NotMulticast(Ipv4Addr),
    /// The discovery port must be fixed and shared: not 0.
    #[error("UdpConfig::port, the discovery port every member shares, must not be 0")]
    ZeroPort,
    /// The datagram size is outside 512..=65,507 bytes.
    #[error("UdpConfig::max_datagram {0} is outside 512..=65507")]
    DatagramSize(usize),
    /// Only IPv4 is supported for now.
    #[error("UdpConfig::bind {0} is not an IPv4 address")]
    NotIpv4(SocketAddr),
    /// The unicast address is `0.0.0.0`: members could not tell where to send to this one
    /// (see [the member's address](UdpConfig#the-members-address)).
    #[error(
        "UdpConfig::bind {0} is unspecified: bind to the address other members send to, \
         which becomes part of this member's id (usually the address of UdpConfig::interface)"
    )]
    UnspecifiedBind(SocketAddr),
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_stay_on_this_host() {
        let c = UdpConfig::default();
        assert!(c.bind.ip().is_loopback());
        assert!(c.interface.is_loopback());
        assert_eq!(c.ttl, 0);
        assert_eq!(c.validate(), Ok(()));
    }

    #[test]
    fn bad_settings_are_named() {
        let c = UdpConfig {
            group: Ipv4Addr::new(10, 0, 0, 1),
            ..UdpConfig::loopback()
        };
        assert_eq!(
            c.validate(),
            Err(UdpConfigError::NotMulticast(Ipv4Addr::new(10, 0, 0, 1)))
        );
        let c = UdpConfig {
            port: 0,
            ..UdpConfig::loopback()
        };
        assert_eq!(c.validate(), Err(UdpConfigError::ZeroPort));
        let c = UdpConfig {
            max_datagram: 100,
            ..UdpConfig::loopback()
        };
        assert_eq!(c.validate(), Err(UdpConfigError::DatagramSize(100)));
    }

    #[test]
    fn an_unspecified_bind_is_refused_naming_the_setting() {
        let bind: SocketAddr = "0.0.0.0:0".parse().unwrap();
        let c = UdpConfig {
            bind,
            interface: Ipv4Addr::new(192, 0, 2, 1),
            ..UdpConfig::loopback()
        };
        assert_eq!(c.validate(), Err(UdpConfigError::UnspecifiedBind(bind)));
        let text = UdpConfigError::UnspecifiedBind(bind).to_string();
        assert!(
            text.starts_with("UdpConfig::bind 0.0.0.0:0 is unspecified"),
            "{text}"
        );
        // The multicast interface may be left to the system: it is not the member's address.
        let c = UdpConfig {
            interface: Ipv4Addr::UNSPECIFIED,
            ..UdpConfig::loopback()
        };
        assert_eq!(c.validate(), Ok(()));
    }
}
