//! The whole run of `conclave-nemesis`: the namespace (outside), the cluster, the faults and
//! the quiet phase (inside), then the checker, the summary and the files.

use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode, Stdio};
use std::sync::mpsc::{channel, Receiver, RecvTimeoutError};
use std::time::{Duration, Instant};

use super::checker::{self, Setting};
use super::cluster::{append, Member, Output, Plan};
use super::faults::{self, garbage_tcp, garbage_udp, set_loss, set_partition};
use super::rng::Rng;
use super::{now_us, plot};

/// How long joining may take, for the first member and then for the rest.
const READY_WAIT: Duration = Duration::from_secs(40);
/// The calm between the last member's join and the first fault.
const WARM_UP: Duration = Duration::from_secs(3);
/// The most members down (killed and not yet back, or paused) at once.
const MAX_DOWN: usize = 2;

const USAGE: &str = "usage: conclave-nemesis --seconds N [--policy available|majority|raft] \
[--transport udp|tcp] [--key] [--seed S] [--out DIR] [--suspect-ms MS] [--hold-ms MS] [--broken] \
[--spare-coordinator] [--handoff]
       conclave-nemesis --check DIR [--policy available|majority] [--suspect-ms MS]";

/// The command line.
#[derive(Clone, Debug)]
struct Options {
    seconds: u64,
    majority: bool,
    /// The Raft engine (over TCP), checked as strictly as `Majority`.
    raft: bool,
    transport: String,
    key: bool,
    seed: u64,
    out: Option<PathBuf>,
    suspect_ms: u64,
    hold_ms: u64,
    broken: bool,
    /// Kills, pauses and partitions never take the coordinator away from a majority (loss,
    /// delay and garbage still reach everyone): what membership changes alone cost.
    spare_coordinator: bool,
    /// The one-hop handoff on (`LockConfig::one_hop_handoff`; it acts under `Majority`).
    handoff: bool,
    inside: bool,
    /// Only check the run folder `--out` again (with `--policy` and `--suspect-ms` as run).
    check: bool,
}

impl Options {
    fn parse(args: &[String]) -> Result<Self, String> {
        let mut o = Self {
            seconds: 60,
            majority: true,
            raft: false,
            transport: "udp".to_owned(),
            key: false,
            seed: now_us(),
            out: None,
            suspect_ms: 1000,
            hold_ms: 20,
            broken: false,
            spare_coordinator: false,
            handoff: false,
            inside: false,
            check: false,
        };
        let mut args = args.iter();
        while let Some(arg) = args.next() {
            let mut value = || args.next().cloned().ok_or(format!("{arg} needs a value"));
            let number = |v: String| v.parse::<u64>().map_err(|e| format!("{arg} {v}: {e}"));
            match arg.as_str() {
                "--seconds" => o.seconds = number(value()?)?,
                "--seed" => o.seed = number(value()?)?,
                "--suspect-ms" => o.suspect_ms = number(value()?)?.max(100),
                "--hold-ms" => o.hold_ms = number(value()?)?,
                "--out" => o.out = Some(PathBuf::from(value()?)),
                "--key" => o.key = true,
                "--broken" => o.broken = true,
                "--spare-coordinator" => o.spare_coordinator = true,
                "--handoff" => o.handoff = true,
                "--inside" => o.inside = true,
                "--check" => {
                    o.check = true;
                    o.out = Some(PathBuf::from(value()?));
                }
                "--policy" => {
                    let policy = value()?;
                    o.raft = policy == "raft";
                    o.majority = match policy.as_str() {
                        "majority" | "raft" => true,
                        "available" => false,
                        other => {
                            return Err(format!("--policy {other}: available, majority or raft"))
                        }
                    }
                }
                "--transport" => {
                    o.transport = value()?;
                    if o.transport != "udp" && o.transport != "tcp" {
                        return Err(format!("--transport {}: udp or tcp", o.transport));
                    }
                }
                other => return Err(format!("unknown argument {other}")),
            }
        }
        if o.raft && o.transport != "tcp" {
            return Err("--policy raft runs over --transport tcp".to_owned());
        }
        Ok(o)
    }

