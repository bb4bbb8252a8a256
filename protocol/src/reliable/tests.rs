//! Tests of [`Reliable`] as a whole.

use std::net::SocketAddr;

use conclave_lock_api::wire::Payload;

use super::*;

fn member(incarnation: u128, port: u16) -> MemberId {
    let addr = SocketAddr::from(([127, 0, 0, 1], port));
    MemberId::new(incarnation, "m", addr).unwrap()
}

fn ms(n: u64) -> Instant {
    Instant::from_nanos(n * 1_000_000)
}

/// Small windows, and every segment acknowledged at once (the tests of delayed and
/// piggybacked acknowledgements set their own delay).
fn config() -> ReliableConfig {
    ReliableConfig {
        send_window: 8,
        recv_window: 8,
        ack_delay: Duration::ZERO,
        ..ReliableConfig::default()
    }
}

fn delayed_acks() -> ReliableConfig {
    ReliableConfig {
        ack_delay: Duration::from_millis(10),
        ..config()
    }
}

fn acks(frames: &[Frame]) -> usize {
    frames.iter().filter(|f| matches!(f, Frame::Ack(_))).count()
}

#[test]
fn a_reply_carries_the_acknowledgement_of_its_request() {
    let mut p = Pair::new(delayed_acks(), 100);
    p.a.send(ms(0), &p.idb, b"request".to_vec()).unwrap();
    let request = frames(&mut p.a);
    feed(&mut p.b, ms(1), &p.ida, request);
    assert_eq!(delivered(&mut p.b), [b"request".to_vec()]);
    // No lone acknowledgement: it waits for the reply, at most `ack_delay`.
    assert!(frames(&mut p.b).is_empty());
    assert_eq!(p.b.poll_timeout(), Some(ms(11)));
    p.b.send(ms(2), &p.ida, b"reply".to_vec()).unwrap();
    let reply = frames(&mut p.b);
    assert_eq!(reply.len(), 1, "one datagram: the reply with the ack on it");
    let Frame::Data(segment) = &reply[0] else {
        panic!("not data: {reply:?}");
    };
    assert!(segment.ack.is_some());
    feed(&mut p.a, ms(3), &p.idb, reply);
    assert!(p.a.is_quiescent(), "the request is acknowledged");
    assert_eq!(delivered(&mut p.a), [b"reply".to_vec()]);
    assert_eq!(p.b.stats().acks_piggybacked, 1);
    // Nothing more to say to b: a's acknowledgement of the reply goes alone after the delay.
    assert!(frames(&mut p.a).is_empty());
    assert_eq!(p.a.poll_timeout(), Some(ms(13)));
    p.a.handle_timeout(ms(13));
    let ack = frames(&mut p.a);
    assert_eq!(acks(&ack), 1);
    feed(&mut p.b, ms(14), &p.ida, ack);
    assert!(p.b.is_quiescent());
    assert_eq!(p.b.stats().acks_sent, 0);
}

#[test]
fn small_messages_queued_together_leave_in_one_bundle() {
    let mut p = Pair::new(delayed_acks(), 1_000);
    // More segments than ACK_AT_ONCE_EVERY, so counting them one by one would ack at once.
    for i in 1..=6 {
        p.a.send(ms(0), &p.idb, msg(i)).unwrap();
    }
    let sent = frames(&mut p.a);
    assert_eq!(sent.len(), 1, "one datagram: {sent:?}");
    let Frame::Bundle(segments) = &sent[0] else {
        panic!("not a bundle: {sent:?}");
    };
    assert_eq!(
        segments.iter().map(|s| s.seq).collect::<Vec<_>>(),
        [1, 2, 3, 4, 5, 6]
    );
    assert_eq!(p.a.stats().bundles_sent, 1);
    feed(&mut p.b, ms(1), &p.ida, sent);
    assert_eq!(delivered(&mut p.b), (1..=6).map(msg).collect::<Vec<_>>());
    // One datagram is one arrival: its acknowledgement may still wait for data.
    assert!(frames(&mut p.b).is_empty());
    p.b.handle_timeout(ms(11));
    feed(&mut p.a, ms(12), &p.idb, frames(&mut p.b));
    assert!(p.a.is_quiescent());

    // What does not fit one datagram goes in the next.
    let big = vec![7; 600];
    p.a.send(ms(20), &p.idb, big.clone()).unwrap();
    p.a.send(ms(20), &p.idb, big.clone()).unwrap();
    assert_eq!(frames(&mut p.a).len(), 2);

    // A bundle larger than any sender makes is refused whole.
    let mut q = Pair::new(delayed_acks(), 1_000);
    q.a.send(ms(0), &q.idb, msg(1)).unwrap();
    let segment = data(&mut q.a).remove(0);
    q.b.handle_bundle(ms(1), &q.ida, vec![segment; MAX_BUNDLE + 1]);
    assert!(delivered(&mut q.b).is_empty());
    assert_eq!(q.b.stats().malformed_dropped, 1);
}

