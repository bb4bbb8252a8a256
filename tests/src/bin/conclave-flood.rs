//! `conclave-flood`: a hostile process for the multi-process flood test. It sends bogus and
//! replayed datagrams at one member on loopback as fast as it can, for a bounded time.
//!
//! ```text
//! conclave-flood <udp|tcp> <target-address> <seconds> <cluster> [<replay-file>]
//! ```
//!
//! The target must be a loopback address; `seconds` is at most 60. The datagrams cycle through
//! four kinds: replays (the packets of `<replay-file>`: each a 4-byte big-endian length, then
//! the bytes, as recorded off the wire), forgeries (a sealed header of `<cluster>` naming the
//! key id of a replayed packet, or a made-up one, with a body of noise: each costs the member
//! an authentication), unsealed packets with this cluster's header, and noise. Over `tcp` they
//! are frames on one connection opened with a well-formed hello (reopened, after 5 ms, if the
//! member closes it: a keyed mesh closes it at once, since the flood cannot prove the key). At the end it prints `SENT <datagrams> <seconds, 3 decimals>` and exits 0.

use std::io::Write;
use std::net::{SocketAddr, TcpStream, UdpSocket};
use std::process::ExitCode;
use std::time::{Duration, Instant};

/// The longest flood allowed.
const MAX_SECONDS: u64 = 60;
/// The most datagrams sent, whatever the time.
const MAX_DATAGRAMS: u64 = 100_000_000;
/// The most replayed packets read from the file.
const MAX_REPLAYS: usize = 100_000;

fn main() -> ExitCode {
    match run(std::env::args().skip(1).collect()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(message) => {
            eprintln!("conclave-flood: {message}");
            ExitCode::from(2)
        }
    }
}

fn run(args: Vec<String>) -> Result<(), String> {
    let [kind, target, seconds, cluster, rest @ ..] = args.as_slice() else {
        return Err(
            "usage: conclave-flood <udp|tcp> <target> <seconds> <cluster> [<replay-file>]".into(),
        );
    };
    let target: SocketAddr = target
        .parse()
        .map_err(|e| format!("target {target:?}: {e}"))?;
    if !target.ip().is_loopback() {
        return Err(format!("{target} is not a loopback address"));
    }
    let seconds: u64 = seconds
        .parse()
        .map_err(|e| format!("seconds {seconds:?}: {e}"))?;
    if seconds > MAX_SECONDS {
        return Err(format!("at most {MAX_SECONDS} seconds"));
    }
    let replays = match rest.first() {
        Some(file) => read_replays(file)?,
        None => Vec::new(),
    };
    let datagrams = hostile(&cluster_id(cluster), &replays);
    let start = Instant::now();
    let deadline = start + Duration::from_secs(seconds);
    let sent = match kind.as_str() {
        "udp" => flood_udp(target, &datagrams, deadline)?,
        "tcp" => flood_tcp(target, &datagrams, deadline)?,
        other => return Err(format!("unknown transport {other:?}")),
    };
    println!("SENT {sent} {:.3}", start.elapsed().as_secs_f64());
    Ok(())
}

/// FNV-1a 64 of the cluster name, as the wire header carries it.
fn cluster_id(name: &str) -> [u8; 8] {
    name.bytes()
        .fold(0xcbf2_9ce4_8422_2325_u64, |h, b| {
            (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3)
        })
        .to_be_bytes()
}

fn read_replays(file: &str) -> Result<Vec<Vec<u8>>, String> {
    let bytes = std::fs::read(file).map_err(|e| format!("{file}: {e}"))?;
    let mut replays = Vec::new();
    let mut rest = bytes.as_slice();
    while rest.len() >= 4 && replays.len() < MAX_REPLAYS {
        let len = u32::from_be_bytes([rest[0], rest[1], rest[2], rest[3]]) as usize;
        let Some(packet) = rest.get(4..4 + len) else {
            break;
        };
        replays.push(packet.to_vec());
        rest = &rest[4 + len..];
    }
    Ok(replays)
}

/// The cycle of datagrams to send: every replay, and as many forgeries, unsealed packets and
/// noise (at least 256 of each kind).
fn hostile(cluster: &[u8; 8], replays: &[Vec<u8>]) -> Vec<Vec<u8>> {
    let mut noise = 0x9e37_79b9_7f4a_7c15_u64;
    let mut next = move || {
        noise ^= noise << 13;
        noise ^= noise >> 7;
        noise ^= noise << 17;
        noise
    };
    let n = replays.len().max(256);
    let now_ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64);
    let mut out = Vec::with_capacity(4 * n);
    for i in 0..n {
        if let Some(replay) = replays.get(i) {
            out.push(replay.clone());
        }
        // A forgery: a sealed header of this cluster (seal version 2), a key id seen on the
        // wire (or made up), a fresh session and counter, the current time (so it is judged by
        // its key, not dropped as old), an address, and noise where the ciphertext and tag go.
        let mut forged = b"CNCS\x02".to_vec();
        forged.extend_from_slice(cluster);
        match replays
            .get(i)
            .filter(|r| r.len() >= 17 && r.starts_with(b"CNCS"))
        {
            Some(r) => forged.extend_from_slice(&r[13..17]),
            None => forged.extend_from_slice(&(next() as u32).to_be_bytes()),
        }
        for _ in 0..3 {
            forged.extend_from_slice(&next().to_be_bytes());
        }
        forged.extend_from_slice(&now_ms.to_be_bytes());
        forged.push(4);
        forged.extend_from_slice(&[127, 0, 0, 1]);
        forged.extend_from_slice(&[0; 12]);
        forged.extend_from_slice(&(next() as u16 | 1).to_be_bytes());
        forged.extend_from_slice(&[0; 4]);
        forged.push(0);
        for _ in 0..(4 + i % 16) {
            forged.extend_from_slice(&next().to_be_bytes());
        }
        out.push(forged);
        let mut unsealed = b"CNCL\x03".to_vec();
        unsealed.extend_from_slice(cluster);
        unsealed.extend_from_slice(&next().to_be_bytes());
        out.push(unsealed);
        out.push(
            (0..(1 + i % 24))
                .flat_map(|_| next().to_be_bytes())
                .collect(),
        );
    }
    out
}

