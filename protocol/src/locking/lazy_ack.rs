//! Acknowledgements of lazy releases, held back by the grantor.
//!
//! A release nobody waits for (a guard dropped rather than awaited) is sent with `lazy` set.
//! Its [`LockMessage::UnlockAck`] only lets the client stop tracking the release, so the
//! grantor need not spend a datagram (and the client a wake-up) on it: it holds the
//! acknowledgement back for up to [`LAZY_ACK_DELAY`] and sends it with the next message it has
//! for that member anyway (a hot lock's next grant to it, usually), in the same datagram.
//!
//! Why this is safe: the release is applied before its acknowledgement is held back, so only
//! the acknowledgement is late. It may leave after later messages of the grantor to the same
//! member (a grant of the member's next request, a reconciliation request, a serving
//! announcement), which an acknowledgement sent at once never did; the client's handling of
//! `UnlockAck` looks at nothing but the request id (it stops resending that release), so the
//! order does not matter. A client that changes grantors meanwhile resends the release to the
//! new one, as it does for any acknowledgement lost with a grantor, and the release is
//! idempotent. Acknowledgements for members that leave the view are dropped.
//!
//! Why 1 ms: shorter than the reliable layer's acknowledgement delay (2 ms in
//! `reliable::ReliableConfig::local()`, 10 ms by default), so a held-back acknowledgement that leaves on
//! its own carries the reliable layer's acknowledgement of the release too: never more
//! datagrams than answering at once, and one fewer whenever another message to the member
//! leaves within the delay.

use std::collections::BTreeMap;
use std::time::Duration;

use conclave_lock_api::wire::LockMessage;
use conclave_lock_api::{MemberId, RequestId, View};

use super::types::Outbox;
use crate::time::Instant;

/// The longest the grantor holds back the acknowledgement of a lazy release.
pub const LAZY_ACK_DELAY: Duration = Duration::from_millis(1);

/// Acknowledgements held back for one member, at most; one more sends them all at once.
const MAX_HELD_BACK: usize = 64;

/// The acknowledgements held back, per member.
#[derive(Debug, Default)]
pub(crate) struct LazyAcks {
    waiting: BTreeMap<MemberId, Held>,
}

#[derive(Debug)]
struct Held {
    /// When the oldest of them is due.
    due: Instant,
    requests: Vec<RequestId>,
}

impl LazyAcks {
    /// Holds back the acknowledgement of `request`'s release to `to`.
    pub(crate) fn hold(
        &mut self,
        now: Instant,
        to: &MemberId,
        request: RequestId,
        out: &mut Outbox,
    ) {
        let held = self.waiting.entry(to.clone()).or_insert_with(|| Held {
            due: now + LAZY_ACK_DELAY,
            requests: Vec::new(),
        });
        held.requests.push(request);
        if held.requests.len() > MAX_HELD_BACK {
            if let Some((to, held)) = self.waiting.remove_entry(to) {
                send(to, held, out);
            }
        }
    }

    /// Sends the acknowledgements due by `now`, and those of every member that `out` already
    /// has a message for (they leave in its datagram).
    pub(crate) fn flush(&mut self, now: Instant, out: &mut Outbox) {
        if self.waiting.is_empty() {
            return;
        }
        let going: Vec<MemberId> = self
            .waiting
            .iter()
            .filter(|(member, held)| held.due <= now || out.iter().any(|(to, _)| to == *member))
            .map(|(member, _)| member.clone())
            .collect();
        for member in going {
            if let Some((to, held)) = self.waiting.remove_entry(&member) {
                send(to, held, out);
            }
        }
    }

    /// Drops the acknowledgements held back for members not in `view`: they would open a
    /// stream to a member that is gone (whose releases the view change ended anyway).
    pub(crate) fn keep_members_of(&mut self, view: &View) {
        self.waiting.retain(|member, _| view.contains(member));
    }

    /// When the oldest acknowledgement held back is due.
    pub(crate) fn next_due(&self) -> Option<Instant> {
        self.waiting.values().map(|held| held.due).min()
    }