#[test]
fn every_fourth_datagram_is_acknowledged_at_once() {
    assert_eq!(ACK_AT_ONCE_EVERY, 4);
    let mut p = Pair::new(delayed_acks(), 100);
    for i in 1..=7 {
        p.a.send(ms(0), &p.idb, msg(i)).unwrap();
    }
    let mut datagrams = frames(&mut p.a).into_iter();
    let mut arrive = |p: &mut Pair, at: u64| {
        let one: Vec<Frame> = datagrams.next().into_iter().collect();
        assert!(
            matches!(one[..], [Frame::Data(_)]),
            "one segment per datagram"
        );
        feed(&mut p.b, ms(at), &p.ida, one);
        frames(&mut p.b)
    };
    for at in [1, 3, 5] {
        assert!(arrive(&mut p, at).is_empty(), "the acknowledgement waits");
        // Its deadline runs from the first arrival it owes, not the last.
        assert_eq!(p.b.poll_timeout(), Some(ms(11)));
    }
    let ack = arrive(&mut p, 7);
    assert_eq!(acks(&ack), 1, "the fourth datagram is acknowledged at once");
    // The count starts again: the next three wait, and the timer sends their
    // acknowledgement (nothing else goes before it).
    for at in [8, 9, 10] {
        assert!(arrive(&mut p, at).is_empty());
    }
    p.b.handle_timeout(ms(17));
    assert!(frames(&mut p.b).is_empty(), "not before its deadline");
    p.b.handle_timeout(ms(18));
    let late = frames(&mut p.b);
    assert_eq!(acks(&late), 1);
    feed(&mut p.a, ms(19), &p.idb, ack);
    feed(&mut p.a, ms(19), &p.idb, late);
    assert!(p.a.is_quiescent());
}

#[test]
fn a_window_below_four_is_acknowledged_when_full() {
    let config = ReliableConfig {
        send_window: 2,
        recv_window: 2,
        ..delayed_acks()
    };
    let mut p = Pair::new(config, 100);
    for i in 1..=2 {
        p.a.send(ms(0), &p.idb, msg(i)).unwrap();
    }
    let mut datagrams = frames(&mut p.a).into_iter();
    feed(
        &mut p.b,
        ms(1),
        &p.ida,
        datagrams.next().into_iter().collect(),
    );
    assert!(frames(&mut p.b).is_empty());
    feed(&mut p.b, ms(1), &p.ida, datagrams.collect());
    // The sender cannot send more until this comes: it does not wait for `ack_delay`.
    assert_eq!(acks(&frames(&mut p.b)), 1);
}

#[test]
fn a_gap_is_reported_at_once() {
    let mut p = Pair::new(delayed_acks(), 100);
    for i in 1..=3 {
        p.a.send(ms(0), &p.idb, msg(i)).unwrap();
    }
    let segments = data(&mut p.a);
    // The first is lost: the second is out of order and acknowledged at once (a duplicate
    // acknowledgement for the sender's fast retransmit).
    p.b.handle_segment(ms(1), &p.ida, segments[1].clone());
    let ack = frames(&mut p.b);
    assert_eq!(acks(&ack), 1);
    let Frame::Ack(ack) = &ack[0] else {
        unreachable!()
    };
    assert_eq!(ack.next_expected, 1);
    // Filling the gap is acknowledged at once too.
    p.b.handle_segment(ms(2), &p.ida, segments[0].clone());
    let ack = frames(&mut p.b);
    assert_eq!(acks(&ack), 1);
    assert_eq!(delivered(&mut p.b), [msg(1), msg(2)]);
    // A segment seen before: at once as well.
    p.b.handle_segment(ms(3), &p.ida, segments[0].clone());
    assert_eq!(acks(&frames(&mut p.b)), 1);
}