fn flood_udp(target: SocketAddr, datagrams: &[Vec<u8>], deadline: Instant) -> Result<u64, String> {
    let socket = UdpSocket::bind("127.0.0.1:0").map_err(|e| format!("bind: {e}"))?;
    socket
        .connect(target)
        .map_err(|e| format!("connect: {e}"))?;
    send_batches(&socket, datagrams, deadline)
}

/// Sends the datagrams in cycles on a connected socket, 64 per system call, until the deadline.
#[cfg(target_os = "linux")]
fn send_batches(
    socket: &UdpSocket,
    datagrams: &[Vec<u8>],
    deadline: Instant,
) -> Result<u64, String> {
    use rustix::net::{sendmmsg, MMsgHdr, SendAncillaryBuffer, SendFlags};
    use std::io::IoSlice;
    let iovs: Vec<[IoSlice<'_>; 1]> = datagrams.iter().map(|d| [IoSlice::new(d)]).collect();
    let mut controls: Vec<SendAncillaryBuffer<'_, '_, '_>> = iovs
        .iter()
        .map(|_| SendAncillaryBuffer::default())
        .collect();
    let mut messages: Vec<MMsgHdr<'_>> = iovs
        .iter()
        .zip(controls.iter_mut())
        .map(|(iov, control)| MMsgHdr::new(iov, control))
        .collect();
    let mut sent = 0u64;
    while Instant::now() < deadline && sent < MAX_DATAGRAMS {
        for batch in messages.chunks_mut(64) {
            // A full buffer (ENOBUFS, EAGAIN) only means these datagrams were not sent.
            if let Ok(n) = sendmmsg(socket, batch, SendFlags::empty()) {
                sent += n as u64;
            }
        }
    }
    Ok(sent)
}

/// Sends the datagrams in cycles on a connected socket, one per system call, until the deadline.
#[cfg(not(target_os = "linux"))]
fn send_batches(
    socket: &UdpSocket,
    datagrams: &[Vec<u8>],
    deadline: Instant,
) -> Result<u64, String> {
    let mut sent = 0u64;
    while Instant::now() < deadline && sent < MAX_DATAGRAMS {
        for d in datagrams {
            if socket.send(d).is_ok() {
                sent += 1;
            }
        }
    }
    Ok(sent)
}

fn flood_tcp(target: SocketAddr, datagrams: &[Vec<u8>], deadline: Instant) -> Result<u64, String> {
    // Frames in batches of a few hundred per write.
    let mut batches = Vec::new();
    let mut batch = Vec::new();
    let mut in_batch = 0u64;
    for d in datagrams {
        batch.extend_from_slice(&u32::try_from(d.len()).unwrap_or(0).to_be_bytes());
        batch.extend_from_slice(d);
        in_batch += 1;
        if in_batch == 256 {
            batches.push((std::mem::take(&mut batch), in_batch));
            in_batch = 0;
        }
    }
    if in_batch > 0 {
        batches.push((batch, in_batch));
    }
    let mut sent = 0u64;
    let mut connects = 0u64;
    while Instant::now() < deadline && sent < MAX_DATAGRAMS {
        if connects > 0 {
            std::thread::sleep(Duration::from_millis(5));
        }
        connects += 1;
        let Ok(mut stream) = TcpStream::connect_timeout(&target, Duration::from_secs(2)) else {
            std::thread::sleep(Duration::from_millis(20));
            continue;
        };
        let _ = stream.set_write_timeout(Some(Duration::from_millis(500)));
        let local = stream.local_addr().map_err(|e| e.to_string())?;
        if stream.write_all(&hello(local)).is_err() {
            continue;
        }
        'connection: while Instant::now() < deadline {
            for (batch, n) in &batches {
                if stream.write_all(batch).is_err() {
                    break 'connection;
                }
                sent += n;
                if Instant::now() >= deadline || sent >= MAX_DATAGRAMS {
                    break 'connection;
                }
            }
        }
    }
    Ok(sent)
}

/// The TCP mesh's hello frame naming `addr` (an IPv4 loopback address).
fn hello(addr: SocketAddr) -> Vec<u8> {
    let mut payload = b"CNCL\x01".to_vec();
    payload.extend_from_slice(&0xf100_d000_u64.to_be_bytes());
    payload.push(4);
    if let SocketAddr::V4(v4) = addr {
        payload.extend_from_slice(&v4.ip().octets());
    } else {
        payload.extend_from_slice(&[127, 0, 0, 1]);
    }
    payload.extend_from_slice(&addr.port().to_be_bytes());
    let mut frame = u32::try_from(payload.len())
        .unwrap_or(0)
        .to_be_bytes()
        .to_vec();
    frame.extend_from_slice(&payload);
    frame
}
