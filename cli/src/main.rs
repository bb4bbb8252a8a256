//! `conclave`: the command-line tool of Conclave, distributed locks for async Rust.
//!
//! It joins a cluster as a member, with the settings a library user gives `Node::builder`
//! (from flags, `CONCLAVE_*` environment variables and a TOML file, in that order of
//! precedence), and then:
//!
//! - `conclave run --lock NAME -- CMD ARGS...` holds the lock while `CMD` runs, passing it
//!   the fencing token (`CONCLAVE_FENCING_TOKEN`), and returns its exit status;
//! - `conclave status [--json]` prints the view, the grantors and the lock table;
//! - `conclave watch [--json]` prints view changes, grantor changes and lock events;
//! - `conclave serve` is a long-running member that leaves gracefully on SIGINT/SIGTERM.
//!
//! The exit codes are in [`exit`]; the guide's "The command-line tool" documents it all.

mod args;
mod config_file;
mod duration;
mod exit;
mod run;
mod serve;
mod settings;
mod signals;
mod snapshot;
mod table;
mod watch;

use std::process::ExitCode;

use clap::Parser;

use crate::args::{Cli, Command};
use crate::exit::CliError;
use crate::settings::{Role, Settings};

fn main() -> ExitCode {
    let cli = Cli::parse();
    match smol::block_on(dispatch(cli)) {
        Ok(code) => ExitCode::from(code),
        Err(error) => error.report(),
    }
}

/// Joins as the subcommand's member, does its work, and leaves.
async fn dispatch(cli: Cli) -> Result<u8, CliError> {
    let role = match &cli.command {
        Command::Serve => Role::Serve,
        Command::Run(_) => Role::Client("run"),
        Command::Status(_) => Role::Client("status"),
        Command::Watch(_) => Role::Client("watch"),
    };
    let settings = Settings::resolve(&cli.member, role)?;
    // A grantor answers within this on a healthy cluster (joining takes as long at most).
    let answer_wait = settings.join_timeout;
    let node = settings.join().await?;
    let result = match &cli.command {
        Command::Run(args) => run::run(&node, args).await,
        Command::Status(args) => {
            let status = snapshot::Status::collect(&node, &args.services, answer_wait).await;
            if args.json {
                serde_json::to_string_pretty(&status)
                    .map(|json| println!("{json}"))
                    .map_err(|e| CliError::Internal(e.to_string()))
            } else {
                print!("{}", table::render(&status));
                Ok(())
            }
            .map(|()| 0)
        }
        Command::Watch(args) => watch::watch(&node, args).await.map(|()| 0),
        Command::Serve => serve::serve(&node).await.map(|()| 0),
    };
    node.leave().await;
    result
}