/// Two endpoints, `a` (incarnation 1, port 1) and `b` (incarnation 2, port 2).
struct Pair {
    a: Reliable,
    b: Reliable,
    ida: MemberId,
    idb: MemberId,
}

impl Pair {
    fn new(config: ReliableConfig, fragment_len: usize) -> Self {
        let (ida, idb) = (member(1, 1), member(2, 2));
        Self {
            a: Reliable::new(ida.clone(), config.clone(), fragment_len),
            b: Reliable::new(idb.clone(), config, fragment_len),
            ida,
            idb,
        }
    }

    /// Moves frames both ways without loss until neither side has any.
    fn exchange(&mut self, now: Instant) {
        loop {
            let from_a = frames(&mut self.a);
            let from_b = frames(&mut self.b);
            if from_a.is_empty() && from_b.is_empty() {
                return;
            }
            feed(&mut self.b, now, &self.ida, from_a);
            feed(&mut self.a, now, &self.idb, from_b);
        }
    }
}

fn frames(r: &mut Reliable) -> Vec<Frame> {
    std::iter::from_fn(|| r.poll_transmit())
        .map(|(_, f)| f)
        .collect()
}

fn data(r: &mut Reliable) -> Vec<Segment> {
    frames(r)
        .into_iter()
        .flat_map(|f| match f {
            Frame::Data(s) => vec![s],
            Frame::Bundle(segments) => segments,
            _ => Vec::new(),
        })
        .collect()
}

fn feed(r: &mut Reliable, now: Instant, from: &MemberId, frames: Vec<Frame>) {
    for frame in frames {
        match frame {
            Frame::Data(s) => r.handle_segment(now, from, s),
            Frame::Bundle(b) => r.handle_bundle(now, from, b),
            Frame::Ack(a) => r.handle_ack(now, from, a),
            other => panic!("unexpected frame {other:?}"),
        }
    }
}

fn delivered(r: &mut Reliable) -> Vec<Vec<u8>> {
    std::iter::from_fn(|| r.poll_delivered())
        .map(|(_, m)| m)
        .collect()
}

fn msg(i: u32) -> Vec<u8> {
    i.to_be_bytes().to_vec()
}

#[test]
fn in_order_delivery_and_quiescence() {
    let mut p = Pair::new(config(), 100);
    for i in 0..20 {
        p.a.send(ms(0), &p.idb, msg(i)).unwrap();
    }
    assert!(p.a.has_unacked(&p.idb));
    assert!(!p.a.is_quiescent());
    p.exchange(ms(1));
    assert_eq!(delivered(&mut p.b), (0..20).map(msg).collect::<Vec<_>>());
    assert!(p.a.is_quiescent());
    assert!(!p.a.has_unacked(&p.idb));
    let stats = p.a.stats();
    assert_eq!(stats.segments_sent, 20);
    assert_eq!(stats.segments_retransmitted, 0);
    assert_eq!(p.b.stats().messages_delivered, 20);
    // Nothing in flight: no retransmission deadline, only the idle sweep.
    assert_eq!(p.a.poll_timeout(), Some(ms(0) + Duration::from_secs(60)));
}

#[test]
fn duplicates_are_suppressed_and_still_acknowledged() {
    let mut p = Pair::new(config(), 100);
    p.a.send(ms(0), &p.idb, b"x".to_vec()).unwrap();
    let seg = data(&mut p.a).remove(0);
    for _ in 0..3 {
        p.b.handle_segment(ms(1), &p.ida, seg.clone());
    }
    assert_eq!(delivered(&mut p.b), [b"x".to_vec()]);
    assert_eq!(p.b.stats().duplicates_dropped, 2);
    // The acknowledgements of one batch are coalesced into one.
    let acks = frames(&mut p.b);
    assert_eq!(acks.len(), 1);
    assert!(matches!(
        acks[0],
        Frame::Ack(Ack {
            next_expected: 2,
            ..
        })
    ));
    // A duplicate after delivery is acknowledged again, not delivered.
    p.b.handle_segment(ms(2), &p.ida, seg);
    assert!(delivered(&mut p.b).is_empty());
    assert_eq!(frames(&mut p.b).len(), 1);
}

