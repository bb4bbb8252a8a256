//! `conclave watch`: view changes, grantor changes and lock events, as they happen.
//!
//! Views and grantor changes come from this member's own streams. Lock events of other
//! members are not sent to every member, so they come from reading the grantor's lock table
//! every `--interval` and comparing it with the previous one: a hold or a wait shorter than
//! the interval can be missed.

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use conclave::{MemberId, Node, View};
use futures::StreamExt;
use serde::Serialize;

use crate::args::WatchArgs;
use crate::exit::CliError;
use crate::signals;
use crate::snapshot::{self, with_timeout, Holder, Table, Waiter};

/// One thing that happened.
#[derive(Debug, Serialize)]
#[serde(tag = "event", rename_all = "snake_case")]
enum Event {
    /// A view was installed (the first one is the view at the start).
    View {
        epoch: u64,
        coordinator: String,
        members: Vec<snapshot::Member>,
        joined: Vec<String>,
        left: Vec<String>,
    },
    /// The default service's grantor changed (the first one is the grantor at the start).
    Grantor { grantor: Option<String> },
    /// An owner got a lock (seen in the grantor's table).
    Locked {
        lock: String,
        owner: String,
        mode: &'static str,
        token: u64,
    },
    /// An owner no longer holds a lock.
    Unlocked {
        lock: String,
        owner: String,
        token: u64,
    },
    /// An owner waits for a lock.
    Waiting {
        lock: String,
        owner: String,
        mode: &'static str,
    },
}

impl Event {
    fn text(&self) -> String {
        match self {
            Event::View {
                epoch,
                coordinator,
                members,
                joined,
                left,
            } => format!(
                "view {epoch}: {} member(s), coordinator {coordinator}; joined [{}]; left [{}]",
                members.len(),
                joined.join(", "),
                left.join(", ")
            ),
            Event::Grantor { grantor } => {
                format!(
                    "grantor {}",
                    grantor.as_deref().unwrap_or("- (none serving)")
                )
            }
            Event::Locked {
                lock,
                owner,
                mode,
                token,
            } => format!("locked {lock} by {owner} ({mode}, token {token})"),
            Event::Unlocked { lock, owner, token } => {
                format!("unlocked {lock} by {owner} (token {token})")
            }
            Event::Waiting { lock, owner, mode } => format!("waiting {lock}: {owner} ({mode})"),
        }
    }
}

/// What woke the watch.
enum Wake {
    View(Option<View>),
    Lock(Option<conclave::LockEvent>),
    Poll,
    Stop,
}

/// Prints events until a signal, `--count` events or `--for` elapsed.
///
/// # Errors
/// [`CliError::Internal`] if signals cannot be caught or output cannot be written.
pub(crate) async fn watch(node: &Node, args: &WatchArgs) -> Result<(), CliError> {
    let mut signals = signals::catch()?;
    let deadline = args.duration.map(|d| Instant::now() + d.0);
    let mut views = node.views();
    let mut lock_events = node.lock_events();
    let mut previous_view: Option<View> = None;
    let mut previous_table = TableState::default();
    let mut last_grantor: Option<MemberId> = None;
    let mut printed = 0u64;
    let mut next_poll = Instant::now();
    loop {
        if args.count.is_some_and(|count| printed >= count) {
            return Ok(());
        }
        let wake = smol::future::or(
            async { Wake::View(views.next().await) },
            smol::future::or(
                async { Wake::Lock(lock_events.next().await) },
                smol::future::or(
                    async {
                        smol::Timer::at(next_poll).await;
                        Wake::Poll
                    },
                    async {
                        smol::future::or(
                            async {
                                signals.next().await;
                            },
                            async {
                                match deadline {
                                    Some(deadline) => {
                                        smol::Timer::at(deadline).await;
                                    }
                                    None => std::future::pending().await,
                                }
                            },
                        )
                        .await;
                        Wake::Stop
                    },
                ),
            ),
        )
        .await;
        let mut events = match wake {
            Wake::View(Some(view)) => {
                let event = view_event(previous_view.as_ref(), &view, node);
                previous_view = Some(view);
                vec![event]
            }
            // The grantor is compared below, after every wake-up.
            Wake::Lock(Some(_)) => Vec::new(),
            Wake::View(None) | Wake::Lock(None) => {
                return Err(CliError::Unavailable("the member stopped".into()))
            }
            Wake::Poll => {
                next_poll = Instant::now() + args.interval.0;
                match with_timeout(
                    args.interval.0.max(Duration::from_secs(1)),
                    node.lock_table(),
                )
                .await
                {
                    Some(Ok(table)) => previous_table.update(&Table::from(&table)),
                    // No grantor serves now (a failover): the next poll will tell.
                    _ => Vec::new(),
                }
            }
            Wake::Stop => return Ok(()),
        };
        // Compared rather than taken from `GrantorChanged` events, so that the grantor known
        // at the start is printed too, and a change is printed once.
        let grantor = node.grantor();
        if grantor != last_grantor {
            events.push(Event::Grantor {
                grantor: grantor.as_ref().map(ToString::to_string),
            });
            last_grantor = grantor;
        }
        for event in events {
            if args.count.is_some_and(|count| printed >= count) {
                return Ok(());
            }
            let line = if args.json {
                serde_json::to_string(&event).map_err(|e| CliError::Internal(e.to_string()))?
            } else {
                event.text()
            };
            println!("{line}");
            printed += 1;
        }
    }
}

fn view_event(previous: Option<&View>, view: &View, node: &Node) -> Event {
    let ids = |v: Option<&View>| -> BTreeSet<String> {
        v.map_or_else(BTreeSet::new, |v| {
            v.members().iter().map(ToString::to_string).collect()
        })
    };
    let (before, now) = (ids(previous), ids(Some(view)));
    Event::View {
        epoch: view.epoch(),
        coordinator: view.coordinator().to_string(),
        members: snapshot::members(view, node),
        joined: now.difference(&before).cloned().collect(),
        left: before.difference(&now).cloned().collect(),
    }
}

/// The holders and waiters of the last table read.
#[derive(Debug, Default)]
struct TableState {
    holders: BTreeSet<(String, Holder)>,
    waiters: BTreeSet<(String, Waiter)>,
}

impl TableState {
    /// Replaces the state with `table`'s and returns what changed.
    fn update(&mut self, table: &Table) -> Vec<Event> {
        let mut holders = BTreeSet::new();
        let mut waiters = BTreeSet::new();
        for lock in &table.locks {
            for holder in &lock.holders {
                // The remaining lease changes at every read; it is not an event.
                let holder = Holder {
                    lease_ms: None,
                    ..holder.clone()
                };
                holders.insert((lock.name.clone(), holder));
            }
            for waiter in &lock.waiters {
                waiters.insert((lock.name.clone(), waiter.clone()));
            }
        }
        let mut events = Vec::new();
        for (lock, h) in self.holders.difference(&holders) {
            events.push(Event::Unlocked {
                lock: lock.clone(),
                owner: h.owner.clone(),
                token: h.token,
            });
        }
        for (lock, w) in waiters.difference(&self.waiters) {
            events.push(Event::Waiting {
                lock: lock.clone(),
                owner: w.owner.clone(),
                mode: w.mode,
            });
        }
        for (lock, h) in holders.difference(&self.holders) {
            events.push(Event::Locked {
                lock: lock.clone(),
                owner: h.owner.clone(),
                mode: h.mode,
                token: h.token,
            });
        }
        self.holders = holders;
        self.waiters = waiters;
        events
    }
}
