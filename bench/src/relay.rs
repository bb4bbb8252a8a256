//! The floor of a contended lock (issue 16): the four-process handoff of the contended
//! measurement done with no lock library at all, raw sockets of the run's kind only, so that a
//! handoff rate can be compared with what this machine allows, not only with the ping-pong.
//!
//! - **Relay**: a fifth process plays a central grantor whose queue always holds the other
//!   four. It sends the grant (one message) to the next in line and reads that holder's one
//!   message, which releases and asks again. Two messages and two wake-ups per handoff: the
//!   least a lock with a central grantor can cost.
//! - **Ring**: four processes pass a token straight to each other. One message and one
//!   wake-up per handoff: the least any lock's handoff can cost.
//!
//! Messages are 100 bytes, as in the ping-pong floor: UDP datagrams, or fixed-size messages on
//! TCP connections with `TCP_NODELAY`. Every process is blocked in a receive while it waits.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream, UdpSocket};
use std::time::{Duration, Instant};

use super::contend::cpu_time;
use super::{Error, Mode, Proc, CONTENDED_FOR};

/// The processes that take turns, as in the contended measurement.
const TAKERS: usize = 4;
/// Bytes in every message.
const MESSAGE: usize = 100;
/// First byte of a message: a grant or token to pass on.
const GO: u8 = 1;
/// First byte of a message: the run is over.
const STOP: u8 = 0;
/// No receive waits longer: a lost peer ends the run with an error instead of a hang.
const PATIENCE: Duration = Duration::from_secs(5);

/// Handoffs per second of the two shapes, and the relay's CPU per handoff.
pub(crate) struct Floors {
    pub(crate) relay: f64,
    /// CPU time of the relay's five processes together, per handoff.
    pub(crate) relay_cpu: Duration,
    pub(crate) ring: f64,
}

/// Runs the relay, then the ring, each for [`CONTENDED_FOR`].
pub(crate) fn measure(mode: Mode) -> Result<Floors, Error> {
    let kind = format!("{mode:?}").to_uppercase();
    let ms = CONTENDED_FOR.as_millis().to_string();

    let mut grantor = Proc::spawn(&["relay-grantor", &kind, &ms])?;
    let addr = grantor.line()?;
    let mut takers = (0..TAKERS)
        .map(|_| Proc::spawn(&["relay-taker", &kind, &addr]))
        .collect::<Result<Vec<_>, _>>()?;
    let (relay, handoffs, mut cpu) = rate_and_cpu(&grantor.line()?)?;
    for taker in &mut takers {
        cpu += cpu_line(&taker.line()?)?;
    }
    drop(takers);

    let mut ring = (0..TAKERS)
        .map(|_| Proc::spawn(&["ring-member", &kind, &ms]))
        .collect::<Result<Vec<_>, _>>()?;
    let addrs = ring
        .iter_mut()
        .map(Proc::line)
        .collect::<Result<Vec<_>, _>>()?;
    for (i, member) in ring.iter_mut().enumerate() {
        let first = if i == 0 { "first" } else { "later" };
        member.send(&format!("{} {first}", addrs[(i + 1) % TAKERS]))?;
    }
    let (ring_rate, _, _) = rate_and_cpu(&ring[0].line()?)?;
    Ok(Floors {
        relay,
        relay_cpu: cpu / u32::try_from(handoffs.max(1)).unwrap_or(u32::MAX),
        ring: ring_rate,
    })
}

/// Parses `COUNT <handoffs> US <elapsed µs> CPU <µs>` into handoffs per second, handoffs and
/// CPU time.
fn rate_and_cpu(line: &str) -> Result<(f64, u64, Duration), Error> {
    let words: Vec<&str> = line.split_whitespace().collect();
    let ["COUNT", count, "US", us, "CPU", cpu] = words[..] else {
        return Err(format!("bad relay line {line:?}").into());
    };
    let count: u64 = count.parse()?;
    let us: f64 = us.parse()?;
    let rate = count as f64 / (us / 1e6).max(1e-9);
    Ok((rate, count, Duration::from_micros(cpu.parse()?)))
}

/// Parses `CPU <µs>`.
fn cpu_line(line: &str) -> Result<Duration, Error> {
    let micros = line
        .strip_prefix("CPU ")
        .ok_or_else(|| format!("expected CPU, got {line:?}"))?;
    Ok(Duration::from_micros(micros.trim().parse()?))
}

/// One end of the raw links: a UDP socket with its peers' addresses, or TCP streams.
enum Links {
    Udp(UdpSocket, Vec<SocketAddr>),
    Tcp(Vec<TcpStream>),
}

impl Links {
    /// Sends one message whose first byte is `kind` to peer `to`.
    fn send(&mut self, to: usize, kind: u8) -> Result<(), Error> {
        let mut message = [7u8; MESSAGE];
        message[0] = kind;
        match self {
            Links::Udp(socket, peers) => {
                socket.send_to(&message, peers[to])?;
            }
            Links::Tcp(streams) => streams[to].write_all(&message)?,
        }
        Ok(())
    }

    /// Receives one message from peer `from` (over UDP: from whoever sends; in both shapes
    /// only one peer can be sending) and returns its first byte.
    fn recv(&mut self, from: usize) -> Result<u8, Error> {
        let mut message = [0u8; MESSAGE];
        match self {
            Links::Udp(socket, _) => {
                socket.recv_from(&mut message)?;
            }
            Links::Tcp(streams) => streams[from].read_exact(&mut message)?,
        }
        Ok(message[0])
    }
}

