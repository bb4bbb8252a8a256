//! The Raft engine across whole-cluster restarts, on real processes: every member killed with
//! `kill -9`, restarted from its data directory, finds the table as it was.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io::{BufRead, BufReader, Write};
use std::net::{SocketAddr, TcpListener};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError};
use std::time::{Duration, Instant};

const NODE: &str = env!("CARGO_BIN_EXE_conclave-raft-node");

/// The longest a member may take to answer a command (or to start).
const WAIT: Duration = Duration::from_secs(30);

/// One `conclave-raft-node` process, killed by its PID when dropped.
struct Member {
    name: String,
    child: Child,
    stdin: ChildStdin,
    lines: Receiver<String>,
    transcript: Vec<String>,
}

impl Member {
    fn spawn(cluster: &str, name: &str, dir: &Path, peers: &str) -> Member {
        let mut child = Command::new(NODE)
            .args([cluster, name, dir.to_str().unwrap(), peers])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn conclave-raft-node");
        let (sender, lines) = mpsc::channel();
        for (pipe, prefix) in [
            (
                Box::new(child.stdout.take().unwrap()) as Box<dyn std::io::Read + Send>,
                "",
            ),
            (Box::new(child.stderr.take().unwrap()), "stderr: "),
        ] {
            let sender = sender.clone();
            std::thread::spawn(move || {
                for line in BufReader::new(pipe).lines() {
                    let Ok(line) = line else { return };
                    if sender.send(format!("{prefix}{line}")).is_err() {
                        return;
                    }
                }
            });
        }
        let stdin = child.stdin.take().unwrap();
        Member {
            name: name.to_owned(),
            child,
            stdin,
            lines,
            transcript: Vec::new(),
        }
    }

    /// The next line starting with `prefix`, within [`WAIT`].
    fn expect(&mut self, prefix: &str) -> String {
        let deadline = Instant::now() + WAIT;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(line) => {
                    self.transcript.push(line.clone());
                    if line.starts_with(prefix) {
                        return line;
                    }
                    if line.starts_with("ERROR") {
                        panic!("{}: {line}\n{:#?}", self.name, self.transcript);
                    }
                }
                Err(RecvTimeoutError::Timeout | RecvTimeoutError::Disconnected) => panic!(
                    "{}: no {prefix:?} within {WAIT:?}\n{:#?}",
                    self.name, self.transcript
                ),
            }
        }
    }

    /// Sends `command` and returns the answer line.
    fn ask(&mut self, command: &str, answer: &str) -> String {
        writeln!(self.stdin, "{command}").unwrap();
        self.stdin.flush().unwrap();
        self.expect(answer)
    }

    /// The token of a `LOCKED <name> <token>` answer.
    fn lock(&mut self, command: &str) -> u64 {
        let line = self.ask(command, "LOCKED ");
        line.rsplit(' ').next().unwrap().parse().unwrap()
    }

    fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Member {
    fn drop(&mut self) {
        self.kill();
    }
}

/// Three free loopback addresses (bound, then released: restarts reuse them).
fn addresses() -> Vec<SocketAddr> {
    let listeners: Vec<TcpListener> = (0..3)
        .map(|_| TcpListener::bind("127.0.0.1:0").unwrap())
        .collect();
    listeners.iter().map(|l| l.local_addr().unwrap()).collect()
}

/// A cluster's data directories, removed when dropped.
struct Dirs(Vec<PathBuf>);

impl Drop for Dirs {
    fn drop(&mut self) {
        for dir in &self.0 {
            let _ = std::fs::remove_dir_all(dir);
        }
    }
}

fn start(cluster: &str, dirs: &Dirs, peers: &str) -> Vec<Member> {
    let mut members: Vec<Member> = (0..3)
        .map(|i| Member::spawn(cluster, &format!("r{i}"), &dirs.0[i], peers))
        .collect();
    for m in &mut members {
        m.expect("READY ");
    }
    members
}

