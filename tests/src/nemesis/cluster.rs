//! The member processes: how each is started (own loopback address, data directory, the
//! `fenced` client right away), restarted, signalled, and how their output reaches the harness.

use std::fs::OpenOptions;
use std::io::{BufRead, BufReader, Write};
use std::net::{Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc::Sender;

use super::{faults, now_us};

/// The members' port on their own loopback address (unicast UDP or the TCP listener).
pub const PORT: u16 = 7700;
/// The UDP discovery port and group.
pub const DISCOVERY: (u16, Ipv4Addr) = (7800, Ipv4Addr::new(239, 255, 67, 76));
/// The locks every member's client works on.
pub const LOCKS: [&str; 4] = ["a", "b", "c", "d"];

/// A line a member printed (`None`: its output ended), with its generation.
#[derive(Debug)]
pub struct Output {
    /// Which member.
    pub member: usize,
    /// Which start of it.
    pub generation: u64,
    /// The line, or `None` at the end of its output.
    pub line: Option<String>,
}

/// How members are started.
#[derive(Clone, Debug)]
pub struct Plan {
    /// The `conclave-node` binary.
    pub node_exe: PathBuf,
    /// The run folder.
    pub dir: PathBuf,
    /// `udp` or `tcp`.
    pub transport: String,
    /// `Majority { 5 }` rather than `Available`.
    pub majority: bool,
    /// The Raft engine instead of the group backend (over TCP).
    pub raft: bool,
    /// The cluster key file, if any.
    pub key_file: Option<PathBuf>,
    /// The failure detector's suspect timeout.
    pub suspect_ms: u64,
    /// How long each section holds its lock.
    pub hold_ms: u64,
    /// The bound of each `lock_timeout`.
    pub timeout_ms: u64,
    /// Runs the deliberately broken client.
    pub broken: bool,
    /// The one-hop handoff on in every member.
    pub handoff: bool,
    /// How many members.
    pub size: usize,
}

/// One member and its current process.
#[derive(Debug)]
pub struct Member {
    /// `n1`..`n5`.
    pub name: String,
    /// Its own loopback address, 127.0.0.k.
    pub ip: Ipv4Addr,
    /// The running process, if any.
    pub child: Option<Child>,
    stdin: Option<ChildStdin>,
    /// Which start this is.
    pub generation: u64,
    /// Whether it is stopped by SIGSTOP now.
    pub paused: bool,
}

impl Member {
    /// Member `index` (from 0).
    pub fn new(index: usize) -> Self {
        let k = u8::try_from(index + 1).unwrap_or(u8::MAX);
        Self {
            name: format!("n{}", index + 1),
            ip: Ipv4Addr::new(127, 0, 0, k),
            child: None,
            stdin: None,
            generation: 0,
            paused: false,
        }
    }

    /// Its address.
    pub fn addr(&self) -> SocketAddr {
        SocketAddr::from((self.ip, PORT))
    }

    /// The process id, if it runs.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// Starts its process and queues the `fenced` command (read once it has joined).
    ///
    /// # Errors
    /// The process could not be started.
    pub fn start(
        &mut self,
        index: usize,
        plan: &Plan,
        founding: &str,
        out: &Sender<Output>,
    ) -> Result<(), String> {
        let data = plan.dir.join("data").join(&self.name);
        let _ = std::fs::create_dir_all(&data);
        let mut cmd = Command::new(&plan.node_exe);
        cmd.arg("nemesis").arg(&self.name).arg(&plan.transport);
        if plan.transport == "udp" {
            cmd.arg(DISCOVERY.0.to_string())
                .arg(DISCOVERY.1.to_string());
        } else {
            for k in 1..=plan.size {
                let k = u8::try_from(k).unwrap_or(u8::MAX);
                cmd.arg(SocketAddr::from((Ipv4Addr::new(127, 0, 0, k), PORT)).to_string());
            }
        }
        cmd.arg("--bind")
            .arg(self.addr().to_string())
            .arg("--data-dir")
            .arg(&data)
            .arg("--suspect-ms")
            .arg(plan.suspect_ms.to_string())
            .arg("--founding")
            .arg(founding);
        if plan.raft {
            let names: Vec<String> = (1..=plan.size).map(|k| format!("n{k}")).collect();
            cmd.arg("--raft").arg(names.join(","));
        } else if plan.majority {
            cmd.arg("--majority").arg(plan.size.to_string());
        }
        if let Some(key) = &plan.key_file {
            cmd.arg("--key-file").arg(key);
        }
        if plan.broken {
            cmd.env("CONCLAVE_NEMESIS_BROKEN", "ignore-lost");
        }
        if plan.handoff {
            cmd.arg("--handoff");
        }
        let err = OpenOptions::new()
            .create(true)
            .append(true)
            .open(plan.dir.join(format!("node-{}.err", self.name)))
            .map_err(|e| format!("stderr file: {e}"))?;
        let mut child = cmd
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(err)
            .spawn()
            .map_err(|e| format!("start {}: {e}", self.name))?;
        append(
            &plan.dir.join("pids"),
            &format!("{} {}\n", child.id(), self.name),
        );
        self.generation += 1;
        self.paused = false;
        let stdout = child.stdout.take();
        self.stdin = child.stdin.take();
        self.child = Some(child);
        let locks = LOCKS.join(" ");
        self.send(&format!(
            "fenced {} {} {} {locks}",
            plan.dir.display(),
            plan.hold_ms,
            plan.timeout_ms
        ));
        if let Some(stdout) = stdout {
            let (out, generation) = (out.clone(), self.generation);
            let log = plan.dir.join(format!("node-{}.out", self.name));
            let spawned = std::thread::Builder::new()
                .name(format!("out-{}", self.name))
                .spawn(move || {
                    for line in BufReader::new(stdout).lines() {
                        let Ok(line) = line else { break };
                        append(&log, &format!("{} {line}\n", now_us()));
                        let line = Some(line);
                        if out
                            .send(Output {
                                member: index,
                                generation,
                                line,
                            })
                            .is_err()
                        {
                            return;
                        }
                    }
                    let _ = out.send(Output {
                        member: index,
                        generation,
                        line: None,
                    });
                });
            if spawned.is_err() {
                return Err("could not start an output reader".to_owned());
            }
        }
        Ok(())
    }

    /// Writes one command line to it (ignored if it is gone).
    pub fn send(&mut self, line: &str) {
        if let Some(stdin) = &mut self.stdin {
            let _ = writeln!(stdin, "{line}").and_then(|()| stdin.flush());
        }
    }

    /// kill -9 and reap.
    pub fn kill(&mut self) {
        self.stdin = None;
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
        self.paused = false;
    }

    /// Sends SIGSTOP or SIGCONT.
    pub fn pause(&mut self, stop: bool) {
        if let Some(pid) = self.pid() {
            let _ = faults::signal(pid, if stop { "STOP" } else { "CONT" });
            self.paused = stop;
        }
    }

    /// Whether its process has exited (reaping it if so).
    pub fn exited(&mut self) -> bool {
        match &mut self.child {
            Some(child) => !matches!(child.try_wait(), Ok(None)),
            None => true,
        }
    }

    /// Closes its input (it then leaves and exits).
    pub fn close_input(&mut self) {
        self.stdin = None;
    }
}

impl Drop for Member {
    /// Whatever happened, no member outlives the harness.
    fn drop(&mut self) {
        if self.paused {
            self.pause(false);
        }
        self.kill();
    }
}

/// Appends to a file, ignoring errors (a log line lost is seen by the checker as a gap).
pub fn append(path: &Path, text: &str) {
    if let Ok(mut f) = OpenOptions::new().create(true).append(true).open(path) {
        let _ = f.write_all(text.as_bytes());
    }
}
