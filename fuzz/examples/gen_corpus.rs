//! Writes the seed corpus of every fuzz target into `fuzz/corpus/<target>/`, replacing what is
//! there:
//!
//! ```text
//! cd fuzz && cargo run --example gen_corpus
//! ```
//!
//! Seeds are valid inputs the fuzzer starts from: an encoded packet of each frame kind and a
//! message of each kind (`wire_decode`); hellos and frame streams (`tcp_frames`); scripts that
//! make the endpoint a coordinator, a joiner, a grantor (`endpoint_input`). Each seed is
//! checked against its target's reader before it is written.

use std::error::Error;
use std::fs;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use conclave_fuzz::script::{self, Reader, Step, Writer};
use conclave_fuzz::{wire_round_trip, CLUSTER};
use conclave_lock_api::wire::{
    self, Ack, ClusterId, Discovery, Frame, GmsMessage, GrantView, LeaseBeat, LockMessage, Message,
    Packet, Payload, PendingRelease, PendingRequest, Probe, ReportedHold, Segment, SharedSetting,
    StreamAck, TableHolder, TableLock, TableWaiter,
};
use conclave_lock_api::{FencingToken, LockMode, LockName, MemberId, OwnerId, RequestId, View};
use conclave_tcp::fuzzing;

type Result<T = ()> = std::result::Result<T, Box<dyn Error>>;

fn main() -> Result {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("corpus");
    let wire = write_all(&root.join("wire_decode"), wire_seeds()?)?;
    let tcp = write_all(&root.join("tcp_frames"), tcp_seeds()?)?;
    let endpoint = write_all(&root.join("endpoint_input"), endpoint_seeds())?;
    println!("wrote {wire} wire_decode, {tcp} tcp_frames and {endpoint} endpoint_input seeds");
    Ok(())
}

/// Replaces the files of `dir` with `seeds`, keeping the `regression-*` entries (inputs the
/// fuzzer found; when a script format changes they must be re-encoded by hand).
fn write_all(dir: &PathBuf, seeds: Vec<(String, Vec<u8>)>) -> Result<usize> {
    fs::create_dir_all(dir)?;
    for entry in fs::read_dir(dir)? {
        let path = entry?.path();
        let found = path
            .file_name()
            .and_then(|n| n.to_str())
            .is_some_and(|n| n.starts_with("regression-"));
        if !found && path.is_file() {
            fs::remove_file(path)?;
        }
    }
    for (name, bytes) in &seeds {
        fs::write(dir.join(name), bytes)?;
    }
    Ok(seeds.len())
}

fn name(s: &str) -> LockName {
    LockName::new(s).expect("a valid lock name")
}

fn owner(member: usize, local: u64) -> OwnerId {
    OwnerId {
        member: script::member(member),
        local,
    }
}