    /// How many acknowledgements are held back.
    #[cfg(test)]
    fn len(&self) -> usize {
        self.waiting.values().map(|held| held.requests.len()).sum()
    }
}

fn send(to: MemberId, held: Held, out: &mut Outbox) {
    for request in held.requests {
        out.push_back((to.clone(), LockMessage::UnlockAck { request }));
    }
}

#[cfg(test)]
mod tests {
    use std::net::SocketAddr;

    use conclave_lock_api::LockName;

    use super::*;

    fn member(n: u16) -> MemberId {
        MemberId::new(
            u128::from(n),
            &format!("m{n}"),
            SocketAddr::from(([127, 0, 0, 1], n)),
        )
        .expect("valid")
    }

    fn acks(out: &Outbox) -> Vec<(MemberId, RequestId)> {
        out.iter()
            .filter_map(|(to, m)| match m {
                LockMessage::UnlockAck { request } => Some((to.clone(), *request)),
                _ => None,
            })
            .collect()
    }

    #[test]
    fn an_ack_waits_for_the_next_message_to_its_member_or_its_delay() {
        let (a, b) = (member(1), member(2));
        let start = Instant::from_nanos(1_000_000_000);
        let mut lazy = LazyAcks::default();
        let mut out = Outbox::new();
        lazy.hold(start, &a, RequestId(1), &mut out);
        lazy.hold(start, &b, RequestId(2), &mut out);
        lazy.flush(start, &mut out);
        assert!(
            out.is_empty(),
            "nothing is due and nothing else goes to a or b"
        );
        assert_eq!(lazy.next_due(), Some(start + LAZY_ACK_DELAY));

        // A message for b: b's acknowledgement goes with it, a's stays.
        out.push_back((
            b.clone(),
            LockMessage::Revoke {
                request: RequestId(9),
                name: LockName::new("l").expect("valid"),
                token: conclave_lock_api::FencingToken(1),
            },
        ));
        lazy.flush(start, &mut out);
        assert_eq!(acks(&out), vec![(b.clone(), RequestId(2))]);
        assert_eq!(lazy.len(), 1);

        // a's is sent when due, alone.
        out.clear();
        lazy.flush(start + (LAZY_ACK_DELAY - Duration::from_nanos(1)), &mut out);
        assert!(out.is_empty());
        lazy.flush(start + LAZY_ACK_DELAY, &mut out);
        assert_eq!(acks(&out), vec![(a, RequestId(1))]);
        assert_eq!((lazy.len(), lazy.next_due()), (0, None));
    }

    #[test]
    fn acks_for_members_gone_from_the_view_are_dropped() {
        let (a, b) = (member(1), member(2));
        let now = Instant::from_nanos(0);
        let mut lazy = LazyAcks::default();
        let mut out = Outbox::new();
        lazy.hold(now, &a, RequestId(1), &mut out);
        lazy.hold(now, &b, RequestId(2), &mut out);
        lazy.keep_members_of(&View::new(2, vec![a.clone()]).expect("a view"));
        lazy.flush(now + LAZY_ACK_DELAY, &mut out);
        assert_eq!(acks(&out), vec![(a, RequestId(1))]);
    }

    #[test]
    fn too_many_held_back_for_one_member_go_at_once() {
        let a = member(1);
        let now = Instant::from_nanos(0);
        let mut lazy = LazyAcks::default();
        let mut out = Outbox::new();
        for request in 0..MAX_HELD_BACK as u64 {
            lazy.hold(now, &a, RequestId(request), &mut out);
        }
        assert!(out.is_empty());
        assert_eq!(lazy.len(), MAX_HELD_BACK);
        lazy.hold(now, &a, RequestId(MAX_HELD_BACK as u64), &mut out);
        let expected: Vec<(MemberId, RequestId)> = (0..=MAX_HELD_BACK as u64)
            .map(|r| (a.clone(), RequestId(r)))
            .collect();
        assert_eq!(acks(&out), expected, "in the order released");
        assert_eq!(lazy.len(), 0);
    }
}
