//! Version 4 of the wire format (the compact form) next to version 3:
//!
//! - golden encodings of version 4 (those of version 3 are pinned in `wire_props.rs`);
//! - the sizes of the hot datagrams in both versions;
//! - what a member of version 3 reads of what a version-4 build sends it, and what the
//!   version-4 decoder tells of its sender's versions;
//! - hostile compact bodies: refused with `Malformed`, never a panic.
//!
//! The property tests of version 4 (round trips of every packet and message, mutations) are in
//! `wire_props.rs`, next to the strategies.

use std::net::SocketAddr;

use conclave_lock_api::wire::{
    self, Ack, ClusterId, DecodeError, Discovery, Frame, GrantView, LeaseBeat, LockMessage,
    Message, Packet, Payload, Probe, Segment, StreamAck, WireVersion, HEADER_LEN,
};
use conclave_lock_api::{FencingToken, LockMode, LockName, MemberId, OwnerId, RequestId};

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn unhex(s: &str) -> Vec<u8> {
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).expect("hex"))
        .collect()
}

/// A member as the front end makes them: the incarnation's high half is the start time in
/// nanoseconds since the Unix epoch, the low half random.
fn member(n: u8) -> MemberId {
    let generation: u128 = 1_760_000_000_000_000_000 + u128::from(n);
    MemberId::new(
        (generation << 64) | 0x9e37_79b9_7f4a_7c15,
        &format!("node-{n}"),
        SocketAddr::from(([10, 0, 0, n], 7800)),
    )
    .expect("valid")
}

fn name() -> LockName {
    LockName::new("orders/7").expect("valid")
}

fn owner() -> OwnerId {
    OwnerId {
        member: member(2),
        local: 17,
    }
}

/// A data segment from `from` carrying `message`, encoded at `version`, with an
/// acknowledgement riding along (as most segments of a lock exchange have).
fn data(from: MemberId, to: &MemberId, message: &Message, version: WireVersion) -> Packet {
    Packet {
        sender: from,
        frame: Frame::Data(Segment {
            to: to.incarnation(),
            stream: 3,
            base: 41,
            seq: 41,
            fragment: 0,
            fragments: 1,
            payload: Payload(wire::encode_message_as(message, version).expect("encodes")),
            ack: Some(StreamAck {
                stream: 5,
                next_expected: 38,
            }),
        }),
    }
}

fn lock() -> Message {
    Message::Lock(LockMessage::Lock {
        request: RequestId(1234),
        name: name(),
        owner: owner(),
        mode: LockMode::Exclusive,
        wait: true,
        stamp: 77,
        lease_ms: None,
        quiet: true,
        passes: false,
    })
}

fn granted() -> Message {
    Message::Lock(LockMessage::Granted {
        request: RequestId(1234),
        name: name(),
        token: FencingToken::new(3, 1001),
        stamp: 77,
        cached: false,
        lease_ms: None,
        view: Some(GrantView {
            epoch: 6,
            coordinator: member(1).incarnation(),
        }),
    })
}

fn unlock() -> Message {
    Message::Lock(LockMessage::Unlock {
        request: RequestId(1234),
        name: name(),
        owner: owner(),
        token: FencingToken::new(3, 1001),
        lazy: false,
        passed_to: None,
    })
}

fn unlock_ack() -> Message {
    Message::Lock(LockMessage::UnlockAck {
        request: RequestId(1234),
    })
}

fn heartbeat() -> Packet {
    Packet {
        sender: member(1),
        frame: Frame::Heartbeat {
            epoch: 6,
            view_epoch: 6,
            coordinator: member(1).incarnation(),
            lease: Some(LeaseBeat {
                max_term: 4,
                probe: Some(Probe { term: 4, seq: 912 }),
                echo: None,
                refused: None,
            }),
        },
    }
}

fn ack() -> Packet {
    Packet {
        sender: member(1),
        frame: Frame::Ack(Ack {
            to: member(2).incarnation(),
            stream: 5,
            next_expected: 39,
        }),
    }
}

/// The representative datagrams of a lock exchange, by name, encoded at `version`.
fn datagrams(version: WireVersion) -> Vec<(&'static str, Vec<u8>)> {
    let cluster = ClusterId::from_name("sizes");
    let (client, grantor) = (member(2), member(1));
    let packets = [
        ("Lock", data(client.clone(), &grantor, &lock(), version)),
        (
            "Granted",
            data(grantor.clone(), &client, &granted(), version),
        ),
        ("Unlock", data(client.clone(), &grantor, &unlock(), version)),
        (
            "UnlockAck",
            data(grantor.clone(), &client, &unlock_ack(), version),
        ),
        ("Heartbeat (lease probe)", heartbeat()),
        ("Ack", ack()),
    ];
    packets
        .into_iter()
        .map(|(name, packet)| {
            let bytes = match version {
                WireVersion::V3 => wire::encode_packet(cluster, &packet),
                _ => wire::encode_packet_as(cluster, &packet, version),
            };
            (name, bytes.expect("encodes"))
        })
        .collect()
}