/// One message of every kind, with names and members the script format can write.
fn messages() -> Vec<(&'static str, Message)> {
    let m = script::member;
    let view = View::new(3, vec![m(0), m(1), m(2)]).expect("a valid view");
    let l = || name("l1");
    let req = RequestId(1);
    let token = FencingToken::new(2, 1);
    let gms = |g| Message::Gms(g);
    let lock = |l| Message::Lock(l);
    vec![
        ("join-request", gms(GmsMessage::JoinRequest)),
        (
            "join",
            gms(GmsMessage::Join {
                settings: vec![SharedSetting {
                    name: "partition_policy".into(),
                    value: "Available".into(),
                }],
            }),
        ),
        (
            "join-refused",
            gms(GmsMessage::JoinRefused {
                setting: "partition_policy".into(),
                coordinator_value: "Available".into(),
                joiner_value: "Majority { cluster_size: 3 }".into(),
            }),
        ),
        ("not-coordinator", gms(GmsMessage::NotCoordinator)),
        ("leave-request", gms(GmsMessage::LeaveRequest)),
        (
            "install-view-delta",
            gms(GmsMessage::InstallViewDelta {
                epoch: 4,
                base_epoch: view.epoch(),
                base_digest: view.digest(),
                left: vec![m(2).incarnation()],
                joined: vec![m(3)],
                digest: View::new(4, vec![m(0), m(1), m(3)])
                    .expect("a valid view")
                    .digest(),
            }),
        ),
        ("install-view", gms(GmsMessage::InstallView { view })),
        (
            "leave-accepted",
            gms(GmsMessage::LeaveAccepted { epoch: 4 }),
        ),
        ("view-request", gms(GmsMessage::ViewRequest { epoch: 4 })),
        (
            "lock",
            lock(LockMessage::Lock {
                request: req,
                name: l(),
                owner: owner(1, 1),
                mode: LockMode::Exclusive,
                wait: true,
                stamp: 1,
                lease_ms: Some(5_000),
                quiet: true,
                passes: true,
            }),
        ),
        (
            "extend-lease",
            lock(LockMessage::ExtendLease {
                request: req,
                name: l(),
                lease_ms: 10_000,
                stamp: 3,
            }),
        ),
        (
            "renew",
            lock(LockMessage::Renew {
                stamp: 2,
                held: vec![req],
            }),
        ),
        (
            "renewed",
            lock(LockMessage::Renewed {
                stamp: 2,
                held: vec![req],
            }),
        ),
        (
            "cancel",
            lock(LockMessage::Cancel {
                request: req,
                name: l(),
            }),
        ),
        (
            "unlock",
            lock(LockMessage::Unlock {
                request: req,
                name: l(),
                owner: owner(1, 1),
                token,
                lazy: false,
                passed_to: None,
            }),
        ),
        (
            "granted",
            lock(LockMessage::Granted {
                request: req,
                name: l(),
                token,
                stamp: 1,
                cached: false,
                lease_ms: Some(900),
                view: Some(GrantView {
                    epoch: 3,
                    coordinator: m(1).incarnation(),
                }),
            }),
        ),
        (
            "queued",
            lock(LockMessage::Queued {
                request: req,
                position: 2,
            }),
        ),
        (
            "denied",
            lock(LockMessage::Denied {
                request: req,
                name: l(),
                unavailable: true,
            }),
        ),
        ("unlock-ack", lock(LockMessage::UnlockAck { request: req })),
        (
            "lock-info-request",
            lock(LockMessage::LockInfoRequest { epoch: 3 }),
        ),
        (
            "lock-info-response",
            lock(LockMessage::LockInfoResponse {
                epoch: 3,
                held: vec![ReportedHold {
                    request: req,
                    name: l(),
                    owner: owner(1, 1),
                    mode: LockMode::Shared,
                    token,
                    lease_ms: Some(1_500),
                }],
                pending: vec![PendingRequest {
                    request: RequestId(2),
                    name: name("l2"),
                    owner: owner(1, 2),
                    mode: LockMode::Exclusive,
                    wait: true,
                    lease_ms: None,
                }],
                releases: vec![PendingRelease {
                    request: RequestId(3),
                    name: name("l3"),
                    owner: owner(1, 3),
                    token: FencingToken::new(1, 7),
                }],
            }),
        ),
        ("serving", lock(LockMessage::Serving { epoch: 3 })),
        (
            "holding",
            lock(LockMessage::Holding {
                held: vec![req],
                pending: vec![RequestId(2)],
                upto: Some(RequestId(3)),
            }),
        ),
        (
            "transfer-request",
            lock(LockMessage::TransferRequest {
                epoch: 3,
                coordinator: m(1).incarnation(),
            }),
        ),
        (
            "transferred",
            lock(LockMessage::Transferred {
                epoch: 3,
                coordinator: m(1).incarnation(),
                generation: 1,
            }),
        ),
        (
            "table-request",
            lock(LockMessage::TableRequest { query: 1 }),
        ),
        (
            "table",
            lock(LockMessage::Table {
                query: 1,
                epoch: 3,
                unavailable: false,
                truncated: false,
                locks: vec![TableLock {
                    name: l(),
                    holders: vec![TableHolder {
                        owner: owner(1, 1),
                        mode: LockMode::Exclusive,
                        token,
                        lease_ms: Some(700),
                    }],
                    waiters: vec![TableWaiter {
                        owner: owner(2, 1),
                        mode: LockMode::Shared,
                    }],
                }],
            }),
        ),
        (
            "duplicate-lock",
            lock(LockMessage::DuplicateLock {
                name: l(),
                owner: owner(1, 1),
                token,
            }),
        ),
        (
            "service-lock",
            Message::Service {
                service: conclave_lock_api::ServiceName::new("s1").expect("a valid name"),
                message: LockMessage::Lock {
                    request: req,
                    name: l(),
                    owner: owner(1, 1),
                    mode: LockMode::Exclusive,
                    wait: true,
                    stamp: 1,
                    lease_ms: None,
                    quiet: false,
                    passes: true,
                },
            },
        ),
    ]
}