fn udp_socket() -> Result<UdpSocket, Error> {
    let socket = UdpSocket::bind("127.0.0.1:0")?;
    socket.set_read_timeout(Some(PATIENCE))?;
    Ok(socket)
}

fn tcp_stream(stream: TcpStream) -> Result<TcpStream, Error> {
    stream.set_nodelay(true)?;
    stream.set_read_timeout(Some(PATIENCE))?;
    Ok(stream)
}

fn is_udp(kind: &str) -> bool {
    kind == "UDP"
}

/// The child role `relay-grantor <UDP|TCP> <ms>`: prints its address, waits for
/// [`TAKERS`] takers, grants to them in turn for `ms`, prints `COUNT <n> US <µs> CPU <µs>`
/// (its CPU time over the run).
pub(crate) fn grantor(kind: &str, ms: &str) -> Result<(), Error> {
    let run_for = Duration::from_millis(ms.parse()?);
    let mut links = if is_udp(kind) {
        let socket = udp_socket()?;
        println!("{}", socket.local_addr()?);
        let mut peers = Vec::with_capacity(TAKERS);
        let mut hello = [0u8; MESSAGE];
        while peers.len() < TAKERS {
            peers.push(socket.recv_from(&mut hello)?.1);
        }
        Links::Udp(socket, peers)
    } else {
        let listener = TcpListener::bind("127.0.0.1:0")?;
        println!("{}", listener.local_addr()?);
        let streams = (0..TAKERS)
            .map(|_| tcp_stream(listener.accept()?.0))
            .collect::<Result<Vec<_>, _>>()?;
        Links::Tcp(streams)
    };
    let cpu = cpu_time();
    let start = Instant::now();
    let mut handoffs = 0u64;
    while start.elapsed() < run_for {
        let holder = handoffs as usize % TAKERS;
        links.send(holder, GO)?;
        links.recv(holder)?;
        handoffs += 1;
    }
    let elapsed = start.elapsed();
    for taker in 0..TAKERS {
        links.send(taker, STOP)?;
    }
    let cpu = cpu_time().saturating_sub(cpu);
    println!(
        "COUNT {handoffs} US {} CPU {}",
        elapsed.as_micros(),
        cpu.as_micros()
    );
    Ok(())
}

/// The child role `relay-taker <UDP|TCP> <grantor>`: answers every grant at once until told
/// to stop, then prints `CPU <µs>` (its CPU time since the first grant).
pub(crate) fn taker(kind: &str, grantor: &str) -> Result<(), Error> {
    let grantor: SocketAddr = grantor.parse()?;
    let mut links = if is_udp(kind) {
        let socket = udp_socket()?;
        socket.send_to(&[STOP; MESSAGE], grantor)?; // hello
        Links::Udp(socket, vec![grantor])
    } else {
        let stream = TcpStream::connect_timeout(&grantor, PATIENCE)?;
        Links::Tcp(vec![tcp_stream(stream)?])
    };
    let mut cpu = None;
    while links.recv(0)? == GO {
        cpu.get_or_insert_with(cpu_time);
        links.send(0, GO)?;
    }
    let cpu = cpu.map_or(Duration::ZERO, |start| cpu_time().saturating_sub(start));
    println!("CPU {}", cpu.as_micros());
    Ok(())
}

/// The child role `ring-member <UDP|TCP> <ms>`: prints its address, reads `<next> first` or
/// `<next> later`, then passes the token to `next` each time it comes round. The first member
/// starts it, stops it after `ms` and prints `COUNT <handoffs> US <µs> CPU <µs>` (the CPU of
/// this member alone).
pub(crate) fn ring_member(kind: &str, ms: &str) -> Result<(), Error> {
    let run_for = Duration::from_millis(ms.parse()?);
    let (socket, listener) = if is_udp(kind) {
        let socket = udp_socket()?;
        println!("{}", socket.local_addr()?);
        (Some(socket), None)
    } else {
        let listener = TcpListener::bind("127.0.0.1:0")?;
        println!("{}", listener.local_addr()?);
        (None, Some(listener))
    };
    let mut line = String::new();
    std::io::BufRead::read_line(&mut std::io::stdin().lock(), &mut line)?;
    let (next, role) = line.trim().split_once(' ').ok_or("bad ring line")?;
    let next: SocketAddr = next.parse()?;
    let first = role == "first";
    // Peer 0 is the next member (sent to); over TCP, peer 1 is the previous one (read from).
    const NEXT: usize = 0;
    const PREVIOUS: usize = 1;
    let mut links = match (socket, listener) {
        (Some(socket), _) => Links::Udp(socket, vec![next]),
        (None, Some(listener)) => {
            let to_next = tcp_stream(TcpStream::connect_timeout(&next, PATIENCE)?)?;
            let from_previous = tcp_stream(listener.accept()?.0)?;
            Links::Tcp(vec![to_next, from_previous])
        }
        (None, None) => unreachable!("one of the two was made above"),
    };
    if !first {
        loop {
            let kind = links.recv(PREVIOUS)?;
            links.send(NEXT, kind)?;
            if kind == STOP {
                return Ok(());
            }
        }
    }
    let cpu = cpu_time();
    let start = Instant::now();
    let mut laps = 0u64;
    while start.elapsed() < run_for {
        links.send(NEXT, GO)?;
        links.recv(PREVIOUS)?;
        laps += 1;
    }
    let elapsed = start.elapsed();
    links.send(NEXT, STOP)?;
    links.recv(PREVIOUS)?;
    println!(
        "COUNT {} US {} CPU {}",
        laps * TAKERS as u64,
        elapsed.as_micros(),
        cpu_time().saturating_sub(cpu).as_micros()
    );
    Ok(())
}
