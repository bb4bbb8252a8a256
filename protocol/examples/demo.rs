//! Conclave's main demo: distributed locks over real UDP sockets on loopback, narrated.
//!
//! Four members, each on its own thread with its own `127.0.0.1` socket, run the sans-IO
//! protocol stack (`Endpoint`) under a minimal blocking driver. The transcript shows:
//!
//! 1. the members find each other and agree on a view; the coordinator is the lock grantor;
//! 2. three members contend for one lock: one holds it, two wait in the grantor's queue;
//! 3. the coordinator is killed (its thread just stops, like `kill -9`): the next member takes
//!    over, rebuilds the lock table from the survivors, the holder keeps its lock, the waiters
//!    are still queued and served, and fencing tokens keep increasing;
//! 4. a firewall splits the cluster; under the `Available` policy both sides grant the same
//!    lock; when the firewall is lifted the halves merge, the duplicate is found, one holder is
//!    kept (the highest fencing token) and the other is told its lock is lost.
//!
//! Run: `cargo run --release -p conclave-protocol --example demo`
//!
//! Nothing leaves the host: every socket is bound to 127.0.0.1 and discovery is sent to the
//! members' own loopback ports (a seed list), not to a multicast group.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::io::ErrorKind;
use std::net::{SocketAddr, UdpSocket};
use std::sync::mpsc::{self, Receiver, Sender};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant as StdInstant};

use conclave_lock_api::{FencingToken, LockName, MemberId, RequestId, View};
use conclave_protocol::locking::{LockNotice, LockRequest};
use conclave_protocol::{Destination, Endpoint, EndpointConfig, EndpointEvent, Instant};

type Error = Box<dyn std::error::Error>;

/// Which side of a simulated firewall each port is on; datagrams between sides are dropped.
type Firewall = Arc<Mutex<HashMap<u16, u8>>>;

/// What the script asks a member's thread to do.
enum Command {
    Lock {
        name: LockName,
        notices: Sender<LockNotice>,
    },
    Unlock(RequestId),
    Stop,
}

/// The script's handle on one member.
struct Member {
    name: String,
    commands: Sender<Command>,
    thread: Option<JoinHandle<()>>,
}

/// A lock request as the script sees it: its id and the notices about it.
struct Ticket {
    who: String,
    request: RequestId,
    notices: Receiver<LockNotice>,
}

fn main() -> Result<(), Error> {
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
    let firewall: Firewall = Arc::new(Mutex::new(HashMap::new()));
    let (views_tx, views) = mpsc::channel();
    let mut watch = Watch {
        views,
        latest: BTreeMap::new(),
    };

    println!("== four members start on loopback, knowing each other's ports");
    let mut members = Vec::new();
    for (i, (name, socket)) in names.iter().zip(sockets).enumerate() {
        // Incarnation ids are random in real use; fixed here so the transcript is stable.
        let id = MemberId::new(
            ((i as u128 + 1) << 120) | 0x5eed,
            name,
            socket.local_addr()?,
        )?;
        members.push(spawn_member(
            id,
            socket,
            seeds.clone(),
            firewall.clone(),
            views_tx.clone(),
            origin,
        ));
    }
    let everyone: BTreeSet<String> = names.iter().map(|n| (*n).to_owned()).collect();
    let view = watch.agreement(&everyone)?;
    println!(
        "   they agree on {view}; {} coordinates and grants locks",
        view.coordinator().name()
    );

    println!("\n== bob, carol and dave all want invoice-42");
    let invoice = LockName::new("invoice-42")?;
    let bob = lock(&members, "bob", &invoice)?;
    let bob_token = granted(&bob)?;
    println!("   bob holds invoice-42 with fencing token {bob_token}");
    let carol = lock(&members, "carol", &invoice)?;
    let dave = lock(&members, "dave", &invoice)?;
    for t in [&carol, &dave] {
        if t.notices.recv_timeout(Duration::from_millis(300)).is_ok() {
            return Err(format!("{} was answered while bob holds the lock", t.who).into());
        }
    }
    println!("   carol and dave wait in the grantor's queue");

    let coordinator = view.coordinator().name().to_owned();
    println!("\n== kill -9 the coordinator, {coordinator}");
    stop(&mut members, &coordinator)?;
    let survivors: BTreeSet<String> = everyone
        .iter()
        .filter(|n| **n != coordinator)
        .cloned()
        .collect();
    let view = watch.agreement(&survivors)?;
    println!(
        "   {} took over: it asked every survivor for its locks, requests and releases, and rebuilt the table",
        view.coordinator().name()
    );
    command(&members, "bob", Command::Unlock(bob.request))?;
    let (first, first_token) = first_granted([&carol, &dave])?;
    let second = if first.who == "carol" { &dave } else { &carol };
    println!(
        "   bob kept invoice-42 through the failover and released it; {} got it next, token {first_token}",
        first.who
    );
    if first_token <= bob_token {
        return Err("fencing tokens went backwards".into());
    }
    command(&members, &first.who, Command::Unlock(first.request))?;
    let second_token = granted(second)?;
    println!(
        "   then {}, token {second_token}: tokens keep increasing across the grantor change",
        second.who
    );
    command(&members, &second.who, Command::Unlock(second.request))?;

    let mut side: Vec<String> = survivors.iter().cloned().collect();
    let lonely = side.pop().ok_or("no survivors")?;
    println!(
        "\n== a firewall cuts {lonely} off from {}",
        side.join(" and ")
    );
    {
        let mut fw = firewall.lock().map_err(|_| "poisoned")?;
        for (i, name) in names.iter().enumerate() {
            fw.insert(seeds[i].port(), u8::from(*name == lonely));
        }
    }
    let big: BTreeSet<String> = side.iter().cloned().collect();
    let small: BTreeSet<String> = [lonely.clone()].into_iter().collect();
    watch.agreement(&big)?;
    watch.agreement(&small)?;
    println!("   each side installs its own view and has its own grantor");
    let report = LockName::new("nightly-report")?;
    let a = lock(&members, &side[0], &report)?;
    let ta = granted(&a)?;
    let b = lock(&members, &lonely, &report)?;
    let tb = granted(&b)?;
    println!(
        "   both sides grant nightly-report (the Available policy keeps every partition working): {} has token {ta}, {lonely} has token {tb}",
        side[0]
    );

    println!("\n== the firewall is lifted");
    firewall.lock().map_err(|_| "poisoned")?.clear();
    let view = watch.agreement(&survivors)?;
    println!("   the coordinators heard each other and merged: {view}");
    let (winner, loser) = if ta > tb { (&a, &b) } else { (&b, &a) };
    match loser.notices.recv_timeout(Duration::from_secs(10)) {
        Ok(LockNotice::Lost { reason, token, .. }) => println!(
            "   the new grantor found two holders of nightly-report: {} (token {token}) was told its lock is lost ({reason}); {} keeps it (highest token)",
            loser.who, winner.who
        ),
        other => return Err(format!("expected {} to be told of the duplicate, got {other:?}", loser.who).into()),
    }
    if let Ok(n) = winner.notices.recv_timeout(Duration::from_millis(300)) {
        return Err(format!("the kept holder {} was disturbed: {n:?}", winner.who).into());
    }

    println!("\n== shutting down");
    for name in names {
        if name != coordinator {
            stop(&mut members, name)?;
        }
    }
    println!("   done in {:.1} s", origin.elapsed().as_secs_f64());
    Ok(())
}

