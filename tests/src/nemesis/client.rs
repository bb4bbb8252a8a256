//! The fenced client a `conclave-node` runs under the nemesis (its `fenced` command), and the
//! fencing register it writes through.
//!
//! Each section: `lock_timeout`; log `GRANT`; write through the register (only if the guard
//! still says `Held`); hold; write again; log `RELEASE` with the status seen just before
//! `unlock`. Every line of the operation log starts with its kind and the wall-clock time in
//! microseconds ([`super::now_us`]):
//!
//! ```text
//! GRANT   <t> <node> <lock> <token> <asked-t> <status>
//! WRITE   <t> <node> <lock> <token> <status> <accepted|refused|skipped|busy> <last-accepted>
//! RELEASE <t> <node> <lock> <token> <status> <ok|error> <unlock-µs>
//! FAIL    <t> <node> <lock> <error words...>
//! LOST    <t> <node> <lock> <reason>
//! START   <t> <node>
//! ```
//!
//! `<t>` of `WRITE` and `RELEASE` is taken before the status is read, so "held at `<t>`" is a
//! claim the library made no earlier than `<t>`.
//!
//! The register is a file per lock under `<dir>/reg/`, holding the highest token accepted; a
//! write takes an OS `flock` on it only for the compare-and-write and refuses a token below
//! the last accepted one. Every decision is appended to `<dir>/reg/<lock>.log` under the same
//! lock: `<t> <node> <token> <last> accepted|refused`. It trusts nothing of the library.

use std::cell::Cell;
use std::fs::{File, OpenOptions};
use std::io::Write;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use conclave::{DistributedMutex, LockStatus, MutexGuard};

use super::now_us;

/// How long a register write waits for the file lock before it gives up (`busy`): a holder of
/// the file lock may have been paused by the nemesis.
const REGISTER_WAIT: Duration = Duration::from_millis(200);
/// The pause after a failed `lock_timeout` before the next attempt.
const RETRY_PAUSE: Duration = Duration::from_millis(50);

/// What the fenced loop needs.
#[derive(Clone, Debug)]
pub struct Fenced {
    /// The run folder: `ops-<node>.log` and `reg/` live here.
    pub dir: PathBuf,
    /// This member's name.
    pub node: String,
    /// How long each section holds the lock.
    pub hold: Duration,
    /// The bound of each `lock_timeout`.
    pub timeout: Duration,
    /// A deliberately broken client (`CONCLAVE_NEMESIS_BROKEN=ignore-lost`): it never looks at
    /// the guard's status, writes as if it held the lock and keeps writing with its old token
    /// for the whole hold.
    pub broken: bool,
}

impl Fenced {
    /// This member's operation log.
    pub fn log_path(&self) -> PathBuf {
        self.dir.join(format!("ops-{}.log", self.node))
    }

    /// Appends one line to the operation log; errors are ignored (the checker sees the gap).
    pub fn log(&self, line: &str) {
        let _ = append(&self.log_path(), &format!("{line}\n"));
    }

    /// Logs a `LOST` notice of `lock`.
    pub fn lost(&self, lock: &str, reason: &str) {
        self.log(&format!("LOST {} {} {lock} {reason}", now_us(), self.node));
    }

    /// Sections on `mutexes` in turn until `stop`; returns how many it ran.
    pub async fn run(&self, mutexes: &[(String, DistributedMutex)], stop: &Cell<bool>) -> u64 {
        let _ = std::fs::create_dir_all(self.dir.join("reg"));
        self.log(&format!("START {} {}", now_us(), self.node));
        let mut next = self.node.bytes().map(usize::from).sum::<usize>();
        let mut sections = 0;
        while !stop.get() && !mutexes.is_empty() {
            let (name, mutex) = &mutexes[next % mutexes.len()];
            next += 1;
            let asked = now_us();
            match mutex.lock_timeout(self.timeout).await {
                Ok(guard) => {
                    self.section(name, guard, asked).await;
                    sections += 1;
                }
                Err(e) => {
                    let error = e.to_string().replace('\n', " ");
                    self.log(&format!("FAIL {} {} {name} {error}", now_us(), self.node));
                    async_io::Timer::after(RETRY_PAUSE).await;
                }
            }
        }
        sections
    }

