//! The real multi-process suite, once over each backend (modules `udp` and `tcp`): each member
//! is a `conclave-node` process (see `tests/src/bin/conclave-node.rs`) driven through its stdin and
//! stdout.
//!
//! Everything stays on loopback. Over UDP: unicast on 127.0.0.1, multicast discovery on
//! interface 127.0.0.1 with TTL 0, on a group and port derived from this test process's id and
//! the test, so parallel tests and parallel runs do not meet. Over TCP: listeners on 127.0.0.1
//! with ephemeral ports; the first member founds the cluster and the others get the live
//! members as seeds. Every child is killed by its own PID when its [`Member`] guard drops, also
//! when the test fails; every wait is bounded.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeSet;
use std::io::{BufRead, BufReader, ErrorKind, Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpStream, UdpSocket};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, Sender};
use std::time::{Duration, Instant};

use conclave::api::wire::{self, ClusterId, Discovery, Frame, Packet};
use conclave::api::Transport;
use conclave::seal::ClusterKey;
use conclave::tcp::TcpMesh;
use conclave::udp::{UdpConfig, UdpMulticast};
use conclave::{EndpointConfig, MemberId, Node, View};
use conclave_tests::attacker::{Direction, Tap};

/// The bound on any single wait for a child's answer.
const WAIT: Duration = Duration::from_secs(30);

/// The node binary under test.
const NODE: &str = env!("CARGO_BIN_EXE_conclave-node");

/// The flooding binary of the flood test.
const FLOOD: &str = env!("CARGO_BIN_EXE_conclave-flood");

/// Which transport the members use.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Backend {
    Udp,
    Tcp,
}

