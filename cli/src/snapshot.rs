//! What `status` prints and `watch` compares: the view, the grantors and the lock tables, as
//! plain serialisable records.

use std::time::Duration;

use conclave::{GrantorTable, LockError, LockMode, Node, OwnerId, View};
use serde::Serialize;

/// The name the default lock service is shown under.
pub(crate) const DEFAULT_SERVICE: &str = "default";

/// The cluster as this member sees it.
#[derive(Debug, Serialize)]
pub(crate) struct Status {
    /// This member.
    pub(crate) member: String,
    /// The epoch of the view.
    pub(crate) epoch: u64,
    /// The view's coordinator.
    pub(crate) coordinator: String,
    /// The view's members, coordinator first.
    pub(crate) members: Vec<Member>,
    /// The default lock service, then the named services asked for.
    pub(crate) services: Vec<Service>,
}

/// A member of the view.
#[derive(Debug, Serialize)]
pub(crate) struct Member {
    /// `name#incarnation`.
    pub(crate) id: String,
    /// Its address.
    pub(crate) address: String,
    /// Whether it coordinates the view.
    pub(crate) coordinator: bool,
    /// Whether it is the member that printed this.
    pub(crate) this: bool,
}

/// A lock service: its grantor and its lock table.
#[derive(Debug, Serialize)]
pub(crate) struct Service {
    /// Its name (`default` for the default service).
    pub(crate) name: String,
    /// The grantor this member knows to serve, if any.
    pub(crate) grantor: Option<String>,
    /// The grantor's lock table, if it answered.
    pub(crate) table: Option<Table>,
    /// Why there is no table.
    pub(crate) table_error: Option<String>,
}

/// A grantor's lock table.
#[derive(Debug, Serialize)]
pub(crate) struct Table {
    /// The grantor that answered.
    pub(crate) grantor: String,
    /// Its view epoch.
    pub(crate) epoch: u64,
    /// Every lock with holders or waiters.
    pub(crate) locks: Vec<Lock>,
    /// Whether the grantor had more locks than one answer carries.
    pub(crate) truncated: bool,
}

/// One lock of a table.
#[derive(Debug, Serialize)]
pub(crate) struct Lock {
    /// Its name.
    pub(crate) name: String,
    /// Its holders.
    pub(crate) holders: Vec<Holder>,
    /// Its waiters in queue order.
    pub(crate) waiters: Vec<Waiter>,
}

/// A holder of a lock.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize)]
pub(crate) struct Holder {
    /// The owner: `member:local id`.
    pub(crate) owner: String,
    /// `exclusive` or `shared`.
    pub(crate) mode: &'static str,
    /// The fencing token, as the integer `run` passes on.
    pub(crate) token: u64,
    /// What is left of the hold's lease, in milliseconds, if it has one.
    pub(crate) lease_ms: Option<u64>,
}

/// A waiter for a lock.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize)]
pub(crate) struct Waiter {
    /// The owner: `member:local id`.
    pub(crate) owner: String,
    /// `exclusive` or `shared`.
    pub(crate) mode: &'static str,
}

impl Status {
    /// Collects the status from `node`: waits up to `wait` for a grantor to serve, then asks
    /// each service's grantor for its table.
    pub(crate) async fn collect(node: &Node, services: &[String], wait: Duration) -> Self {
        let view = node.view();
        let member = node.member_id().to_string();
        let _ = with_timeout(wait, node.wait_until_serving()).await;
        let mut reports = vec![Service {
            name: DEFAULT_SERVICE.into(),
            grantor: node.grantor().map(|g| g.to_string()),
            ..Service::from_table(with_timeout(wait, node.lock_table()).await)
        }];
        for name in services {
            let report = match node.lock_service(name.as_str()) {
                Ok(service) => {
                    let _ = with_timeout(wait, service.wait_until_serving()).await;
                    Service {
                        name: name.clone(),
                        grantor: service.grantor().map(|g| g.to_string()),
                        ..Service::from_table(with_timeout(wait, service.lock_table()).await)
                    }
                }
                Err(e) => Service {
                    name: name.clone(),
                    grantor: None,
                    table: None,
                    table_error: Some(e.to_string()),
                },
            };
            reports.push(report);
        }
        Status {
            epoch: view.as_ref().map_or(0, View::epoch),
            coordinator: view
                .as_ref()
                .map_or_else(String::new, |v| v.coordinator().to_string()),
            members: view.as_ref().map_or_else(Vec::new, |v| members(v, node)),
            member,
            services: reports,
        }
    }
}

impl Service {
    fn from_table(table: Option<Result<GrantorTable, LockError>>) -> Self {
        let (table, table_error) = match table {
            Some(Ok(table)) => (Some(Table::from(&table)), None),
            Some(Err(e)) => (None, Some(format!("the grantor did not answer: {e}"))),
            None => (None, Some("the grantor did not answer in time".into())),
        };
        Service {
            name: String::new(),
            grantor: None,
            table,
            table_error,
        }
    }
}

impl From<&GrantorTable> for Table {
    fn from(table: &GrantorTable) -> Self {
        Table {
            grantor: table.grantor.to_string(),
            epoch: table.epoch,
            truncated: table.truncated,
            locks: table
                .locks
                .iter()
                .map(|lock| Lock {
                    name: lock.name.to_string(),
                    holders: lock
                        .holders
                        .iter()
                        .map(|h| Holder {
                            owner: owner(&h.owner),
                            mode: mode(h.mode),
                            token: h.token.0,
                            lease_ms: h.lease_ms,
                        })
                        .collect(),
                    waiters: lock
                        .waiters
                        .iter()
                        .map(|w| Waiter {
                            owner: owner(&w.owner),
                            mode: mode(w.mode),
                        })
                        .collect(),
                })
                .collect(),
        }
    }
}

/// The members of `view`, as records.
pub(crate) fn members(view: &View, node: &Node) -> Vec<Member> {
    view.members()
        .iter()
        .map(|m| Member {
            id: m.to_string(),
            address: m.addr().to_string(),
            coordinator: m == view.coordinator(),
            this: m == node.member_id(),
        })
        .collect()
}

/// An owner as `member:local id`.
pub(crate) fn owner(owner: &OwnerId) -> String {
    format!("{}:{}", owner.member, owner.local)
}

/// A lock mode as a word.
pub(crate) fn mode(mode: LockMode) -> &'static str {
    match mode {
        LockMode::Shared => "shared",
        _ => "exclusive",
    }
}

/// `future`'s output, or `None` if `limit` passes first.
pub(crate) async fn with_timeout<T>(
    limit: Duration,
    future: impl std::future::Future<Output = T>,
) -> Option<T> {
    smol::future::or(async { Some(future.await) }, async {
        smol::Timer::after(limit).await;
        None
    })
    .await
}