#[test]
fn reordered_segments_are_delivered_in_order() {
    let mut p = Pair::new(config(), 100);
    for i in 0..6 {
        p.a.send(ms(0), &p.idb, msg(i)).unwrap();
    }
    let mut segs = data(&mut p.a);
    segs.reverse();
    for s in segs {
        p.b.handle_segment(ms(1), &p.ida, s);
    }
    assert_eq!(delivered(&mut p.b), (0..6).map(msg).collect::<Vec<_>>());
}

#[test]
fn lost_segment_is_retransmitted_with_backoff_up_to_the_cap() {
    let config = ReliableConfig {
        retransmit_timeout: Duration::from_millis(100),
        max_retransmit_timeout: Duration::from_millis(500),
        ..config()
    };
    let mut p = Pair::new(config, 100);
    p.a.send(ms(0), &p.idb, b"lost".to_vec()).unwrap();
    assert_eq!(p.a.poll_timeout(), Some(ms(100)));
    let _lost = data(&mut p.a);
    // An early call changes nothing.
    p.a.handle_timeout(ms(50));
    assert!(data(&mut p.a).is_empty());
    let mut now = ms(100);
    for expected_gap in [200, 400, 500, 500] {
        p.a.handle_timeout(now);
        let resent = data(&mut p.a);
        assert_eq!(resent.len(), 1);
        assert_eq!(resent[0].seq, 1);
        let next = p.a.poll_timeout().unwrap();
        assert_eq!(next - now, Duration::from_millis(expected_gap));
        now = next;
    }
    assert_eq!(p.a.stats().segments_retransmitted, 4);
    // Delivery and acknowledgement reset the backoff.
    p.a.handle_timeout(now);
    let seg = data(&mut p.a).remove(0);
    p.b.handle_segment(now, &p.ida, seg);
    feed(&mut p.a, now, &p.idb, frames(&mut p.b));
    assert!(p.a.is_quiescent());
    p.a.send(now, &p.idb, b"next".to_vec()).unwrap();
    assert_eq!(p.a.poll_timeout(), Some(now + Duration::from_millis(100)));
}

#[test]
fn large_message_is_fragmented_and_reassembled() {
    let mut p = Pair::new(config(), 10);
    let big: Vec<u8> = (0..1000u32).map(|i| (i % 251) as u8).collect();
    p.a.send(ms(0), &p.idb, big.clone()).unwrap();
    p.a.send(ms(0), &p.idb, b"after".to_vec()).unwrap();
    p.exchange(ms(1));
    assert_eq!(delivered(&mut p.b), [big, b"after".to_vec()]);
    assert_eq!(p.a.stats().segments_sent, 101);
    assert!(p.a.is_quiescent());
}

#[test]
fn send_window_bounds_segments_in_flight() {
    let mut p = Pair::new(config(), 10);
    p.a.send(ms(0), &p.idb, vec![0; 200]).unwrap();
    let first = data(&mut p.a);
    assert_eq!(first.len(), 8);
    assert!(data(&mut p.a).is_empty());
    // Acknowledging three releases three more.
    for s in first.into_iter().take(3) {
        p.b.handle_segment(ms(1), &p.ida, s);
    }
    feed(&mut p.a, ms(1), &p.idb, frames(&mut p.b));
    let more = data(&mut p.a);
    assert_eq!(more.iter().map(|s| s.seq).collect::<Vec<_>>(), [9, 10, 11]);
    assert_eq!(more[0].base, 4);
}