/// A one-fragment segment from a peer to the endpoint carrying `message`.
fn segment(stream: u64, seq: u64, message: &Message, ack: Option<StreamAck>) -> Segment {
    Segment {
        to: script::member(0).incarnation(),
        stream,
        base: 0,
        seq,
        fragment: 0,
        fragments: 1,
        payload: Payload(wire::encode_message(message).expect("encodes")),
        ack,
    }
}

/// A packet of every frame kind.
fn frames() -> Vec<(&'static str, Frame)> {
    let m = script::member;
    let view = View::new(5, vec![m(1), m(2), m(0)]).expect("a valid view");
    let join = Message::Gms(GmsMessage::JoinRequest);
    let serving = Message::Lock(LockMessage::Serving { epoch: 5 });
    let ack = StreamAck {
        stream: 1,
        next_expected: 1,
    };
    vec![
        ("discovery-ping", Frame::Discovery(Discovery::Ping)),
        (
            "discovery-announce",
            Frame::Discovery(Discovery::Announce {
                view,
                heard: Vec::new(),
                settings: Vec::new(),
            }),
        ),
        (
            "heartbeat",
            Frame::Heartbeat {
                epoch: 5,
                view_epoch: 5,
                coordinator: m(1).incarnation(),
                lease: None,
            },
        ),
        (
            "heartbeat-lease",
            Frame::Heartbeat {
                epoch: 5,
                view_epoch: 5,
                coordinator: m(1).incarnation(),
                lease: Some(LeaseBeat {
                    max_term: 2,
                    probe: Some(Probe { term: 2, seq: 9 }),
                    echo: Some(Probe { term: 1, seq: 3 }),
                    refused: Some(1),
                }),
            },
        ),
        ("data", Frame::Data(segment(1, 0, &join, None))),
        ("data-ack", Frame::Data(segment(1, 1, &serving, Some(ack)))),
        (
            "bundle",
            Frame::Bundle(vec![
                segment(1, 0, &join, None),
                segment(1, 1, &serving, Some(ack)),
            ]),
        ),
        (
            "ack",
            Frame::Ack(Ack {
                to: m(0).incarnation(),
                stream: 1,
                next_expected: 3,
            }),
        ),
    ]
}

fn wire_seeds() -> Result<Vec<(String, Vec<u8>)>> {
    let cluster = ClusterId::from_name(CLUSTER);
    let mut seeds = Vec::new();
    for (kind, frame) in frames() {
        let packet = Packet {
            sender: script::member(1),
            frame,
        };
        seeds.push((
            format!("packet-{kind}"),
            wire::encode_packet(cluster, &packet)?,
        ));
    }
    // A sender with an IPv6 address and a scope id, which travels in a field of its own.
    let v6: SocketAddr = "[fe80::1%3]:7800".parse()?;
    let packet = Packet {
        sender: MemberId::new(9, "v6", v6)?,
        frame: Frame::Discovery(Discovery::Ping),
    };
    seeds.push((
        "packet-ipv6-sender".into(),
        wire::encode_packet(cluster, &packet)?,
    ));
    for (kind, message) in messages() {
        seeds.push((format!("message-{kind}"), wire::encode_message(&message)?));
    }
    for (_, bytes) in &seeds {
        wire_round_trip(bytes);
        let decodes =
            wire::decode_packet(cluster, bytes).is_ok() || wire::decode_message(bytes).is_ok();
        assert!(decodes, "a seed that decodes");
    }
    Ok(seeds)
}

