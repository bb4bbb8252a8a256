//! Property test of the reliable layer: two endpoints over a deterministic lossy channel.
//!
//! A chaos phase loses, duplicates, delays and reorders datagrams while both sides send
//! messages of random sizes (many of them cut into fragments); a calm phase then delivers
//! everything with timeouts advancing. Checked: every message is delivered exactly once and in
//! order, both sides become quiescent within a bounded number of steps, and after both sides
//! have forgotten each other (idle eviction) new messages still arrive exactly once.

use std::net::SocketAddr;
use std::time::Duration;

use conclave_lock_api::wire::Frame;
use conclave_lock_api::MemberId;
use conclave_protocol::reliable::{Reliable, ReliableConfig, Stats};
use conclave_protocol::Instant;
use proptest::prelude::*;

/// splitmix64: the channel's only source of randomness, seeded by the test input.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }

    fn percent(&mut self, p: u8) -> bool {
        self.below(100) < u64::from(p)
    }
}

#[derive(Clone, Copy, Debug)]
struct Chaos {
    loss: u8,
    dup: u8,
    max_delay_ms: u64,
}

const CALM: Chaos = Chaos {
    loss: 0,
    dup: 0,
    max_delay_ms: 2,
};

#[derive(Clone, Debug)]
struct Scenario {
    seed: u64,
    chaos: Chaos,
    fragment_len: usize,
    send_window: u32,
    recv_extra: u32,
    /// (sender index, size, send time in ms)
    messages: Vec<(usize, usize, u64)>,
}

struct InFlight {
    at: Instant,
    order: u64,
    dest: usize,
    frame: Frame,
}

struct Net {
    ids: [MemberId; 2],
    nodes: [Reliable; 2],
    in_flight: Vec<InFlight>,
    /// `sent[i]`: the messages node `i` sent, in order.
    sent: [Vec<Vec<u8>>; 2],
    /// `received[i]`: the messages node `i` received, in order.
    received: [Vec<Vec<u8>>; 2],
    rng: Rng,
    now: Instant,
}

impl Net {
    fn new(s: &Scenario) -> Self {
        let ids = [
            MemberId::new(0xa, "a", SocketAddr::from(([10, 0, 0, 1], 7800))).expect("valid"),
            MemberId::new(0xb, "b", SocketAddr::from(([10, 0, 0, 2], 7800))).expect("valid"),
        ];
        let config = ReliableConfig {
            retransmit_timeout: Duration::from_millis(20),
            max_retransmit_timeout: Duration::from_millis(200),
            send_window: s.send_window,
            recv_window: s.send_window + s.recv_extra,
            idle_timeout: Duration::from_secs(5),
            ..ReliableConfig::default()
        };
        config.validate().expect("valid config");
        let nodes = ids
            .clone()
            .map(|id| Reliable::new(id, config.clone(), s.fragment_len));
        Self {
            ids,
            nodes,
            in_flight: Vec::new(),
            sent: [Vec::new(), Vec::new()],
            received: [Vec::new(), Vec::new()],
            rng: Rng(s.seed),
            now: Instant::ZERO,
        }
    }

    fn send(&mut self, from: usize, size: usize) {
        let index = self.sent[from].len() as u32;
        let mut message = vec![from as u8];
        message.extend_from_slice(&index.to_be_bytes());
        message.extend((0..size).map(|i| (i as u32).wrapping_mul(31).wrapping_add(index) as u8));
        let to = self.ids[1 - from].clone();
        self.nodes[from]
            .send(self.now, &to, message.clone())
            .expect("send");
        self.sent[from].push(message);
    }

    /// Takes every frame the nodes want to send and puts it on the channel.
    fn collect(&mut self, chaos: Chaos) {
        for from in 0..2 {
            while let Some((to, frame)) = self.nodes[from].poll_transmit() {
                assert_eq!(to, self.ids[1 - from]);
                if self.rng.percent(chaos.loss) {
                    continue;
                }
                let copies = if self.rng.percent(chaos.dup) { 2 } else { 1 };
                for _ in 0..copies {
                    let delay = self.rng.below(chaos.max_delay_ms + 1);
                    self.in_flight.push(InFlight {
                        at: self.now + Duration::from_millis(delay),
                        order: self.rng.next(),
                        dest: 1 - from,
                        frame: frame.clone(),
                    });
                }
            }
        }
    }

    /// Delivers every frame due by `now`, in (time, random) order, and fires due timeouts.
    fn advance(&mut self) {
        let (mut due, later): (Vec<_>, Vec<_>) =
            self.in_flight.drain(..).partition(|f| f.at <= self.now);
        self.in_flight = later;
        due.sort_by_key(|f| (f.at, f.order));
        for f in due {
            let from = self.ids[1 - f.dest].clone();
            match f.frame {
                Frame::Data(s) => self.nodes[f.dest].handle_segment(self.now, &from, s),
                Frame::Bundle(b) => self.nodes[f.dest].handle_bundle(self.now, &from, b),
                Frame::Ack(a) => self.nodes[f.dest].handle_ack(self.now, &from, a),
                other => panic!("unexpected frame {other:?}"),
            }
            self.check_delivered(f.dest);
        }
        for node in &mut self.nodes {
            if node.poll_timeout().is_some_and(|t| t <= self.now) {
                node.handle_timeout(self.now);
            }
        }
    }