#[test]
fn holds_and_tokens_survive_a_full_cluster_restart() {
    let cluster = format!("raft-restart-{}", std::process::id());
    let dirs = Dirs(
        (0..3)
            .map(|i| std::env::temp_dir().join(format!("conclave-{cluster}-{i}")))
            .collect(),
    );
    for dir in &dirs.0 {
        let _ = std::fs::remove_dir_all(dir);
    }
    let peers = addresses()
        .iter()
        .enumerate()
        .map(|(i, a)| format!("r{i}={a}"))
        .collect::<Vec<_>>()
        .join(",");

    let mut members = start(&cluster, &dirs, &peers);
    let job = members[0].lock("lock job");
    let config = members[1].lock("read config");
    let mut last = job.max(config);
    for _ in 0..3 {
        let t = members[2].lock("lock scratch");
        assert!(t > last, "tokens increase: {t} after {last}");
        last = t;
        members[2].ask("unlock scratch", "UNLOCKED");
    }

    // Every member killed at once, mid-hold.
    for m in &mut members {
        m.kill();
    }
    drop(members);

    let mut members = start(&cluster, &dirs, &peers);
    // The table is as it was: both holds, their tokens.
    let table = members[2].ask("table", "TABLE");
    assert!(table.contains(&format!("job=r0:{job}")), "{table}");
    assert!(table.contains(&format!("config=r1:{config}")), "{table}");
    assert!(!table.contains("scratch"), "{table}");
    // The hold excludes others still.
    members[2].ask("try job", "BUSY job");
    // Its member finds it among its holds, and takes it back (nobody held it in between), with
    // a new token above every earlier one: a fencing register refuses the dead process's writes.
    let holds = members[0].ask("holds", "HOLDS");
    assert!(holds.contains(&format!("job={job}")), "{holds}");
    let adopted = members[0].lock("lock job");
    assert!(adopted > last, "{adopted} after {last}");
    last = adopted;
    members[0].ask("unlock job", "UNLOCKED job");
    // The next grant's token is above every token of the cluster's life.
    let next = members[2].lock("lock job");
    assert!(next > last, "{next} after {last}: tokens never go back");

    // And once more: a second full restart keeps going up.
    for m in &mut members {
        m.kill();
    }
    drop(members);
    let mut members = start(&cluster, &dirs, &peers);
    let table = members[1].ask("table", "TABLE");
    assert!(table.contains(&format!("job=r2:{next}")), "{table}");
    let after = members[1].lock("lock other");
    assert!(after > next, "{after} after {next}");
}

/// Seed 002's minority rule, on the Raft engine: a member cut off from the others resigns its
/// holds (`Lost(Minority)`, told to the guard) and its waits (`LockError::NotMember`) before
/// the majority grants its lock to anyone else; a `try_lock` there fails at once with
/// `NotMember`; once it hears the others again it locks again.
#[test]
fn a_member_cut_off_resigns_before_the_majority_grants_again() {
    use conclave::api::Transport;
    use conclave::faults::Faults;
    use conclave::memory::MemoryNetwork;
    use conclave::raft::{RaftConfig, RaftPeer};
    use conclave::{LockError, LockLostReason, LockStatus, Node};
    use conclave_tests::{fixtures, within, WAIT};

    let cluster = format!("raft-minority-{}", std::process::id());
    smol::block_on(within(Duration::from_secs(120), "the scenario", async {
        let network = MemoryNetwork::new();
        let faults = Faults::new();
        let transports: Vec<_> = (0..3).map(|_| faults.wrap(network.transport())).collect();
        let peers: Vec<RaftPeer> = transports
            .iter()
            .enumerate()
            .map(|(i, t)| RaftPeer::new(format!("r{i}"), t.local_addr()))
            .collect();
        let addrs: Vec<SocketAddr> = peers.iter().map(|p| p.addr).collect();
        let config = RaftConfig::local(peers);
        let joins = transports.into_iter().enumerate().map(|(i, t)| {
            Node::builder(&cluster)
                .name(format!("r{i}"))
                .transport(t)
                .data_dir(fixtures::raft_data_dir(&cluster, i))
                .raft(config.clone())
                .join()
        });
        let nodes = within(WAIT, "join", futures::future::try_join_all(joins))
            .await
            .unwrap();
        let (cut, other, third) = (&nodes[0], &nodes[1], &nodes[2]);
        let held = within(WAIT, "lock", cut.mutex("x").unwrap().lock())
            .await
            .unwrap();
        let blocker = within(WAIT, "lock y", third.mutex("y").unwrap().lock())
            .await
            .unwrap();
        let mut waiting = Box::pin(cut.mutex("y").unwrap().lock());
        assert!(futures::poll!(waiting.as_mut()).is_pending());
        let lost = held.lost();

        faults.isolate(addrs[0]);
        let (told, granted) = within(
            WAIT,
            "resignation and the next grant",
            futures::future::join(async { (lost.await, std::time::Instant::now()) }, async {
                (
                    other.mutex("x").unwrap().lock().await,
                    std::time::Instant::now(),
                )
            }),
        )
        .await;
        assert_eq!(told.0, LockLostReason::Minority);
        assert!(
            told.1 <= granted.1,
            "the cut-off holder was told after the next grant"
        );
        let next = granted
            .0
            .expect("the majority grants once the member is expired");
        assert!(next.fencing_token() > held.fencing_token());
        assert_eq!(held.status(), LockStatus::Lost);
        assert_eq!(
            within(WAIT, "the cut-off wait", waiting).await.unwrap_err(),
            LockError::NotMember
        );
        assert_eq!(
            within(
                WAIT,
                "a try_lock cut off",
                cut.mutex("w").unwrap().try_lock()
            )
            .await
            .unwrap_err(),
            LockError::NotMember
        );
        drop(blocker);
        drop(next);

        faults.heal();
        let again = within(WAIT, "a lock once healed", cut.mutex("z").unwrap().lock())
            .await
            .unwrap();
        assert_eq!(again.status(), LockStatus::Held);
        drop(again);
        for node in nodes {
            within(WAIT, "leave", node.leave()).await;
        }
    }));
}