/// The sizes of the hot datagrams, printed with `--nocapture` (the figures in the changelog):
/// version 4 takes at most 60% of the bytes of version 3 for each (what is left is mostly the
/// member ids: 128-bit incarnations, names and addresses).
#[test]
fn hot_datagrams_take_about_half_the_bytes() {
    let old = datagrams(WireVersion::V3);
    let new = datagrams(WireVersion::V4);
    println!("| datagram | v3 bytes | v4 bytes |");
    println!("|---|---|---|");
    for ((name, old), (_, new)) in old.iter().zip(&new) {
        println!("| {name} | {} | {} |", old.len(), new.len());
        assert!(
            new.len() * 100 <= old.len() * 60,
            "{name}: {} bytes in v4, {} in v3",
            new.len(),
            old.len()
        );
    }
    let messages = [
        ("Lock", lock()),
        ("Granted", granted()),
        ("Unlock", unlock()),
        ("UnlockAck", unlock_ack()),
    ];
    println!("| message (segment payload) | v3 bytes | v4 bytes |");
    for (name, message) in messages {
        let old = wire::encode_message(&message).expect("encodes").len();
        let new = wire::encode_message_as(&message, WireVersion::V4)
            .expect("encodes")
            .len();
        println!("| {name} | {old} | {new} |");
    }
}

/// PINNED WIRE FORMAT, version 4. If this fails, the compact form changed: members of
/// different builds would no longer understand each other.
#[test]
fn golden_v4_ping_packet() {
    const GOLDEN: &str = concat!(
        "434e434c",                             // magic "CNCL"
        "04",                                   // protocol version
        "2b72c88efe37d9c4",                     // cluster id: FNV-1a of "golden", big-endian
        "a2",                                   // Packet: map of 2
        "00",                                   // 0: sender
        "a3",                                   // MemberId: map of 3
        "00",                                   // 0: incarnation
        "c2500123456789abcdef0011223344556677", // bignum: tag 2, 16 bytes
        "01666e6f64652d31",                     // 1: name "node-1"
        "02",                                   // 2: addr
        "8200",                                 // [0 (V4),
        "828418c0000201191e78",                 // [[192, 0, 2, 1], 7800]]
        "01",                                   // 1: frame
        "8200",                                 // [0 (Discovery),
        "00",                                   // 0 (Ping)]
    );
    let sender = MemberId::new(
        0x0123_4567_89ab_cdef_0011_2233_4455_6677,
        "node-1",
        SocketAddr::from(([192, 0, 2, 1], 7800)),
    )
    .expect("valid");
    let packet = Packet {
        sender,
        frame: Frame::Discovery(Discovery::Ping),
    };
    let cluster = ClusterId::from_name("golden");
    let bytes = wire::encode_packet_as(cluster, &packet, WireVersion::V4).expect("encodes");
    assert_eq!(hex(&bytes), GOLDEN, "the wire format changed");
    assert_eq!(wire::decode_packet(cluster, &bytes), Ok(packet));
}

/// PINNED WIRE FORMAT, version 4, for messages: the version byte, then the compact form.
#[test]
fn golden_v4_messages() {
    let granted = Message::Lock(LockMessage::Granted {
        request: RequestId(42),
        name: name(),
        token: FencingToken::new(3, 1),
        stamp: 9,
        cached: false,
        lease_ms: None,
        view: None,
    });
    let lock = Message::Lock(LockMessage::Lock {
        request: RequestId(42),
        name: name(),
        owner: OwnerId {
            member: MemberId::new(1, "n", SocketAddr::from(([192, 0, 2, 1], 7800))).expect("valid"),
            local: 3,
        },
        mode: LockMode::Exclusive,
        wait: true,
        stamp: 9,
        lease_ms: None,
        quiet: false,
        passes: false,
    });
    let unlock_ack = Message::Lock(LockMessage::UnlockAck {
        request: RequestId(42),
    });
    let cases = [
        (
            granted,
            concat!(
                "04",                   // version 4
                "8201",                 // [1 (Lock),
                "8206",                 // [6 (Granted),
                "a4",                   // { 4 fields
                "00182a",               // 0: request 42
                "01686f72646572732f37", // 1: name "orders/7"
                "021b0000000300000001", // 2: token
                "0309",                 // 3: stamp 9 }]]
            ),
        ),
        (
            lock,
            concat!(
                "04",
                "8201",
                "8200",
                "a6",                     // Lock { 6 fields
                "00182a",                 // 0: request
                "01686f72646572732f37",   // 1: name
                "02a2",                   // 2: owner {
                "00a3000101616e02820082", //   0: member { 0: 1, 1: "n", 2: [0, [
                "8418c0000201191e78",     //     [192, 0, 2, 1], 7800]] }
                "0103",                   //   1: local 3 }
                "0300",                   // 3: mode 0 (Exclusive)
                "04f5",                   // 4: wait true
                "0509",                   // 5: stamp 9 }
            ),
        ),
        (unlock_ack, "048201820aa100182a"),
    ];
    for (message, golden) in cases {
        let bytes = wire::encode_message_as(&message, WireVersion::V4).expect("encodes");
        assert_eq!(hex(&bytes), golden, "the wire format changed: {message:?}");
        assert_eq!(wire::decode_message(&bytes), Ok(message));
    }
}

