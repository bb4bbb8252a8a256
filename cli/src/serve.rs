//! `conclave serve`: a long-running member.

use std::io::Write;

use conclave::Node;
use futures::StreamExt;

use crate::exit::CliError;
use crate::signals;

/// Announces the member on standard output (`serving as <member> at <address>`) and waits
/// for SIGINT, SIGTERM or SIGHUP; the caller then leaves the cluster gracefully.
///
/// # Errors
/// [`CliError::Internal`] if signals cannot be caught.
pub(crate) async fn serve(node: &Node) -> Result<(), CliError> {
    let mut signals = signals::catch()?;
    let member = node.member_id();
    println!("serving as {member} at {}", member.addr());
    std::io::stdout().flush()?;
    if let Some(Ok(signal)) = signals.next().await {
        eprintln!("conclave: {signal:?} received: leaving the cluster");
    }
    Ok(())
}
