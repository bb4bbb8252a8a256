//! The `conclave` binary against real clusters on loopback: a `conclave serve` process and
//! `run`, `status` and `watch` processes joining it over the TCP mesh on 127.0.0.1 with
//! ephemeral ports (UDP multicast on 127.0.0.1 with TTL 0 for the config-file test), with the
//! one-host timings. Every process is killed by its id when its test ends, and every wait is
//! bounded.

mod cli {
    use std::collections::HashMap;
    use std::io::{BufRead, BufReader, Read};
    use std::net::Ipv4Addr;
    use std::path::PathBuf;
    use std::process::{Child, Command, Stdio};
    use std::sync::mpsc::{channel, Receiver};
    use std::sync::{Arc, Mutex, PoisonError};
    use std::thread;
    use std::time::{Duration, Instant};

    use serde_json::Value;

    /// The longest any one step may take (joining, a lock, an exit).
    const WAIT: Duration = Duration::from_secs(30);

    /// The exit codes the guide documents.
    const UNAVAILABLE: i32 = 69;
    const LOCK_TIMEOUT: i32 = 75;
    const CONFIG: i32 = 78;
    const LOCK_LOST: i32 = 79;
    const NOT_FOUND: i32 = 127;

    /// `conclave args...` with `env` over a clean `CONCLAVE_*` environment and the one-host
    /// timings.
    fn conclave(env: &HashMap<&str, String>, args: &[&str]) -> Command {
        let mut command = Command::new(env!("CARGO_BIN_EXE_conclave"));
        for (key, _) in std::env::vars() {
            if key.starts_with("CONCLAVE_") {
                command.env_remove(key);
            }
        }
        command.env("CONCLAVE_TIMINGS", "local");
        command.envs(env.iter().map(|(k, v)| (*k, v)));
        command.args(args);
        command
    }

    /// Runs `conclave args...` with `env` to the end: exit code, standard output and error.
    fn run_to_end(env: &HashMap<&str, String>, args: &[&str]) -> (i32, String, String) {
        Running::spawn(&args.join(" "), conclave(env, args)).finish()
    }

    /// A running `conclave` process: its output lines, and a guard that kills it by its id.
    struct Running {
        what: String,
        child: Child,
        lines: Receiver<String>,
        seen: Vec<String>,
        stderr: Arc<Mutex<String>>,
    }

    impl Running {
        fn spawn(what: &str, mut command: Command) -> Self {
            let mut child = command
                .stdin(Stdio::null())
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .expect("conclave starts");
            let (send, lines) = channel();
            let stdout = child.stdout.take().expect("piped");
            thread::spawn(move || {
                for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                    if send.send(line).is_err() {
                        break;
                    }
                }
            });
            let stderr = Arc::new(Mutex::new(String::new()));
            let mut pipe = child.stderr.take().expect("piped");
            let sink = stderr.clone();
            thread::spawn(move || {
                let mut text = String::new();
                let mut buffer = [0u8; 4096];
                while let Ok(n @ 1..) = pipe.read(&mut buffer) {
                    text.push_str(&String::from_utf8_lossy(&buffer[..n]));
                    *sink.lock().unwrap_or_else(PoisonError::into_inner) = text.clone();
                }
            });
            Running {
                what: what.to_owned(),
                child,
                lines,
                seen: Vec::new(),
                stderr,
            }
        }

        /// The next line of standard output that `wanted` accepts (bounded by [`WAIT`]).
        fn expect(&mut self, wanted: impl Fn(&str) -> bool) -> String {
            let deadline = Instant::now() + WAIT;
            loop {
                let left = deadline.saturating_duration_since(Instant::now());
                match self.lines.recv_timeout(left) {
                    Ok(line) => {
                        self.seen.push(line.clone());
                        if wanted(&line) {
                            return line;
                        }
                    }
                    Err(_) => panic!(
                        "{}: no such line within {WAIT:?}\n{}",
                        self.what,
                        self.report()
                    ),
                }
            }
        }

        /// Waits (bounded) for the exit; the exit code, all standard output and standard error.
        fn finish(&mut self) -> (i32, String, String) {
            let deadline = Instant::now() + WAIT;
            let status = loop {
                if let Some(status) = self.child.try_wait().expect("wait") {
                    break status;
                }
                assert!(
                    Instant::now() < deadline,
                    "{} did not exit\n{}",
                    self.what,
                    self.report()
                );
                thread::sleep(Duration::from_millis(20));
            };
            // The readers end with the pipes, at the exit.
            while let Ok(line) = self.lines.recv_timeout(Duration::from_secs(5)) {
                self.seen.push(line);
            }
            let code = status.code().unwrap_or(-1);
            (
                code,
                self.seen.join("\n"),
                self.stderr
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .clone(),
            )
        }

