//! The faults the harness injects from inside the namespace: packet loss and partitions with
//! nftables, signals, and garbage bytes at a member's port.

use std::io::Write;
use std::net::{Ipv4Addr, SocketAddr, TcpStream, UdpSocket};
use std::process::{Command, Stdio};
use std::time::Duration;

use super::rng::Rng;

/// The table the harness owns: `output` jumps to `loss` and `part`, which faults fill and heal
/// empties. On loopback every packet passes `output` once.
pub const NFT_SETUP: &str = "\
add table inet nemesis
add chain inet nemesis loss
add chain inet nemesis part
add chain inet nemesis output { type filter hook output priority 0; policy accept; }
add rule inet nemesis output jump loss
add rule inet nemesis output jump part
";

/// Runs an nft script.
///
/// # Errors
/// nft could not be run or refused the script.
pub fn nft(script: &str) -> Result<(), String> {
    let mut child = Command::new("nft")
        .args(["-f", "-"])
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| format!("nft: {e}"))?;
    if let Some(mut stdin) = child.stdin.take() {
        stdin
            .write_all(script.as_bytes())
            .map_err(|e| format!("nft stdin: {e}"))?;
    }
    let out = child.wait_with_output().map_err(|e| format!("nft: {e}"))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "nft: {}: {script}",
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}

/// Drops `percent` % of all packets (0 heals).
///
/// # Errors
/// As [`nft`].
pub fn set_loss(percent: u64) -> Result<(), String> {
    let mut script = "flush chain inet nemesis loss\n".to_owned();
    if percent > 0 {
        script.push_str(&format!(
            "add rule inet nemesis loss numgen random mod 100 < {percent} drop\n"
        ));
    }
    nft(&script)
}

/// Drops every packet from each `from` address to each `to` address (one way); an empty list
/// heals. Multicast discovery (to the group address) is not cut: nft sees no receiver there.
///
/// # Errors
/// As [`nft`].
pub fn set_partition(cuts: &[(Ipv4Addr, Ipv4Addr)]) -> Result<(), String> {
    let mut script = "flush chain inet nemesis part\n".to_owned();
    for (from, to) in cuts {
        script.push_str(&format!(
            "add rule inet nemesis part ip saddr {from} ip daddr {to} drop\n"
        ));
    }
    nft(&script)
}

/// Sends `signal` (`STOP`, `CONT`, `KILL`) to `pid` with kill(1).
///
/// # Errors
/// kill could not be run or failed.
pub fn signal(pid: u32, signal: &str) -> Result<(), String> {
    let status = Command::new("kill")
        .arg(format!("-{signal}"))
        .arg(pid.to_string())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .map_err(|e| format!("kill: {e}"))?;
    if status.success() {
        Ok(())
    } else {
        Err(format!("kill -{signal} {pid}: {status}"))
    }
}

/// Sends `count` datagrams of random bytes (some with a plausible first byte) at `target`;
/// returns how many left.
pub fn garbage_udp(target: SocketAddr, rng: &mut Rng, count: usize) -> usize {
    let Ok(socket) = UdpSocket::bind((Ipv4Addr::LOCALHOST, 0)) else {
        return 0;
    };
    let mut sent = 0;
    for _ in 0..count {
        let len = usize::try_from(rng.range(1, 1400)).unwrap_or(1);
        let bytes: Vec<u8> = (0..len).map(|_| rng.next_u64() as u8).collect();
        if socket.send_to(&bytes, target).is_ok() {
            sent += 1;
        }
    }
    sent
}

/// Opens `connections` TCP connections to `target` and writes random bytes on each (up to
/// 64 KiB, each within 200 ms); returns how many bytes were written.
pub fn garbage_tcp(target: SocketAddr, rng: &mut Rng, connections: usize) -> usize {
    let mut written = 0;
    for _ in 0..connections {
        let Ok(mut stream) = TcpStream::connect_timeout(&target, Duration::from_millis(200)) else {
            continue;
        };
        let _ = stream.set_write_timeout(Some(Duration::from_millis(200)));
        let len = usize::try_from(rng.range(1, 65_536)).unwrap_or(1);
        let bytes: Vec<u8> = (0..len).map(|_| rng.next_u64() as u8).collect();
        if stream.write_all(&bytes).is_ok() {
            written += len;
        }
    }
    written
}
