//! Benchmarks of the protocol core: the wire codec and the reliable layer.
//!
//! `cargo bench -p conclave-protocol --bench core -- --warm-up-time 1 --measurement-time 2`

use std::hint::black_box;
use std::net::SocketAddr;

use conclave_lock_api::wire::{
    self, ClusterId, Frame, GmsMessage, Message, Packet, Payload, Segment, StreamAck,
    PACKET_OVERHEAD_MAX,
};
use conclave_lock_api::{MemberId, View};
use conclave_protocol::reliable::{Reliable, ReliableConfig};
use conclave_protocol::Instant;
use criterion::{BatchSize, Criterion, Throughput};

/// The datagram size of the throughput benchmark: a typical Ethernet-safe UDP payload.
const DATAGRAM: usize = 1400;

fn member(n: u16) -> MemberId {
    let addr = SocketAddr::from(([127, 0, (n >> 8) as u8, n as u8], 7800));
    let incarnation = 0x5eed_0000_0000_0000_0000_0000_0000_0000 | u128::from(n);
    MemberId::new(incarnation, &format!("member-{n:02}"), addr).expect("valid member")
}

fn wire_benches(c: &mut Criterion) {
    let cluster = ClusterId::from_name("bench");
    let data = Packet {
        sender: member(1),
        frame: Frame::Data(Segment {
            to: member(2).incarnation(),
            stream: 3,
            base: 1000,
            seq: 1017,
            fragment: 0,
            fragments: 1,
            payload: Payload((0..100).collect()),
            ack: Some(StreamAck {
                stream: 2,
                next_expected: 990,
            }),
        }),
    };
    let view = View::new(42, (1..=16).map(member).collect()).expect("valid view");
    let install = Message::Gms(GmsMessage::InstallView { view });

    let data_bytes = wire::encode_packet(cluster, &data).expect("encodes");
    let install_bytes = wire::encode_message(&install).expect("encodes");

    let mut group = c.benchmark_group("wire");
    group.throughput(Throughput::Elements(1));
    group.bench_function("encode_packet/data_100B", |b| {
        b.iter(|| wire::encode_packet(cluster, black_box(&data)))
    });
    group.bench_function("decode_packet/data_100B", |b| {
        b.iter(|| wire::decode_packet(cluster, black_box(&data_bytes)))
    });
    group.bench_function("encode_message/install_view_16", |b| {
        b.iter(|| wire::encode_message(black_box(&install)))
    });
    group.bench_function("decode_message/install_view_16", |b| {
        b.iter(|| wire::decode_message(black_box(&install_bytes)))
    });
    group.finish();
}

/// A sender and a receiver connected by an in-memory, lossless exchange.
struct Link {
    ids: [MemberId; 2],
    a: Reliable,
    b: Reliable,
    now: Instant,
}

impl Link {
    fn new() -> Self {
        let ids = [member(1), member(2)];
        let fragment_len = DATAGRAM - PACKET_OVERHEAD_MAX;
        Self {
            a: Reliable::new(ids[0].clone(), ReliableConfig::default(), fragment_len),
            b: Reliable::new(ids[1].clone(), ReliableConfig::default(), fragment_len),
            ids,
            now: Instant::ZERO,
        }
    }

    /// Sends every message from `a` to `b` and moves frames until both sides are done;
    /// returns the number of messages delivered.
    fn push(&mut self, messages: Vec<Vec<u8>>) -> usize {
        for message in messages {
            self.a
                .send(self.now, &self.ids[1], message)
                .expect("queue has room");
        }
        let mut delivered = 0;
        loop {
            let mut moved = false;
            while let Some((_, frame)) = self.a.poll_transmit() {
                moved = true;
                match frame {
                    Frame::Data(segment) => self.b.handle_segment(self.now, &self.ids[0], segment),
                    Frame::Bundle(segments) => {
                        self.b.handle_bundle(self.now, &self.ids[0], segments)
                    }
                    other => unreachable!("sender sent {other:?}"),
                }
            }
            while let Some((_, message)) = self.b.poll_delivered() {
                delivered += 1;
                black_box(message);
            }
            while let Some((_, frame)) = self.b.poll_transmit() {
                moved = true;
                match frame {
                    Frame::Ack(ack) => self.a.handle_ack(self.now, &self.ids[1], ack),
                    other => unreachable!("receiver sent {other:?}"),
                }
            }
            if !moved {
                return delivered;
            }
        }
    }
}

fn reliable_benches(c: &mut Criterion) {
    let mut group = c.benchmark_group("reliable/throughput");
    for (label, size, batch) in [("64B", 64usize, 256usize), ("4KiB", 4096, 64)] {
        for unit in ["msgs", "bytes"] {
            group.throughput(match unit {
                "msgs" => Throughput::Elements(batch as u64),
                _ => Throughput::Bytes((batch * size) as u64),
            });
            let mut link = Link::new();
            group.bench_function(format!("{unit}/{label}"), |b| {
                b.iter_batched(
                    || vec![vec![0xab_u8; size]; batch],
                    |messages| {
                        let delivered = link.push(messages);
                        debug_assert_eq!(delivered, batch);
                        delivered
                    },
                    BatchSize::SmallInput,
                )
            });
            assert!(link.a.is_quiescent());
        }
    }
    group.finish();
}

fn main() {
    let mut criterion = Criterion::default().configure_from_args();
    wire_benches(&mut criterion);
    reliable_benches(&mut criterion);
    criterion.final_summary();
}