/// A `tcp_frames` input: `max_frame` (2 bytes), the chunk seed, the stream.
fn tcp_input(max_frame: u16, seed: u8, stream: &[Vec<u8>]) -> Vec<u8> {
    let mut input = Vec::new();
    input.extend((max_frame - 512).to_be_bytes());
    input.push(seed);
    for part in stream {
        input.extend_from_slice(part);
    }
    input
}

fn tcp_seeds() -> Result<Vec<(String, Vec<u8>)>> {
    let hello4 = fuzzing::encode_hello(0x0102_0304_0506_0708, "127.0.0.1:7800".parse()?);
    let hello6 = fuzzing::encode_hello(42, "[fe80::1%3]:7801".parse()?);
    let packet = Packet {
        sender: script::member(1),
        frame: Frame::Discovery(Discovery::Ping),
    };
    let datagram = fuzzing::encode_frame(&wire::encode_packet(
        ClusterId::from_name(CLUSTER),
        &packet,
    )?);
    let frame = |len: usize| fuzzing::encode_frame(&vec![0xa5; len]);
    let seeds = vec![
        (
            "hello-v4",
            tcp_input(65_535, 0, std::slice::from_ref(&hello4)),
        ),
        (
            "hello-v6",
            tcp_input(65_535, 1, std::slice::from_ref(&hello6)),
        ),
        (
            "hello-frames",
            tcp_input(
                65_535,
                2,
                &[hello4.clone(), datagram.clone(), frame(0), frame(1000)],
            ),
        ),
        (
            "hello-v6-frames-small-limit",
            tcp_input(512, 3, &[hello6.clone(), frame(512), datagram.clone()]),
        ),
        (
            "hello-large-frame",
            tcp_input(65_535, 4, &[hello4.clone(), frame(20_000)]),
        ),
        (
            "hello-too-long",
            tcp_input(1024, 5, &[hello4.clone(), vec![0, 0, 4, 1, 7, 7]]),
        ),
        ("oversized-hello", tcp_input(65_535, 6, &[frame(100)])),
        (
            "not-conclave",
            tcp_input(65_535, 7, &[b"GET / HTTP/1.1\r\n\r\n".to_vec()]),
        ),
    ];
    Ok(seeds
        .into_iter()
        .map(|(name, bytes)| (name.to_owned(), bytes))
        .collect())
}

/// An `endpoint_input` seed: the configuration byte, then the script of `steps`, checked to
/// read back as `steps`.
fn endpoint_input(config: u8, steps: &[Step]) -> Vec<u8> {
    let mut writer = Writer::default();
    for step in steps {
        writer.step(step);
    }
    let script = writer.finish();
    let mut reader = Reader::new(&script);
    let mut read = Vec::new();
    while let Some(step) = reader.next_step() {
        read.push(step);
    }
    assert_eq!(read, steps, "a script reads back as written");
    let mut input = vec![config];
    input.extend(script);
    input
}

fn from(member: usize, frame: Frame) -> Step {
    Step::Packet(Packet {
        sender: script::member(member),
        frame,
    })
}