        fn signal(&self, signal: rustix::process::Signal) {
            let pid = rustix::process::Pid::from_raw(self.child.id() as i32).expect("a pid");
            rustix::process::kill_process(pid, signal).expect("signal sent");
        }

        fn report(&self) -> String {
            format!(
                "--- {} stdout:\n{}\n--- stderr:\n{}",
                self.what,
                self.seen.join("\n"),
                self.stderr.lock().unwrap_or_else(PoisonError::into_inner)
            )
        }
    }

    impl Drop for Running {
        fn drop(&mut self) {
            let _ = self.child.kill();
            let _ = self.child.wait();
            if thread::panicking() {
                eprintln!("{}", self.report());
            }
        }
    }

    /// A cluster of one `conclave serve`, and the settings that join it.
    struct Cluster {
        env: HashMap<&'static str, String>,
        serve: Running,
        serving_as: String,
    }

    impl Cluster {
        fn start(test: &str) -> Self {
            let mut env = HashMap::new();
            env.insert(
                "CONCLAVE_CLUSTER",
                format!("cli-{test}-{}", std::process::id()),
            );
            env.insert("CONCLAVE_TRANSPORT", "tcp".to_owned());
            Self::serve(env)
        }

        /// Starts `conclave serve` with `env`; over TCP, the members that follow get it as
        /// their seed.
        fn serve(mut env: HashMap<&'static str, String>) -> Self {
            let mut serve = Running::spawn("serve", conclave(&env, &["serve", "--name", "server"]));
            let line = serve.expect(|l| l.starts_with("serving as "));
            let (member, address) = line["serving as ".len()..]
                .split_once(" at ")
                .expect("serving as <member> at <address>");
            let serving_as = member.to_owned();
            if env.get("CONCLAVE_TRANSPORT").is_some_and(|t| t == "tcp") {
                env.insert("CONCLAVE_SEEDS", address.to_owned());
            }
            Cluster {
                env,
                serve,
                serving_as,
            }
        }

        fn spawn(&self, what: &str, args: &[&str]) -> Running {
            Running::spawn(what, conclave(&self.env, args))
        }

        /// Runs `args` to the end: exit code, standard output, standard error.
        fn run(&self, args: &[&str]) -> (i32, String, String) {
            run_to_end(&self.env, args)
        }

        /// Starts `conclave run --lock job <extra>` with a command that runs `on_term` when
        /// it gets SIGTERM, and waits until the command runs.
        fn run_trapping(&self, extra: &[&str], on_term: &str) -> Running {
            let script =
                format!("trap '{on_term}' TERM; echo started; while :; do sleep 0.05; done");
            let mut args = vec!["run", "--lock", "job"];
            args.extend_from_slice(extra);
            args.extend_from_slice(&["--", "sh", "-c", &script]);
            let mut run = self.spawn("run", &args);
            run.expect(|l| l == "started");
            run
        }

        /// Starts `conclave run` holding `lock` until killed; returns it and its token.
        fn hold(&self, name: &str, lock: &str) -> (Running, u64) {
            let mut holder = self.spawn(
                name,
                &[
                    "run",
                    "--name",
                    name,
                    "--lock",
                    lock,
                    "--",
                    "sh",
                    "-c",
                    "echo token $CONCLAVE_FENCING_TOKEN; exec sleep 600",
                ],
            );
            let line = holder.expect(|l| l.starts_with("token "));
            (holder, line[6..].parse().expect("a token"))
        }
    }

    fn status_json(cluster: &Cluster) -> Value {
        let (code, out, err) = cluster.run(&["status", "--json"]);
        assert_eq!(code, 0, "{err}");
        serde_json::from_str(&out).expect("status --json prints JSON")
    }

    #[test]
    fn run_passes_the_token_and_returns_the_command_status() {
        let cluster = Cluster::start("run");
        let (code, out, err) = cluster.run(&[
            "run",
            "--lock",
            "job",
            "--",
            "sh",
            "-c",
            "echo token $CONCLAVE_FENCING_TOKEN lock $CONCLAVE_LOCK; exit 7",
        ]);
        assert_eq!(code, 7, "{out}\n{err}");
        let words: Vec<&str> = out.split_whitespace().collect();
        assert_eq!(words[0], "token", "{out}");
        let first: u64 = words[1].parse().expect("an integer token");
        assert!(first > 0);
        assert_eq!(&words[2..], ["lock", "job"]);
        // The next holder's token is higher, and a shared lock runs its command too.
        let (code, out, err) = cluster.run(&[
            "run",
            "--shared",
            "--lock",
            "job",
            "--",
            "sh",
            "-c",
            "echo $CONCLAVE_FENCING_TOKEN",
        ]);
        assert_eq!(code, 0, "{err}");
        let second: u64 = out.trim().parse().expect("an integer token");
        assert!(second > first, "{second} after {first}");
    }

    #[test]
    fn run_exits_with_the_lock_timeout_code_while_another_process_holds_the_lock() {
        let cluster = Cluster::start("timeout");
        let (_holder, _) = cluster.hold("holder", "job");
        let started = Instant::now();
        let (code, out, err) = cluster.run(&[
            "run",
            "--lock",
            "job",
            "--timeout",
            "300ms",
            "--",
            "echo",
            "ran",
        ]);
        assert_eq!(code, LOCK_TIMEOUT, "{err}");
        assert!(!out.contains("ran"), "the command must not run: {out}");
        assert!(err.contains("held by another owner"), "{err}");
        assert!(started.elapsed() < WAIT);
        let (code, _, err) = cluster.run(&[
            "run",
            "--lock",
            "job",
            "--timeout",
            "0",
            "--",
            "echo",
            "ran",
        ]);
        assert_eq!(code, LOCK_TIMEOUT, "try once: {err}");
        // Another lock is free.
        let (code, out, _) = cluster.run(&["run", "--lock", "other", "--", "echo", "ran"]);
        assert_eq!((code, out.trim()), (0, "ran"));
    }

    #[test]
    fn run_kills_the_command_and_exits_with_the_lost_code_when_the_lock_is_lost() {
        let cluster = Cluster::start("lost");
        // A lease shorter than the command: the guard turns lost when it runs out.
        let mut run = cluster.run_trapping(
            &["--lease", "1s", "--kill-grace", "5s"],
            "echo terminated; exit 143",
        );
        let (code, out, err) = run.finish();
        assert_eq!(code, LOCK_LOST, "{out}\n{err}");
        assert!(out.contains("terminated"), "the command got SIGTERM: {out}");
        assert!(err.contains("lost (the lock lease expired)"), "{err}");
        // The lock is free again for the next one.
        let (code, _, err) =
            cluster.run(&["run", "--lock", "job", "--timeout", "10s", "--", "true"]);
        assert_eq!(code, 0, "{err}");
    }

    #[test]
    fn run_exit_codes_for_a_missing_command_a_bad_configuration_and_no_cluster() {
        let cluster = Cluster::start("codes");
        let (code, _, err) = cluster.run(&["run", "--lock", "job", "--", "/nonexistent/cmd"]);
        assert_eq!(code, NOT_FOUND, "{err}");
        // The lock was released: another process takes it at once.
        let (code, _, err) = cluster.run(&["run", "--lock", "job", "--timeout", "0", "--", "true"]);
        assert_eq!(code, 0, "{err}");

        let (code, _, err) = run_to_end(&HashMap::new(), &["run", "--lock", "job", "--", "true"]);
        assert_eq!(code, CONFIG, "{err}");
        assert!(err.contains("no cluster name"), "{err}");

        let (code, _, err) = cluster.run(&["--policy", "majority", "status"]);
        assert_eq!(code, CONFIG, "majority without a size: {err}");

        // A seed nobody listens on.
        let mut env = cluster.env.clone();
        env.insert("CONCLAVE_SEEDS", "127.0.0.1:1".into());
        env.insert("CONCLAVE_JOIN_TIMEOUT", "3s".into());
        let (code, _, err) = run_to_end(&env, &["run", "--lock", "job", "--", "true"]);
        assert_eq!(code, UNAVAILABLE, "{err}");
        assert!(err.contains("cannot join"), "{err}");
    }

    #[test]
    fn status_prints_the_view_the_grantor_and_the_lock_table() {
        let cluster = Cluster::start("status");
        let (_holder, token) = cluster.hold("holder", "invoice-42");

        let (code, out, err) = cluster.run(&["status"]);
        assert_eq!(code, 0, "{err}");
        let coordinator_line = out
            .lines()
            .find(|l| l.starts_with(&cluster.serving_as))
            .unwrap_or_else(|| panic!("the server is listed:\n{out}"));
        assert!(coordinator_line.contains("coordinator"), "{out}");
        assert!(
            out.contains(&format!("default  {}", cluster.serving_as)),
            "{out}"
        );
        let lock_line = out
            .lines()
            .find(|l| l.starts_with("invoice-42"))
            .unwrap_or_else(|| panic!("the lock is listed:\n{out}"));
        assert!(lock_line.contains("holder#"), "{lock_line}");
        assert!(lock_line.contains(&token.to_string()), "{lock_line}");

        let status = status_json(&cluster);
        assert_eq!(status["coordinator"], cluster.serving_as.as_str());
        let members = status["members"].as_array().expect("members");
        assert_eq!(members.len(), 3, "server, holder, status: {status}");
        assert!(members.iter().all(|m| m["address"]
            .as_str()
            .is_some_and(|a| a.starts_with("127.0.0.1:"))));
        let service = &status["services"][0];
        assert_eq!(service["name"], "default");
        assert_eq!(service["grantor"], cluster.serving_as.as_str());
        let lock = &service["table"]["locks"][0];
        assert_eq!(lock["name"], "invoice-42");
        assert_eq!(lock["holders"][0]["token"], token);
        assert_eq!(lock["holders"][0]["mode"], "exclusive");
        assert!(lock["holders"][0]["owner"]
            .as_str()
            .is_some_and(|o| o.starts_with("holder#")));
    }

    #[test]
    fn watch_prints_a_view_change_when_a_member_joins_and_its_lock() {
        let cluster = Cluster::start("watch");
        let mut watch = cluster.spawn(
            "watch",
            &["watch", "--json", "--for", "60s", "--interval", "100ms"],
        );
        let first: Value =
            serde_json::from_str(&watch.expect(|l| l.contains("\"view\""))).expect("JSON");
        assert_eq!(first["coordinator"], cluster.serving_as.as_str());
        watch.expect(|l| l.contains("\"grantor\"") && l.contains(&cluster.serving_as));
        let (_joiner, token) = cluster.hold("joiner", "job");
        let joined: Value = serde_json::from_str(
            &watch.expect(|l| l.contains("\"view\"") && l.contains("\"joined\":[\"joiner#")),
        )
        .expect("JSON");
        assert_eq!(joined["members"].as_array().map(Vec::len), Some(3));
        let locked: Value =
            serde_json::from_str(&watch.expect(|l| l.contains("\"locked\""))).expect("JSON");
        assert_eq!(locked["lock"], "job");
        assert_eq!(locked["token"], token);

        // Bounded by a count, in text.
        let (code, out, err) = cluster.run(&["watch", "--count", "2"]);
        assert_eq!(code, 0, "{err}");
        assert_eq!(out.lines().count(), 2, "{out}");
        assert!(out.starts_with("view "), "{out}");
    }

    #[test]
    fn a_toml_file_configures_the_member_and_env_and_flags_override_it() {
        let pid = std::process::id();
        let dir = Scratch::new("toml");
        let file = dir.0.join("conclave.toml");
        std::fs::write(
            &file,
            format!(
                "cluster = \"cli-toml-{pid}\"\n\
                 transport = \"udp\"\n\
                 founding = \"with-others\"\n\
                 timings = \"local\"\n\
                 [udp]\n\
                 group = \"{}\"\n\
                 port = {}\n\
                 interface = \"127.0.0.1\"\n\
                 ttl = 0\n\
                 [locks]\n\
                 lease = \"8s\"\n",
                Ipv4Addr::new(239, 202, (pid >> 8) as u8, pid as u8),
                21_000 + pid % 20_000,
            ),
        )
        .expect("config written");
        let config = file.to_str().expect("a UTF-8 path");
        let mut serve_env = HashMap::new();
        serve_env.insert("CONCLAVE_CONFIG", config.to_owned());
        serve_env.insert("CONCLAVE_FOUNDING", "alone".to_owned());
        let cluster = Cluster::serve(serve_env);
        assert!(
            cluster.serving_as.starts_with("server#"),
            "{}",
            cluster.serving_as
        );

        // The environment names this member over the file's default; a flag over both.
        let mut env = HashMap::new();
        env.insert("CONCLAVE_CONFIG", config.to_owned());
        env.insert("CONCLAVE_NAME", "from-env".to_owned());
        let (code, out, err) = run_to_end(&env, &["status", "--json"]);
        assert_eq!(code, 0, "{err}");
        let json: Value = serde_json::from_str(&out).expect("JSON");
        assert!(
            json["member"]
                .as_str()
                .is_some_and(|m| m.starts_with("from-env#")),
            "{json}"
        );
        assert!(json["coordinator"]
            .as_str()
            .is_some_and(|m| m.starts_with("server#")));

        let (code, out, err) = run_to_end(&env, &["status", "--json", "--name", "from-flag"]);
        assert_eq!(code, 0, "{err}");
        let json: Value = serde_json::from_str(&out).expect("JSON");
        assert!(
            json["member"]
                .as_str()
                .is_some_and(|m| m.starts_with("from-flag#")),
            "{json}"
        );

        // The environment's cluster replaces the file's: nobody runs it.
        env.insert("CONCLAVE_CLUSTER", format!("cli-toml-elsewhere-{pid}"));
        env.insert("CONCLAVE_JOIN_TIMEOUT", "2s".to_owned());
        let (code, _, err) = run_to_end(&env, &["status"]);
        assert_eq!(code, UNAVAILABLE, "{err}");

        // A typo in the file is a configuration error naming it.
        std::fs::write(&file, "clustr = \"x\"\n").expect("config written");
        let (code, _, err) = run_to_end(&HashMap::new(), &["--config", config, "status"]);
        assert_eq!(code, CONFIG, "{err}");
        assert!(err.contains("clustr"), "{err}");
    }

    #[test]
    fn run_forwards_sigterm_and_serve_leaves_on_sigterm() {
        let cluster = Cluster::start("signals");
        let mut run = cluster.run_trapping(&[], "echo got TERM; exit 3");
        run.signal(rustix::process::Signal::TERM);
        let (code, out, err) = run.finish();
        assert_eq!(code, 3, "the command's own status: {out}\n{err}");
        assert!(out.contains("got TERM"), "{out}");
        // It released the lock on the way out.
        let (code, _, err) = cluster.run(&["run", "--lock", "job", "--timeout", "0", "--", "true"]);
        assert_eq!(code, 0, "{err}");

        let Cluster { mut serve, .. } = cluster;
        serve.signal(rustix::process::Signal::TERM);
        let (code, _, err) = serve.finish();
        assert_eq!(code, 0, "{err}");
        assert!(err.contains("leaving the cluster"), "{err}");
    }

    #[test]
    fn a_keyed_cluster_admits_only_members_with_its_key_file() {
        let dir = Scratch::new("key");
        let key = dir.0.join("cluster.key");
        std::fs::write(&key, format!("{}\n", "5a".repeat(32))).expect("key written");
        let key = key.to_str().expect("a UTF-8 path").to_owned();
        let mut env = HashMap::new();
        env.insert(
            "CONCLAVE_CLUSTER",
            format!("cli-key-{}", std::process::id()),
        );
        env.insert("CONCLAVE_TRANSPORT", "tcp".to_owned());
        env.insert("CONCLAVE_CLUSTER_KEY_FILE", key);
        let cluster = Cluster::serve(env);
        let mut env = cluster.env.clone();
        env.insert("CONCLAVE_JOIN_TIMEOUT", "3s".to_owned());

        let (code, _, err) = run_to_end(&env, &["run", "--lock", "job", "--", "true"]);
        assert_eq!(code, 0, "{err}");

        env.remove("CONCLAVE_CLUSTER_KEY_FILE");
        let (code, _, err) = run_to_end(&env, &["run", "--lock", "job", "--", "true"]);
        assert_eq!(code, UNAVAILABLE, "{err}");

        let (code, _, err) = run_to_end(
            &env,
            &[
                "--key-file",
                "/nonexistent/key",
                "run",
                "--lock",
                "job",
                "--",
                "true",
            ],
        );
        assert_eq!(code, CONFIG, "{err}");
    }

    /// A scratch directory, removed when the test passes.
    struct Scratch(PathBuf);

    impl Scratch {
        fn new(test: &str) -> Self {
            let dir =
                std::env::temp_dir().join(format!("conclave-cli-{test}-{}", std::process::id()));
            std::fs::create_dir_all(&dir).expect("scratch directory");
            Scratch(dir)
        }
    }

    impl Drop for Scratch {
        fn drop(&mut self) {
            if !thread::panicking() {
                let _ = std::fs::remove_dir_all(&self.0);
            }
        }
    }
}