fn command(members: &[Member], who: &str, command: Command) -> Result<(), Error> {
    let member = members
        .iter()
        .find(|m| m.name == who)
        .ok_or("no such member")?;
    member
        .commands
        .send(command)
        .map_err(|_| "member thread gone")?;
    Ok(())
}

/// Asks `who` for `name`; the request id comes back as the first notice channel message.
fn lock(members: &[Member], who: &str, name: &LockName) -> Result<Ticket, Error> {
    let (tx, rx) = mpsc::channel();
    command(
        members,
        who,
        Command::Lock {
            name: name.clone(),
            notices: tx,
        },
    )?;
    // The member thread answers with a synthetic `Released` carrying the request id first.
    match rx.recv_timeout(Duration::from_secs(5))? {
        LockNotice::Released { request } => Ok(Ticket {
            who: who.to_owned(),
            request,
            notices: rx,
        }),
        other => Err(format!("unexpected first notice {other:?}").into()),
    }
}

fn granted(ticket: &Ticket) -> Result<FencingToken, Error> {
    match ticket.notices.recv_timeout(Duration::from_secs(15))? {
        LockNotice::Granted { token, .. } => Ok(token),
        other => Err(format!("{} expected a grant, got {other:?}", ticket.who).into()),
    }
}

/// Waits for whichever of `tickets` is granted first. (Waiters keep their place in the queue
/// while one grantor serves; across a grantor change the new grantor queues them again from
/// the members' reports, in view order.)
fn first_granted(tickets: [&Ticket; 2]) -> Result<(&Ticket, FencingToken), Error> {
    let deadline = StdInstant::now() + Duration::from_secs(15);
    while StdInstant::now() < deadline {
        for t in tickets {
            match t.notices.recv_timeout(Duration::from_millis(20)) {
                Ok(LockNotice::Granted { token, .. }) => return Ok((t, token)),
                Ok(other) => {
                    return Err(format!("{} expected a grant, got {other:?}", t.who).into())
                }
                Err(_) => {}
            }
        }
    }
    Err("no waiter was granted within 15 s".into())
}

fn stop(members: &mut [Member], who: &str) -> Result<(), Error> {
    let member = members
        .iter_mut()
        .find(|m| m.name == who)
        .ok_or("no such member")?;
    let _ = member.commands.send(Command::Stop);
    if let Some(thread) = member.thread.take() {
        thread.join().map_err(|_| "member thread panicked")?;
    }
    Ok(())
}