/// What a version-4 build sends a member of version 3: a version-3 datagram that the old
/// decoder (cbor4ii's and ciborium's serde mapping of `Packet`, behind the version check of
/// version 3) reads as before, and that tells a version-4 decoder the sender speaks 4.
#[test]
fn version_three_members_read_what_a_version_four_build_sends_them() {
    let cluster = ClusterId::from_name("rolling");
    let old_decode = |bytes: &[u8]| -> Result<Packet, String> {
        if bytes[4] != 3 {
            return Err(format!("unsupported protocol version {}", bytes[4]));
        }
        cbor4ii::serde::from_slice(&bytes[HEADER_LEN..]).map_err(|e| e.to_string())
    };
    for packet in [
        heartbeat(),
        ack(),
        data(member(1), &member(2), &granted(), WireVersion::V3),
    ] {
        let bytes = wire::encode_packet_as(cluster, &packet, WireVersion::V3).expect("encodes");
        assert_eq!(old_decode(&bytes), Ok(packet.clone()));
        let earlier: Packet =
            ciborium::from_reader(&bytes[HEADER_LEN..]).expect("the earlier codec reads it");
        assert_eq!(earlier, packet);
        // The advertisement is the only difference to the plain version-3 form.
        let plain = wire::encode_packet(cluster, &packet).expect("encodes");
        assert_eq!(bytes.len(), plain.len() + 8, "\"speaks\": 4");
        let heard = wire::decode_datagram(cluster, &bytes).expect("decodes");
        assert_eq!(
            (heard.packet, heard.version, heard.common),
            (packet.clone(), WireVersion::V3, WireVersion::V4)
        );
        let heard = wire::decode_datagram(cluster, &plain).expect("decodes");
        assert_eq!(
            (heard.version, heard.common),
            (WireVersion::V3, WireVersion::V3)
        );
        // A version-4 datagram is refused by the old decoder: it is never sent to one.
        let new = wire::encode_packet_as(cluster, &packet, WireVersion::V4).expect("encodes");
        assert!(old_decode(&new).is_err());
        let heard = wire::decode_datagram(cluster, &new).expect("decodes");
        assert_eq!(
            (heard.version, heard.common),
            (WireVersion::V4, WireVersion::V4)
        );
    }
}

/// A later build may name a newer version than this one speaks: the newest both speak is this
/// build's. A version-4 body may carry fields this build does not know (higher indices):
/// they are skipped.
#[test]
fn newer_senders_are_understood_as_far_as_this_build_goes() {
    let cluster = ClusterId::from_name("golden");
    let mut bytes = wire::encode_packet(cluster, &ack()).expect("encodes");
    // Packet: map of 2 -> 3, then "speaks": 9.
    assert_eq!(bytes[HEADER_LEN], 0xa2);
    bytes[HEADER_LEN] = 0xa3;
    bytes.extend_from_slice(&[0x66, b's', b'p', b'e', b'a', b'k', b's', 0x09]);
    let heard = wire::decode_datagram(cluster, &bytes).expect("decodes");
    assert_eq!(
        (heard.version, heard.common),
        (WireVersion::V3, WireVersion::V4)
    );

    let mut bytes = wire::encode_packet_as(cluster, &ack(), WireVersion::V4).expect("encodes");
    assert_eq!(bytes[HEADER_LEN], 0xa2);
    bytes[HEADER_LEN] = 0xa4;
    // 2: 5 (a version it speaks), 7: [1, {0: "x"}] (a field from the future).
    bytes.extend_from_slice(&[0x02, 0x05, 0x07, 0x82, 0x01, 0xa1, 0x00, 0x61, b'x']);
    let heard = wire::decode_datagram(cluster, &bytes).expect("decodes");
    assert_eq!(heard.packet, ack());
    assert_eq!(
        (heard.version, heard.common),
        (WireVersion::V4, WireVersion::V4)
    );
}