    /// The `--policy` value.
    fn policy(&self) -> &'static str {
        if self.raft {
            "raft"
        } else if self.majority {
            "majority"
        } else {
            "available"
        }
    }

    /// The arguments that rerun this run (without `--out` and `--inside`).
    fn rerun(&self) -> String {
        format!(
            "scripts/nemesis.sh --seconds {} --policy {} --transport {}{} --seed {}{}{}{}{}{}",
            self.seconds,
            self.policy(),
            self.transport,
            if self.key { " --key" } else { "" },
            self.seed,
            if self.suspect_ms == 1000 {
                String::new()
            } else {
                format!(" --suspect-ms {}", self.suspect_ms)
            },
            if self.hold_ms == 20 {
                String::new()
            } else {
                format!(" --hold-ms {}", self.hold_ms)
            },
            if self.broken { " --broken" } else { "" },
            if self.spare_coordinator {
                " --spare-coordinator"
            } else {
                ""
            },
            if self.handoff { " --handoff" } else { "" },
        )
    }

    fn as_args(&self, out: &Path) -> Vec<String> {
        let mut v: Vec<String> = [
            "--seconds",
            &self.seconds.to_string(),
            "--policy",
            self.policy(),
            "--transport",
            &self.transport,
            "--seed",
            &self.seed.to_string(),
            "--suspect-ms",
            &self.suspect_ms.to_string(),
            "--hold-ms",
            &self.hold_ms.to_string(),
            "--inside",
        ]
        .iter()
        .map(|s| (*s).to_owned())
        .collect();
        v.push("--out".to_owned());
        v.push(out.display().to_string());
        if self.key {
            v.push("--key".to_owned());
        }
        if self.broken {
            v.push("--broken".to_owned());
        }
        if self.spare_coordinator {
            v.push("--spare-coordinator".to_owned());
        }
        if self.handoff {
            v.push("--handoff".to_owned());
        }
        v
    }

    /// How soon after the heal every lock must be granted again: 10 suspect timeouts.
    fn liveness(&self) -> Duration {
        Duration::from_millis(self.suspect_ms * 10)
    }
}

/// The binary's `main`.
pub fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let options = match Options::parse(&args) {
        Ok(o) => o,
        Err(message) => {
            eprintln!("conclave-nemesis: {message}\n{USAGE}");
            return ExitCode::from(2);
        }
    };
    let result = if options.check {
        check_again(&options)
    } else if options.inside {
        inside(&options)
    } else {
        outside(&options)
    };
    match result {
        Ok(code) => code,
        Err(message) => {
            eprintln!("conclave-nemesis: {message}");
            eprintln!("seed {}; rerun: {}", options.seed, options.rerun());
            ExitCode::from(2)
        }
    }
}

