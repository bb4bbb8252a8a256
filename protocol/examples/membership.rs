//! A narrated membership demo over real UDP sockets on loopback.
//!
//! Four members, each on its own thread with its own `127.0.0.1` socket, run the sans-IO
//! [`Endpoint`] with a minimal blocking driver. The transcript shows them discover each other
//! and agree on a view; then the coordinator is killed (its thread just stops, like `kill -9`)
//! and the next member takes over; then a simulated firewall splits the survivors, each side
//! forms its own view, and once it is lifted the two coordinators find each other and merge.
//!
//! Run: `cargo run --release -p conclave-protocol --example membership`
//!
//! Nothing leaves the host: every socket is bound to 127.0.0.1 and discovery is sent to the
//! members' own loopback ports (a seed list), not to a multicast group.

use std::collections::{BTreeMap, BTreeSet};
use std::io::ErrorKind;
use std::net::{SocketAddr, UdpSocket};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{self, Receiver, Sender};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant as StdInstant};

use conclave_lock_api::{MemberId, View};
use conclave_protocol::{Destination, Endpoint, EndpointConfig, EndpointEvent, Instant};

/// Which side of a simulated firewall each port is on; datagrams between sides are dropped.
type Firewall = Arc<Mutex<Vec<(u16, u8)>>>;

struct Member {
    name: String,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let origin = StdInstant::now();
    let names = ["alice", "bob", "carol", "dave"];
    let sockets: Vec<UdpSocket> = names
        .iter()
        .map(|_| UdpSocket::bind("127.0.0.1:0"))
        .collect::<Result<_, _>>()?;
    let seeds: Arc<Vec<SocketAddr>> = Arc::new(
        sockets
            .iter()
            .map(|s| s.local_addr())
            .collect::<Result<_, _>>()?,
    );
    let firewall: Firewall = Arc::new(Mutex::new(Vec::new()));
    let (events_tx, events) = mpsc::channel();
    let mut watch = Watch {
        events,
        latest: BTreeMap::new(),
        origin,
    };

    println!(
        "== {} members start on loopback, knowing each other's ports",
        names.len()
    );
    let mut members: Vec<Member> = Vec::new();
    for (i, (name, socket)) in names.iter().zip(sockets).enumerate() {
        let stop = Arc::new(AtomicBool::new(false));
        let member = MemberId::new(
            ((0x1000 * (i as u128 + 1)) << 96) | i as u128,
            name,
            socket.local_addr()?,
        )?;
        let thread = spawn_member(
            member,
            socket,
            seeds.clone(),
            firewall.clone(),
            stop.clone(),
            events_tx.clone(),
            origin,
        );
        members.push(Member {
            name: (*name).to_owned(),
            stop,
            thread: Some(thread),
        });
    }

    let everyone: BTreeSet<String> = names.iter().map(|n| (*n).to_owned()).collect();
    let view = watch.agreement(&everyone)?;
    println!(
        "   all four agree on {view}; the coordinator is {}",
        view.coordinator()
    );

    let coordinator = view.coordinator().name().to_owned();
    println!("\n== kill -9 the coordinator, {coordinator}");
    let victim = members
        .iter_mut()
        .find(|m| m.name == coordinator)
        .ok_or("coordinator not found")?;
    victim.stop.store(true, Ordering::SeqCst);
    if let Some(thread) = victim.thread.take() {
        thread.join().map_err(|_| "member thread panicked")?;
    }
    let survivors: BTreeSet<String> = everyone
        .iter()
        .filter(|n| **n != coordinator)
        .cloned()
        .collect();
    let view = watch.agreement(&survivors)?;
    println!(
        "   survivors agree on {view}; {} took over",
        view.coordinator()
    );

    let mut sides: Vec<String> = survivors.iter().cloned().collect();
    let lonely = sides.pop().ok_or("no survivors")?;
    println!(
        "\n== a firewall cuts {lonely} off from {}",
        sides.join(" and ")
    );
    {
        let mut fw = firewall.lock().map_err(|_| "poisoned")?;
        for (i, name) in names.iter().enumerate() {
            fw.push((seeds[i].port(), u8::from(*name == lonely)));
        }
    }
    let left: BTreeSet<String> = sides.iter().cloned().collect();
    let alone: BTreeSet<String> = [lonely.clone()].into_iter().collect();
    let view = watch.agreement(&left)?;
    println!("   one side installs {view}");
    let view = watch.agreement(&alone)?;
    println!("   the other side installs {view}");

