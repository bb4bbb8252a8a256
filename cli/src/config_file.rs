//! The TOML config file: the same settings as the flags, plus the protocol's timings.

use std::net::{Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};

use serde::Deserialize;

use crate::args::{FoundingKind, PolicyKind, Timings, TransportKind};
use crate::duration::HumanDuration;
use crate::exit::CliError;

/// A config file. Every field is optional; unknown fields are refused (a typo would
/// otherwise be ignored silently).
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct ConfigFile {
    pub(crate) cluster: Option<String>,
    pub(crate) name: Option<String>,
    pub(crate) transport: Option<TransportKind>,
    pub(crate) bind: Option<SocketAddr>,
    pub(crate) key_file: Option<PathBuf>,
    pub(crate) data_dir: Option<PathBuf>,
    pub(crate) policy: Option<PolicyKind>,
    pub(crate) cluster_size: Option<usize>,
    pub(crate) founding: Option<FoundingKind>,
    pub(crate) timings: Option<Timings>,
    pub(crate) join_timeout: Option<HumanDuration>,
    #[serde(default)]
    pub(crate) udp: UdpSection,
    #[serde(default)]
    pub(crate) tcp: TcpSection,
    #[serde(default)]
    pub(crate) gms: GmsSection,
    #[serde(default)]
    pub(crate) locks: LocksSection,
}

/// `[udp]`: `conclave::udp::UdpConfig`'s fields.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct UdpSection {
    pub(crate) group: Option<Ipv4Addr>,
    pub(crate) port: Option<u16>,
    pub(crate) interface: Option<Ipv4Addr>,
    pub(crate) ttl: Option<u32>,
    pub(crate) max_datagram: Option<usize>,
}

/// `[tcp]`: `conclave::tcp::TcpConfig`'s fields.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct TcpSection {
    pub(crate) seeds: Option<Vec<SocketAddr>>,
    pub(crate) max_connections: Option<usize>,
    pub(crate) connect_timeout: Option<HumanDuration>,
    pub(crate) idle_timeout: Option<HumanDuration>,
}

/// `[gms]`: the membership timings of `EndpointConfig::gms`.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct GmsSection {
    pub(crate) heartbeat_interval: Option<HumanDuration>,
    pub(crate) suspect_timeout: Option<HumanDuration>,
    pub(crate) discovery_timeout: Option<HumanDuration>,
    pub(crate) announce_interval: Option<HumanDuration>,
    pub(crate) leave_timeout: Option<HumanDuration>,
    pub(crate) join_batch: Option<HumanDuration>,
}

/// `[locks]`: the lock settings of `EndpointConfig::locks`.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct LocksSection {
    pub(crate) lease: Option<HumanDuration>,
    pub(crate) lease_margin: Option<HumanDuration>,
    pub(crate) support_lease: Option<HumanDuration>,
    pub(crate) suspend_after: Option<HumanDuration>,
    pub(crate) reconcile_timeout: Option<HumanDuration>,
}

impl ConfigFile {
    /// Reads and parses `path`.
    ///
    /// # Errors
    /// [`CliError::Config`] naming the file and the problem.
    pub(crate) fn load(path: &Path) -> Result<Self, CliError> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| CliError::Config(format!("reading {}: {e}", path.display())))?;
        Self::parse(&text).map_err(|e| CliError::Config(format!("{}: {e}", path.display())))
    }

    /// Parses the text of a config file.
    pub(crate) fn parse(text: &str) -> Result<Self, toml::de::Error> {
        toml::from_str(text)
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[test]
    fn a_full_file_parses() {
        let file = ConfigFile::parse(
            r#"
            cluster = "orders"
            name = "worker-7"
            transport = "tcp"
            bind = "127.0.0.1:7800"
            policy = "majority"
            cluster_size = 3
            founding = "with-others"
            timings = "local"
            join_timeout = "20s"
            [tcp]
            seeds = ["127.0.0.1:7801", "127.0.0.1:7802"]
            [locks]
            lease = "8s"
            [gms]
            suspect_timeout = "1500ms"
            "#,
        )
        .expect("parses");
        assert_eq!(file.cluster.as_deref(), Some("orders"));
        assert_eq!(file.transport, Some(TransportKind::Tcp));
        assert_eq!(file.policy, Some(PolicyKind::Majority));
        assert_eq!(file.founding, Some(FoundingKind::WithOthers));
        assert_eq!(file.tcp.seeds.map(|s| s.len()), Some(2));
        assert_eq!(
            file.gms.suspect_timeout.map(|d| d.0),
            Some(Duration::from_millis(1500))
        );
    }

    #[test]
    fn a_typo_is_refused() {
        let error = ConfigFile::parse("clustr = \"orders\"").expect_err("unknown field");
        assert!(error.to_string().contains("clustr"), "{error}");
    }
}
