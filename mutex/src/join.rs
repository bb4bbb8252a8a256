//! Starting a [`Node`] of the group backend: sealing its transport, spawning its driver thread
//! and waiting for its first view.

use std::sync::Arc;
use std::time::Duration;

use async_io::Timer;
use conclave_lock_api::seal::{Keyring, SealedTransport, Sealer};
use conclave_lock_api::wire::ClusterId;
use conclave_lock_api::{MemberId, Transport};
use conclave_protocol::gms::{Founding, JoinProblem};
use conclave_protocol::{Endpoint, EndpointConfig};
use futures::future::{select, Either};
use tracing::debug;

use crate::driver;
use crate::durable::TermFile;
use crate::error::NodeError;
use crate::incarnation::incarnation;
use crate::node::Node;
use crate::shared::{Inner, Phase};

/// What [`NodeBuilder::join`](crate::NodeBuilder::join) resolved from the builder: everything a
/// node needs to start.
pub(crate) struct JoinPlan {
    /// The cluster's name (already validated).
    pub(crate) cluster: String,
    /// The member's human-readable name.
    pub(crate) name: String,
    /// The transport, before sealing.
    pub(crate) transport: Arc<dyn Transport>,
    /// The validated configuration.
    pub(crate) config: EndpointConfig,
    /// When this member may found a cluster.
    pub(crate) founding: Founding,
    /// The cluster key, if any.
    pub(crate) keys: Option<Keyring>,
    /// Where the durable term is kept, if anywhere.
    pub(crate) data_dir: Option<std::path::PathBuf>,
    /// The longest a waiting lock future busy-polls.
    pub(crate) spin_wait: Duration,
    /// How long to wait for the first view.
    pub(crate) join_timeout: Duration,
}

/// Starts the node's driver thread and waits until the node is in a view. Every error stops
/// the node again (the node made here is dropped on every early return).
pub(crate) async fn start(plan: JoinPlan) -> Result<Node, NodeError> {
    let JoinPlan {
        cluster,
        name,
        transport,
        config,
        founding,
        keys,
        data_dir,
        spin_wait,
        join_timeout,
    } = plan;
    let sealer = Arc::new(Sealer::new(
        ClusterId::from_name(&cluster),
        keys.clone(),
        transport.local_addr(),
    )?);
    if let Some(keys) = &keys {
        transport.use_keyring(ClusterId::from_name(&cluster), keys, sealer.session());
    }
    let transport: Arc<dyn Transport> = Arc::new(SealedTransport::new(transport, sealer.clone()));
    let member = MemberId::new(incarnation(), &name, transport.local_addr())?;
    let leave_bound = config.gms.leave_timeout * 2 + Duration::from_millis(200);
    // Within this, a reachable grantor answers, or the membership has replaced an
    // unreachable one and its successor has rebuilt its table.
    let answer_bound = config.gms.suspect_timeout + config.locks.reconcile_timeout;
    let durable = match &data_dir {
        Some(dir) => Some(TermFile::open(dir).map_err(NodeError::DataDir)?),
        None => None,
    };
    let mut endpoint = Endpoint::new(&cluster, member, config, transport.max_datagram_size());
    endpoint.set_founding(founding);
    if let Some(file) = &durable {
        endpoint.restore_term(file.saved());
    }
    let (commands, receiver) = async_channel::unbounded();
    let inner = Arc::new(Inner::new(
        endpoint,
        transport,
        commands,
        spin_wait,
        answer_bound,
    ));
    inner.lock().durable = durable;
    let thread = driver::spawn(inner.clone(), receiver, leave_bound, sealer.clone())
        .map_err(NodeError::Spawn)?;
    *inner
        .thread
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner) = Some(thread);
    // Dropped on every early return below: the node shuts down again.
    let node = Node::group(&inner, sealer.clone());
    wait_for_view(node, &inner, &sealer, &cluster, join_timeout).await
}

/// Waits until the started `node` is in a view, or fails: a refusal, a shutdown, an
/// authentication failure, or the join timeout.
async fn wait_for_view(
    node: Node,
    inner: &Inner,
    sealer: &Sealer,
    cluster: &str,
    join_timeout: Duration,
) -> Result<Node, NodeError> {
    let mut timer = Timer::after(join_timeout);
    loop {
        let listener = {
            let shared = inner.lock();
            if shared.phase != Phase::Running {
                return Err(NodeError::Shutdown);
            }
            if shared.view.is_none() {
                // A refusal is final; having heard nobody yet is not (a lossy network, a
                // cluster still starting): that fails only at the join timeout.
                if let Some(JoinProblem::SettingMismatch {
                    coordinator,
                    setting,
                    coordinator_value,
                    joiner_value,
                }) = &shared.join_problem
                {
                    return Err(NodeError::SettingMismatch {
                        coordinator: coordinator.clone(),
                        setting: setting.clone(),
                        cluster_value: coordinator_value.clone(),
                        our_value: joiner_value.clone(),
                    });
                }
                Some(inner.changed.listen())
            } else {
                None
            }
        };
        let Some(listener) = listener else {
            let alone = node.view().is_some_and(|v| v.len() == 1);
            if let Some(rejection) = sealer.rejection().filter(|_| alone) {
                return Err(NodeError::Authentication(rejection));
            }
            debug!(member = %inner.member, "joined");
            return Ok(node);
        };
        if let Either::Right(_) = select(listener, &mut timer).await {
            let nobody = inner.lock().join_problem == Some(JoinProblem::NobodyAnswered);
            if let Some(rejection) = sealer.rejection() {
                return Err(NodeError::Authentication(rejection));
            }
            return Err(if nobody {
                NodeError::NoCluster {
                    cluster: cluster.to_owned(),
                    places: inner.transport.discovery_report(),
                }
            } else {
                NodeError::JoinTimeout(join_timeout)
            });
        }
    }
}