#[test]
fn segments_beyond_the_receive_window_are_dropped() {
    let mut p = Pair::new(config(), 10);
    p.a.send(ms(0), &p.idb, b"x".to_vec()).unwrap();
    let mut seg = data(&mut p.a).remove(0);
    seg.seq = 9; // next_expected 1 + recv_window 8
    p.b.handle_segment(ms(1), &p.ida, seg.clone());
    assert_eq!(p.b.stats().out_of_window_dropped, 1);
    seg.seq = 8;
    p.b.handle_segment(ms(1), &p.ida, seg);
    assert_eq!(p.b.stats().out_of_window_dropped, 1);
    assert!(delivered(&mut p.b).is_empty());
}

#[test]
fn queue_bound_returns_queue_full() {
    let config = ReliableConfig {
        max_queued_bytes: 100,
        ..config()
    };
    let mut p = Pair::new(config, 10);
    // An empty queue takes any one message, even above the bound.
    p.a.send(ms(0), &p.idb, vec![0; 150]).unwrap();
    assert_eq!(
        p.a.send(ms(0), &p.idb, vec![0; 1]),
        Err(SendError::QueueFull {
            queued: 150,
            max: 100
        })
    );
    p.exchange(ms(1));
    p.a.send(ms(1), &p.idb, vec![0; 60]).unwrap();
    p.a.send(ms(1), &p.idb, vec![0; 40]).unwrap();
    assert!(matches!(
        p.a.send(ms(1), &p.idb, vec![0; 1]),
        Err(SendError::QueueFull { queued: 100, .. })
    ));
}

#[test]
fn send_errors() {
    let config = ReliableConfig {
        max_message_len: 50,
        max_peers: 1,
        ..config()
    };
    let mut p = Pair::new(config, 10);
    assert_eq!(
        p.a.send(ms(0), &p.ida.clone(), vec![1]),
        Err(SendError::ToSelf)
    );
    assert_eq!(
        p.a.send(ms(0), &p.idb, vec![0; 51]),
        Err(SendError::TooLarge { len: 51, max: 50 })
    );
    p.a.send(ms(0), &p.idb, vec![0; 50]).unwrap();
    assert_eq!(
        p.a.send(ms(0), &member(3, 3), vec![1]),
        Err(SendError::TooManyPeers { max: 1 })
    );
    // Segments from a new peer beyond the limit are dropped too.
    let mut c = Reliable::new(member(3, 3), ReliableConfig::default(), 10);
    c.send(ms(0), &p.ida, b"hi".to_vec()).unwrap();
    for s in data(&mut c) {
        p.a.handle_segment(ms(0), &member(3, 3), s);
    }
    assert_eq!(p.a.stats().peer_limit_dropped, 1);
    assert_eq!(p.a.peer_count(), 1);
}

#[test]
fn malformed_segments_are_dropped_without_panic() {
    let config = ReliableConfig {
        max_message_len: 1000,
        ..config()
    };
    let mut p = Pair::new(config, 10);
    let good = Segment {
        to: 2,
        stream: 1,
        base: 1,
        seq: 1,
        fragment: 0,
        fragments: 1,
        payload: Payload(vec![1]),
        ack: None,
    };
    let bad = [
        Segment {
            fragments: 0,
            ..good.clone()
        },
        Segment {
            fragment: 3,
            fragments: 3,
            ..good.clone()
        },
        Segment {
            fragments: u32::MAX,
            ..good.clone()
        },
        Segment {
            payload: Payload(vec![0; 1001]),
            ..good.clone()
        },
        Segment {
            base: 5,
            ..good.clone()
        },
        Segment {
            seq: u64::MAX,
            base: u64::MAX,
            ..good.clone()
        },
    ];
    for s in bad {
        p.b.handle_segment(ms(0), &p.ida, s);
    }
    assert_eq!(p.b.stats().malformed_dropped, 6);
    assert_eq!(p.b.peer_count(), 0);
    assert!(frames(&mut p.b).is_empty());
    // Inconsistent counts within a message, then a hostile base near the end of the space.
    p.b.handle_segment(
        ms(0),
        &p.ida,
        Segment {
            fragments: 3,
            ..good.clone()
        },
    );
    let second = Segment {
        seq: 2,
        fragment: 1,
        fragments: 4,
        ..good.clone()
    };
    p.b.handle_segment(ms(0), &p.ida, second);
    let far = Segment {
        seq: u64::MAX - 1,
        base: u64::MAX - 1,
        ..good.clone()
    };
    p.b.handle_segment(ms(0), &p.ida, far);
    assert_eq!(delivered(&mut p.b), [vec![1]]);
    // Acks of segments never sent are refused.
    p.a.send(ms(0), &p.idb, b"x".to_vec()).unwrap();
    let stream = data(&mut p.a)[0].stream;
    p.a.handle_ack(
        ms(0),
        &p.idb,
        Ack {
            to: 1,
            stream,
            next_expected: 99,
        },
    );
    assert!(p.a.has_unacked(&p.idb));
    assert_eq!(p.a.stats().malformed_dropped, 1);
}

