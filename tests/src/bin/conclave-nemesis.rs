//! `conclave-nemesis`: five `conclave-node` processes in a network namespace of their own, each
//! running fenced clients on four locks, while faults chosen by a seed hit them; then a quiet
//! phase, and a checker that reads only the logs. Linux, as root. `docs/reliability.md` says
//! what it injects and what it checks; `scripts/nemesis.sh` builds and runs it.
//!
//! ```text
//! conclave-nemesis --seconds N [--policy available|majority] [--transport udp|tcp] [--key]
//!                  [--seed S] [--out DIR] [--suspect-ms MS] [--hold-ms MS] [--broken]
//!                  [--spare-coordinator]
//! conclave-nemesis --check DIR [--policy available|majority] [--suspect-ms MS]
//! ```
//!
//! It creates the namespace `conclave-nemesis-<pid>`, runs itself inside it (`--inside`),
//! and deletes the namespace afterwards, killing by PID any member process still alive. It
//! prints the summary (one `name: value` line per count, `violations` last), writes
//! `faults.log`, `history.log`, `plot.svg`, `summary.txt`, `violations.txt` and `overlaps.txt`
//! to the run folder, and exits 1 on any violation (2 on a harness error), printing the seed and the
//! command that reruns it. `--check DIR` runs the checker again on a finished run's folder
//! (the policy and suspect timeout as the run had them).

fn main() -> std::process::ExitCode {
    #[cfg(target_os = "linux")]
    {
        conclave_tests::nemesis::harness::main()
    }
    #[cfg(not(target_os = "linux"))]
    {
        eprintln!("conclave-nemesis runs on Linux only");
        std::process::ExitCode::from(2)
    }
}
