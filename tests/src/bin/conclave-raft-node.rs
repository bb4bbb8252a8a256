//! A Raft member in a process of its own, driven by lines on stdin, for the tests that kill
//! and restart whole clusters (`tests/tests/raft.rs`).
//!
//! ```text
//! conclave-raft-node <cluster> <member-name> <data-dir> <name=addr>,<name=addr>,... [--grace-ms MS]
//! ```
//!
//! The member listens on its own address of the list (TCP mesh on loopback) and prints
//! `READY <member id>` once the cluster applied its arrival. Commands, one per line; each
//! answer is one line:
//!
//! | command | answer |
//! |---|---|
//! | `lock NAME` | `LOCKED NAME TOKEN` (exclusive, waits) |
//! | `read NAME` | `LOCKED NAME TOKEN` (shared, waits) |
//! | `try NAME` | `LOCKED NAME TOKEN` or `BUSY NAME` |
//! | `unlock NAME` | `UNLOCKED NAME` or `ERROR ...` |
//! | `holds` | `HOLDS NAME=TOKEN ...` (this member's holds, recovered ones included) |
//! | `table` | `TABLE NAME=HOLDER:TOKEN ...` (the cluster's table, read through the leader) |
//!
//! Tokens print as their raw 64-bit value. Errors print `ERROR <what>`. The process holds
//! what it locked until told to unlock, or until it is killed.

use std::collections::BTreeMap;
use std::io::BufRead;
use std::net::SocketAddr;
use std::process::ExitCode;
use std::time::Duration;

use conclave::raft::{RaftConfig, RaftPeer};
use conclave::tcp::{TcpConfig, TcpMesh};
use conclave::{MutexGuard, Node, RwLockGuard};

enum Held {
    Exclusive(MutexGuard),
    Shared(RwLockGuard),
}

fn main() -> ExitCode {
    match run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("conclave-raft-node: {e}");
            ExitCode::from(2)
        }
    }
}

fn run() -> Result<(), String> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [cluster, name, dir, peers, rest @ ..] = args.as_slice() else {
        return Err(
            "usage: conclave-raft-node <cluster> <name> <data-dir> <name=addr,...> [--grace-ms MS]"
                .into(),
        );
    };
    let mut grace = None;
    let mut rest = rest.iter();
    while let Some(flag) = rest.next() {
        match flag.as_str() {
            "--grace-ms" => {
                let ms: u64 = rest
                    .next()
                    .ok_or("--grace-ms needs milliseconds")?
                    .parse()
                    .map_err(|e| format!("--grace-ms: {e}"))?;
                grace = Some(Duration::from_millis(ms));
            }
            other => return Err(format!("unknown argument {other:?}")),
        }
    }
    let peers: Vec<RaftPeer> = peers
        .split(',')
        .map(|p| {
            let (n, a) = p
                .split_once('=')
                .ok_or(format!("peer {p:?} is not name=addr"))?;
            let addr: SocketAddr = a.parse().map_err(|e| format!("peer {p:?}: {e}"))?;
            Ok(RaftPeer::new(n, addr))
        })
        .collect::<Result<_, String>>()?;
    let addr = peers
        .iter()
        .find(|p| &p.name == name)
        .ok_or("this member is not in the peer list")?
        .addr;
    if !addr.ip().is_loopback() {
        return Err("tests listen on loopback only".into());
    }
    let mesh = TcpMesh::bind(&TcpConfig {
        bind: addr,
        ..TcpConfig::loopback()
    })
    .map_err(|e| format!("bind {addr}: {e}"))?;
    let mut config = RaftConfig::new(peers);
    config.tick = Duration::from_millis(10);
    if let Some(grace) = grace {
        config.recovered_hold_grace = grace;
    }
    smol::block_on(async {
        let node = Node::builder(cluster.as_str())
            .name(name.as_str())
            .transport(mesh)
            .data_dir(dir)
            .raft(config)
            .join_timeout(Duration::from_secs(30))
            .join()
            .await
            .map_err(|e| format!("join: {e}"))?;
        println!("READY {}", node.member_id());
        let mut held: BTreeMap<String, Held> = BTreeMap::new();
        let stdin = std::io::stdin();
        for line in stdin.lock().lines() {
            let line = line.map_err(|e| e.to_string())?;
            let (command, lock) = line.split_once(' ').unwrap_or((line.as_str(), ""));
            let answer = match command {
                "lock" => match node.mutex(lock) {
                    Ok(m) => match m.lock().await {
                        Ok(g) => {
                            let t = g.fencing_token().0;
                            held.insert(lock.to_owned(), Held::Exclusive(g));
                            format!("LOCKED {lock} {t}")
                        }
                        Err(e) => format!("ERROR {e}"),
                    },
                    Err(e) => format!("ERROR {e}"),
                },
                "read" => match node.rw_lock(lock) {
                    Ok(m) => match m.read().await {
                        Ok(g) => {
                            let t = g.fencing_token().0;
                            held.insert(lock.to_owned(), Held::Shared(g));
                            format!("LOCKED {lock} {t}")
                        }
                        Err(e) => format!("ERROR {e}"),
                    },
                    Err(e) => format!("ERROR {e}"),
                },
                "try" => match node.mutex(lock) {
                    Ok(m) => match m.try_lock().await {
                        Ok(g) => {
                            let t = g.fencing_token().0;
                            held.insert(lock.to_owned(), Held::Exclusive(g));
                            format!("LOCKED {lock} {t}")
                        }
                        Err(conclave::LockError::WouldBlock) => format!("BUSY {lock}"),
                        Err(e) => format!("ERROR {e}"),
                    },
                    Err(e) => format!("ERROR {e}"),
                },
                "unlock" => match held.remove(lock) {
                    Some(Held::Exclusive(g)) => match g.unlock().await {
                        Ok(()) => format!("UNLOCKED {lock}"),
                        Err(e) => format!("ERROR {e}"),
                    },
                    Some(Held::Shared(g)) => match g.unlock().await {
                        Ok(()) => format!("UNLOCKED {lock}"),
                        Err(e) => format!("ERROR {e}"),
                    },
                    None => format!("ERROR {lock} is not held here"),
                },
                "holds" => {
                    let mut out = String::from("HOLDS");
                    for h in node.held_locks() {
                        out.push_str(&format!(" {}={}", h.name, h.token.0));
                    }
                    out
                }
                "table" => match node.lock_table().await {
                    Ok(table) => {
                        let mut out = String::from("TABLE");
                        for lock in &table.locks {
                            for h in &lock.holders {
                                out.push_str(&format!(
                                    " {}={}:{}",
                                    lock.name,
                                    h.owner.member.name(),
                                    h.token.0
                                ));
                            }
                        }
                        out
                    }
                    Err(e) => format!("ERROR {e}"),
                },
                other => format!("ERROR unknown command {other:?}"),
            };
            println!("{answer}");
        }
        node.leave().await;
        Ok(())
    })
}