#[test]
fn segments_and_acks_for_another_incarnation_are_dropped() {
    let mut p = Pair::new(config(), 10);
    p.a.send(ms(0), &p.idb, b"x".to_vec()).unwrap();
    let mut seg = data(&mut p.a).remove(0);
    seg.to = 99; // b's previous incarnation
    p.b.handle_segment(ms(1), &p.ida, seg.clone());
    assert!(delivered(&mut p.b).is_empty());
    assert!(frames(&mut p.b).is_empty());
    assert_eq!(p.b.stats().stale_dropped, 1);
    let ack = Ack {
        to: 99,
        stream: seg.stream,
        next_expected: 2,
    };
    p.a.handle_ack(ms(1), &p.idb, ack);
    let ack = Ack {
        to: 1,
        stream: seg.stream + 1,
        next_expected: 2,
    };
    p.a.handle_ack(ms(1), &p.idb, ack);
    assert!(p.a.has_unacked(&p.idb));
    assert_eq!(p.a.stats().stale_dropped, 2);
}

#[test]
fn new_stream_after_remove_peer_resets_the_receiver() {
    let mut p = Pair::new(config(), 10);
    for i in 0..3 {
        p.a.send(ms(0), &p.idb, msg(i)).unwrap();
    }
    p.exchange(ms(1));
    assert_eq!(delivered(&mut p.b).len(), 3);
    let old = {
        p.a.send(ms(2), &p.idb, b"old".to_vec()).unwrap();
        data(&mut p.a).remove(0)
    };
    // The membership layer removed b, then b came back (same incarnation).
    p.a.remove_peer(&p.idb);
    assert!(p.a.is_quiescent());
    assert_eq!(p.a.poll_timeout(), None);
    for i in 10..13 {
        p.a.send(ms(3), &p.idb, msg(i)).unwrap();
    }
    let new = data(&mut p.a);
    assert!(new[0].stream > old.stream);
    assert_eq!((new[0].seq, new[0].base), (1, 1));
    for s in new {
        p.b.handle_segment(ms(3), &p.ida, s);
    }
    // A late segment of the old stream is stale.
    p.b.handle_segment(ms(3), &p.ida, old);
    assert_eq!(delivered(&mut p.b), (10..13).map(msg).collect::<Vec<_>>());
    p.exchange(ms(4));
    assert!(p.a.is_quiescent());
    assert!(delivered(&mut p.b).is_empty());
}

#[test]
fn evicted_receiver_recovers_through_base() {
    let mut p = Pair::new(config(), 10);
    p.a.send(ms(0), &p.idb, msg(0)).unwrap();
    p.exchange(ms(0));
    assert_eq!(delivered(&mut p.b), [msg(0)]);
    // b forgets a while a still has an unacknowledged message to it, whose first
    // transmission is lost.
    p.a.send(ms(1), &p.idb, msg(1)).unwrap();
    let _lost = data(&mut p.a);
    p.b.remove_peer(&p.ida);
    assert_eq!(p.b.peer_count(), 0);
    p.a.handle_timeout(ms(101));
    let resent = data(&mut p.a);
    assert_eq!((resent[0].seq, resent[0].base), (2, 2));
    feed(
        &mut p.b,
        ms(101),
        &p.ida,
        resent.into_iter().map(Frame::Data).collect(),
    );
    p.exchange(ms(101));
    assert_eq!(delivered(&mut p.b), [msg(1)]);
    assert!(p.a.is_quiescent());
}