fn endpoint_seeds() -> Vec<(String, Vec<u8>)> {
    let m = script::member;
    const AVAILABLE: u8 = 0;
    const MAJORITY_OF_3: u8 = 5;
    let join = Message::Gms(GmsMessage::JoinRequest);
    // The endpoint discovers nobody and forms a view of itself.
    let alone = vec![Step::Advance(400), Step::Advance(400)];
    // Then peer 1 joins and asks for a lock, which the endpoint grants.
    let mut coordinator = alone.clone();
    coordinator.extend([
        from(1, Frame::Data(segment(1, 0, &join, None))),
        Step::Advance(20),
        from(
            1,
            Frame::Heartbeat {
                epoch: 2,
                view_epoch: 2,
                coordinator: m(0).incarnation(),
                lease: None,
            },
        ),
        from(
            1,
            Frame::Data(segment(
                1,
                1,
                &Message::Lock(LockMessage::Lock {
                    request: RequestId(1),
                    name: name("l1"),
                    owner: owner(1, 1),
                    mode: LockMode::Exclusive,
                    wait: true,
                    stamp: 1,
                    lease_ms: None,
                    quiet: false,
                    passes: false,
                }),
                None,
            )),
        ),
        Step::Lock {
            owner: 1,
            name: name("l1"),
            mode: LockMode::Exclusive,
            wait: true,
            timeout_ms: Some(500),
            quiet: false,
        },
        Step::Advance(100),
        from(
            1,
            Frame::Data(segment(
                1,
                2,
                &Message::Lock(LockMessage::Unlock {
                    request: RequestId(1),
                    name: name("l1"),
                    owner: owner(1, 1),
                    token: FencingToken::new(2, 1),
                    lazy: true,
                    passed_to: None,
                }),
                Some(StreamAck {
                    stream: 1,
                    next_expected: 2,
                }),
            )),
        ),
        Step::Advance(100),
        Step::Unlock(128), // as a dropped guard: `unlock_lazy`
        Step::QueryTable,
        Step::Advance(1000),
    ]);
    // The endpoint hears peer 1's announcement, joins its view and asks it for a lock.
    let view = View::new(7, vec![m(1), m(0)]).expect("a valid view");
    let joiner = vec![
        from(
            1,
            Frame::Discovery(Discovery::Announce {
                view: View::new(6, vec![m(1)]).expect("a valid view"),
                heard: Vec::new(),
                settings: Vec::new(),
            }),
        ),
        Step::Advance(10),
        from(
            1,
            Frame::Data(segment(
                1,
                0,
                &Message::Gms(GmsMessage::InstallView { view }),
                None,
            )),
        ),
        from(
            1,
            Frame::Heartbeat {
                epoch: 7,
                view_epoch: 7,
                coordinator: m(1).incarnation(),
                lease: None,
            },
        ),
        from(
            1,
            Frame::Data(segment(
                1,
                1,
                &Message::Lock(LockMessage::Serving { epoch: 7 }),
                None,
            )),
        ),
        Step::Lock {
            owner: 1,
            name: name("l2"),
            mode: LockMode::Shared,
            wait: false,
            timeout_ms: None,
            quiet: true,
        },
        from(
            1,
            Frame::Data(segment(
                1,
                2,
                &Message::Lock(LockMessage::Granted {
                    request: RequestId(1),
                    name: name("l2"),
                    token: FencingToken::new(7, 1),
                    stamp: 0,
                    cached: true,
                    lease_ms: None,
                    view: None,
                }),
                None,
            )),
        ),
        Step::Advance(50),
        Step::Unlock(0),
        Step::Advance(50),
        Step::Leave,
        Step::Advance(600),
    ];
    let mut seeds = vec![
        ("alone".to_owned(), endpoint_input(AVAILABLE, &alone)),
        (
            "coordinator".to_owned(),
            endpoint_input(AVAILABLE, &coordinator),
        ),
        (
            "coordinator-majority".to_owned(),
            endpoint_input(MAJORITY_OF_3, &coordinator),
        ),
        ("joiner".to_owned(), endpoint_input(AVAILABLE, &joiner)),
        (
            "joiner-majority".to_owned(),
            endpoint_input(MAJORITY_OF_3, &joiner),
        ),
        (
            "raw-garbage".to_owned(),
            endpoint_input(
                AVAILABLE,
                &[
                    Step::Raw(b"CNCL\x03garbage".to_vec()),
                    Step::Advance(400),
                    Step::Raw(vec![0xff; 64]),
                ],
            ),
        ),
    ];
    // Every frame kind, and every message from a member of the coordinator's view.
    for (kind, frame) in frames() {
        let mut steps = alone.clone();
        steps.push(from(1, frame));
        steps.push(Step::Advance(100));
        seeds.push((format!("frame-{kind}"), endpoint_input(AVAILABLE, &steps)));
    }
    for (kind, message) in messages() {
        let mut steps = alone.clone();
        steps.push(from(1, Frame::Data(segment(1, 0, &join, None))));
        steps.push(from(1, Frame::Data(segment(1, 1, &message, None))));
        steps.push(Step::Advance(100));
        seeds.push((format!("message-{kind}"), endpoint_input(AVAILABLE, &steps)));
    }
    seeds
}
