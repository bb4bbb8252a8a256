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
    // Its member finds it among its holds, and takes it back with its token.
    let holds = members[0].ask("holds", "HOLDS");
    assert!(holds.contains(&format!("job={job}")), "{holds}");
    assert_eq!(
        members[0].lock("lock job"),
        job,
        "the same hold, the same token"
    );
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