#[test]
fn idle_peers_are_evicted_and_streams_restart_cleanly() {
    let config = ReliableConfig {
        idle_timeout: Duration::from_secs(8),
        ..config()
    };
    let mut p = Pair::new(config, 10);
    p.a.send(ms(0), &p.idb, msg(0)).unwrap();
    p.exchange(ms(0));
    assert_eq!(p.b.poll_timeout(), Some(ms(8000)));
    p.a.handle_timeout(ms(7999));
    p.b.handle_timeout(ms(7999));
    assert_eq!(p.a.peer_count(), 1);
    p.a.handle_timeout(ms(8000));
    p.b.handle_timeout(ms(8000));
    assert_eq!((p.a.peer_count(), p.b.peer_count()), (0, 0));
    assert_eq!(p.a.stats().peers_evicted, 1);
    assert_eq!(p.a.poll_timeout(), None);
    // Both sides forgot; a new stream starts from 1 and is delivered once.
    p.a.send(ms(9000), &p.idb, msg(1)).unwrap();
    p.exchange(ms(9000));
    assert_eq!(delivered(&mut p.b), [msg(0), msg(1)]);
}

#[test]
fn busy_peers_are_not_evicted() {
    let config = ReliableConfig {
        idle_timeout: Duration::from_secs(1),
        max_retransmit_timeout: Duration::from_secs(1),
        ..config()
    };
    let mut p = Pair::new(config, 10);
    p.a.send(ms(0), &p.idb, msg(0)).unwrap();
    let _lost = data(&mut p.a);
    let mut now = ms(0);
    while now < ms(10_000) {
        now = p.a.poll_timeout().unwrap();
        p.a.handle_timeout(now);
        let _ = frames(&mut p.a);
    }
    assert!(p.a.has_unacked(&p.idb));
    assert_eq!(p.a.stats().peers_evicted, 0);
}

#[test]
fn peer_restart_drops_the_old_state() {
    let mut p = Pair::new(config(), 10);
    p.a.send(ms(0), &p.idb, msg(0)).unwrap();
    p.exchange(ms(0));
    let _ = delivered(&mut p.b);
    // Unacknowledged data to b's old incarnation, and a late segment from it.
    p.a.send(ms(1), &p.idb, msg(1)).unwrap();
    let _ = data(&mut p.a);
    p.b.send(ms(1), &p.ida, b"late".to_vec()).unwrap();
    let late = data(&mut p.b);

    // b restarts at the same address with a new incarnation and talks to a.
    let idb2 = member(22, 2);
    let mut b2 = Reliable::new(idb2.clone(), config(), 10);
    b2.send(ms(2), &p.ida, b"new".to_vec()).unwrap();
    feed(&mut p.a, ms(2), &idb2, frames(&mut b2));
    assert!(!p.a.has_unacked(&p.idb));
    assert_eq!(p.a.peer_count(), 1);
    assert_eq!(p.a.stats().peers_restarted, 1);
    assert_eq!(delivered(&mut p.a), [b"new".to_vec()]);
    // The old incarnation's late traffic neither delivers nor disturbs the new one.
    feed(
        &mut p.a,
        ms(3),
        &p.idb,
        late.into_iter().map(Frame::Data).collect(),
    );
    assert!(delivered(&mut p.a).is_empty());
    assert_eq!(p.a.peer_count(), 1);
    feed(&mut b2, ms(3), &p.ida, frames(&mut p.a));
    assert!(b2.is_quiescent());
}