fn run(program: &str, args: &[&str]) -> Result<(), String> {
    let out = Command::new(program)
        .args(args)
        .stdin(Stdio::null())
        .output()
        .map_err(|e| format!("{program}: {e}"))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "{program} {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}

/// Creates the namespace, runs the harness inside it, and cleans up whatever happened.
fn outside(options: &Options) -> Result<ExitCode, String> {
    let name = format!(
        "{}-{}{}-seed{}",
        options.policy(),
        options.transport,
        if options.key { "-key" } else { "" },
        options.seed
    );
    let dir = options
        .out
        .clone()
        .unwrap_or_else(|| std::env::temp_dir().join("conclave-nemesis").join(name));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let dir = dir
        .canonicalize()
        .map_err(|e| format!("{}: {e}", dir.display()))?;
    let ns = format!("conclave-nemesis-{}", std::process::id());
    run("ip", &["netns", "add", &ns])?;
    let setup = (|| {
        run(
            "ip",
            &["-n", &ns, "link", "set", "lo", "up", "multicast", "on"],
        )?;
        run(
            "ip",
            &["-n", &ns, "route", "add", "224.0.0.0/4", "dev", "lo"],
        )
    })();
    let status = setup.and_then(|()| {
        let exe = std::env::current_exe().map_err(|e| format!("current_exe: {e}"))?;
        Command::new("ip")
            .args(["netns", "exec", &ns])
            .arg(exe)
            .args(options.as_args(&dir))
            .status()
            .map_err(|e| format!("ip netns exec: {e}"))
    });
    // Whatever the inner run did, no member survives it and the namespace goes.
    let pids = std::fs::read_to_string(dir.join("pids")).unwrap_or_default();
    for pid in pids
        .lines()
        .filter_map(|l| l.split(' ').next()?.parse::<u32>().ok())
    {
        let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
        if String::from_utf8_lossy(&cmdline).contains("conclave-node") {
            let _ = faults::signal(pid, "CONT");
            let _ = faults::signal(pid, "KILL");
        }
    }
    let deleted = run("ip", &["netns", "del", &ns]);
    let status = status?;
    deleted?;
    Ok(match status.code() {
        Some(0) => ExitCode::SUCCESS,
        Some(1) => ExitCode::from(1),
        _ => ExitCode::from(2),
    })
}

/// What is going on in the cluster.
struct Run {
    members: Vec<Member>,
    plan: Plan,
    out: std::sync::mpsc::Sender<Output>,
    rx: Receiver<Output>,
    rng: Rng,
    faults_log: PathBuf,
    /// Members' latest view epochs and coordinators (by name).
    coordinator: (u64, Option<String>),
    ready: Vec<bool>,
    stopped: Vec<Option<u64>>,
    /// Scheduled actions: (when, what).
    agenda: Vec<(Instant, Action)>,
    partition: bool,
    loss: bool,
    delay: bool,
    /// `--spare-coordinator`.
    spare_coordinator: bool,
}

#[derive(Clone, Debug)]
enum Action {
    Restart(usize),
    Resume(usize),
    HealPartition,
    HealLoss,
    HealDelay,
}

impl Run {
    fn log(&self, kind: &str, detail: &str) {
        append(&self.faults_log, &format!("{} {kind} {detail}\n", now_us()));
    }

    /// Handles the members' output until `deadline`.
    fn pump(&mut self, deadline: Instant) {
        loop {
            let now = Instant::now();
            if now >= deadline {
                return;
            }
            match self.rx.recv_timeout(deadline - now) {
                Ok(output) => self.output(output),
                Err(RecvTimeoutError::Timeout | RecvTimeoutError::Disconnected) => return,
            }
        }
    }

    fn output(&mut self, output: Output) {
        let i = output.member;
        if self.members[i].generation != output.generation {
            return;
        }
        let Some(line) = output.line else {
            // Its output ended; `reap` notices the exit.
            return;
        };
        let words: Vec<&str> = line.split_whitespace().collect();
        match words.as_slice() {
            ["READY", _, epoch, first, ..] | ["VIEW", epoch, first, ..] => {
                if words[0] == "READY" {
                    self.ready[i] = true;
                }
                let epoch = epoch.parse().unwrap_or(0);
                if epoch >= self.coordinator.0 {
                    let name = first.split('#').next().unwrap_or("").to_owned();
                    self.coordinator = (epoch, Some(name));
                }
            }
            ["STOPPED", n] => self.stopped[i] = Some(n.parse().unwrap_or(0)),
            _ => {}
        }
    }

    fn down(&self) -> usize {
        self.members
            .iter()
            .filter(|m| m.child.is_none() || m.paused)
            .count()
    }

    /// A member that exited by itself (a restart that could not join in time) is restarted.
    fn reap(&mut self) {
        for i in 0..self.members.len() {
            if self.members[i].child.is_some() && self.members[i].exited() {
                self.log("exit", &self.members[i].name.clone());
                self.members[i].kill();
                self.ready[i] = false;
                self.agenda.push((
                    Instant::now() + Duration::from_millis(500),
                    Action::Restart(i),
                ));
            }
        }
    }

    fn due(&mut self) {
        self.reap();
        let now = Instant::now();
        let (due, later): (Vec<_>, Vec<_>) = self.agenda.drain(..).partition(|(t, _)| *t <= now);
        self.agenda = later;
        for (_, action) in due {
            self.act(action);
        }
    }

    fn act(&mut self, action: Action) {
        match action {
            Action::Restart(i) => {
                if self.members[i].child.is_none() {
                    let (plan, out) = (self.plan.clone(), self.out.clone());
                    match self.members[i].start(i, &plan, "with-others", &out) {
                        Ok(()) => self.log("restart", &self.members[i].name.clone()),
                        Err(e) => self.log("error", &e),
                    }
                }
            }
            Action::Resume(i) => {
                if self.members[i].paused {
                    self.members[i].pause(false);
                    self.log("resume", &self.members[i].name.clone());
                }
            }
            Action::HealPartition => {
                if self.partition {
                    self.partition = false;
                    let r = set_partition(&[]);
                    self.log("heal-partition", &r.err().unwrap_or_default());
                }
            }
            Action::HealLoss => {
                if self.loss {
                    self.loss = false;
                    let r = set_loss(0);
                    self.log("heal-loss", &r.err().unwrap_or_default());
                }
            }
            Action::HealDelay => {
                if self.delay {
                    self.delay = false;
                    for m in &mut self.members {
                        m.send("net delay 0 0");
                    }
                    self.log("heal-delay", "");
                }
            }
        }
    }

    /// Injects one fault drawn from the generator.
    fn fault(&mut self) {
        let n = self.members.len();
        let up: Vec<usize> = (0..n)
            .filter(|&i| self.members[i].child.is_some() && !self.members[i].paused)
            .collect();
        // With --spare-coordinator, kills and pauses choose among the others.
        let coordinator = self
            .coordinator
            .1
            .clone()
            .and_then(|c| (0..n).find(|&i| self.members[i].name == c));
        let up: Vec<usize> = if self.spare_coordinator {
            up.into_iter().filter(|&i| Some(i) != coordinator).collect()
        } else {
            up
        };
        let room = self.down() < MAX_DOWN && !up.is_empty();
        let mut kinds: Vec<(&str, u64)> = vec![("garbage", 15)];
        if room {
            kinds.extend([("kill", 20), ("pause", 20)]);
        }
        if !self.partition {
            kinds.push(("partition", 15));
        }
        if !self.loss {
            kinds.push(("loss", 12));
        }
        if !self.delay {
            kinds.push(("delay", 12));
        }
        let total: u64 = kinds.iter().map(|k| k.1).sum();
        let mut pick = self.rng.range(0, total - 1);
        let kind = kinds
            .iter()
            .find(|k| {
                if pick < k.1 {
                    true
                } else {
                    pick -= k.1;
                    false
                }
            })
            .map_or("garbage", |k| k.0);
        match kind {
            "kill" => {
                let i = up[self.rng.index(up.len())];
                self.members[i].kill();
                self.ready[i] = false;
                self.log("kill", &self.members[i].name.clone());
                let back = Duration::from_millis(self.rng.range(200, 3000));
                self.agenda
                    .push((Instant::now() + back, Action::Restart(i)));
            }
            "pause" => {
                let target = coordinator
                    .filter(|i| up.contains(i))
                    .filter(|_| self.rng.chance(50));
                let (i, role) = match target {
                    Some(i) => (i, "coordinator"),
                    None => (up[self.rng.index(up.len())], "member"),
                };
                let ms = self.rng.range(100, 10_000);
                self.members[i].pause(true);
                self.log("pause", &format!("{} {ms}ms {role}", self.members[i].name));
                self.agenda.push((
                    Instant::now() + Duration::from_millis(ms),
                    Action::Resume(i),
                ));
            }
            "partition" => {
                let mut side: Vec<bool> = (0..n).map(|_| self.rng.chance(50)).collect();
                if side.iter().all(|&s| s) || side.iter().all(|&s| !s) {
                    let i = self.rng.index(n);
                    side[i] = !side[i];
                }
                if let Some(c) = coordinator.filter(|_| self.spare_coordinator) {
                    spare_side(&mut side, c);
                }
                let one_way = self.rng.chance(50);
                let mut cuts = Vec::new();
                for a in 0..n {
                    for b in 0..n {
                        if side[a] && !side[b] || (!one_way && !side[a] && side[b]) {
                            cuts.push((self.members[a].ip, self.members[b].ip));
                        }
                    }
                }
                let names = |want: bool| {
                    (0..n)
                        .filter(|&i| side[i] == want)
                        .map(|i| self.members[i].name.clone())
                        .collect::<Vec<_>>()
                        .join(",")
                };
                let ms = self.rng.range(1000, 8000);
                let r = set_partition(&cuts);
                self.partition = true;
                let arrow = if one_way { "->" } else { "|" };
                self.log(
                    "partition",
                    &format!(
                        "{} {}{arrow}{} {ms}ms {}",
                        if one_way { "one-way" } else { "two-way" },
                        names(true),
                        names(false),
                        r.err().unwrap_or_default()
                    ),
                );
                self.agenda.push((
                    Instant::now() + Duration::from_millis(ms),
                    Action::HealPartition,
                ));
            }
            "loss" => {
                let percent = self.rng.range(5, 40);
                let ms = self.rng.range(1000, 6000);
                let r = set_loss(percent);
                self.loss = true;
                self.log(
                    "loss",
                    &format!("{percent}% {ms}ms {}", r.err().unwrap_or_default()),
                );
                self.agenda
                    .push((Instant::now() + Duration::from_millis(ms), Action::HealLoss));
            }
            "delay" => {
                let delay = self.rng.range(1, 60);
                let jitter = self.rng.range(0, 120);
                let ms = self.rng.range(1000, 6000);
                let mut who = Vec::new();
                for i in 0..n {
                    if self.rng.chance(60) {
                        self.members[i].send(&format!("net delay {delay} {jitter}"));
                        who.push(self.members[i].name.clone());
                    }
                }
                self.delay = true;
                self.log(
                    "delay",
                    &format!("{delay}ms+{jitter}ms {} {ms}ms", who.join(",")),
                );
                self.agenda.push((
                    Instant::now() + Duration::from_millis(ms),
                    Action::HealDelay,
                ));
            }
            _ => {
                let i = self.rng.index(n);
                let target = self.members[i].addr();
                let what = if self.plan.transport == "udp" {
                    let count = usize::try_from(self.rng.range(50, 2000)).unwrap_or(50);
                    format!("{} datagrams", garbage_udp(target, &mut self.rng, count))
                } else {
                    let conns = usize::try_from(self.rng.range(1, 8)).unwrap_or(1);
                    format!("{} bytes", garbage_tcp(target, &mut self.rng, conns))
                };
                self.log("garbage", &format!("{} {what}", self.members[i].name));
            }
        }
    }

    /// Heals everything and brings every member back.
    fn heal(&mut self) {
        let agenda: Vec<Action> = self.agenda.drain(..).map(|(_, a)| a).collect();
        for action in agenda {
            self.act(action);
        }
        for i in 0..self.members.len() {
            self.act(Action::Restart(i));
        }
    }
}

/// The run proper, inside the namespace.
fn inside(options: &Options) -> Result<ExitCode, String> {
    let dir = options.out.clone().ok_or("--inside needs --out")?;
    let exe = std::env::current_exe().map_err(|e| format!("current_exe: {e}"))?;
    let node_exe = exe.with_file_name("conclave-node");
    faults::nft(faults::NFT_SETUP)?;
    let key_file = if options.key {
        let mut rng = Rng::new(options.seed ^ 0x006b_6579);
        let hex: String = (0..4).map(|_| format!("{:016x}", rng.next_u64())).collect();
        let path = dir.join("cluster.key");
        std::fs::write(&path, format!("{hex}\n")).map_err(|e| format!("key: {e}"))?;
        Some(path)
    } else {
        None
    };
    let plan = Plan {
        node_exe,
        dir: dir.clone(),
        transport: options.transport.clone(),
        majority: options.majority,
        raft: options.raft,
        key_file,
        suspect_ms: options.suspect_ms,
        hold_ms: options.hold_ms,
        timeout_ms: options.suspect_ms * 5,
        broken: options.broken,
        handoff: options.handoff,
        size: 5,
    };
    let (out, rx) = channel();
    let mut run = Run {
        members: (0..plan.size).map(Member::new).collect(),
        plan,
        out,
        rx,
        rng: Rng::new(options.seed),
        faults_log: dir.join("faults.log"),
        coordinator: (0, None),
        ready: vec![false; 5],
        stopped: vec![None; 5],
        agenda: Vec::new(),
        partition: false,
        loss: false,
        delay: false,
        spare_coordinator: options.spare_coordinator,
    };
    println!(
        "nemesis: {} over {}{}, seed {}, {} s of faults, run folder {}",
        if options.raft {
            "the Raft engine"
        } else if options.majority {
            "Majority{5}"
        } else {
            "Available"
        },
        options.transport,
        if options.key {
            " with a cluster key"
        } else {
            ""
        },
        options.seed,
        options.seconds,
        dir.display()
    );
    // Start: the first member founds, the others join it (Raft members all start at once:
    // each waits for a majority).
    let (plan, out) = (run.plan.clone(), run.out.clone());
    run.members[0].start(0, &plan, "alone", &out)?;
    if !plan.raft {
        wait_ready(&mut run, &[0])?;
    }
    for i in 1..run.members.len() {
        run.members[i].start(i, &plan, "with-others", &out)?;
    }
    wait_ready(&mut run, &[0, 1, 2, 3, 4])?;
    // A short calm first, so the fault phase's figures measure the faults, not the start.
    let calm = Instant::now() + WARM_UP;
    while Instant::now() < calm {
        run.pump(calm);
    }
    // Faults.
    run.log("start", &format!("seed {}", options.seed));
    let start = Instant::now();
    let end = start + Duration::from_secs(options.seconds);
    let mut next = start + Duration::from_millis(run.rng.range(300, 2500));
    while Instant::now() < end {
        let wake = run
            .agenda
            .iter()
            .map(|(t, _)| *t)
            .chain([next, end, Instant::now() + Duration::from_millis(200)])
            .min()
            .unwrap_or(end);
        run.pump(wake);
        run.due();
        if Instant::now() >= next && Instant::now() < end {
            run.fault();
            next = Instant::now() + Duration::from_millis(run.rng.range(300, 2500));
        }
    }
    // Quiet: heal, then every lock must be granted again.
    run.heal();
    run.log("quiet", "");
    let quiet = options.liveness() + Duration::from_secs(5);
    let quiet_end = Instant::now() + quiet;
    while Instant::now() < quiet_end {
        run.pump(quiet_end.min(Instant::now() + Duration::from_millis(200)));
        run.due();
    }
    // Stop: every member answers `stop` once its section in progress is over.
    let answer = Duration::from_millis(run.plan.timeout_ms + run.plan.hold_ms) + options.liveness();
    for m in &mut run.members {
        m.send("stop");
    }
    let stop_end = Instant::now() + answer;
    while Instant::now() < stop_end && run.stopped.iter().any(Option::is_none) {
        run.pump(stop_end.min(Instant::now() + Duration::from_millis(100)));
    }
    run.log("end", "");
    let unanswered: Vec<String> = (0..run.members.len())
        .filter(|&i| run.stopped[i].is_none())
        .map(|i| run.members[i].name.clone())
        .collect();
    for m in &mut run.members {
        m.close_input();
    }
    let bye = Instant::now() + Duration::from_secs(5);
    while Instant::now() < bye && run.members.iter_mut().any(|m| !m.exited()) {
        std::thread::sleep(Duration::from_millis(50));
    }
    for m in &mut run.members {
        m.kill();
    }
    let _ = faults::nft("delete table inet nemesis\n");
    // Check.
    let mut report = checker::check(&dir, setting(options));
    for name in unanswered {
        report.violations.push(format!(
            "{name} did not answer `stop` within {:.1}s after the quiet phase: a request left pending",
            answer.as_secs_f64()
        ));
    }
    let names: Vec<String> = run.members.iter().map(|m| m.name.clone()).collect();
    write_outputs(&dir, &report, &names);
    let summary = report.summary();
    print!("{summary}");
    for v in report.violations.iter().take(20) {
        println!("VIOLATION {v}");
    }
    println!("run folder: {}", dir.display());
    if report.violations.is_empty() {
        println!("seed {}: passed", options.seed);
        Ok(ExitCode::SUCCESS)
    } else {
        println!(
            "seed {}: {} violations; rerun: {}",
            options.seed,
            report.violations.len(),
            options.rerun()
        );
        Ok(ExitCode::from(1))
    }
}

/// `--check DIR`: the checker again on a finished run's folder (rewriting its outputs).
fn check_again(options: &Options) -> Result<ExitCode, String> {
    let dir = options.out.clone().ok_or("--check needs a folder")?;
    let report = checker::check(&dir, setting(options));
    let names: Vec<String> = (1..=5).map(|k| format!("n{k}")).collect();
    write_outputs(&dir, &report, &names);
    print!("{}", report.summary());
    for v in report.violations.iter().take(20) {
        println!("VIOLATION {v}");
    }
    Ok(if report.violations.is_empty() {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    })
}

fn setting(options: &Options) -> Setting {
    Setting {
        majority: options.majority,
        liveness_us: u64::try_from(options.liveness().as_micros()).unwrap_or(u64::MAX),
    }
}

fn wait_ready(run: &mut Run, which: &[usize]) -> Result<(), String> {
    let deadline = Instant::now() + READY_WAIT;
    while Instant::now() < deadline && which.iter().any(|&i| !run.ready[i]) {
        run.pump(deadline.min(Instant::now() + Duration::from_millis(100)));
    }
    match which.iter().find(|&&i| !run.ready[i]) {
        Some(&i) => Err(format!(
            "{} did not join within {READY_WAIT:?} (see node-{}.err/.out)",
            run.members[i].name, run.members[i].name
        )),
        None => Ok(()),
    }
}

/// `history.log` (faults and operations merged by time), `plot.svg`, `summary.txt`,
/// `violations.txt`, `overlaps.txt`.
fn write_outputs(dir: &Path, report: &checker::Report, names: &[String]) {
    let mut lines: Vec<(u64, String)> = report
        .faults
        .iter()
        .map(|f| (f.t, format!("{} FAULT {} {}", f.t, f.kind, f.detail)))
        .collect();
    for name in names {
        let text = std::fs::read_to_string(dir.join(format!("ops-{name}.log"))).unwrap_or_default();
        for line in text.lines() {
            let t = line
                .split_whitespace()
                .nth(1)
                .and_then(|t| t.parse().ok())
                .unwrap_or(0);
            lines.push((t, line.to_owned()));
        }
    }
    lines.sort_by_key(|(t, _)| *t);
    let history: String = lines.into_iter().map(|(_, l)| l + "\n").collect();
    let _ = std::fs::write(dir.join("history.log"), history);
    let _ = std::fs::write(dir.join("plot.svg"), plot::svg(report, names));
    let _ = std::fs::write(dir.join("summary.txt"), report.summary());
    let violations: String = report.violations.iter().map(|v| v.clone() + "\n").collect();
    let _ = std::fs::write(dir.join("violations.txt"), violations);
    let overlaps: String = report.overlaps.iter().map(|v| v.clone() + "\n").collect();
    let _ = std::fs::write(dir.join("overlaps.txt"), overlaps);
}

/// Moves members so that the coordinator `c` is on the larger side of a partition (`side` marks
/// one side): it keeps a majority, and the partition cuts off a minority only.
fn spare_side(side: &mut [bool], c: usize) {
    let mine = side[c];
    let with_c = side.iter().filter(|&&s| s == mine).count();
    let mut missing = (side.len() / 2 + 1).saturating_sub(with_c);
    for s in side.iter_mut() {
        if missing == 0 {
            break;
        }
        if *s != mine {
            *s = !*s;
            missing -= 1;
        }
    }
}