/// Messages of either version travel in datagrams of either version (a message is encoded when
/// it is queued, the datagram when it is sent; the sender may learn its peer's version in
/// between), and `decode_message` reads both.
#[test]
fn messages_of_either_version_in_datagrams_of_either() {
    let cluster = ClusterId::from_name("mixed");
    for message_version in [WireVersion::V3, WireVersion::V4] {
        for datagram_version in [WireVersion::V3, WireVersion::V4] {
            let packet = data(member(2), &member(1), &lock(), message_version);
            let bytes =
                wire::encode_packet_as(cluster, &packet, datagram_version).expect("encodes");
            let Ok(Packet {
                frame: Frame::Data(segment),
                ..
            }) = wire::decode_packet(cluster, &bytes)
            else {
                panic!("a data packet");
            };
            assert_eq!(wire::decode_message(&segment.payload.0), Ok(lock()));
        }
    }
}

/// Hostile compact bodies, behind a valid version-4 header and on their own as messages:
/// each is refused as malformed, at once.
#[test]
fn hostile_compact_bodies_are_malformed() {
    let cluster = ClusterId::from_name("hostile");
    let mut header = Vec::new();
    wire::Header::write_version(cluster, WireVersion::V4, &mut header);
    let deep_arrays = [vec![0x81; 10_000], vec![0x00]].concat();
    let deep_variants = [[0x82, 0x00].repeat(10_000), vec![0x00]].concat();
    let bodies: Vec<(&str, Vec<u8>)> = vec![
        ("empty", vec![]),
        ("not a map", vec![0x00]),
        ("a map of 2^64 - 1 entries", unhex("bbffffffffffffffff")),
        ("an array of 2^64 - 1", unhex("a2009bffffffffffffffff")),
        ("a text of 2^64 - 1 bytes", unhex("a2017bffffffffffffffff")),
        ("indefinite map", unhex("bf00")),
        ("reserved head", unhex("a200fc")),
        ("a break", unhex("a200ff")),
        (
            "deep arrays",
            [vec![0xa1, 0x07], deep_arrays.clone()].concat(),
        ),
        (
            "deep variants",
            [vec![0xa1, 0x01], deep_variants.clone()].concat(),
        ),
        (
            "bignum of 17 bytes",
            unhex("a100a100c2510100000000000000000000000000000000"),
        ),
        ("unknown tag", unhex("a100a100c600")),
        ("invalid UTF-8 name", unhex("a100a200010162c328")),
        ("a variant index too high", unhex("a2018218ff00")),
        ("an enum as a map", unhex("a201a10000")),
        ("a variant array of 3", unhex("a20183000000")),
        ("string keys", unhex("a1666672616d65820000")),
        ("a unit variant with content", unhex("a2018200820000")),
    ];
    for (what, body) in bodies {
        let bytes = [header.clone(), body.clone()].concat();
        let result = wire::decode_packet(cluster, &bytes);
        assert!(
            matches!(result, Err(DecodeError::Malformed(_))),
            "{what}: {result:?}"
        );
        let message = [vec![4], body].concat();
        let result = wire::decode_message(&message);
        assert!(
            matches!(result, Err(DecodeError::Malformed(_))),
            "{what} (message): {result:?}"
        );
    }
}

/// The one-hop handoff's messages, and a release naming the grant it passed on, round-trip in
/// both versions.
#[test]
fn handoff_messages_in_both_versions() {
    let successor = wire::Successor {
        member: member(3),
        request: RequestId(77),
        token: FencingToken::new(3, 1002),
        stamp: 9,
        lease_ms: Some(1200),
        view: wire::GrantView {
            epoch: 4,
            coordinator: 0xfeed,
        },
    };
    let messages = [
        Message::Lock(LockMessage::Designate {
            request: RequestId(1234),
            name: name(),
            next: Some(successor.clone()),
        }),
        Message::Lock(LockMessage::Designate {
            request: RequestId(1234),
            name: name(),
            next: None,
        }),
        Message::Lock(LockMessage::Passed {
            grantor: member(1),
            name: name(),
            grant: successor,
        }),
        Message::Lock(LockMessage::Unlock {
            request: RequestId(1234),
            name: name(),
            owner: owner(),
            token: FencingToken::new(3, 1001),
            lazy: true,
            passed_to: Some((RequestId(77), FencingToken::new(3, 1002))),
        }),
    ];
    for message in messages {
        for version in [WireVersion::V3, WireVersion::V4] {
            let bytes = wire::encode_message_as(&message, version).expect("encodes");
            assert_eq!(
                wire::decode_message(&bytes).expect("decodes"),
                message,
                "{version:?}"
            );
        }
    }
}