/// Issue 30, finding 1: the receiver forgot b's old incarnation (membership removal or the idle
/// sweep), then a datagram of that dead incarnation arrives late. It must not retire b's live
/// successor: the successor's later traffic is still delivered.
#[test]
fn a_late_datagram_of_a_dead_incarnation_never_retires_its_successor() {
    // Incarnation ids: random high half, generation low half. The old one's random bits are
    // the larger, so only the generation can order them.
    let old_b = member(0xffff << 64 | 5, 2);
    let new_b = member(0x0001 << 64 | 9, 2);
    let a_id = member(1, 1);
    let mut a = Reliable::new(a_id.clone(), config(), 10);
    let mut old = Reliable::new(old_b.clone(), config(), 10);
    old.send(ms(0), &a_id, b"early".to_vec()).unwrap();
    feed(&mut a, ms(0), &old_b, frames(&mut old));
    assert_eq!(delivered(&mut a), [b"early".to_vec()]);
    old.send(ms(0), &a_id, b"from the past".to_vec()).unwrap();
    let late = frames(&mut old);
    a.remove_peer(&old_b);

    let mut b = Reliable::new(new_b.clone(), config(), 10);
    b.send(ms(1), &a_id, b"one".to_vec()).unwrap();
    feed(&mut a, ms(1), &new_b, frames(&mut b));
    assert_eq!(delivered(&mut a), [b"one".to_vec()]);

    // The dead incarnation's datagram arrives late: dropped, and b stays known.
    feed(&mut a, ms(2), &old_b, late);
    assert!(delivered(&mut a).is_empty());
    assert_eq!(a.stats().peers_restarted, 0);
    assert!(a.stats().stale_dropped >= 1);

    // b's next message still gets through, and a's answers reach b.
    b.send(ms(3), &a_id, b"two".to_vec()).unwrap();
    feed(&mut a, ms(3), &new_b, frames(&mut b));
    assert_eq!(delivered(&mut a), [b"two".to_vec()]);
    a.send(ms(4), &new_b, b"reply".to_vec()).unwrap();
    feed(&mut b, ms(4), &a_id, frames(&mut a));
    assert_eq!(delivered(&mut b), [b"reply".to_vec()]);
}

#[test]
fn poll_timeout_is_the_earliest_deadline() {
    let mut r = Reliable::new(member(1, 1), config(), 10);
    assert_eq!(r.poll_timeout(), None);
    let (b, c) = (member(2, 2), member(3, 3));
    r.send(ms(10), &b, vec![1]).unwrap();
    r.send(ms(30), &c, vec![1]).unwrap();
    let _ = frames(&mut r);
    assert_eq!(r.poll_timeout(), Some(ms(110)));
    r.handle_timeout(ms(110));
    // b backed off to 200 ms; c is next.
    assert_eq!(r.poll_timeout(), Some(ms(130)));
    r.handle_ack(
        ms(120),
        &c,
        Ack {
            to: 1,
            stream: 2,
            next_expected: 2,
        },
    );
    assert_eq!(r.poll_timeout(), Some(ms(310)));
    r.remove_peer(&b);
    // Only the idle sweep of c is left.
    assert_eq!(r.poll_timeout(), Some(ms(10) + Duration::from_secs(60)));
}

#[test]
fn peers_are_served_round_robin() {
    let mut r = Reliable::new(member(1, 1), config(), 10);
    let (b, c) = (member(2, 2), member(3, 3));
    r.send(ms(0), &b, vec![0; 30]).unwrap();
    r.send(ms(0), &c, vec![0; 30]).unwrap();
    let order: Vec<u128> = std::iter::from_fn(|| r.poll_transmit())
        .map(|(to, _)| to.incarnation())
        .collect();
    assert_eq!(order, [2, 3, 2, 3, 2, 3]);
}

#[test]
fn reliable_is_send_sync_and_debug() {
    fn assert_send_sync<T: Send + Sync + fmt::Debug>() {}
    assert_send_sync::<Reliable>();
    let r = Reliable::new(member(1, 1), config(), 10);
    assert!(format!("{r:?}").contains("Reliable"));
}

#[test]
fn fragment_length_is_clamped_to_what_the_wire_carries() {
    let r = Reliable::new(member(1, 1), config(), usize::MAX);
    assert_eq!(r.max_fragment_len(), MAX_FRAGMENT_LEN);
    let r = Reliable::new(member(1, 1), config(), 0);
    assert_eq!(r.max_fragment_len(), 1);
    // An invalid configuration is clamped, not refused.
    let bad = ReliableConfig {
        send_window: 0,
        ..ReliableConfig::default()
    };
    let r = Reliable::new(member(1, 1), bad, 10);
    assert_eq!(r.config().send_window, 1);
}