/// Every test of the suite, once per backend: `udp::<test>` and `tcp::<test>`.
macro_rules! over_both_backends {
    ($($test:ident),* $(,)?) => {
        mod udp {
            $(#[test] fn $test() { super::$test(super::Backend::Udp) })*
        }
        mod tcp {
            $(#[test] fn $test() { super::$test(super::Backend::Tcp) })*
        }
    };
}

over_both_backends!(
    three_processes_form_one_view,
    five_processes_form_one_view,
    sixty_four_processes_form_one_view,
    processes_exclude_each_other_on_a_shared_counter,
    survivors_of_a_killed_coordinator_keep_their_locks_and_serve_its_waiters,
    a_killed_coordinator_under_the_majority_policy,
    a_paused_grantor_grants_nothing_when_it_wakes,
    a_killed_member_restarts_and_rejoins_as_a_new_member,
    garbage_and_foreign_traffic_is_ignored,
    tokens_never_go_back_after_the_whole_cluster_restarts,
    a_rolling_restart_keeps_serving,
    a_killed_idle_member_stops_no_grant,
);

/// The tests of the security suite that need processes: `security::udp::<test>` and
/// `security::tcp::<test>`.
mod security {
    over_both_backends!(
        keys_rotate_while_processes_count,
        a_flood_of_bogus_and_replayed_datagrams,
    );

    use super::{Backend, Cluster};

    fn keys_rotate_while_processes_count(backend: Backend) {
        super::keys_rotate_while_processes_count(Cluster::new("rotate", 9, backend));
    }

    fn a_flood_of_bogus_and_replayed_datagrams(backend: Backend) {
        super::a_flood_of_bogus_and_replayed_datagrams(Cluster::new("flood", 10, backend));
    }
}

fn three_processes_form_one_view(backend: Backend) {
    let mut cluster = Cluster::new("view3", 0, backend);
    cluster.start_all(&["a", "b", "c"]);
}

fn five_processes_form_one_view(backend: Backend) {
    let mut cluster = Cluster::new("view5", 1, backend);
    cluster.start_all(&["a", "b", "c", "d", "e"]);
}

/// 64 member processes started together agree on one view of all of them (bounded by the
/// suite's wait; every process killed by its PID when the cluster is dropped). The count of
/// views they went through is the simulator's business (`protocol/tests/scale.rs`).
fn sixty_four_processes_form_one_view(backend: Backend) {
    // One 64-process cluster at a time: two at once on a 2-core machine starve the seed of a
    // TCP cluster, its joiners found clusters of their own, and those can only meet again
    // through a seed that still coordinates.
    static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let _turn = ONE_AT_A_TIME
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let mut cluster = Cluster::new("view64", 11, backend);
    let names: Vec<String> = (0..64).map(|i| format!("m{i}")).collect();
    let names: Vec<&str> = names.iter().map(String::as_str).collect();
    let view = cluster.start_all(&names);
    assert_eq!(view.len(), 64);
}

fn processes_exclude_each_other_on_a_shared_counter(backend: Backend) {
    const ROUNDS: u64 = 20;
    let mut cluster = Cluster::new("mutex", 2, backend);
    cluster.start_all(&["a", "b", "c"]);
    let counter = cluster.dir.join("counter");
    for member in &mut cluster.members {
        member.send(&format!("incr {} counter {ROUNDS}", counter.display()));
    }
    for member in &mut cluster.members {
        member.expect("the increments end", |l| {
            l == format!("DONE incr counter {ROUNDS}")
        });
    }
    let expected = ROUNDS * cluster.members.len() as u64;
    assert_eq!(read_counter(&counter), expected);
    check_log(&counter, expected, &["a", "b", "c"]);
}

fn survivors_of_a_killed_coordinator_keep_their_locks_and_serve_its_waiters(backend: Backend) {
    coordinator_killed(Cluster::new("kill", 3, backend));
}

fn a_killed_coordinator_under_the_majority_policy(backend: Backend) {
    // The dead member's lock is re-granted only after its lease has run out.
    let mut cluster = Cluster::new("kill-majority", 6, backend);
    cluster.majority = Some(3);
    coordinator_killed(cluster);
}

/// `SIGSTOP` of the grantor under `Majority` (a process pause: GC, VM steal), for longer than
/// the leases, with a release of the lock it guards waiting in its socket buffer. The others
/// take over and serve a waiter. When the paused grantor resumes, it reads the release: in its
/// old table the lock is now free and its own request waits for it — yet it grants nothing
/// while the new holder holds (its term lost its majority while it slept). Its request is
/// served only after the new holder releases.
fn a_paused_grantor_grants_nothing_when_it_wakes(backend: Backend) {
    let mut cluster = Cluster::new("pause-majority", 7, backend);
    cluster.majority = Some(3);
    let view = cluster.start_all(&["a", "b", "c"]);
    let grantor = cluster.index_of(&view[0]);
    let holder = cluster.index_of(&view[1]);
    let other = cluster.index_of(&view[2]);

    cluster.members[holder].send("lock x");
    cluster.members[holder].expect("holder granted", |l| l.starts_with("GRANTED x "));
    cluster.members[grantor].send("lock x");
    cluster.members[grantor].expect("the grantor waits", |l| l == "WAITING x");

    cluster.members[grantor].signal("STOP");
    // The release reaches the paused grantor's socket buffer (the others do not suspect it
    // yet); it is also kept and resent to whoever grants next.
    cluster.members[holder].send("unlock x");
    cluster.members[other].send("lock x");
    cluster.members[other].expect("the others take over and serve the waiter", |l| {
        l.starts_with("GRANTED x ")
    });
    cluster.members[holder].expect("released", |l| l == "RELEASED x");
    cluster.agree(&[holder, other]);
    std::thread::sleep(Duration::from_millis(500));
    // The paused grantor has slept longer than a lease and the new grantor's grace.
    cluster.members[grantor].signal("CONT");
    for _ in 0..30 {
        for i in [grantor, holder, other] {
            cluster.members[i].poll(Duration::from_millis(50));
        }
    }
    assert!(
        !cluster.members[grantor].saw_prefix("GRANTED x"),
        "the woken grantor was granted a lock someone else holds\n{}\n{}",
        cluster.members[grantor].report(),
        cluster.members[other].report()
    );
    assert_eq!(cluster.status(other, "x"), "held");
    cluster.members[other].send("unlock x");
    cluster.members[other].expect("released", |l| l == "RELEASED x");
    cluster.members[grantor].expect("served after the release", |l| l.starts_with("GRANTED x "));
}

/// `kill -9` of every member of a `Majority` cluster while one holds a lock, then a restart of
/// all of them on their data directories: the first token issued afterwards exceeds the last
/// one issued before (without the data directories the new grantor's term, and its tokens,
/// would start low again).
fn tokens_never_go_back_after_the_whole_cluster_restarts(backend: Backend) {
    let mut cluster = Cluster::new("restart-all", 8, backend);
    cluster.majority = Some(3);
    cluster.data_dirs = true;
    let names = ["a", "b", "c"];
    let view = cluster.start_all(&names);
    let mut last = 0u64;
    for (round, id) in view.iter().cycle().take(4).enumerate() {
        let i = cluster.index_of(id);
        cluster.members[i].send("lock t");
        let line = cluster.members[i].expect("granted", |l| l.starts_with("GRANTED t "));
        let token: u64 = line.rsplit(' ').next().unwrap().parse().unwrap();
        assert!(token > last, "round {round}: {token} after {last}");
        last = token;
        if round < 3 {
            cluster.members[i].send("unlock t");
            cluster.members[i].expect("released", |l| l == "RELEASED t");
        }
    }
    for member in &mut cluster.members {
        member.kill();
    }
    cluster.members.clear();
    cluster.start_all(&names);
    let first = cluster.members.len() - 1;
    cluster.members[first].send("lock t");
    let line =
        cluster.members[first].expect("granted after the restart", |l| l.starts_with("GRANTED t "));
    let token: u64 = line.rsplit(' ').next().unwrap().parse().unwrap();
    assert!(
        token > last,
        "the first token after the restart, {token}, does not exceed the last before, {last}"
    );
}

/// A rolling restart under a steady lock workload. Five members; each running member locks
/// three locks in turn, holding each for 5 ms (`conclave-node`'s `work`). One by one, in the
/// order of the first view, every member stops its work, leaves gracefully and starts again
/// under the same name (a new incarnation), and the next goes once every member shows a view
/// of all five: each leaves while it coordinates, so each leave hands the grantor role over.
///
/// No grant waits longer than three times the failure-detection time, the suspect timeout of
/// the timings the nodes use (`EndpointConfig::local()`: 400 ms, so 1.2 s); the critical
/// sections of each lock never overlap (its log alternates the entry and exit of one holder,
/// tokens increasing); and no member loses a lock it held (no `LOST` line: a member that leaves
/// stops its work first, so it holds nothing when it goes).
fn a_rolling_restart_keeps_serving(backend: Backend) {
    const LOCKS: [&str; 3] = ["r0", "r1", "r2"];
    let bound = EndpointConfig::local().gms.suspect_timeout * 3;
    let mut cluster = Cluster::new("rolling", 12, backend);
    let names = ["a", "b", "c", "d", "e"];
    let first_view = cluster.start_all(&names);
    // Restarted members find the cluster under the library's default rule: they must not
    // found one of their own.
    cluster.founding = Some("with-others");
    let all: Vec<usize> = (0..names.len()).collect();
    let work = format!("work {} 5 {}", cluster.dir.display(), LOCKS.join(" "));
    for member in &mut cluster.members {
        member.send(&work);
    }
    let mut transcripts = Vec::new();
    for id in &first_view {
        // The workload runs on for a moment between restarts.
        for &i in &all {
            cluster.members[i].poll(Duration::from_millis(60));
        }
        let i = cluster.index_of(id);
        let coordinator = cluster.members[i].view.as_ref().map(|(_, m)| m[0].clone());
        assert_eq!(
            coordinator.as_ref(),
            Some(id),
            "{id} leaves as the coordinator"
        );
        cluster.members[i].send("stop");
        cluster.members[i].expect("its work stops", |l| l.starts_with("STOPPED "));
        cluster.members[i].send("quit");
        cluster.members[i].expect("it leaves", |l| l == "BYE");
        cluster.members[i].kill();
        let name = cluster.members[i].name.clone();
        let restarted = cluster.spawn(&name);
        let gone = std::mem::replace(&mut cluster.members[i], restarted);
        transcripts.push(gone);
        cluster.members[i].ready();
        cluster.agree(&all);
        cluster.members[i].send(&work);
    }
    for &i in &all {
        cluster.members[i].poll(Duration::from_millis(60));
    }
    for member in &mut cluster.members {
        member.send("stop");
        member.expect("the work stops", |l| l.starts_with("STOPPED "));
    }
    for member in transcripts.iter().chain(&cluster.members) {
        assert!(
            !member.saw_prefix("LOST ") && !member.saw_prefix("ERROR "),
            "{}: a lock was lost, or an operation failed\n{}",
            member.name,
            member.report()
        );
    }
    let mut longest = Duration::ZERO;
    for lock in LOCKS {
        longest = longest.max(check_work_log(
            &cluster.dir.join(format!("{lock}.log")),
            bound,
        ));
    }
    eprintln!("rolling restart over {backend:?}: the longest grant wait was {longest:?} (bound {bound:?})");
}

/// `kill -9` of a member that holds nothing and waits for nothing, under `Majority` with five
/// members, then its restart under the same name: four members keep locking three locks
/// (`conclave-node`'s `work`, 5 ms holds) throughout. Neither the view that drops the dead
/// member nor the one that admits its successor begins a new grantor term (every token of the
/// run has the same term, its high half), grants go on between the steps, no grant waits longer
/// than three times the suspect timeout (a new term would cost the support lease, the lease and
/// its margin on top of the detection), and no worker loses a lock.
fn a_killed_idle_member_stops_no_grant(backend: Backend) {
    const LOCKS: [&str; 3] = ["i0", "i1", "i2"];
    let bound = EndpointConfig::local().gms.suspect_timeout * 3;
    let mut cluster = Cluster::new("idle-kill", 13, backend);
    cluster.majority = Some(5);
    let view = cluster.start_all(&["a", "b", "c", "d", "e"]);
    // The last member of the view: neither the coordinator nor the grantor.
    let victim = cluster.index_of(&view[4]);
    let workers: Vec<usize> = (0..5).filter(|&i| i != victim).collect();
    // The first grant begins the grantor's term (it waits for the support lease); the
    // workload starts once the term stands.
    let first = workers[0];
    cluster.members[first].send("lock i0");
    cluster.members[first].expect("the term begins", |l| l.starts_with("GRANTED i0 "));
    cluster.members[first].send("unlock i0");
    cluster.members[first].expect("released", |l| l == "RELEASED i0");
    let work = format!("work {} 5 {}", cluster.dir.display(), LOCKS.join(" "));
    for &i in &workers {
        cluster.members[i].send(&work);
    }
    let logs: Vec<PathBuf> = LOCKS
        .iter()
        .map(|lock| cluster.dir.join(format!("{lock}.log")))
        .collect();
    let mut sections = wait_for_sections(&mut cluster, &workers, &logs, 0);

    cluster.members[victim].kill();
    cluster.agree(&workers);
    sections = wait_for_sections(&mut cluster, &workers, &logs, sections);

    let name = cluster.members[victim].name.clone();
    let mut successor = cluster.spawn(&name);
    successor.ready();
    cluster.members[victim] = successor;
    cluster.agree(&[0, 1, 2, 3, 4]);
    wait_for_sections(&mut cluster, &workers, &logs, sections);

    for &i in &workers {
        cluster.members[i].send("stop");
        cluster.members[i].expect("the work stops", |l| l.starts_with("STOPPED "));
    }
    for member in &cluster.members {
        assert!(
            !member.saw_prefix("LOST ") && !member.saw_prefix("ERROR "),
            "{}: a lock was lost, or an operation failed\n{}",
            member.name,
            member.report()
        );
    }
    let mut longest = Duration::ZERO;
    let mut terms = BTreeSet::new();
    for log in &logs {
        longest = longest.max(check_work_log(log, bound));
        let text = std::fs::read_to_string(log).unwrap();
        terms.extend(text.lines().filter_map(|line| {
            let token: u64 = line
                .strip_prefix("enter ")?
                .split(' ')
                .next()?
                .parse()
                .ok()?;
            Some(token >> 32)
        }));
    }
    assert_eq!(
        terms.len(),
        1,
        "the kill or the restart of a member that held nothing began a new grantor term: terms {terms:?}"
    );
    eprintln!("idle member killed and restarted over {backend:?}: the longest grant wait was {longest:?} (bound {bound:?})");
}

/// Polls the `workers` until the locks' logs hold at least 20 more lines (10 sections) than
/// `before`, so grants went on; returns the new count. Fails after `WAIT`.
fn wait_for_sections(
    cluster: &mut Cluster,
    workers: &[usize],
    logs: &[PathBuf],
    before: usize,
) -> usize {
    let deadline = Instant::now() + WAIT;
    loop {
        for &i in workers {
            cluster.members[i].poll(Duration::from_millis(20));
        }
        let lines: usize = logs
            .iter()
            .map(|log| std::fs::read_to_string(log).map_or(0, |text| text.lines().count()))
            .sum();
        if lines >= before + 20 {
            return lines;
        }
        assert!(
            Instant::now() < deadline,
            "grants stopped: {lines} log lines, {before} before, after {WAIT:?}"
        );
    }
}

/// Checks the log of one lock of `work`: each entry followed directly by the exit of the same
/// token and member (no overlap), tokens strictly increasing, no grant waited longer than
/// `bound`. Returns the longest wait.
fn check_work_log(log: &Path, bound: Duration) -> Duration {
    let text = std::fs::read_to_string(log).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    assert!(
        lines.len() >= 20 && lines.len() % 2 == 0,
        "{}: too few sections, or one cut short:\n{text}",
        log.display()
    );
    let mut last: Option<u64> = None;
    let mut longest = Duration::ZERO;
    for (i, pair) in lines.chunks(2).enumerate() {
        let enter: Vec<&str> = pair[0].split(' ').collect();
        let exit: Vec<&str> = pair[1].split(' ').collect();
        assert!(
            enter.len() == 4 && enter[0] == "enter" && exit.len() == 3 && exit[0] == "exit",
            "section {i} is not an entry followed by its exit: {pair:?}\nlog:\n{text}"
        );
        assert_eq!(
            enter[1..3],
            exit[1..],
            "critical sections overlap at section {i}\nlog:\n{text}"
        );
        let token: u64 = enter[1].parse().unwrap();
        assert!(
            last.is_none_or(|last| token > last),
            "fencing token {token} after {last:?} at section {i}\nlog:\n{text}"
        );
        last = Some(token);
        let waited = Duration::from_micros(enter[3].parse().unwrap());
        assert!(
            waited <= bound,
            "section {i} waited {waited:?} for its grant, above {bound:?}\nlog:\n{text}"
        );
        longest = longest.max(waited);
    }
    longest
}

/// `kill -9` of the coordinator of three processes, one survivor holding a lock, the other
/// waiting for a lock of the coordinator.
fn coordinator_killed(mut cluster: Cluster) {
    let view = cluster.start_all(&["a", "b", "c"]);
    // The coordinator (also the grantor) dies; `next` becomes the grantor and must rebuild
    // the table from `holder`'s report.
    let coordinator = cluster.index_of(&view[0]);
    let next = cluster.index_of(&view[1]);
    let holder = cluster.index_of(&view[2]);

    cluster.members[holder].send("lock held");
    cluster.members[holder].expect("holder granted", |l| l.starts_with("GRANTED held "));
    cluster.members[coordinator].send("lock doomed");
    cluster.members[coordinator]
        .expect("coordinator granted", |l| l.starts_with("GRANTED doomed "));
    cluster.members[next].send("lock doomed");
    cluster.members[next].expect("waiter registered", |l| l == "WAITING doomed");
    // Give the request time to reach the grantor's queue (not needed for correctness: an
    // unanswered request is also reported to the next grantor).
    std::thread::sleep(Duration::from_millis(300));
    for i in [coordinator, next, holder] {
        cluster.members[i].poll(Duration::from_millis(10));
    }
    assert!(
        !cluster.members[next].saw_prefix("GRANTED doomed"),
        "granted a lock its holder still holds\n{}\n{}",
        cluster.members[coordinator].report(),
        cluster.members[next].report()
    );

    cluster.members[coordinator].kill();
    let survivors = [next, holder];
    cluster.agree(&survivors);

    cluster.members[next].expect("the waiter is served", |l| l.starts_with("GRANTED doomed "));
    assert_eq!(cluster.status(holder, "held"), "held");
    cluster.members[next].send("try held");
    cluster.members[next].expect("the hold survived", |l| {
        l == "BUSY held" || l.starts_with("GRANTED held ")
    });
    assert!(
        cluster.members[next].saw("BUSY held"),
        "the new grantor granted a lock the holder still has"
    );
    cluster.members[holder].send("unlock held");
    cluster.members[holder].expect("released", |l| l == "RELEASED held");
    // Under `Majority` a new grantor grants nothing until the old leases have run out (a
    // try-lock of the free lock then reports `Unavailable`; a lock still fenced for a departed
    // holder, `WouldBlock`): retry.
    let mut busy = 0;
    loop {
        cluster.members[next].send("try held");
        let line = cluster.members[next].expect("free after release", |l| {
            l == "BUSY held"
                || l.starts_with("GRANTED held ")
                || l.starts_with("ERROR try held no grantor can grant")
                || l.starts_with("ERROR lock held no grantor can grant")
        });
        if line.starts_with("GRANTED") {
            break;
        }
        busy += 1;
        assert!(busy < 40, "{}", cluster.members[next].report());
        std::thread::sleep(Duration::from_millis(250));
    }
    assert!(!cluster.members[holder].saw_prefix("LOST "));
    assert!(!cluster.members[next].saw_prefix("LOST "));
}

fn a_killed_member_restarts_and_rejoins_as_a_new_member(backend: Backend) {
    let mut cluster = Cluster::new("restart", 4, backend);
    let view = cluster.start_all(&["a", "b", "c"]);
    let victim = cluster.index_of(&view[1]);
    let old = cluster.members[victim].id.clone();
    cluster.members[victim].kill();
    let survivors: Vec<usize> = (0..3).filter(|&i| i != victim).collect();
    cluster.agree(&survivors);

    let name = cluster.members[victim].name.clone();
    let mut fresh = cluster.spawn(&name);
    fresh.ready();
    assert_ne!(fresh.id, old, "a restarted process is a new member");
    assert_eq!(member_name(&fresh.id), member_name(&old));
    cluster.members[victim] = fresh;
    let view = cluster.agree(&[0, 1, 2]);
    assert!(!view.contains(&old));

    cluster.members[victim].send("lock after-restart");
    cluster.members[victim].expect("granted", |l| l.starts_with("GRANTED after-restart "));
    let other = survivors[0];
    cluster.members[other].send("try after-restart");
    cluster.members[other].expect("busy", |l| l == "BUSY after-restart");
}

fn garbage_and_foreign_traffic_is_ignored(backend: Backend) {
    const ROUNDS: u64 = 10;
    let mut cluster = Cluster::new("garbage", 5, backend);
    let before = cluster.start_all(&["a", "b", "c"]);
    let counter = cluster.dir.join("counter");
    for i in [0, 1] {
        cluster.members[i].send(&format!("incr {} counter {ROUNDS}", counter.display()));
    }
    match backend {
        Backend::Udp => udp_noise(&cluster),
        Backend::Tcp => tcp_noise(&cluster),
    }

    // Bad commands are answered with errors, and the node goes on.
    let long = "x".repeat(5_000);
    for bad in [
        "bogus",
        "lock",
        "lock a b",
        "incr f l many",
        "incr f l 1000000000",
        "unlock never-held",
        "\u{0}\u{7f}\u{fffd}",
        &long,
    ] {
        cluster.members[2].send(bad);
    }
    cluster.members[2].send("status sentinel");
    cluster.members[2].expect("answers after bad commands", |l| {
        l == "STATUS sentinel none"
    });
    let errors = cluster.members[2]
        .transcript
        .iter()
        .filter(|l| l.starts_with("ERROR "))
        .count();
    assert_eq!(errors, 8, "{}", cluster.members[2].report());

    for i in [0, 1] {
        cluster.members[i].expect("the increments end", |l| {
            l == format!("DONE incr counter {ROUNDS}")
        });
    }
    assert_eq!(read_counter(&counter), 2 * ROUNDS);
    check_log(&counter, 2 * ROUNDS, &["a", "b"]);
    cluster.members[2].send("lock after");
    cluster.members[2].expect("granted", |l| l.starts_with("GRANTED after "));
    cluster.members[0].send("try after");
    cluster.members[0].expect("busy", |l| l == "BUSY after");
    cluster.members[2].send("unlock after");
    cluster.members[2].expect("released", |l| l == "RELEASED after");
    cluster.members[0].send("try after");
    cluster.members[0].expect("granted", |l| l.starts_with("GRANTED after "));
    // Nobody was excluded or confused into another view by the noise.
    let after = cluster.agree(&[0, 1, 2]);
    assert_eq!(
        before.iter().collect::<BTreeSet<_>>(),
        after.iter().collect::<BTreeSet<_>>()
    );
}

/// Hostile datagrams to every member and to the discovery group, from a socket of no member.
fn udp_noise(cluster: &Cluster) {
    // A listener on the group proves the noise reaches it over loopback.
    let listener = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::DGRAM, None).unwrap();
    listener.set_reuse_address(true).unwrap();
    listener.set_reuse_port(true).unwrap();
    listener
        .bind(&SocketAddr::from((cluster.group, cluster.port)).into())
        .unwrap();
    listener
        .join_multicast_v4(&cluster.group, &Ipv4Addr::LOCALHOST)
        .unwrap();
    let listener = UdpSocket::from(listener);
    listener
        .set_read_timeout(Some(Duration::from_millis(100)))
        .unwrap();

    let socket = UdpSocket::bind("127.0.0.1:0").unwrap();
    let sock = socket2::SockRef::from(&socket);
    sock.set_multicast_if_v4(&Ipv4Addr::LOCALHOST).unwrap();
    socket.set_multicast_ttl_v4(0).unwrap();
    socket.set_multicast_loop_v4(true).unwrap();
    let mut targets: Vec<SocketAddr> = cluster.members.iter().map(|m| m.addr).collect();
    targets.push(SocketAddr::from((cluster.group, cluster.port)));
    let datagrams = hostile_datagrams(&cluster.name);
    for round in 0..3 {
        for bytes in &datagrams {
            for to in &targets {
                // A send may fail with ENOBUFS under load; that only means fewer datagrams.
                let _ = socket.send_to(bytes, to);
            }
        }
        if round == 0 {
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    let mut heard = 0;
    let mut buf = vec![0; 65_536];
    while let Ok((_, from)) = listener.recv_from(&mut buf) {
        heard += usize::from(from == socket.local_addr().unwrap());
    }
    assert!(heard > 0, "the noise did not reach the group");
}

/// Hostile traffic to every member's TCP port: connections that break the framing (junk, a
/// 4 GiB length prefix, an oversized frame after a valid hello), each of which the member must
/// close; then well-framed hostile datagrams from a peer that speaks the TCP handshake.
fn tcp_noise(cluster: &Cluster) {
    let targets: Vec<SocketAddr> = cluster.members.iter().map(|m| m.addr).collect();
    let mut hello_from_nobody = Vec::new();
    hello_from_nobody.extend_from_slice(b"CNCL");
    hello_from_nobody.push(1); // handshake version
    hello_from_nobody.extend_from_slice(&7u64.to_be_bytes()); // instance id
    hello_from_nobody.push(4);
    hello_from_nobody.extend_from_slice(&[127, 0, 0, 1]);
    hello_from_nobody.extend_from_slice(&9u16.to_be_bytes());
    let mut framed_hello = (hello_from_nobody.len() as u32).to_be_bytes().to_vec();
    framed_hello.extend_from_slice(&hello_from_nobody);
    let mut oversized_after_hello = framed_hello.clone();
    oversized_after_hello.extend_from_slice(&u32::MAX.to_be_bytes());
    let breaking: [&[u8]; 4] = [
        b"GET / HTTP/1.1\r\nHost: conclave\r\n\r\n",
        &u32::MAX.to_be_bytes(),
        b"CNCL\x01 not a hello at all",
        &oversized_after_hello,
    ];
    for to in &targets {
        for bytes in breaking {
            let mut stream = TcpStream::connect_timeout(to, WAIT).unwrap();
            stream.set_write_timeout(Some(WAIT)).unwrap();
            stream.set_read_timeout(Some(WAIT)).unwrap();
            // The member may close before all is written: that is the point.
            let _ = stream.write_all(bytes);
            let mut sink = Vec::new();
            match stream.read_to_end(&mut sink) {
                Ok(_) => {}
                Err(e) if e.kind() == ErrorKind::ConnectionReset => {}
                Err(e) => panic!("{to} kept a connection that sent {bytes:?} open: {e}"),
            }
        }
        // A connection that hangs up at once.
        drop(TcpStream::connect_timeout(to, WAIT).unwrap());
    }

    // A peer that completes the handshake and sends garbage, truncated and foreign packets.
    let datagrams = hostile_datagrams(&cluster.name);
    async_io::block_on(async {
        let mesh = TcpMesh::loopback([]).unwrap();
        for bytes in datagrams
            .iter()
            .filter(|d| !d.is_empty() && d.len() <= 60_000)
        {
            for to in &targets {
                mesh.send_to(*to, bytes).unwrap();
            }
        }
        // Drive the mesh (it has no thread of its own) until everything was written.
        let deadline = Instant::now() + WAIT;
        while mesh.stats().queued_bytes > 0 || mesh.stats().connections < targets.len() {
            assert!(
                Instant::now() < deadline,
                "the noise was not sent: {:?}",
                mesh.stats()
            );
            let recv = std::pin::pin!(mesh.recv());
            let tick = async_io::Timer::after(Duration::from_millis(10));
            futures::future::select(recv, tick).await;
        }
        assert!(mesh.stats().frames_sent >= targets.len() as u64);
        mesh.close().await;
    });
}

/// Datagrams a hostile or confused sender might send: random bytes, our header followed by
/// junk, an oversized datagram, truncated valid packets, another cluster's valid packets and a
/// future protocol version.
fn hostile_datagrams(cluster: &str) -> Vec<Vec<u8>> {
    let mut rng = 0x5eed_u64 ^ u64::from(std::process::id());
    let mut random = |len: usize| -> Vec<u8> {
        (0..len)
            .map(|_| {
                rng = rng
                    .wrapping_mul(6_364_136_223_846_793_005)
                    .wrapping_add(1_442_695_040_888_963_407);
                (rng >> 56) as u8
            })
            .collect()
    };
    let ours = ClusterId::from_name(cluster);
    let foreign = ClusterId::from_name("someone-else");
    let fake = MemberId::new(42, "intruder", "127.0.0.1:9".parse().unwrap()).unwrap();
    let view = View::new(7, vec![fake.clone()]).unwrap();
    let packets = [
        Frame::Discovery(Discovery::Ping),
        Frame::Discovery(Discovery::Announce {
            view,
            heard: vec![1],
            settings: Vec::new(),
        }),
        Frame::Heartbeat {
            epoch: 1 << 40,
            view_epoch: 1 << 40,
            coordinator: 1,
            lease: None,
        },
    ]
    .map(|frame| Packet {
        sender: fake.clone(),
        frame,
    });
    let header = |cluster: ClusterId| {
        let mut out = Vec::new();
        wire::Header::write(cluster, &mut out);
        out
    };

    let mut out = Vec::new();
    for len in [0, 1, 4, 12, 13, 100, 1400] {
        out.push(random(len));
    }
    for len in [1, 20, 500] {
        let mut bytes = header(ours);
        bytes.extend(random(len));
        out.push(bytes);
    }
    out.push(random(65_000));
    let mut big = header(ours);
    big.extend(random(65_000 - big.len()));
    out.push(big);
    for packet in &packets {
        let valid = wire::encode_packet(ours, packet).unwrap();
        for cut in [1, 5, 13, 14, valid.len() / 2, valid.len() - 1] {
            out.push(valid[..cut].to_vec());
        }
        out.push(wire::encode_packet(foreign, packet).unwrap());
        let mut newer = valid.clone();
        newer[4] = 99;
        out.push(newer);
    }
    out
}

/// The integer in the counter file.
fn read_counter(path: &Path) -> u64 {
    std::fs::read_to_string(path)
        .unwrap()
        .trim()
        .parse()
        .unwrap()
}

/// Checks the enter/exit log of the counter: `sections` critical sections, each an `enter`
/// followed directly by the `exit` of the same token and member (no overlap), tokens strictly
/// increasing in log order, every member of `members` present.
fn check_log(counter: &Path, sections: u64, members: &[&str]) {
    let mut log = counter.as_os_str().to_owned();
    log.push(".log");
    let text = std::fs::read_to_string(PathBuf::from(log)).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len() as u64, 2 * sections, "log:\n{text}");
    let mut last: Option<u64> = None;
    let mut seen = BTreeSet::new();
    for (i, pair) in lines.chunks(2).enumerate() {
        let enter: Vec<&str> = pair[0].split(' ').collect();
        let exit: Vec<&str> = pair[1].split(' ').collect();
        assert!(
            enter.len() == 3 && enter[0] == "enter" && exit.len() == 3 && exit[0] == "exit",
            "section {i} is not an enter followed by its exit: {pair:?}\nlog:\n{text}"
        );
        assert_eq!(
            enter[1..],
            exit[1..],
            "critical sections overlap at section {i}\nlog:\n{text}"
        );
        let token: u64 = enter[1].parse().unwrap();
        assert!(
            last.is_none_or(|last| token > last),
            "fencing token {token} after {last:?} at section {i}\nlog:\n{text}"
        );
        last = Some(token);
        seen.insert(enter[2].to_owned());
    }
    let expected: BTreeSet<String> = members.iter().map(|m| (*m).to_owned()).collect();
    assert_eq!(seen, expected);
}

/// The name part of a member token `<name>#<incarnation>@<address>`.
fn member_name(id: &str) -> &str {
    id.split('#').next().unwrap_or("")
}

/// One test's cluster: its name, backend, discovery group and port (UDP), scratch directory
/// and members.
struct Cluster {
    name: String,
    backend: Backend,
    port: u16,
    group: Ipv4Addr,
    dir: PathBuf,
    members: Vec<Member>,
    /// `--majority N` for the members started from now on.
    majority: Option<usize>,
    /// Whether members get `--data-dir <dir>/<name>` (their data survives a restart).
    data_dirs: bool,
    /// `--key-file <file>` for the members started from now on.
    key_file: Option<PathBuf>,
    /// `--suspect-ms <ms>` for the members started from now on.
    suspect_ms: Option<u64>,
    /// `--founding` for members started from now on (`None`: the node binary's default,
    /// `alone`).
    founding: Option<&'static str>,
}

impl Cluster {
    /// A cluster for test number `test` (below 16) of this process.
    fn new(test: &str, index: u8, backend: Backend) -> Self {
        assert!(index < 16);
        let pid = std::process::id();
        let port = 20_000 + (pid % 2_500) as u16 * 16 + u16::from(index);
        let group = Ipv4Addr::new(239, 200 + index, (pid >> 8) as u8, pid as u8);
        let kind = format!("{backend:?}").to_lowercase();
        let test = format!("{test}-{kind}");
        let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("multiprocess-{pid}-{test}"));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        Self {
            name: format!("conclave-mp-{test}-{pid}"),
            backend,
            port,
            group,
            dir,
            members: Vec::new(),
            majority: None,
            data_dirs: false,
            key_file: None,
            suspect_ms: None,
            founding: None,
        }
    }

    /// Starts a member: over UDP it finds the others by multicast; over TCP it gets every
    /// live member it knows the address of as a seed (none: it founds the cluster).
    fn spawn(&self, name: &str) -> Member {
        let mut args = vec![self.name.clone(), name.to_owned()];
        match self.backend {
            Backend::Udp => {
                args.extend(["udp".to_owned(), self.port.to_string()]);
                args.push(self.group.to_string());
            }
            Backend::Tcp => {
                args.push("tcp".to_owned());
                args.extend(self.seeds().map(|seed| seed.to_string()));
            }
        }
        if let Some(n) = self.majority {
            args.extend(["--majority".to_owned(), n.to_string()]);
        }
        if self.data_dirs {
            let dir = self.dir.join("data").join(name);
            args.extend(["--data-dir".to_owned(), dir.display().to_string()]);
        }
        if let Some(ms) = self.suspect_ms {
            args.extend(["--suspect-ms".to_owned(), ms.to_string()]);
        }
        if let Some(file) = &self.key_file {
            args.extend(["--key-file".to_owned(), file.display().to_string()]);
        }
        if let Some(founding) = self.founding {
            args.extend(["--founding".to_owned(), founding.to_owned()]);
        }
        Member::spawn(name, &args)
    }

    /// The addresses of the members that are running and ready.
    fn seeds(&self) -> impl Iterator<Item = SocketAddr> + '_ {
        self.members
            .iter()
            .filter(|m| m.alive && !m.id.is_empty())
            .map(|m| m.addr)
    }

    /// Starts one process per name and waits until they agree on one view of exactly them;
    /// returns it (member tokens, coordinator first). Over UDP all start at once; over TCP
    /// the first starts alone (it is everyone's seed), then the others at once.
    fn start_all(&mut self, names: &[&str]) -> Vec<String> {
        let mut names = names.iter();
        if self.backend == Backend::Tcp && self.seeds().next().is_none() {
            if let Some(first) = names.next() {
                let mut member = self.spawn(first);
                member.ready();
                self.members.push(member);
            }
        }
        for name in names {
            let member = self.spawn(name);
            self.members.push(member);
        }
        for member in &mut self.members {
            if member.id.is_empty() {
                member.ready();
            }
        }
        let all: Vec<usize> = (0..self.members.len()).collect();
        self.agree(&all)
    }

    /// Which member has the token `id`.
    fn index_of(&self, id: &str) -> usize {
        self.members.iter().position(|m| m.id == id).unwrap()
    }

    /// Waits until the members at `indices` all show the same view, made of exactly them.
    fn agree(&mut self, indices: &[usize]) -> Vec<String> {
        let wanted: BTreeSet<String> = indices
            .iter()
            .map(|&i| self.members[i].id.clone())
            .collect();
        let deadline = Instant::now() + WAIT;
        loop {
            for &i in indices {
                self.members[i].poll(Duration::from_millis(20));
            }
            let views: Vec<&Option<(u64, Vec<String>)>> =
                indices.iter().map(|&i| &self.members[i].view).collect();
            if let Some(Some((epoch, members))) = views.first() {
                let same = views
                    .iter()
                    .all(|v| v.as_ref().is_some_and(|(e, _)| e == epoch));
                if same && members.iter().cloned().collect::<BTreeSet<_>>() == wanted {
                    return members.clone();
                }
            }
            if Instant::now() > deadline {
                let seen: Vec<String> = indices
                    .iter()
                    .map(|&i| format!("{}: {:?}", self.members[i].name, self.members[i].view))
                    .collect();
                panic!("no agreement on a view of {wanted:?} within {WAIT:?}: {seen:#?}");
            }
        }
    }

    /// The status of `lock` at member `i` once it is not suspended (a grantor change may
    /// suspend it for a moment).
    fn status(&mut self, i: usize, lock: &str) -> String {
        let deadline = Instant::now() + WAIT;
        loop {
            self.members[i].send(&format!("status {lock}"));
            let prefix = format!("STATUS {lock} ");
            let line = self.members[i].expect("status", |l| l.starts_with(&prefix));
            let status = line[prefix.len()..].to_owned();
            if status != "suspended" || Instant::now() > deadline {
                return status;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        // The members drop (and are killed) after this; the scratch directory of a passing
        // test goes now, a failing test's stays for inspection.
        if !std::thread::panicking() {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }
}

/// One `conclave-node` child process. Dropping it kills the child by its PID and reaps it.
struct Member {
    name: String,
    child: Child,
    stdin: Option<ChildStdin>,
    lines: Receiver<String>,
    /// Everything the child printed so far, for assertions and failure reports.
    transcript: Vec<String>,
    /// How much of the transcript [`Member::expect`] has looked at.
    cursor: usize,
    /// `<name>#<incarnation>@<address>`, once ready.
    id: String,
    addr: SocketAddr,
    /// The last view the child reported: epoch and member tokens.
    view: Option<(u64, Vec<String>)>,
    /// Not killed yet.
    alive: bool,
}

impl Member {
    fn spawn(name: &str, args: &[String]) -> Self {
        let mut child = Command::new(NODE)
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn conclave-node");
        let (sender, lines) = mpsc::channel();
        forward(child.stdout.take().unwrap(), "", sender.clone());
        forward(child.stderr.take().unwrap(), "stderr: ", sender);
        Self {
            name: name.to_owned(),
            stdin: child.stdin.take(),
            child,
            lines,
            transcript: Vec::new(),
            cursor: 0,
            id: String::new(),
            addr: SocketAddr::from(([0, 0, 0, 0], 0)),
            view: None,
            alive: true,
        }
    }

    /// Waits for `READY` and records the member's id and address.
    fn ready(&mut self) {
        let line = self.expect("READY", |l| l.starts_with("READY "));
        let id = line.split(' ').nth(1).unwrap().to_owned();
        self.addr = id.rsplit('@').next().unwrap().parse().unwrap();
        self.id = id;
    }

    fn send(&mut self, command: &str) {
        let stdin = self.stdin.as_mut().expect("stdin open");
        if let Err(e) = writeln!(stdin, "{command}").and_then(|()| stdin.flush()) {
            panic!(
                "{}: cannot send {command:?}: {e}\n{}",
                self.name,
                self.report()
            );
        }
    }

    /// The first line after those already looked at that satisfies `wanted`, read from the
    /// child if it did not print it yet; panics after [`WAIT`]. Lines up to it count as looked at.
    fn expect(&mut self, what: &str, wanted: impl Fn(&str) -> bool) -> String {
        while self.cursor < self.transcript.len() {
            self.cursor += 1;
            if wanted(&self.transcript[self.cursor - 1]) {
                return self.transcript[self.cursor - 1].clone();
            }
        }
        let deadline = Instant::now() + WAIT;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(line) => {
                    self.record(&line);
                    self.cursor = self.transcript.len();
                    if wanted(&line) {
                        return line;
                    }
                }
                Err(RecvTimeoutError::Timeout) => {
                    panic!(
                        "{}: no {what} within {WAIT:?}\n{}",
                        self.name,
                        self.report()
                    )
                }
                Err(RecvTimeoutError::Disconnected) => {
                    panic!("{}: exited before {what}\n{}", self.name, self.report())
                }
            }
        }
    }

    /// Reads the lines that arrive within `wait`.
    fn poll(&mut self, wait: Duration) {
        let deadline = Instant::now() + wait;
        while let Ok(line) = self
            .lines
            .recv_timeout(deadline.saturating_duration_since(Instant::now()))
        {
            self.record(&line);
        }
    }

    fn record(&mut self, line: &str) {
        let words: Vec<&str> = line.split(' ').collect();
        let view = match words.as_slice() {
            ["READY", _, epoch, members @ ..] | ["VIEW", epoch, members @ ..] => {
                epoch.parse().ok().map(|e| (e, members))
            }
            _ => None,
        };
        if let Some((epoch, members)) = view {
            self.view = Some((epoch, members.iter().map(|m| (*m).to_owned()).collect()));
        }
        self.transcript.push(line.to_owned());
    }

    /// Whether the child printed exactly `line`.
    fn saw(&self, line: &str) -> bool {
        self.transcript.iter().any(|l| l == line)
    }

    /// Whether the child printed a line starting with `prefix`.
    fn saw_prefix(&self, prefix: &str) -> bool {
        self.transcript.iter().any(|l| l.starts_with(prefix))
    }

    /// `kill -9` of the child, by its PID, and reaping it.
    /// Sends a signal (`STOP`, `CONT`) to the process, by its PID.
    fn signal(&mut self, signal: &str) {
        let status = Command::new("kill")
            .arg(format!("-{signal}"))
            .arg(self.child.id().to_string())
            .status()
            .expect("kill(1) runs");
        assert!(status.success(), "kill -{signal} {}", self.child.id());
        if signal == "STOP" {
            self.wait_stopped();
        }
    }

    /// Waits (at most 5 s) until every thread of the process has stopped: `kill -STOP`
    /// returns before a thread that is running on another CPU stops, and a test that sends the
    /// stopped process a datagram next must know it cannot read it any more (on a loaded
    /// machine the paused grantor read the release it was meant to find on waking).
    fn wait_stopped(&self) {
        let tasks = format!("/proc/{}/task", self.child.id());
        let deadline = Instant::now() + Duration::from_secs(5);
        while Instant::now() < deadline {
            let Ok(entries) = std::fs::read_dir(&tasks) else {
                return; // no procfs: nothing to wait on
            };
            let stopped = entries.flatten().all(|task| {
                std::fs::read_to_string(task.path().join("stat")).is_ok_and(|stat| {
                    // The state follows the command name, which is in parentheses.
                    stat.rsplit_once(") ")
                        .is_some_and(|(_, rest)| rest.starts_with('T') || rest.starts_with('t'))
                })
            });
            if stopped {
                return;
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        panic!(
            "{}: pid {} did not stop within 5 s",
            self.name,
            self.child.id()
        );
    }

    fn kill(&mut self) {
        self.alive = false;
        self.stdin = None;
        let _ = self.child.kill();
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            match self.child.try_wait() {
                Ok(Some(_)) | Err(_) => return,
                Ok(None) => std::thread::sleep(Duration::from_millis(10)),
            }
        }
        eprintln!("{}: pid {} not reaped in 10 s", self.name, self.child.id());
    }

    fn report(&self) -> String {
        format!(
            "--- transcript of {} (pid {}) ---\n{}",
            self.name,
            self.child.id(),
            self.transcript.join("\n")
        )
    }
}

impl Drop for Member {
    fn drop(&mut self) {
        if std::thread::panicking() {
            // Whatever is still buffered helps explain the failure.
            self.poll(Duration::from_millis(10));
            eprintln!("{}", self.report());
        }
        self.kill();
    }
}

/// Forwards the lines of `from` to `to`, each prefixed, on a thread that ends with the pipe.
fn forward(from: impl Read + Send + 'static, prefix: &'static str, to: Sender<String>) {
    std::thread::spawn(move || {
        for line in BufReader::new(from).lines() {
            let Ok(line) = line else { return };
            if to.send(format!("{prefix}{line}")).is_err() {
                return;
            }
        }
    });
}

/// Writes a key file (64 hex digits, private) for `byte`.
fn key_file(dir: &Path, name: &str, byte: u8) -> PathBuf {
    let path = dir.join(name);
    std::fs::write(&path, ClusterKey::from_bytes([byte; 32]).to_hex()).unwrap();
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
    }
    path
}

/// A member's `STATS` line as numbers: the seal counters, then resident KiB.
fn stats(member: &mut Member) -> Vec<u64> {
    member.send("stats");
    let line = member.expect("stats", |l| l.starts_with("STATS "));
    line.split(' ')
        .skip(1)
        .map(|w| w.parse().unwrap())
        .collect()
}

/// Three processes count under one lock while their keys rotate (install the new key on all,
/// make it primary on all, remove the old one on all): the counter ends exact, no hold is lost,
/// nothing fails authentication, and a member with the old key is then refused.
fn keys_rotate_while_processes_count(mut cluster: Cluster) {
    const ROUNDS: u64 = 400;
    let old = key_file(&cluster.dir, "old.key", 11);
    let new = key_file(&cluster.dir, "new.key", 12);
    cluster.key_file = Some(old.clone());
    cluster.start_all(&["a", "b", "c"]);
    let counter = cluster.dir.join("counter");
    for member in &mut cluster.members {
        member.send(&format!("incr {} counter {ROUNDS}", counter.display()));
    }
    for (action, file) in [("install", &new), ("use", &new), ("remove", &old)] {
        // Between steps the members take the lock a few dozen times more: packets sealed
        // before a step (queued, in flight) arrive before the next step removes their key.
        let progress = || {
            // The counter file is rewritten in place: a read may catch it empty.
            std::fs::read_to_string(&counter)
                .ok()
                .and_then(|t| t.trim().parse::<u64>().ok())
        };
        let start = (0..1000).find_map(|_| progress()).unwrap_or(0);
        let deadline = Instant::now() + WAIT;
        while progress().is_none_or(|n| n < start + 30) {
            assert!(
                Instant::now() < deadline,
                "no progress before `key {action}`"
            );
            std::thread::sleep(Duration::from_millis(5));
        }
        for member in &mut cluster.members {
            member.send(&format!("key {action} {}", file.display()));
            member.expect("keys", |l| l.starts_with("KEYS "));
        }
    }
    let new_id = ClusterKey::from_bytes([12; 32]).id().to_string();
    for member in &mut cluster.members {
        let keys = member
            .transcript
            .iter()
            .rev()
            .find(|l| l.starts_with("KEYS "))
            .unwrap()
            .clone();
        assert_eq!(keys, format!("KEYS {new_id} {new_id}"));
        // The rotation ended while this member was still counting.
        assert!(
            !member.saw_prefix("DONE incr"),
            "{} finished before the rotation did: raise ROUNDS",
            member.name
        );
    }
    for member in &mut cluster.members {
        member.expect("the increments end", |l| {
            l == format!("DONE incr counter {ROUNDS}")
        });
    }
    let expected = ROUNDS * 3;
    assert_eq!(read_counter(&counter), expected);
    check_log(&counter, expected, &["a", "b", "c"]);
    for member in &mut cluster.members {
        assert!(!member.saw_prefix("LOST "), "{}", member.report());
        assert!(!member.saw_prefix("ERROR "), "{}", member.report());
        let s = stats(member);
        assert_eq!(
            s[2], 0,
            "{} counted failed authentication: {s:?}",
            member.name
        );
    }
    // The old key alone is refused now; the new one joins.
    cluster.key_file = Some(old);
    let mut stale = cluster.spawn("stale");
    let line = stale.expect("refusal", |l| {
        l.starts_with("FATAL ") || l.starts_with("READY ")
    });
    assert!(line.contains("authentication failed"), "{line}");
    cluster.key_file = Some(new);
    cluster.start_all(&["late"]);
}

/// A hostile process floods the grantor with bogus and replayed datagrams (over UDP at least
/// 100,000 a second) while two members keep taking a lock: locks keep being granted, the
/// grantor's memory stays bounded, and its counters show the drops (over TCP the mesh refuses
/// the flood's connections at the handshake, so none reaches the sealing layer).
fn a_flood_of_bogus_and_replayed_datagrams(mut cluster: Cluster) {
    const SECONDS: u64 = 4;
    // One flood at a time: two would share the two cores and measure each other.
    static ONE_FLOOD: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let _flood = ONE_FLOOD
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let key = key_file(&cluster.dir, "cluster.key", 21);
    cluster.key_file = Some(key);
    // The flood fills the grantor's receive queue, and the kernel drops what does not fit,
    // heartbeats included: with the one-host suspect timeout (400 ms) the members then suspect
    // each other, split, and under `Available` each part grants the lock (as documented), so
    // the counter is written by two holders at once. Failure detection is not what this test
    // is about: members suspect only after longer than the flood lasts.
    cluster.suspect_ms = Some(3 * SECONDS * 1_000);
    let view = cluster.start_all(&["a", "b", "c"]);
    let grantor = cluster.index_of(&view[0]);
    let target = cluster.members[grantor].addr;

    // Replay material: a keyed member of this process, tapped, takes a lock a few times; what it
    // sent to the grantor, as it crossed the network, is what the flood replays.
    let replays = record_traffic_to(&cluster, target);
    assert!(!replays.is_empty());
    let replay_file = cluster.dir.join("replays");
    let mut bytes = Vec::new();
    for r in &replays {
        bytes.extend_from_slice(&u32::try_from(r.len()).unwrap().to_be_bytes());
        bytes.extend_from_slice(r);
    }
    std::fs::write(&replay_file, bytes).unwrap();

    let before = stats(&mut cluster.members[grantor]);
    let kind = match cluster.backend {
        Backend::Udp => "udp",
        Backend::Tcp => "tcp",
    };
    let mut flood = Flooder::spawn(&[
        kind.to_owned(),
        target.to_string(),
        SECONDS.to_string(),
        cluster.name.clone(),
        replay_file.display().to_string(),
    ]);
    // Locks keep being granted while the flood lasts: rounds of increments by two members,
    // each round bounded by the suite's wait.
    let counter = cluster.dir.join("counter");
    let workers: Vec<usize> = (0..3).filter(|&i| i != grantor).collect();
    let mut rounds = 0u64;
    while flood.running() {
        for &i in &workers {
            cluster.members[i].send(&format!("incr {} counter 5", counter.display()));
        }
        for &i in &workers {
            cluster.members[i].expect("increments under the flood", |l| l == "DONE incr counter 5");
        }
        rounds += 1;
    }
    let (sent, secs) = flood.finish();
    let rate = sent as f64 / secs;
    let after = stats(&mut cluster.members[grantor]);
    let dropped: u64 = [2, 3, 4, 5, 6].iter().map(|&i| after[i] - before[i]).sum();
    let grown_kib = after[9].saturating_sub(before[9]);
    eprintln!(
        "flood over {kind}: {sent} datagrams in {secs:.2} s ({rate:.0}/s); the grantor dropped {dropped} \
         (authentication {}, key mismatch {}, replayed {}, stale {}, foreign {}); resident memory {} -> {} KiB; \
         {} lock rounds of 2 × 5 increments during the flood",
        after[2] - before[2], after[3] - before[3], after[4] - before[4], after[5] - before[5],
        after[6] - before[6], before[9], after[9], rounds
    );
    assert!(rounds >= 1);
    match cluster.backend {
        Backend::Udp => {
            assert!(
                rate >= 100_000.0,
                "the flood reached only {rate:.0} datagrams/s"
            );
            assert!(
                dropped >= 100_000,
                "the grantor counted only {dropped} drops"
            );
            assert!(after[4] - before[4] > 0, "no replay was counted");
            assert!(after[2] - before[2] > 0, "no forgery was counted");
        }
        // The keyed mesh closes the flood's connections at the handshake (it cannot prove the
        // key): not one of its frames reaches the sealing layer.
        Backend::Tcp => assert_eq!(
            (after[2] - before[2], after[3] - before[3]),
            (0, 0),
            "frames of an unauthenticated connection reached the sealer"
        ),
    }
    assert!(
        grown_kib < 64 * 1024,
        "resident memory grew by {grown_kib} KiB"
    );
    assert_eq!(read_counter(&counter), rounds * 10);
    let names: Vec<&str> = workers
        .iter()
        .map(|&i| cluster.members[i].name.as_str())
        .collect();
    check_log(&counter, rounds * 10, &names);
    let all: Vec<usize> = (0..3).collect();
    cluster.agree(&all);
}

/// Joins `cluster` from this process with its key, through a tap, takes a lock a few times and
/// leaves; returns the datagrams it sent to `target`, as they crossed the network.
fn record_traffic_to(cluster: &Cluster, target: SocketAddr) -> Vec<Vec<u8>> {
    let tap = match cluster.backend {
        Backend::Udp => Tap::new(
            UdpMulticast::bind(&UdpConfig {
                group: cluster.group,
                port: cluster.port,
                ..UdpConfig::loopback()
            })
            .unwrap(),
        ),
        Backend::Tcp => Tap::new(TcpMesh::loopback(cluster.seeds()).unwrap()),
    };
    let key = ClusterKey::from_file(cluster.key_file.as_ref().unwrap()).unwrap();
    smol::block_on(async {
        let node = Node::builder(&cluster.name)
            .name("recorder")
            .transport(tap.clone())
            .config(EndpointConfig::local())
            .cluster_key(key)
            .join_timeout(WAIT)
            .join()
            .await
            .unwrap();
        let mutex = node.mutex("recorded").unwrap();
        for _ in 0..20 {
            mutex.lock().await.unwrap().unlock().await.unwrap();
        }
        node.leave().await;
    });
    tap.seen()
        .into_iter()
        .filter(|t| t.direction == Direction::Sent && t.peer == Some(target))
        .map(|t| t.bytes)
        .collect()
}

/// A `conclave-flood` process, killed by its PID when dropped.
struct Flooder {
    child: Child,
    out: Receiver<String>,
}

impl Flooder {
    fn spawn(args: &[String]) -> Self {
        let mut child = Command::new(FLOOD)
            .args(args)
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("spawn conclave-flood");
        let (sender, out) = mpsc::channel();
        forward(child.stdout.take().unwrap(), "", sender);
        Self { child, out }
    }

    fn running(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }

    /// Waits for the flood's end (bounded) and returns what it sent and for how long.
    fn finish(&mut self) -> (u64, f64) {
        let line = self
            .out
            .recv_timeout(WAIT)
            .expect("conclave-flood reports what it sent");
        let words: Vec<&str> = line.split(' ').collect();
        assert_eq!(words.first(), Some(&"SENT"), "{line}");
        (words[1].parse().unwrap(), words[2].parse().unwrap())
    }
}

impl Drop for Flooder {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