    async fn section(&self, name: &str, guard: MutexGuard, asked: u64) {
        let token = guard.fencing_token().0;
        let t = now_us();
        let status = status_word(guard.status());
        self.log(&format!(
            "GRANT {t} {} {name} {token} {asked} {status}",
            self.node
        ));
        self.write(name, token, &guard);
        if self.broken {
            // Keeps writing with its token whatever happens to the lock.
            let end = Instant::now() + self.hold;
            while Instant::now() < end {
                async_io::Timer::after(Duration::from_millis(10)).await;
                self.write(name, token, &guard);
            }
        } else {
            async_io::Timer::after(self.hold).await;
            self.write(name, token, &guard);
        }
        let t = now_us();
        let status = self.status(&guard);
        let started = Instant::now();
        let outcome = match guard.unlock().await {
            Ok(()) => "ok".to_owned(),
            Err(e) => format!("error:{}", e.to_string().replace(char::is_whitespace, "_")),
        };
        self.log(&format!(
            "RELEASE {t} {} {name} {token} {status} {outcome} {}",
            self.node,
            started.elapsed().as_micros()
        ));
    }

    fn status(&self, guard: &MutexGuard) -> &'static str {
        if self.broken {
            "held"
        } else {
            status_word(guard.status())
        }
    }

    /// One write through the register, if the guard still says `Held`.
    fn write(&self, name: &str, token: u64, guard: &MutexGuard) {
        let t = now_us();
        let status = self.status(guard);
        let (outcome, last) = if status == "held" {
            match register_write(&self.dir, name, token, &self.node) {
                Ok((true, last)) => ("accepted", last),
                Ok((false, last)) => ("refused", last),
                Err(_) => ("busy", 0),
            }
        } else {
            ("skipped", 0)
        };
        self.log(&format!(
            "WRITE {t} {} {name} {token} {status} {outcome} {last}",
            self.node
        ));
    }
}

/// `held`, `suspended` or `lost`.
pub fn status_word(status: LockStatus) -> &'static str {
    match status {
        LockStatus::Held => "held",
        LockStatus::Suspended => "suspended",
        _ => "lost",
    }
}

/// Writes `token` to the register of `lock` under `dir/reg/` unless a higher token was accepted
/// before: `(accepted, last accepted before)`.
///
/// # Errors
/// The file could not be opened, locked within 200 ms, read or written.
pub fn register_write(
    dir: &Path,
    lock: &str,
    token: u64,
    node: &str,
) -> std::io::Result<(bool, u64)> {
    let path = dir.join("reg").join(lock);
    let file = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(&path)?;
    lock_file(&file)?;
    let mut buf = [0_u8; 21];
    let n = file.read_at(&mut buf, 0)?;
    let last = std::str::from_utf8(&buf[..n])
        .ok()
        .and_then(|s| s.trim().parse::<u64>().ok())
        .unwrap_or(0);
    let accepted = token >= last;
    if accepted {
        // Fixed width, one write at offset 0: a kill -9 cannot leave half a number.
        file.write_all_at(format!("{token:020}\n").as_bytes(), 0)?;
    }
    let verdict = if accepted { "accepted" } else { "refused" };
    let mut log = path.into_os_string();
    log.push(".log");
    append(
        Path::new(&log),
        &format!("{} {node} {token} {last} {verdict}\n", now_us()),
    )?;
    // The file lock goes with the descriptor.
    drop(file);
    Ok((accepted, last))
}

fn lock_file(file: &File) -> std::io::Result<()> {
    use rustix::fs::{flock, FlockOperation};
    let start = Instant::now();
    loop {
        match flock(file, FlockOperation::NonBlockingLockExclusive) {
            Ok(()) => return Ok(()),
            Err(e) if e == rustix::io::Errno::WOULDBLOCK && start.elapsed() < REGISTER_WAIT => {
                std::thread::sleep(Duration::from_millis(1));
            }
            Err(e) => return Err(e.into()),
        }
    }
}

/// Appends `line` to `path` with one write.
fn append(path: &Path, line: &str) -> std::io::Result<()> {
    OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .and_then(|mut f| f.write_all(line.as_bytes()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_register_refuses_a_token_below_the_last_accepted() {
        let dir = std::env::temp_dir().join(format!("conclave-register-{}", std::process::id()));
        std::fs::create_dir_all(dir.join("reg")).unwrap();
        assert_eq!(register_write(&dir, "a", 5, "n1").unwrap(), (true, 0));
        assert_eq!(register_write(&dir, "a", 5, "n1").unwrap(), (true, 5));
        assert_eq!(register_write(&dir, "a", 4, "n2").unwrap(), (false, 5));
        assert_eq!(register_write(&dir, "a", 9, "n2").unwrap(), (true, 5));
        let log = std::fs::read_to_string(dir.join("reg").join("a.log")).unwrap();
        assert_eq!(log.lines().filter(|l| l.ends_with("refused")).count(), 1);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