/// The latest view each member reported.
struct Watch {
    views: Receiver<(String, View)>,
    latest: BTreeMap<String, View>,
}

impl Watch {
    /// Waits (at most 20 s) until the members in `who` report one view holding exactly them.
    fn agreement(&mut self, who: &BTreeSet<String>) -> Result<View, Error> {
        let deadline = StdInstant::now() + Duration::from_secs(20);
        loop {
            let views: Vec<&View> = who.iter().filter_map(|n| self.latest.get(n)).collect();
            if views.len() == who.len() && views.windows(2).all(|w| w[0] == w[1]) {
                let names: BTreeSet<String> = views[0]
                    .members()
                    .iter()
                    .map(|m| m.name().to_owned())
                    .collect();
                if &names == who {
                    return Ok(views[0].clone());
                }
            }
            let left = deadline.saturating_duration_since(StdInstant::now());
            let (name, view) = self
                .views
                .recv_timeout(left)
                .map_err(|_| "no agreement within 20 s")?;
            self.latest.insert(name, view);
        }
    }
}

/// Runs one member on its own thread: commands in, datagrams in and out, timers.
fn spawn_member(
    id: MemberId,
    socket: UdpSocket,
    seeds: Arc<Vec<SocketAddr>>,
    firewall: Firewall,
    views: Sender<(String, View)>,
    origin: StdInstant,
) -> Member {
    let name = id.name().to_owned();
    let (commands, inbox) = mpsc::channel::<Command>();
    let thread = std::thread::spawn(move || {
        let port = id.addr().port();
        let name = id.name().to_owned();
        let clock = || Instant::from_duration(origin.elapsed());
        let side = |p: u16| {
            firewall
                .lock()
                .map(|fw| fw.get(&p).copied().unwrap_or(0))
                .unwrap_or(0)
        };
        let mut endpoint = Endpoint::new("demo", id, EndpointConfig::local(), 65_000);
        let mut waiting: HashMap<RequestId, Sender<LockNotice>> = HashMap::new();
        let mut next_owner = 1;
        let mut buf = vec![0u8; 65_536];
        endpoint.join(clock());
        loop {
            while let Ok(command) = inbox.try_recv() {
                match command {
                    Command::Lock { name, notices } => {
                        next_owner += 1;
                        let request =
                            endpoint.lock(clock(), LockRequest::exclusive(next_owner, name));
                        let _ = notices.send(LockNotice::Released { request });
                        waiting.insert(request, notices);
                    }
                    Command::Unlock(request) => {
                        let _ = endpoint.unlock(clock(), request);
                    }
                    Command::Stop => return,
                }
            }
            while let Some(transmit) = endpoint.poll_transmit() {
                let targets: Vec<SocketAddr> = match transmit.destination {
                    Destination::Member(addr) => vec![addr],
                    Destination::Discovery => {
                        seeds.iter().copied().filter(|a| a.port() != port).collect()
                    }
                };
                for to in targets
                    .into_iter()
                    .filter(|to| side(to.port()) == side(port))
                {
                    let _ = socket.send_to(&transmit.bytes, to);
                }
            }
            while let Some(event) = endpoint.poll_event() {
                match event {
                    EndpointEvent::ViewInstalled { view, .. } => {
                        let _ = views.send((name.clone(), view));
                    }
                    EndpointEvent::Lock(notice) => {
                        let request = match &notice {
                            LockNotice::Granted { request, .. }
                            | LockNotice::Refused { request, .. }
                            | LockNotice::Lost { request, .. } => *request,
                            // Acknowledged unlocks, queue places and resolved unexpected
                            // grants are not part of the transcript.
                            LockNotice::Released { .. }
                            | LockNotice::Queued { .. }
                            | LockNotice::Unexpected { .. }
                            | LockNotice::GrantorServing { .. }
                            | LockNotice::Table { .. } => continue,
                            _ => continue,
                        };
                        if let Some(tx) = waiting.get(&request) {
                            let _ = tx.send(notice);
                        }
                    }
                    // The demo uses the default lock service only.
                    EndpointEvent::ServiceLock { .. }
                    | EndpointEvent::Left
                    | EndpointEvent::JoinProblem(_) => {}
                    _ => {}
                }
            }
            let wait = endpoint
                .poll_timeout()
                .map_or(Duration::from_millis(5), |t| t - clock())
                .clamp(Duration::from_millis(1), Duration::from_millis(5));
            let _ = socket.set_read_timeout(Some(wait));
            match socket.recv_from(&mut buf) {
                Ok((len, from)) if side(from.port()) == side(port) => {
                    endpoint.handle_datagram(clock(), &buf[..len])
                }
                Ok(_) => {}
                Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {}
                Err(_) => {}
            }
            endpoint.handle_timeout(clock());
        }
    });
    Member {
        name,
        commands,
        thread: Some(thread),
    }
}