    println!("\n== the firewall is lifted");
    firewall.lock().map_err(|_| "poisoned")?.clear();
    let view = watch.agreement(&survivors)?;
    println!("   the coordinators heard each other and merged: {view}");

    println!("\n== shutting down");
    for member in &mut members {
        member.stop.store(true, Ordering::SeqCst);
        if let Some(thread) = member.thread.take() {
            thread.join().map_err(|_| "member thread panicked")?;
        }
    }
    println!("   done in {:.1} s", origin.elapsed().as_secs_f64());
    Ok(())
}

/// The latest view each member reported, fed by the members' threads.
struct Watch {
    events: Receiver<(String, View)>,
    latest: BTreeMap<String, View>,
    origin: StdInstant,
}

impl Watch {
    /// Waits (at most 20 s) until the members named in `who` all report the same view holding
    /// exactly them.
    fn agreement(&mut self, who: &BTreeSet<String>) -> Result<View, Box<dyn std::error::Error>> {
        let deadline = StdInstant::now() + Duration::from_secs(20);
        loop {
            if let Some(view) = self.agreed(who) {
                return Ok(view);
            }
            let left = deadline.saturating_duration_since(StdInstant::now());
            let (name, view) = self
                .events
                .recv_timeout(left)
                .map_err(|_| "no agreement within 20 s")?;
            println!(
                "   [{:>6.3} s] {name:<5} installs {view}",
                self.origin.elapsed().as_secs_f64()
            );
            self.latest.insert(name, view);
        }
    }

    fn agreed(&self, who: &BTreeSet<String>) -> Option<View> {
        let views: Vec<&View> = who.iter().filter_map(|n| self.latest.get(n)).collect();
        if views.len() != who.len() || !views.windows(2).all(|w| w[0] == w[1]) {
            return None;
        }
        let names: BTreeSet<String> = views[0]
            .members()
            .iter()
            .map(|m| m.name().to_owned())
            .collect();
        (&names == who).then(|| views[0].clone())
    }
}

fn spawn_member(
    member: MemberId,
    socket: UdpSocket,
    seeds: Arc<Vec<SocketAddr>>,
    firewall: Firewall,
    stop: Arc<AtomicBool>,
    events: Sender<(String, View)>,
    origin: StdInstant,
) -> JoinHandle<()> {
    std::thread::spawn(move || {
        let name = member.name().to_owned();
        let local_port = member.addr().port();
        let clock = || Instant::from_duration(origin.elapsed());
        let mut endpoint = Endpoint::new("demo", member, EndpointConfig::local(), 65_000);
        endpoint.join(clock());
        let mut buf = vec![0u8; 65_536];
        let side_of = |port: u16| -> u8 {
            firewall
                .lock()
                .map(|fw| fw.iter().find(|(p, _)| *p == port).map_or(0, |(_, s)| *s))
                .unwrap_or(0)
        };
        while !stop.load(Ordering::SeqCst) {
            while let Some(transmit) = endpoint.poll_transmit() {
                let targets: Vec<SocketAddr> = match transmit.destination {
                    Destination::Member(addr) => vec![addr],
                    Destination::Discovery => seeds
                        .iter()
                        .copied()
                        .filter(|a| a.port() != local_port)
                        .collect(),
                };
                for to in targets {
                    if side_of(to.port()) == side_of(local_port) {
                        let _ = socket.send_to(&transmit.bytes, to);
                    }
                }
            }
            while let Some(event) = endpoint.poll_event() {
                if let EndpointEvent::ViewInstalled { view, .. } = event {
                    let _ = events.send((name.clone(), view));
                }
            }
            let wait = endpoint
                .poll_timeout()
                .map_or(Duration::from_millis(50), |t| t - clock())
                .clamp(Duration::from_millis(1), Duration::from_millis(50));
            let _ = socket.set_read_timeout(Some(wait));
            match socket.recv_from(&mut buf) {
                Ok((len, from)) if side_of(from.port()) == side_of(local_port) => {
                    endpoint.handle_datagram(clock(), &buf[..len]);
                }
                Ok(_) => {}
                Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {}
                Err(_) => {}
            }
            endpoint.handle_timeout(clock());
        }
    })
}