    /// Every delivery must be the next message its sender sent: in order, exactly once.
    fn check_delivered(&mut self, at: usize) {
        while let Some((from, message)) = self.nodes[at].poll_delivered() {
            assert_eq!(from, self.ids[1 - at]);
            let k = self.received[at].len();
            assert!(
                k < self.sent[1 - at].len(),
                "node {at} delivered more messages than were sent"
            );
            assert_eq!(
                message,
                self.sent[1 - at][k],
                "node {at}: message {k} out of order, duplicated or corrupted"
            );
            self.received[at].push(message);
        }
    }

    fn settled(&self) -> bool {
        self.in_flight.is_empty() && self.nodes.iter().all(Reliable::is_quiescent)
    }

    /// Runs without faults, jumping to the next event, until everything is delivered and
    /// acknowledged. Panics if that takes more than `max_steps` steps.
    fn calm(&mut self, max_steps: usize) {
        for _ in 0..max_steps {
            self.collect(CALM);
            if self.settled() {
                return;
            }
            let next_frame = self.in_flight.iter().map(|f| f.at).min();
            let next_timer = self.nodes.iter().filter_map(Reliable::poll_timeout).min();
            let next = next_frame
                .into_iter()
                .chain(next_timer)
                .min()
                .expect("a next event");
            self.now = self.now.max(next);
            self.advance();
        }
        panic!(
            "not quiescent after {max_steps} calm steps: stats {:?} / {:?}",
            self.nodes[0].stats(),
            self.nodes[1].stats()
        );
    }

    fn assert_all_delivered(&self) {
        for i in 0..2 {
            assert_eq!(
                self.received[1 - i].len(),
                self.sent[i].len(),
                "messages of node {i} missing"
            );
        }
    }
}

/// Runs a scenario; returns the stats of both nodes.
fn run(s: &Scenario) -> [Stats; 2] {
    let mut net = Net::new(s);
    let mut schedule = s.messages.clone();
    schedule.sort_by_key(|m| m.2);
    let mut schedule = schedule.into_iter().peekable();
    // Chaos: 1 ms ticks until every message is sent and a while after.
    let chaos_end = Instant::from_nanos(2_000_000_000);
    while net.now < chaos_end {
        while let Some(&(from, size, at)) = schedule.peek() {
            if Instant::from_nanos(at * 1_000_000) > net.now {
                break;
            }
            net.send(from, size);
            schedule.next();
        }
        net.collect(s.chaos);
        net.now += Duration::from_millis(1);
        net.advance();
    }
    net.calm(20_000);
    net.assert_all_delivered();

    // Both sides forget each other once idle; a new exchange is still exactly-once.
    let until = net.now + Duration::from_secs(10);
    while let Some(next) = net.nodes.iter().filter_map(Reliable::poll_timeout).min() {
        if next > until {
            break;
        }
        net.now = next;
        net.advance();
    }
    assert_eq!(net.nodes[0].peer_count(), 0);
    assert_eq!(net.nodes[1].peer_count(), 0);
    for i in 0..4 {
        net.send(i % 2, i * 40);
    }
    net.calm(20_000);
    net.assert_all_delivered();
    [net.nodes[0].stats(), net.nodes[1].stats()]
}

fn scenario() -> impl Strategy<Value = Scenario> {
    (
        any::<u64>(),
        (0u8..50, 0u8..30, 0u64..40),
        1usize..48,
        1u32..16,
        0u32..16,
        prop::collection::vec((0usize..2, 0usize..400, 0u64..1500), 1..40),
    )
        .prop_map(
            |(seed, (loss, dup, max_delay_ms), fragment_len, send_window, recv_extra, messages)| {
                Scenario {
                    seed,
                    chaos: Chaos {
                        loss,
                        dup,
                        max_delay_ms,
                    },
                    fragment_len,
                    send_window,
                    recv_extra,
                    messages,
                }
            },
        )
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn exactly_once_in_order_through_chaos(s in scenario()) {
        run(&s);
    }
}

#[test]
fn heavy_loss_with_tiny_fragments() {
    let s = Scenario {
        seed: 7,
        chaos: Chaos {
            loss: 60,
            dup: 20,
            max_delay_ms: 50,
        },
        fragment_len: 1,
        send_window: 8,
        recv_extra: 0,
        messages: (0..12).map(|i| (i % 2, 97 * i, 10 * i as u64)).collect(),
    };
    let stats = run(&s);
    assert!(stats[0].segments_retransmitted > 0);
    assert!(stats[1].duplicates_dropped > 0);
}

#[test]
fn same_seed_same_run() {
    let s = Scenario {
        seed: 42,
        chaos: Chaos {
            loss: 20,
            dup: 10,
            max_delay_ms: 30,
        },
        fragment_len: 16,
        send_window: 4,
        recv_extra: 4,
        messages: (0..20).map(|i| (i % 2, 13 * i, 50 * i as u64)).collect(),
    };
    assert_eq!(run(&s), run(&s));
}
