//! Property tests of the wire format (`conclave_lock_api::wire`).
//!
//! - strategies for every wire type, built through the public constructors;
//! - round trips of every [`Packet`] and [`Message`];
//! - rejections, each with its own [`DecodeError`] variant (foreign cluster, version, magic,
//!   truncation, trailing bytes, oversized input);
//! - "any bytes decode without panicking": random bytes, random bodies behind a valid header,
//!   and random mutations of valid encodings;
//! - bounded work on hostile CBOR (huge declared lengths, deep nesting), also re-run in a child
//!   process under an address-space limit on Linux;
//! - the [`PACKET_OVERHEAD_MAX`] bound;
//! - golden encodings that pin the wire format.

use std::collections::HashSet;
use std::net::{Ipv6Addr, SocketAddr, SocketAddrV6};
use std::time::{Duration, Instant};

use conclave_lock_api::wire::{
    self, Ack, ClusterId, DecodeError, Discovery, EncodeError, Frame, GmsMessage, GrantView,
    LeaseBeat, LockMessage, Message, Packet, Payload, PendingRelease, PendingRequest, Probe,
    ReportedHold, Segment, SharedSetting, StreamAck, TableHolder, TableLock, TableWaiter,
    WireVersion, BUNDLED_SEGMENT_OVERHEAD_MAX, HEADER_LEN, MAGIC, MAX_MESSAGE_LEN, MAX_PACKET_LEN,
    PACKET_OVERHEAD_MAX,
};
use conclave_lock_api::{FencingToken, LockMode, LockName, MemberId, OwnerId, RequestId, View};
use proptest::prelude::*;
use proptest::sample::Index;
use proptest::strategy::ValueTree;
use proptest::test_runner::TestRunner;

// ---------------------------------------------------------------------------------------------
// Strategies
// ---------------------------------------------------------------------------------------------

/// u64 values mixing the CBOR length classes (0..24, u8, u16, u32, u64) with uniform ones.
fn arb_u64() -> BoxedStrategy<u64> {
    prop_oneof![
        2 => any::<u64>(),
        1 => 0..24u64,
        1 => 0..=u64::from(u16::MAX),
        1 => 0..=u64::from(u32::MAX),
        1 => prop::sample::select(vec![
            0,
            23,
            24,
            255,
            256,
            65_535,
            65_536,
            u64::from(u32::MAX),
            u64::from(u32::MAX) + 1,
            u64::MAX,
        ]),
    ]
    .boxed()
}

fn arb_u32() -> BoxedStrategy<u32> {
    prop_oneof![
        any::<u32>(),
        0..24u32,
        prop::sample::select(vec![0, 1, 23, 24, 255, 256, 65_535, 65_536, u32::MAX]),
    ]
    .boxed()
}

/// u128 values: uniform ones need a CBOR bignum, small ones a plain integer.
fn arb_u128() -> BoxedStrategy<u128> {
    prop_oneof![
        3 => any::<u128>(),
        1 => arb_u64().prop_map(u128::from),
        1 => prop::sample::select(vec![
            0,
            u128::from(u64::MAX),
            u128::from(u64::MAX) + 1,
            1 << 120,
            u128::MAX,
        ]),
    ]
    .boxed()
}

/// Characters of any UTF-8 width, with a good share of 4-byte ones.
fn arb_char() -> BoxedStrategy<char> {
    prop_oneof![
        3 => any::<char>(),
        1 => prop::char::range('\u{80}', '\u{7ff}'),
        1 => prop::char::range('\u{800}', '\u{ffff}'),
        1 => prop::char::range('\u{10000}', '\u{10ffff}'),
    ]
    .boxed()
}

/// Keeps the longest prefix of `chars` that fits in `max` bytes.
fn fit(chars: Vec<char>, max: usize) -> String {
    let mut s = String::new();
    for c in chars {
        if s.len() + c.len_utf8() > max {
            break;
        }
        s.push(c);
    }
    s
}

/// Member names: up to 64 bytes of non-control characters, multibyte included.
fn arb_member_name() -> BoxedStrategy<String> {
    let max = MemberId::MAX_NAME_LEN;
    prop_oneof![
        3 => prop::collection::vec(arb_char().prop_filter("control", |c| !c.is_control()), 0..=max)
            .prop_map(move |chars| fit(chars, max)),
        1 => (0..=max).prop_map(|n| "n".repeat(n)),
    ]
    .boxed()
}

/// IPv4 and IPv6 socket addresses.
///
/// IPv6 addresses come with arbitrary flowinfo and scope ids: `MemberId::new` drops the
/// flowinfo and the wire carries the scope id.
fn arb_socket_addr() -> BoxedStrategy<SocketAddr> {
    prop_oneof![
        (any::<[u8; 4]>(), any::<u16>()).prop_map(SocketAddr::from),
        (any::<u128>(), any::<u16>(), any::<u32>(), any::<u32>()).prop_map(
            |(ip, port, flow, scope)| SocketAddr::V6(SocketAddrV6::new(
                ip.into(),
                port,
                flow,
                scope
            ))
        ),
        (any::<[u8; 4]>(), any::<u16>()).prop_map(|(ip, port)| {
            let ip = std::net::Ipv4Addr::from(ip).to_ipv6_mapped();
            SocketAddr::V6(SocketAddrV6::new(ip, port, 0, 0))
        }),
    ]
    .boxed()
}

fn arb_member_id() -> BoxedStrategy<MemberId> {
    (arb_u128(), arb_member_name(), arb_socket_addr())
        .prop_map(|(incarnation, name, addr)| {
            MemberId::new(incarnation, &name, addr).expect("the strategy only makes valid names")
        })
        .boxed()
}

fn arb_owner_id() -> BoxedStrategy<OwnerId> {
    (arb_member_id(), arb_u64())
        .prop_map(|(member, local)| OwnerId { member, local })
        .boxed()
}

fn arb_request_id() -> impl Strategy<Value = RequestId> {
    arb_u64().prop_map(RequestId)
}

/// Lock names: 1..=255 bytes of non-control characters, multibyte included.
fn arb_lock_name() -> BoxedStrategy<LockName> {
    let max = LockName::MAX_LEN;
    prop_oneof![
        3 => prop::collection::vec(arb_char().prop_filter("control", |c| !c.is_control()), 1..=max)
            .prop_map(move |chars| fit(chars, max)),
        1 => (1..=max).prop_map(|n| "l".repeat(n)),
    ]
    .prop_map(|name| LockName::new(name).expect("the strategy only makes valid lock names"))
    .boxed()
}

fn arb_lock_mode() -> impl Strategy<Value = LockMode> {
    prop_oneof![Just(LockMode::Exclusive), Just(LockMode::Shared)]
}

fn arb_token() -> impl Strategy<Value = FencingToken> {
    arb_u64().prop_map(FencingToken)
}

/// Views of 1..=20 distinct members, built through `View::new`.
fn arb_view() -> BoxedStrategy<View> {
    (arb_u64(), prop::collection::vec(arb_member_id(), 1..=20))
        .prop_map(|(epoch, mut members)| {
            let mut seen = HashSet::new();
            members.retain(|m| seen.insert(m.clone()));
            View::new(epoch, members).expect("members are distinct and non-empty")
        })
        .boxed()
}

fn arb_payload() -> BoxedStrategy<Payload> {
    prop::collection::vec(any::<u8>(), 0..2000)
        .prop_map(Payload)
        .boxed()
}

fn arb_segment() -> BoxedStrategy<Segment> {
    (
        arb_u128(),
        arb_u64(),
        arb_u64(),
        arb_u64(),
        arb_u32(),
        arb_u32(),
        arb_payload(),
        proptest::option::of((arb_u64(), arb_u64())),
    )
        .prop_map(
            |(to, stream, base, seq, fragment, fragments, payload, ack)| Segment {
                to,
                stream,
                base,
                seq,
                fragment,
                fragments,
                payload,
                ack: ack.map(|(stream, next_expected)| StreamAck {
                    stream,
                    next_expected,
                }),
            },
        )
        .boxed()
}

fn arb_ack() -> BoxedStrategy<Ack> {
    (arb_u128(), arb_u64(), arb_u64())
        .prop_map(|(to, stream, next_expected)| Ack {
            to,
            stream,
            next_expected,
        })
        .boxed()
}

fn arb_settings() -> BoxedStrategy<Vec<SharedSetting>> {
    prop::collection::vec(
        ("[a-z_]{1,16}", ".{0,24}").prop_map(|(name, value)| SharedSetting { name, value }),
        0..4,
    )
    .boxed()
}

fn arb_discovery() -> BoxedStrategy<Discovery> {
    prop_oneof![
        Just(Discovery::Ping),
        (
            arb_view(),
            prop::collection::vec(arb_u128(), 0..3),
            arb_settings()
        )
            .prop_map(|(view, heard, settings)| Discovery::Announce {
                view,
                heard,
                settings
            }),
    ]
    .boxed()
}

fn arb_frame() -> BoxedStrategy<Frame> {
    prop_oneof![
        arb_discovery().prop_map(Frame::Discovery),
        (arb_u64(), arb_u64(), any::<u128>(), arb_lease_beat()).prop_map(
            |(epoch, view_epoch, coordinator, lease)| Frame::Heartbeat {
                epoch,
                view_epoch,
                coordinator,
                lease,
            }
        ),
        arb_segment().prop_map(Frame::Data),
        prop::collection::vec(arb_segment(), 0..4).prop_map(Frame::Bundle),
        arb_ack().prop_map(Frame::Ack),
    ]
    .boxed()
}

fn arb_probe() -> BoxedStrategy<Probe> {
    (arb_u64(), arb_u64())
        .prop_map(|(term, seq)| Probe { term, seq })
        .boxed()
}

fn arb_lease_beat() -> BoxedStrategy<Option<LeaseBeat>> {
    prop::option::of(
        (
            arb_u64(),
            prop::option::of(arb_probe()),
            prop::option::of(arb_probe()),
            prop::option::of(arb_u64()),
        )
            .prop_map(|(max_term, probe, echo, refused)| LeaseBeat {
                max_term,
                probe,
                echo,
                refused,
            }),
    )
    .boxed()
}

fn arb_packet() -> BoxedStrategy<Packet> {
    (arb_member_id(), arb_frame())
        .prop_map(|(sender, frame)| Packet { sender, frame })
        .boxed()
}

fn arb_gms_message() -> BoxedStrategy<GmsMessage> {
    prop_oneof![
        Just(GmsMessage::JoinRequest),
        Just(GmsMessage::NotCoordinator),
        Just(GmsMessage::LeaveRequest),
        arb_view().prop_map(|view| GmsMessage::InstallView { view }),
        arb_u64().prop_map(|epoch| GmsMessage::LeaveAccepted { epoch }),
        (
            (arb_u64(), arb_u64(), arb_u64(), arb_u64()),
            prop::collection::vec(arb_u128(), 0..4),
            prop::collection::vec(arb_member_id(), 0..4),
        )
            .prop_map(|((epoch, base_epoch, base_digest, digest), left, joined)| {
                GmsMessage::InstallViewDelta {
                    epoch,
                    base_epoch,
                    base_digest,
                    left,
                    joined,
                    digest,
                }
            }),
        arb_u64().prop_map(|epoch| GmsMessage::ViewRequest { epoch }),
        arb_settings().prop_map(|settings| GmsMessage::Join { settings }),
        ("[a-z_]{1,16}", ".{0,24}", ".{0,24}").prop_map(
            |(setting, coordinator_value, joiner_value)| GmsMessage::JoinRefused {
                setting,
                coordinator_value,
                joiner_value,
            }
        ),
    ]
    .boxed()
}

fn arb_held_lock() -> BoxedStrategy<ReportedHold> {
    (
        arb_request_id(),
        arb_lock_name(),
        arb_owner_id(),
        arb_lock_mode(),
        arb_token(),
        prop::option::of(arb_u64()),
    )
        .prop_map(
            |(request, name, owner, mode, token, lease_ms)| ReportedHold {
                request,
                name,
                owner,
                mode,
                token,
                lease_ms,
            },
        )
        .boxed()
}

fn arb_pending_request() -> BoxedStrategy<PendingRequest> {
    (
        arb_request_id(),
        arb_lock_name(),
        arb_owner_id(),
        arb_lock_mode(),
        any::<bool>(),
        prop::option::of(arb_u64()),
    )
        .prop_map(
            |(request, name, owner, mode, wait, lease_ms)| PendingRequest {
                request,
                name,
                owner,
                mode,
                wait,
                lease_ms,
            },
        )
        .boxed()
}

fn arb_pending_release() -> BoxedStrategy<PendingRelease> {
    (
        arb_request_id(),
        arb_lock_name(),
        arb_owner_id(),
        arb_token(),
    )
        .prop_map(|(request, name, owner, token)| PendingRelease {
            request,
            name,
            owner,
            token,
        })
        .boxed()
}

fn arb_table_lock() -> BoxedStrategy<TableLock> {
    (
        arb_lock_name(),
        prop::collection::vec(
            (
                arb_owner_id(),
                arb_lock_mode(),
                arb_token(),
                prop::option::of(arb_u64()),
            ),
            0..3,
        ),
        prop::collection::vec((arb_owner_id(), arb_lock_mode()), 0..3),
    )
        .prop_map(|(name, holders, waiters)| TableLock {
            name,
            holders: holders
                .into_iter()
                .map(|(owner, mode, token, lease_ms)| TableHolder {
                    owner,
                    mode,
                    token,
                    lease_ms,
                })
                .collect(),
            waiters: waiters
                .into_iter()
                .map(|(owner, mode)| TableWaiter { owner, mode })
                .collect(),
        })
        .boxed()
}

fn arb_lock_message() -> BoxedStrategy<LockMessage> {
    prop_oneof![
        (
            arb_request_id(),
            arb_lock_name(),
            arb_owner_id(),
            arb_lock_mode(),
            any::<bool>(),
            arb_u64(),
            prop::option::of(arb_u64()),
            any::<bool>(),
            any::<bool>()
        )
            .prop_map(
                |(request, name, owner, mode, wait, stamp, lease_ms, quiet, passes)| {
                    LockMessage::Lock {
                        request,
                        name,
                        owner,
                        mode,
                        wait,
                        stamp,
                        lease_ms,
                        quiet,
                        passes,
                    }
                }
            ),
        (arb_request_id(), arb_lock_name(), arb_u64(), arb_u64()).prop_map(
            |(request, name, lease_ms, stamp)| LockMessage::ExtendLease {
                request,
                name,
                lease_ms,
                stamp
            }
        ),
        (arb_u64(), prop::collection::vec(arb_request_id(), 0..6))
            .prop_map(|(stamp, held)| LockMessage::Renew { stamp, held }),
        (arb_u64(), prop::collection::vec(arb_request_id(), 0..6))
            .prop_map(|(stamp, held)| LockMessage::Renewed { stamp, held }),
        (arb_request_id(), any::<u32>())
            .prop_map(|(request, position)| LockMessage::Queued { request, position }),
        arb_u64().prop_map(|epoch| LockMessage::Serving { epoch }),
        arb_u64().prop_map(|query| LockMessage::TableRequest { query }),
        (
            prop::collection::vec(arb_request_id(), 0..4),
            prop::collection::vec(arb_request_id(), 0..4),
            prop::option::of(arb_request_id())
        )
            .prop_map(|(held, pending, upto)| LockMessage::Holding {
                held,
                pending,
                upto
            }),
        (arb_u64(), arb_u128())
            .prop_map(|(epoch, coordinator)| LockMessage::TransferRequest { epoch, coordinator }),
        (
            (arb_u64(), arb_u128()),
            arb_u64(),
            arb_token(),
            prop::collection::vec(arb_held_lock(), 0..3),
            prop::collection::vec(arb_pending_request(), 0..3),
            arb_u64()
        )
            .prop_map(
                |((epoch, coordinator), token_epoch, last_token, held, waiting, generation)| {
                    LockMessage::Handoff {
                        epoch,
                        coordinator,
                        token_epoch,
                        last_token,
                        held,
                        waiting,
                        generation,
                    }
                }
            ),
        (arb_u64(), arb_u128(), arb_u64()).prop_map(|(epoch, coordinator, generation)| {
            LockMessage::Transferred {
                epoch,
                coordinator,
                generation,
            }
        }),
        (arb_u64(), arb_u128(), arb_member_id(), arb_u64()).prop_map(
            |(epoch, coordinator, grantor, generation)| LockMessage::NotGrantor {
                epoch,
                coordinator,
                grantor,
                generation,
            }
        ),
        (
            arb_u64(),
            arb_u64(),
            any::<bool>(),
            any::<bool>(),
            prop::collection::vec(arb_table_lock(), 0..3)
        )
            .prop_map(
                |(query, epoch, unavailable, truncated, locks)| LockMessage::Table {
                    query,
                    epoch,
                    unavailable,
                    truncated,
                    locks
                }
            ),
        (arb_request_id(), arb_lock_name())
            .prop_map(|(request, name)| LockMessage::Cancel { request, name }),
        (
            arb_request_id(),
            arb_lock_name(),
            arb_owner_id(),
            arb_token(),
            any::<bool>()
        )
            .prop_map(|(request, name, owner, token, lazy)| LockMessage::Unlock {
                request,
                name,
                owner,
                token,
                lazy,
                passed_to: lazy.then_some((request, token)),
            }),
        (
            arb_request_id(),
            arb_lock_name(),
            arb_token(),
            arb_u64(),
            any::<bool>(),
            prop::option::of(arb_u64()),
            prop::option::of((arb_u64(), arb_u128()))
        )
            .prop_map(|(request, name, token, stamp, cached, lease_ms, view)| {
                LockMessage::Granted {
                    request,
                    name,
                    token,
                    stamp,
                    cached,
                    lease_ms,
                    view: view.map(|(epoch, coordinator)| GrantView { epoch, coordinator }),
                }
            }),
        (arb_request_id(), arb_lock_name(), arb_token()).prop_map(|(request, name, token)| {
            LockMessage::Revoke {
                request,
                name,
                token,
            }
        }),
        (arb_request_id(), arb_lock_name(), any::<bool>()).prop_map(
            |(request, name, unavailable)| LockMessage::Denied {
                request,
                name,
                unavailable
            }
        ),
        arb_request_id().prop_map(|request| LockMessage::UnlockAck { request }),
        arb_u64().prop_map(|epoch| LockMessage::LockInfoRequest { epoch }),
        (
            arb_u64(),
            prop::collection::vec(arb_held_lock(), 0..6),
            prop::collection::vec(arb_pending_request(), 0..6),
            prop::collection::vec(arb_pending_release(), 0..6),
        )
            .prop_map(
                |(epoch, held, pending, releases)| LockMessage::LockInfoResponse {
                    epoch,
                    held,
                    pending,
                    releases,
                }
            ),
        (arb_lock_name(), arb_owner_id(), arb_token())
            .prop_map(|(name, owner, token)| { LockMessage::DuplicateLock { name, owner, token } }),
    ]
    .boxed()
}

fn arb_message() -> BoxedStrategy<Message> {
    prop_oneof![
        arb_gms_message().prop_map(Message::Gms),
        arb_lock_message().prop_map(Message::Lock),
        ("[a-z0-9/-]{1,64}", arb_lock_message()).prop_map(|(service, message)| {
            Message::Service {
                service: conclave_lock_api::ServiceName::new(service).expect("valid"),
                message,
            }
        }),
    ]
    .boxed()
}

fn arb_cluster() -> BoxedStrategy<ClusterId> {
    prop_oneof![
        any::<u64>().prop_map(ClusterId),
        "[a-z]{0,12}".prop_map(|name| ClusterId::from_name(&name)),
    ]
    .boxed()
}

// Exhaustive matches: adding a variant breaks the build here, as a reminder to add it to the
// strategies above (and `strategies_cover_every_variant` checks that they produce it).

fn frame_kind(frame: &Frame) -> &'static str {
    match frame {
        Frame::Discovery(Discovery::Ping) => "Discovery::Ping",
        Frame::Discovery(Discovery::Announce { .. }) => "Discovery::Announce",
        Frame::Heartbeat { .. } => "Heartbeat",
        Frame::Data(_) => "Data",
        Frame::Bundle(_) => "Bundle",
        Frame::Ack(_) => "Ack",
    }
}

fn message_kind(message: &Message) -> &'static str {
    match message {
        Message::Gms(GmsMessage::JoinRequest) => "JoinRequest",
        Message::Gms(GmsMessage::NotCoordinator) => "NotCoordinator",
        Message::Gms(GmsMessage::LeaveRequest) => "LeaveRequest",
        Message::Gms(GmsMessage::InstallView { .. }) => "InstallView",
        Message::Gms(GmsMessage::LeaveAccepted { .. }) => "LeaveAccepted",
        Message::Gms(GmsMessage::InstallViewDelta { .. }) => "InstallViewDelta",
        Message::Gms(GmsMessage::ViewRequest { .. }) => "ViewRequest",
        Message::Gms(GmsMessage::Join { .. }) => "Join",
        Message::Gms(GmsMessage::JoinRefused { .. }) => "JoinRefused",
        Message::Lock(LockMessage::Lock { .. }) => "Lock",
        Message::Lock(LockMessage::Cancel { .. }) => "Cancel",
        Message::Lock(LockMessage::Unlock { .. }) => "Unlock",
        Message::Lock(LockMessage::Granted { .. }) => "Granted",
        Message::Lock(LockMessage::Revoke { .. }) => "Revoke",
        Message::Lock(LockMessage::Renew { .. }) => "Renew",
        Message::Lock(LockMessage::ExtendLease { .. }) => "ExtendLease",
        Message::Lock(LockMessage::Renewed { .. }) => "Renewed",
        Message::Lock(LockMessage::Queued { .. }) => "Queued",
        Message::Lock(LockMessage::Denied { .. }) => "Denied",
        Message::Lock(LockMessage::UnlockAck { .. }) => "UnlockAck",
        Message::Lock(LockMessage::LockInfoRequest { .. }) => "LockInfoRequest",
        Message::Lock(LockMessage::LockInfoResponse { .. }) => "LockInfoResponse",
        Message::Lock(LockMessage::DuplicateLock { .. }) => "DuplicateLock",
        Message::Lock(LockMessage::Serving { .. }) => "Serving",
        Message::Lock(LockMessage::TableRequest { .. }) => "TableRequest",
        Message::Lock(LockMessage::Holding { .. }) => "Holding",
        Message::Lock(LockMessage::TransferRequest { .. }) => "TransferRequest",
        Message::Lock(LockMessage::Handoff { .. }) => "Handoff",
        Message::Lock(LockMessage::Transferred { .. }) => "Transferred",
        Message::Lock(LockMessage::NotGrantor { .. }) => "NotGrantor",
        Message::Lock(LockMessage::Table { .. }) => "Table",
        Message::Lock(LockMessage::Designate { .. }) => "Designate",
        Message::Lock(LockMessage::Passed { .. }) => "Passed",
        Message::Service { .. } => "Service",
    }
}

fn sample<S: Strategy>(strategy: &S, n: usize) -> Vec<S::Value> {
    let mut runner = TestRunner::deterministic();
    (0..n)
        .map(|_| {
            strategy
                .new_tree(&mut runner)
                .expect("strategy generates")
                .current()
        })
        .collect()
}

#[test]
fn strategies_cover_every_variant() {
    let frames: HashSet<_> = sample(&arb_frame(), 100).iter().map(frame_kind).collect();
    assert_eq!(frames.len(), 6, "frames generated: {frames:?}");
    let messages: HashSet<_> = sample(&arb_message(), 400)
        .iter()
        .map(message_kind)
        .collect();
    assert_eq!(messages.len(), 32, "messages generated: {messages:?}");

    // The shapes the strategies promise are really produced.
    let members = sample(&arb_member_id(), 200);
    assert!(members.iter().any(|m| m.addr().is_ipv4()));
    assert!(members.iter().any(|m| m.addr().is_ipv6()));
    assert!(members
        .iter()
        .any(|m| m.name().len() == MemberId::MAX_NAME_LEN));
    assert!(members
        .iter()
        .any(|m| m.name().chars().any(|c| c.len_utf8() > 1)));
    assert!(members
        .iter()
        .any(|m| m.incarnation() > u128::from(u64::MAX)));
    assert!(members
        .iter()
        .any(|m| m.incarnation() <= u128::from(u64::MAX)));
    let names = sample(&arb_lock_name(), 200);
    assert!(names.iter().any(|n| n.as_str().len() == LockName::MAX_LEN));
    assert!(names.iter().any(|n| n.as_str().len() == 1));
    let views = sample(&arb_view(), 100);
    assert!(views.iter().any(|v| v.len() == 1));
    assert!(views.iter().any(|v| v.len() >= 15));
}

// ---------------------------------------------------------------------------------------------
// Helpers
// ---------------------------------------------------------------------------------------------

fn config() -> ProptestConfig {
    ProptestConfig {
        cases: 256,
        // No regression files written into the source tree; failures print their input.
        failure_persistence: None,
        ..ProptestConfig::default()
    }
}

fn encode(cluster: ClusterId, packet: &Packet) -> Vec<u8> {
    wire::encode_packet(cluster, packet).expect("packets of the strategies encode")
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn is_malformed<T>(result: &Result<T, DecodeError>) -> bool {
    matches!(result, Err(DecodeError::Malformed(_)))
}

/// Checks an input the decoder accepted: it must re-encode to something that decodes to itself.
fn check_accepted_packet(cluster: ClusterId, packet: &Packet) -> Result<(), TestCaseError> {
    let again = wire::encode_packet(cluster, packet)
        .map_err(|e| TestCaseError::fail(format!("decoded packet does not re-encode: {e}")))?;
    prop_assert_eq!(&wire::decode_packet(cluster, &again), &Ok(packet.clone()));
    Ok(())
}

fn check_accepted_message(message: &Message) -> Result<(), TestCaseError> {
    let again = wire::encode_message(message)
        .map_err(|e| TestCaseError::fail(format!("decoded message does not re-encode: {e}")))?;
    prop_assert_eq!(&wire::decode_message(&again), &Ok(message.clone()));
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// Round trips and rejections
// ---------------------------------------------------------------------------------------------

proptest! {
    #![proptest_config(config())]

    #[test]
    fn packets_round_trip(cluster in arb_cluster(), packet in arb_packet()) {
        let bytes = wire::encode_packet(cluster, &packet)
            .map_err(|e| TestCaseError::fail(format!("encode failed: {e}")))?;
        prop_assert_eq!(&bytes[..4], &MAGIC[..]);
        prop_assert_eq!(bytes[4], WireVersion::V3.byte());
        prop_assert_eq!(&bytes[5..HEADER_LEN], &cluster.0.to_be_bytes()[..]);
        prop_assert_eq!(wire::decode_packet(cluster, &bytes), Ok(packet.clone()));
        // The encoding is a function of the value: re-encoding gives the same bytes.
        prop_assert_eq!(encode(cluster, &packet), bytes);
    }

    #[test]
    fn messages_round_trip(message in arb_message()) {
        let bytes = wire::encode_message(&message)
            .map_err(|e| TestCaseError::fail(format!("encode failed: {e}")))?;
        prop_assert_eq!(wire::decode_message(&bytes), Ok(message.clone()));
        prop_assert_eq!(wire::encode_message(&message), Ok(bytes));
    }

    /// Members of earlier releases encoded with another CBOR library (ciborium): every packet
    /// and message is the same bytes with either, and each side decodes the other's.
    #[test]
    fn the_encoding_is_the_earlier_releases_byte_for_byte(
        cluster in arb_cluster(),
        packet in arb_packet(),
        message in arb_message(),
    ) {
        let bytes = encode(cluster, &packet);
        let earlier = with_cluster_header(cluster, &cbor(&packet));
        prop_assert_eq!(hex(&bytes), hex(&earlier));
        let decoded: Packet = ciborium::from_reader(&bytes[HEADER_LEN..])
            .map_err(|e| TestCaseError::fail(format!("the earlier codec refused: {e}")))?;
        prop_assert_eq!(decoded, packet);
        let bytes = wire::encode_message(&message)
            .map_err(|e| TestCaseError::fail(format!("encode failed: {e}")))?;
        prop_assert_eq!(hex(&bytes), hex(&cbor(&message)));
        let decoded: Message = ciborium::from_reader(bytes.as_slice())
            .map_err(|e| TestCaseError::fail(format!("the earlier codec refused: {e}")))?;
        prop_assert_eq!(decoded, message);
    }

    /// Member ids (every message carries some) encode as the derived serde form of earlier
    /// releases did, IPv6 scope ids included, and decode from it.
    #[test]
    fn member_ids_encode_as_in_earlier_releases(id in arb_member_id()) {
        #[derive(serde::Serialize)]
        struct EarlierRawMemberId {
            incarnation: u128,
            name: String,
            addr: SocketAddr,
            #[serde(skip_serializing_if = "is_zero")]
            scope: u32,
        }
        fn is_zero(v: &u32) -> bool {
            *v == 0
        }
        let earlier = EarlierRawMemberId {
            incarnation: id.incarnation(),
            name: id.name().to_owned(),
            addr: id.addr(),
            scope: match id.addr() {
                SocketAddr::V6(v6) => v6.scope_id(),
                SocketAddr::V4(_) => 0,
            },
        };
        prop_assert_eq!(hex(&cbor(&id)), hex(&cbor(&earlier)));
        let decoded: MemberId = ciborium::from_reader(cbor(&earlier).as_slice())
            .map_err(|e| TestCaseError::fail(format!("refused: {e}")))?;
        prop_assert_eq!(decoded.addr(), id.addr());
        prop_assert_eq!(decoded, id);
    }

    /// A message travels as the payload of a data segment: both layers round trip together.
    #[test]
    fn messages_round_trip_inside_segments(
        cluster in arb_cluster(),
        sender in arb_member_id(),
        message in arb_message(),
        to in arb_u128(),
    ) {
        let bytes = wire::encode_message(&message)
            .map_err(|e| TestCaseError::fail(format!("encode failed: {e}")))?;
        let packet = Packet {
            sender,
            frame: Frame::Data(Segment {
                to, stream: 1, base: 0, seq: 0, fragment: 0, fragments: 1,
                payload: Payload(bytes), ack: None,
            }),
        };
        let decoded = wire::decode_packet(cluster, &encode(cluster, &packet));
        let Ok(Packet { frame: Frame::Data(segment), .. }) = decoded else {
            return Err(TestCaseError::fail(format!("not a data packet: {decoded:?}")));
        };
        prop_assert_eq!(wire::decode_message(&segment.payload.0), Ok(message));
    }

    #[test]
    fn data_packets_respect_the_overhead_bound(
        cluster in arb_cluster(),
        sender in arb_member_id(),
        segment in arb_segment(),
    ) {
        let n = segment.payload.0.len();
        let bytes = encode(cluster, &Packet { sender, frame: Frame::Data(segment) });
        prop_assert!(bytes.len() <= n + PACKET_OVERHEAD_MAX, "{} > {n} + {PACKET_OVERHEAD_MAX}", bytes.len());
    }

    #[test]
    fn bundles_respect_the_overhead_bound(
        cluster in arb_cluster(),
        sender in arb_member_id(),
        segments in prop::collection::vec(arb_segment(), 1..8),
    ) {
        let n: usize = segments.iter().map(|s| s.payload.0.len()).sum();
        let bound = n + PACKET_OVERHEAD_MAX + (segments.len() - 1) * BUNDLED_SEGMENT_OVERHEAD_MAX;
        let bytes = encode(cluster, &Packet { sender, frame: Frame::Bundle(segments) });
        prop_assert!(bytes.len() <= bound, "{} > {bound}", bytes.len());
    }

    #[test]
    fn foreign_clusters_are_rejected(a in any::<u64>(), b in any::<u64>(), packet in arb_packet()) {
        prop_assume!(a != b);
        let bytes = encode(ClusterId(a), &packet);
        prop_assert_eq!(
            wire::decode_packet(ClusterId(b), &bytes),
            Err(DecodeError::ForeignCluster { cluster: ClusterId(a) })
        );
    }

    #[test]
    fn other_versions_are_rejected(
        cluster in arb_cluster(),
        version in any::<u8>().prop_filter("other version", |v| WireVersion::from_byte(*v).is_none()),
        packet in arb_packet(),
        other_cluster in any::<u64>(),
    ) {
        let mut bytes = encode(cluster, &packet);
        bytes[4] = version;
        prop_assert_eq!(
            wire::decode_packet(cluster, &bytes),
            Err(DecodeError::UnsupportedVersion { version })
        );
        // The version is checked before the cluster: a future version may change the header.
        prop_assert_eq!(
            wire::decode_packet(ClusterId(other_cluster), &bytes),
            Err(DecodeError::UnsupportedVersion { version })
        );
    }

    #[test]
    fn wrong_magic_is_rejected(
        cluster in arb_cluster(),
        magic in any::<[u8; 4]>().prop_filter("not the magic", |m| *m != MAGIC),
        flip in (0..4usize, 1..=255u8),
        packet in arb_packet(),
    ) {
        let mut bytes = encode(cluster, &packet);
        bytes[..4].copy_from_slice(&magic);
        prop_assert_eq!(wire::decode_packet(cluster, &bytes), Err(DecodeError::BadMagic));
        // A single changed bit anywhere in the magic is enough.
        let mut bytes = encode(cluster, &packet);
        bytes[flip.0] ^= flip.1;
        prop_assert_eq!(wire::decode_packet(cluster, &bytes), Err(DecodeError::BadMagic));
    }

    #[test]
    fn truncated_packets_are_rejected(cluster in arb_cluster(), packet in arb_packet(), cut in any::<Index>()) {
        let bytes = encode(cluster, &packet);
        let cut = cut.index(bytes.len());
        let result = wire::decode_packet(cluster, &bytes[..cut]);
        if cut < HEADER_LEN {
            prop_assert_eq!(result, Err(DecodeError::Truncated { len: cut }));
        } else {
            prop_assert!(is_malformed(&result), "cut at {cut}/{}: {result:?}", bytes.len());
        }
    }

    /// Every cut of the header, and every cut just after it, for one packet per case.
    #[test]
    fn header_cuts_are_truncated(cluster in arb_cluster(), packet in arb_packet()) {
        let bytes = encode(cluster, &packet);
        for cut in 0..HEADER_LEN {
            prop_assert_eq!(
                wire::decode_packet(cluster, &bytes[..cut]),
                Err(DecodeError::Truncated { len: cut })
            );
        }
        prop_assert!(is_malformed(&wire::decode_packet(cluster, &bytes[..HEADER_LEN])));
        prop_assert!(is_malformed(&wire::decode_packet(cluster, &bytes[..HEADER_LEN + 1])));
    }

    #[test]
    fn truncated_messages_are_rejected(message in arb_message(), cut in any::<Index>()) {
        let bytes = wire::encode_message(&message)
            .map_err(|e| TestCaseError::fail(format!("encode failed: {e}")))?;
        let cut = cut.index(bytes.len());
        let result = wire::decode_message(&bytes[..cut]);
        prop_assert!(is_malformed(&result), "cut at {cut}/{}: {result:?}", bytes.len());
    }

    #[test]
    fn trailing_bytes_are_rejected(
        cluster in arb_cluster(),
        packet in arb_packet(),
        message in arb_message(),
        extra in prop::collection::vec(any::<u8>(), 1..64),
    ) {
        let mut bytes = encode(cluster, &packet);
        bytes.extend_from_slice(&extra);
        let result = wire::decode_packet(cluster, &bytes);
        prop_assert!(is_malformed(&result), "{result:?}");

        let mut bytes = wire::encode_message(&message)
            .map_err(|e| TestCaseError::fail(format!("encode failed: {e}")))?;
        bytes.extend_from_slice(&extra);
        let result = wire::decode_message(&bytes);
        prop_assert!(is_malformed(&result), "{result:?}");
    }
}

#[test]
fn oversized_inputs_are_refused_before_parsing() {
    let cluster = ClusterId::from_name("big");
    // Garbage that would otherwise be `BadMagic`: the size is checked first.
    let garbage = vec![0u8; MAX_PACKET_LEN + 1];
    assert_eq!(
        wire::decode_packet(cluster, &garbage),
        Err(DecodeError::TooLarge {
            len: MAX_PACKET_LEN + 1,
            max: MAX_PACKET_LEN
        })
    );
    // A valid packet made one byte too long by padding is refused the same way.
    let mut padded = encode(cluster, &ping_packet());
    padded.resize(MAX_PACKET_LEN + 1, 0);
    assert_eq!(
        wire::decode_packet(cluster, &padded),
        Err(DecodeError::TooLarge {
            len: MAX_PACKET_LEN + 1,
            max: MAX_PACKET_LEN
        })
    );

    let garbage = vec![0xffu8; MAX_MESSAGE_LEN + 1];
    assert_eq!(
        wire::decode_message(&garbage),
        Err(DecodeError::TooLarge {
            len: MAX_MESSAGE_LEN + 1,
            max: MAX_MESSAGE_LEN
        })
    );
}

#[test]
fn packets_at_the_size_limit() {
    let cluster = ClusterId::from_name("limit");
    let sender = MemberId::new(1, "a", SocketAddr::from(([10, 0, 0, 1], 1))).expect("valid");
    let data = |n: usize| Packet {
        sender: sender.clone(),
        frame: Frame::Data(Segment {
            to: 2,
            stream: 0,
            base: 0,
            seq: 0,
            fragment: 0,
            fragments: 1,
            payload: Payload(vec![0xa5; n]),
            ack: None,
        }),
    };
    // Find the payload that makes the datagram exactly MAX_PACKET_LEN bytes.
    let overhead = encode(cluster, &data(60_000)).len() - 60_000;
    let n = MAX_PACKET_LEN - overhead;
    let bytes = encode(cluster, &data(n));
    assert_eq!(bytes.len(), MAX_PACKET_LEN);
    assert_eq!(wire::decode_packet(cluster, &bytes), Ok(data(n)));
    // One more byte of payload is refused by the encoder.
    assert_eq!(
        wire::encode_packet(cluster, &data(n + 1)),
        Err(EncodeError::TooLarge {
            len: MAX_PACKET_LEN + 1,
            max: MAX_PACKET_LEN
        })
    );
}

// ---------------------------------------------------------------------------------------------
// Any bytes decode without panicking
// ---------------------------------------------------------------------------------------------

proptest! {
    #![proptest_config(config())]

    #[test]
    fn arbitrary_bytes_never_panic(cluster in arb_cluster(), bytes in prop::collection::vec(any::<u8>(), 0..4096)) {
        if let Ok(packet) = wire::decode_packet(cluster, &bytes) {
            check_accepted_packet(cluster, &packet)?;
        }
        if let Ok(message) = wire::decode_message(&bytes) {
            check_accepted_message(&message)?;
        }
    }

    /// Random bodies behind a valid header, so the CBOR decoder is reached.
    #[test]
    fn arbitrary_bodies_never_panic(cluster in arb_cluster(), body in prop::collection::vec(any::<u8>(), 0..4096)) {
        let mut bytes = Vec::with_capacity(HEADER_LEN + body.len());
        wire::Header::write_version(cluster, WireVersion::V3, &mut bytes);
        bytes.extend_from_slice(&body);
        match wire::decode_packet(cluster, &bytes) {
            Ok(packet) => check_accepted_packet(cluster, &packet)?,
            Err(e) => prop_assert!(matches!(e, DecodeError::Malformed(_)), "{e:?}"),
        }
    }

    /// Bodies that start like a packet (a two-entry map keyed "sender") then go random.
    #[test]
    fn plausible_bodies_never_panic(
        cluster in arb_cluster(),
        prefix in arb_packet().prop_flat_map(|p| {
            let len = encode(ClusterId(0), &p).len();
            (Just(p), HEADER_LEN..=len)
        }),
        tail in prop::collection::vec(any::<u8>(), 0..256),
    ) {
        let (packet, keep) = prefix;
        let mut bytes = encode(cluster, &packet);
        bytes.truncate(keep);
        bytes.extend_from_slice(&tail);
        if let Ok(packet) = wire::decode_packet(cluster, &bytes) {
            check_accepted_packet(cluster, &packet)?;
        }
    }

    #[test]
    fn mutated_packets_never_panic(
        cluster in arb_cluster(),
        packet in arb_packet(),
        edits in prop::collection::vec((any::<Index>(), 1..=255u8), 1..4),
    ) {
        let mut bytes = encode(cluster, &packet);
        for (at, xor) in &edits {
            // Mutations of the body; header mutations are covered by the rejection tests.
            let at = HEADER_LEN + at.index(bytes.len() - HEADER_LEN);
            bytes[at] ^= xor;
        }
        if let Ok(decoded) = wire::decode_packet(cluster, &bytes) {
            check_accepted_packet(cluster, &decoded)?;
        }
    }

    /// One byte set to a value of special meaning in CBOR (long or indefinite lengths, breaks,
    /// tags, floats), inserted or deleted.
    #[test]
    fn structurally_mutated_packets_never_panic(
        cluster in arb_cluster(),
        packet in arb_packet(),
        at in any::<Index>(),
        byte in prop_oneof![
            prop::sample::select(vec![
                0x1b, 0x3b, 0x5a, 0x5b, 0x5f, 0x7a, 0x7b, 0x7f, 0x9a, 0x9b, 0x9f, 0xba, 0xbb,
                0xbf, 0xc2, 0xc3, 0xd8, 0xdb, 0xf4, 0xf5, 0xf6, 0xf7, 0xf9, 0xfa, 0xfb, 0xff,
                0x1c, 0x3c, 0x5c, 0x7c, 0x9c, 0xbc, 0xdc, 0xfc,
            ]),
            any::<u8>(),
        ],
        how in 0..3u8,
    ) {
        let mut bytes = encode(cluster, &packet);
        let at = HEADER_LEN + at.index(bytes.len() - HEADER_LEN);
        match how {
            0 => bytes[at] = byte,
            1 => bytes.insert(at, byte),
            _ => {
                bytes.remove(at);
            }
        }
        if let Ok(decoded) = wire::decode_packet(cluster, &bytes) {
            check_accepted_packet(cluster, &decoded)?;
        }
    }

    #[test]
    fn mutated_messages_never_panic(
        message in arb_message(),
        edits in prop::collection::vec((any::<Index>(), 1..=255u8), 1..4),
        insert in prop::option::of((any::<Index>(), any::<u8>())),
    ) {
        let mut bytes = wire::encode_message(&message)
            .map_err(|e| TestCaseError::fail(format!("encode failed: {e}")))?;
        for (at, xor) in &edits {
            let at = at.index(bytes.len());
            bytes[at] ^= xor;
        }
        if let Some((at, byte)) = insert {
            let at = at.index(bytes.len());
            bytes.insert(at, byte);
        }
        if let Ok(decoded) = wire::decode_message(&bytes) {
            check_accepted_message(&decoded)?;
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Version 4, the compact form (its golden encodings and sizes are in `wire_v4.rs`)
// ---------------------------------------------------------------------------------------------

fn encode_v4(cluster: ClusterId, packet: &Packet) -> Vec<u8> {
    wire::encode_packet_as(cluster, packet, WireVersion::V4)
        .expect("packets of the strategies encode")
}

fn encode_message_v4(message: &Message) -> Vec<u8> {
    wire::encode_message_as(message, WireVersion::V4).expect("messages of the strategies encode")
}

proptest! {
    #![proptest_config(config())]

    #[test]
    fn v4_packets_round_trip(cluster in arb_cluster(), packet in arb_packet()) {
        let bytes = encode_v4(cluster, &packet);
        prop_assert_eq!(bytes[4], 4);
        let heard = wire::decode_datagram(cluster, &bytes)
            .map_err(|e| TestCaseError::fail(format!("decode failed: {e}")))?;
        prop_assert_eq!(heard.version, WireVersion::V4);
        prop_assert_eq!(&heard.packet, &packet);
        prop_assert_eq!(encode_v4(cluster, &packet), bytes.clone());
        // Never larger than version 3.
        prop_assert!(bytes.len() <= encode(cluster, &packet).len());
        // What this build sends a member of version 3 reads as before, and names version 4.
        let old = wire::encode_packet_as(cluster, &packet, WireVersion::V3)
            .map_err(|e| TestCaseError::fail(format!("encode failed: {e}")))?;
        let earlier: Packet = ciborium::from_reader(&old[HEADER_LEN..])
            .map_err(|e| TestCaseError::fail(format!("the earlier codec refused: {e}")))?;
        prop_assert_eq!(&earlier, &packet);
        let heard = wire::decode_datagram(cluster, &old)
            .map_err(|e| TestCaseError::fail(format!("decode failed: {e}")))?;
        prop_assert_eq!((heard.version, heard.common), (WireVersion::V3, WireVersion::V4));
        prop_assert_eq!(heard.packet, packet);
    }

    #[test]
    fn v4_messages_round_trip(message in arb_message()) {
        let bytes = encode_message_v4(&message);
        prop_assert_eq!(bytes[0], 4);
        prop_assert_eq!(wire::decode_message(&bytes), Ok(message.clone()));
        prop_assert_eq!(encode_message_v4(&message), bytes.clone());
        prop_assert!(bytes.len() <= wire::encode_message(&message).map(|b| b.len()).unwrap_or(0));
    }

    #[test]
    fn v4_data_packets_respect_the_overhead_bound(
        cluster in arb_cluster(),
        sender in arb_member_id(),
        segments in prop::collection::vec(arb_segment(), 1..8),
    ) {
        let n: usize = segments.iter().map(|s| s.payload.0.len()).sum();
        let bound = n + PACKET_OVERHEAD_MAX + (segments.len() - 1) * BUNDLED_SEGMENT_OVERHEAD_MAX;
        for version in [WireVersion::V3, WireVersion::V4] {
            let packet = Packet { sender: sender.clone(), frame: Frame::Bundle(segments.clone()) };
            let bytes = wire::encode_packet_as(cluster, &packet, version)
                .map_err(|e| TestCaseError::fail(format!("encode failed: {e}")))?;
            prop_assert!(bytes.len() <= bound, "{version:?}: {} > {bound}", bytes.len());
        }
    }

    #[test]
    fn v4_truncations_and_trailing_bytes_are_malformed(
        cluster in arb_cluster(),
        packet in arb_packet(),
        message in arb_message(),
        cut in any::<Index>(),
        extra in prop::collection::vec(any::<u8>(), 1..64),
    ) {
        let bytes = encode_v4(cluster, &packet);
        let at = HEADER_LEN + cut.index(bytes.len() - HEADER_LEN);
        prop_assert!(is_malformed(&wire::decode_packet(cluster, &bytes[..at])));
        let longer = [bytes, extra.clone()].concat();
        prop_assert!(is_malformed(&wire::decode_packet(cluster, &longer)));
        let bytes = encode_message_v4(&message);
        let at = 1 + cut.index(bytes.len() - 1);
        prop_assert!(is_malformed(&wire::decode_message(&bytes[..at])));
        let longer = [bytes, extra].concat();
        prop_assert!(is_malformed(&wire::decode_message(&longer)));
    }

    /// Random bodies behind a valid version-4 header, so the compact decoder is reached.
    #[test]
    fn arbitrary_v4_bodies_never_panic(cluster in arb_cluster(), body in prop::collection::vec(any::<u8>(), 0..4096)) {
        let mut bytes = Vec::with_capacity(HEADER_LEN + body.len());
        wire::Header::write_version(cluster, WireVersion::V4, &mut bytes);
        bytes.extend_from_slice(&body);
        match wire::decode_packet(cluster, &bytes) {
            Ok(packet) => check_accepted_packet(cluster, &packet)?,
            Err(e) => prop_assert!(matches!(e, DecodeError::Malformed(_)), "{e:?}"),
        }
    }

    #[test]
    fn mutated_v4_packets_and_messages_never_panic(
        cluster in arb_cluster(),
        packet in arb_packet(),
        message in arb_message(),
        edits in prop::collection::vec((any::<Index>(), any::<u8>(), 0..3u8), 1..4),
    ) {
        let mut bytes = encode_v4(cluster, &packet);
        let mut body = encode_message_v4(&message);
        for (at, byte, how) in &edits {
            for (bytes, from) in [(&mut bytes, HEADER_LEN), (&mut body, 1)] {
                let at = from + at.index(bytes.len() - from);
                match how {
                    0 => bytes[at] ^= byte | 1,
                    1 => bytes.insert(at, *byte),
                    _ => {
                        bytes.remove(at);
                    }
                }
            }
        }
        if let Ok(decoded) = wire::decode_packet(cluster, &bytes) {
            check_accepted_packet(cluster, &decoded)?;
        }
        if let Ok(decoded) = wire::decode_message(&body) {
            check_accepted_message(&decoded)?;
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Hostile CBOR: huge declared lengths and deep nesting
// ---------------------------------------------------------------------------------------------

/// A CBOR head of `major` type with argument `n`, always in the 8-byte form when `long`.
fn head(major: u8, n: u64, long: bool) -> Vec<u8> {
    let m = major << 5;
    match n {
        _ if long => [&[m | 27][..], &n.to_be_bytes()].concat(),
        0..=23 => vec![m | n as u8],
        24..=0xff => vec![m | 24, n as u8],
        0x100..=0xffff => [&[m | 25][..], &(n as u16).to_be_bytes()].concat(),
        0x1_0000..=0xffff_ffff => [&[m | 26][..], &(n as u32).to_be_bytes()].concat(),
        _ => [&[m | 27][..], &n.to_be_bytes()].concat(),
    }
}

fn text(s: &str) -> Vec<u8> {
    [head(3, s.len() as u64, false), s.as_bytes().to_vec()].concat()
}

fn cbor<T: serde::Serialize>(value: &T) -> Vec<u8> {
    let mut out = Vec::new();
    ciborium::into_writer(value, &mut out).expect("serializes");
    out
}

fn with_cluster_header(cluster: ClusterId, body: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    wire::Header::write_version(cluster, WireVersion::V3, &mut out);
    out.extend_from_slice(body);
    out
}

fn with_header(body: &[u8]) -> Vec<u8> {
    with_cluster_header(hostile_cluster(), body)
}

fn hostile_cluster() -> ClusterId {
    ClusterId::from_name("hostile")
}

fn hostile_member() -> MemberId {
    MemberId::new(u128::MAX, "m", SocketAddr::from(([10, 1, 2, 3], 4000))).expect("valid")
}

/// A packet body `{ "sender": <member>, "frame": <frame bytes> }`.
fn packet_body(frame: &[u8]) -> Vec<u8> {
    [
        vec![0xa2],
        text("sender"),
        cbor(&hostile_member()),
        text("frame"),
        frame.to_vec(),
    ]
    .concat()
}

/// The prefix of a data frame up to (not including) the payload's byte-string head.
fn data_frame_up_to_payload() -> Vec<u8> {
    let mut frame = vec![0xa1];
    frame.extend(text("Data"));
    frame.push(0xa7);
    frame.extend(text("to"));
    frame.extend(cbor(&u128::MAX));
    for key in ["stream", "base", "seq"] {
        frame.extend(text(key));
        frame.extend(cbor(&u64::MAX));
    }
    for key in ["fragment", "fragments"] {
        frame.extend(text(key));
        frame.extend(cbor(&u32::MAX));
    }
    frame.extend(text("payload"));
    frame
}

fn nested(open: &[u8], depth: usize, close: &[u8]) -> Vec<u8> {
    let mut out = open.repeat(depth);
    out.extend_from_slice(close);
    out
}

/// Bodies declaring far more than they contain, or nesting far deeper than any message.
/// Each is `(what, bytes, is_packet)`; packets get the header, messages are decoded as they are.
fn hostile_inputs() -> Vec<(&'static str, Vec<u8>, bool)> {
    const DEEP: usize = 10_000;
    let huge = [1u64 << 32, 1 << 60, u64::MAX];
    let mut cases: Vec<(&'static str, Vec<u8>, bool)> = Vec::new();

    // Sanity: the hand-made pieces assemble into a valid packet.
    let mut valid = data_frame_up_to_payload();
    valid.extend(head(2, 3, false));
    valid.extend([1, 2, 3]);
    cases.push(("valid data packet (sanity)", packet_body(&valid), true));

    for n in huge {
        cases.push(("top-level map of huge length", head(5, n, true), true));
        cases.push(("top-level array of huge length", head(4, n, true), true));
        cases.push(("message map of huge length", head(5, n, true), false));
        let mut body = vec![0xa1];
        body.extend(text("Lock"));
        body.push(0xa1);
        body.extend(text("LockInfoResponse"));
        body.extend(head(5, n, true));
        body.extend(text("epoch"));
        body.push(0x01);
        cases.push(("message struct of huge length", body, false));

        let mut payload = data_frame_up_to_payload();
        payload.extend(head(2, n, true));
        payload.extend([0u8; 100]);
        cases.push((
            "payload byte string of huge length",
            packet_body(&payload),
            true,
        ));

        let mut payload = data_frame_up_to_payload();
        payload.extend(head(4, n, true));
        payload.extend([0u8; 100]);
        cases.push((
            "payload as an array of huge length",
            packet_body(&payload),
            true,
        ));

        // The sender's name as a text string of huge length.
        let mut body = vec![0xa2];
        body.extend(text("sender"));
        body.push(0xa3);
        body.extend(text("incarnation"));
        body.push(0x01);
        body.extend(text("name"));
        body.extend(head(3, n, true));
        body.extend(b"abc");
        cases.push(("member name of huge length", body, true));

        // The incarnation as a bignum (tag 2) of huge length.
        let mut body = vec![0xa2];
        body.extend(text("sender"));
        body.push(0xa3);
        body.extend(text("incarnation"));
        body.push(0xc2);
        body.extend(head(2, n, true));
        body.extend([0u8; 20]);
        cases.push(("incarnation bignum of huge length", body, true));

        // A view announcing a huge number of members, of which one is present.
        let mut frame = vec![0xa1];
        frame.extend(text("Discovery"));
        frame.push(0xa1);
        frame.extend(text("Announce"));
        frame.push(0xa1);
        frame.extend(text("view"));
        frame.push(0xa2);
        frame.extend(text("epoch"));
        frame.push(0x07);
        frame.extend(text("members"));
        frame.extend(head(4, n, true));
        frame.extend(cbor(&hostile_member()));
        cases.push(("view with a huge member count", packet_body(&frame), true));

        // Reconciliation lists of huge length.
        for list in ["held", "pending", "releases"] {
            let mut body = vec![0xa1];
            body.extend(text("Lock"));
            body.push(0xa1);
            body.extend(text("LockInfoResponse"));
            body.push(0xa4);
            body.extend(text("epoch"));
            body.push(0x01);
            body.extend(text(list));
            body.extend(head(4, n, true));
            cases.push(("reconciliation list of huge length", body, false));
        }

        // A lock name of huge length.
        let mut body = vec![0xa1];
        body.extend(text("Lock"));
        body.push(0xa1);
        body.extend(text("Denied"));
        body.push(0xa2);
        body.extend(text("request"));
        body.push(0x01);
        body.extend(text("name"));
        body.extend(head(3, n, true));
        body.extend(b"orders");
        cases.push(("lock name of huge length", body, false));
    }

    // Deep nesting, at the top level and as the value of an unknown field (which serde skips
    // with `IgnoredAny`, recursing into it).
    let deep: [(&'static str, Vec<u8>); 6] = [
        ("nested arrays", nested(&[0x81], DEEP, &[0x00])),
        ("nested maps", nested(&[0xa1, 0x00], DEEP, &[0x00])),
        ("nested indefinite arrays", nested(&[0x9f], DEEP, &[])),
        ("nested indefinite maps", nested(&[0xbf, 0x00], DEEP, &[])),
        ("nested tags", nested(&[0xc6], DEEP, &[0x00])),
        (
            "nested arrays of huge length",
            nested(&head(4, u64::MAX, true), DEEP / 2, &[]),
        ),
    ];
    for (what, bytes) in deep {
        cases.push((what, bytes.clone(), true));
        cases.push((what, bytes.clone(), false));

        let mut body = vec![0xa3];
        body.extend(text("sender"));
        body.extend(cbor(&hostile_member()));
        body.extend(text("frame"));
        body.extend(cbor(&Frame::Heartbeat {
            epoch: 1,
            view_epoch: 1,
            coordinator: 1,
            lease: None,
        }));
        body.extend(text("unknown"));
        body.extend(&bytes);
        cases.push((what, body, true));

        let mut body = vec![0xa1];
        body.extend(text("Lock"));
        body.push(0xa1);
        body.extend(text("LockInfoRequest"));
        body.push(0xa2);
        body.extend(text("epoch"));
        body.push(0x01);
        body.extend(text("unknown"));
        body.extend(&bytes);
        cases.push((what, body, false));
    }
    cases
}

/// Decodes every hostile input, each within a second, and checks it is refused.
fn decode_hostile_inputs() {
    for (what, body, is_packet) in hostile_inputs() {
        let start = Instant::now();
        let ok = if is_packet {
            let bytes = with_header(&body);
            assert!(bytes.len() <= MAX_PACKET_LEN, "{what}: test input too long");
            wire::decode_packet(hostile_cluster(), &bytes).is_ok()
        } else {
            wire::decode_message(&body).is_ok()
        };
        let elapsed = start.elapsed();
        assert!(
            elapsed < Duration::from_secs(1),
            "{what}: decoding took {elapsed:?}"
        );
        assert_eq!(ok, what.ends_with("(sanity)"), "{what}: decoded = {ok}");
    }
}

/// Set in the child process that re-runs the hostile inputs under a memory limit.
const CHILD_ENV: &str = "CONCLAVE_WIRE_PROPS_MEMORY_LIMITED_CHILD";

/// Hostile inputs fail fast, without panicking or overflowing the stack. On Linux they are also
/// decoded in a child process limited to 512 MiB of address space: an allocation sized from a
/// declared length (4 GiB and up here) aborts the child and fails this test.
#[test]
fn hostile_inputs_fail_fast_with_bounded_memory() {
    decode_hostile_inputs();
    if cfg!(target_os = "linux") && std::env::var_os(CHILD_ENV).is_none() {
        run_self_under_memory_limit("hostile_inputs_fail_fast_with_bounded_memory");
    }
}

fn run_self_under_memory_limit(test: &str) {
    const LIMIT_KIB: u64 = 512 * 1024;
    let exe = std::env::current_exe().expect("test executable");
    let output = std::process::Command::new("sh")
        .arg("-c")
        .arg(format!(
            "ulimit -v {LIMIT_KIB} 2>/dev/null || exit 77; exec \"$0\" \"$@\""
        ))
        .arg(&exe)
        .args([test, "--exact", "--test-threads=1", "--nocapture"])
        .env(CHILD_ENV, "1")
        .output();
    let output = match output {
        Ok(output) => output,
        Err(e) => {
            eprintln!("skipping the memory-limited run: cannot start sh: {e}");
            return;
        }
    };
    if output.status.code() == Some(77) {
        eprintln!("skipping the memory-limited run: cannot set ulimit -v");
        return;
    }
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        output.status.success() && stdout.contains("1 passed"),
        "memory-limited child failed ({}):\n{stdout}\n{stderr}",
        output.status
    );
}

// ---------------------------------------------------------------------------------------------
// Overhead bound
// ---------------------------------------------------------------------------------------------

/// The largest encodings of every field but the payload: longest names, an IPv6 address with
/// all bits set (flowinfo and scope id included), every number at its maximum.
#[test]
fn overhead_bound_holds_for_the_largest_headers() {
    let cluster = ClusterId(u64::MAX);
    let ip = Ipv6Addr::from(u128::MAX);
    let addr = SocketAddr::V6(SocketAddrV6::new(ip, u16::MAX, u32::MAX, u32::MAX));
    let ascii = "x".repeat(MemberId::MAX_NAME_LEN);
    let wide = "\u{1f512}".repeat(MemberId::MAX_NAME_LEN / 4);
    assert_eq!(wide.len(), MemberId::MAX_NAME_LEN);
    let max_payload = MAX_PACKET_LEN - PACKET_OVERHEAD_MAX;
    let sizes = [
        0,
        1,
        23,
        24,
        255,
        256,
        1_200,
        1_472,
        8_192,
        65_535 - 1_000,
        max_payload,
    ];
    for name in [&ascii, &wide] {
        let sender = MemberId::new(u128::MAX, name, addr).expect("valid");
        for n in sizes {
            let packet = Packet {
                sender: sender.clone(),
                frame: Frame::Data(Segment {
                    to: u128::MAX,
                    stream: u64::MAX,
                    base: u64::MAX,
                    seq: u64::MAX,
                    fragment: u32::MAX,
                    fragments: u32::MAX,
                    payload: Payload(vec![0xff; n]),
                    ack: Some(StreamAck {
                        stream: u64::MAX,
                        next_expected: u64::MAX,
                    }),
                }),
            };
            let bytes = wire::encode_packet(cluster, &packet)
                .unwrap_or_else(|e| panic!("payload of {n} bytes: {e}"));
            assert!(
                bytes.len() <= n + PACKET_OVERHEAD_MAX,
                "payload of {n} bytes encodes to {} > {n} + {PACKET_OVERHEAD_MAX}",
                bytes.len()
            );
            // The same segment bundled with copies of itself: each adds its payload and at
            // most BUNDLED_SEGMENT_OVERHEAD_MAX.
            let Frame::Data(segment) = &packet.frame else {
                unreachable!()
            };
            if n <= 8_192 {
                let copies = 3;
                let bundle = Packet {
                    sender: sender.clone(),
                    frame: Frame::Bundle(vec![segment.clone(); copies]),
                };
                let bytes = wire::encode_packet(cluster, &bundle).unwrap();
                let bound =
                    copies * n + PACKET_OVERHEAD_MAX + (copies - 1) * BUNDLED_SEGMENT_OVERHEAD_MAX;
                assert!(
                    bytes.len() <= bound,
                    "bundle of {copies} x {n}: {} > {bound}",
                    bytes.len()
                );
            }
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Golden encodings
// ---------------------------------------------------------------------------------------------

fn ping_packet() -> Packet {
    let sender = MemberId::new(
        0x0123_4567_89ab_cdef_0011_2233_4455_6677,
        "node-1",
        SocketAddr::from(([192, 0, 2, 1], 7800)),
    )
    .expect("valid");
    Packet {
        sender,
        frame: Frame::Discovery(Discovery::Ping),
    }
}

/// Lists of 24 elements or more take a longer CBOR header than the property strategies ever
/// generate: a 64-member view and a bundle of 64 segments are the same bytes as the earlier
/// releases' codec (ciborium) wrote, too.
#[test]
fn long_lists_encode_as_in_earlier_releases() {
    let mut seen = HashSet::new();
    let mut members = sample(&arb_member_id(), 80);
    members.retain(|m| seen.insert(m.clone()));
    members.truncate(64);
    assert_eq!(members.len(), 64, "80 samples hold 64 distinct members");
    let view = View::new(7, members).expect("distinct and non-empty");
    let message = Message::Gms(GmsMessage::InstallView { view });
    let bytes = wire::encode_message(&message).expect("encodes");
    assert_eq!(hex(&bytes), hex(&cbor(&message)));
    assert_eq!(wire::decode_message(&bytes), Ok(message));

    let cluster = ClusterId(42);
    let sender = sample(&arb_member_id(), 1).remove(0);
    let packet = Packet {
        sender,
        // Short payloads: 64 of the strategy's (up to 2,000 bytes each) overflow a datagram.
        frame: Frame::Bundle(
            sample(&arb_segment(), 64)
                .into_iter()
                .map(|mut segment| {
                    segment.payload.0.truncate(100);
                    segment
                })
                .collect(),
        ),
    };
    let bytes = encode(cluster, &packet);
    assert_eq!(
        hex(&bytes),
        hex(&with_cluster_header(cluster, &cbor(&packet)))
    );
    assert_eq!(wire::decode_packet(cluster, &bytes), Ok(packet));
}

/// PINNED WIRE FORMAT. If this test fails, the bytes on the wire changed: members of different
/// builds would no longer understand each other. That is a protocol version change: bump
/// `PROTOCOL_VERSION` (and update the bytes below) only if the change is intended.
#[test]
fn golden_ping_packet() {
    const GOLDEN: &str = concat!(
        "434e434c",                             // magic "CNCL"
        "03",                                   // protocol version
        "2b72c88efe37d9c4",                     // cluster id: FNV-1a of "golden", big-endian
        "a2",                                   // Packet: map of 2
        "6673656e646572",                       // "sender"
        "a3",                                   // MemberId: map of 3
        "6b696e6361726e6174696f6e",             // "incarnation"
        "c2500123456789abcdef0011223344556677", // bignum: tag 2, 16 bytes
        "646e616d65666e6f64652d31",             // "name": "node-1"
        "6461646472a1625634",                   // "addr": { "V4":
        "828418c0000201191e78",                 // [[192, 0, 2, 1], 7800] }
        "656672616d65",                         // "frame"
        "a169446973636f766572796450696e67",     // { "Discovery": "Ping" }
    );
    let cluster = ClusterId::from_name("golden");
    let bytes = encode(cluster, &ping_packet());
    assert_eq!(hex(&bytes), GOLDEN, "the wire format changed");
    assert_eq!(
        WireVersion::V3.byte(),
        3,
        "update the golden bytes with the version"
    );
    assert_eq!(wire::decode_packet(cluster, &bytes), Ok(ping_packet()));
}

/// PINNED WIRE FORMAT, for messages (which travel inside data segments): a change here is a
/// protocol version change too.
#[test]
fn golden_granted_message() {
    const GOLDEN: &str = "a1644c6f636ba1674772616e746564a46772657175657374182a646e616d65686f72646572732f3765746f6b656e1b0000000300000001657374616d7009";
    let message = Message::Lock(LockMessage::Granted {
        request: RequestId(42),
        name: LockName::new("orders/7").expect("valid"),
        token: FencingToken::new(3, 1),
        stamp: 9,
        cached: false,
        lease_ms: None,
        view: None,
    });
    let bytes = wire::encode_message(&message).expect("encodes");
    assert_eq!(hex(&bytes), GOLDEN, "the wire format changed");
    assert_eq!(wire::decode_message(&bytes), Ok(message));
}

// ---------------------------------------------------------------------------------------------
// Regressions: bugs this file found in `MemberId`'s wire form (IPv6 scope ids lost, decoded
// names not validated), fixed in src/ids.rs.
// ---------------------------------------------------------------------------------------------

fn round_trip_member(sender: MemberId) -> Result<Packet, DecodeError> {
    let cluster = ClusterId::from_name("v6");
    let packet = Packet {
        sender,
        frame: Frame::Heartbeat {
            epoch: 1,
            view_epoch: 1,
            coordinator: 1,
            lease: None,
        },
    };
    wire::decode_packet(cluster, &encode(cluster, &packet))
}

/// A link-local IPv6 address needs its scope id (`fe80::1%2`) to be usable; `MemberId`
/// equality includes it, so a member whose id loses it on the wire no longer recognizes itself
/// in a view it receives.
#[test]
fn ipv6_scope_id_survives_the_wire() {
    let ip: Ipv6Addr = "fe80::1".parse().expect("valid");
    let addr = SocketAddr::V6(SocketAddrV6::new(ip, 7800, 0, 2));
    let member = MemberId::new(1, "link-local", addr).expect("valid");
    let decoded = round_trip_member(member.clone()).map(|p| p.sender);
    assert_eq!(decoded, Ok(member));
}

#[test]
fn ipv6_flowinfo_is_dropped_at_construction_and_never_differs_on_the_wire() {
    let ip: Ipv6Addr = "2001:db8::1".parse().expect("valid");
    let addr = SocketAddr::V6(SocketAddrV6::new(ip, 7800, 0x12345, 0));
    let member = MemberId::new(1, "flow", addr).expect("valid");
    let decoded = round_trip_member(member.clone()).map(|p| p.sender.addr());
    // Compared as parts: `Debug` of a socket address does not show the flowinfo.
    let parts = |addr: SocketAddr| match addr {
        SocketAddr::V6(v6) => Some((*v6.ip(), v6.port(), v6.flowinfo(), v6.scope_id())),
        SocketAddr::V4(_) => None,
    };
    assert_eq!(decoded.map(parts), Ok(parts(member.addr())));
}

/// The wire form of a member id, as `MemberId` serializes it, but without its validation.
#[derive(serde::Serialize)]
struct RawMemberId<'a> {
    incarnation: u128,
    name: &'a str,
    addr: SocketAddr,
}

/// `MemberId::new` refuses names over 64 bytes and control characters, but decoding does not
/// go through it: a peer can make a receiver hold (and re-send in views) ids that could never
/// be built locally, e.g. 60 KB names, which `PACKET_OVERHEAD_MAX` assumes impossible.
#[test]
fn decoded_member_names_are_validated() {
    let addr = SocketAddr::from(([10, 0, 0, 1], 7800));
    let raw = |name: &str| {
        let body = packet_body_with_sender(&cbor(&RawMemberId {
            incarnation: 1,
            name,
            addr,
        }));
        with_header(&body)
    };
    // The mirror type is faithful: a valid name encodes exactly like `MemberId`.
    let valid = MemberId::new(1, "ok", addr).expect("valid");
    assert_eq!(
        raw("ok"),
        with_header(&packet_body_with_sender(&cbor(&valid)))
    );
    assert!(wire::decode_packet(hostile_cluster(), &raw("ok")).is_ok());

    let long = "x".repeat(MemberId::MAX_NAME_LEN + 1);
    for name in [long.as_str(), "evil\nname", "\u{1b}[31mred"] {
        let result = wire::decode_packet(hostile_cluster(), &raw(name));
        assert!(
            is_malformed(&result),
            "invalid member name {name:?} was accepted: {result:?}"
        );
    }
}

/// `LockName::new` refuses empty names, names over 255 bytes and control characters; a message
/// naming such a lock is malformed (the receiver drops it), never decoded into a name that could
/// not be built locally.
#[test]
fn decoded_lock_names_are_validated() {
    let cancel = |name: &str| {
        wire::encode_message(&Message::Lock(LockMessage::Cancel {
            request: RequestId(1),
            name: LockName::new(name).expect("valid"),
        }))
        .expect("encodes")
    };
    let valid = cancel("abXcd");
    assert!(wire::decode_message(&valid).is_ok());
    // The name's CBOR text: a one-byte head (major type 3, length 5), then its bytes.
    let at = valid
        .windows(6)
        .position(|w| w == b"\x65abXcd")
        .expect("the name is in the message");
    let with_name = |text: &[u8]| [&valid[..at], text, &valid[at + 6..]].concat();
    assert_eq!(with_name(b"\x65abXcd"), valid, "the splice is faithful");
    for control in [b'\n', b'\t', 0x1b, 0, 0x7f] {
        let bytes = with_name(&[0x65, b'a', b'b', control, b'c', b'd']);
        let result = wire::decode_message(&bytes);
        assert!(
            is_malformed(&result),
            "lock name with {control:#x} was accepted: {result:?}"
        );
    }
    let empty = wire::decode_message(&with_name(&[0x60]));
    assert!(is_malformed(&empty), "empty lock name accepted: {empty:?}");
    let long = [&[0x79, 0x01, 0x00][..], &[b'l'; 256]].concat();
    let long = wire::decode_message(&with_name(&long));
    assert!(is_malformed(&long), "256-byte lock name accepted: {long:?}");
}

fn packet_body_with_sender(sender: &[u8]) -> Vec<u8> {
    [
        vec![0xa2],
        text("sender"),
        sender.to_vec(),
        text("frame"),
        cbor(&Frame::Heartbeat {
            epoch: 1,
            view_epoch: 1,
            coordinator: 1,
            lease: None,
        }),
    ]
    .concat()
}

/// The lock name of the pinned messages below.
fn pinned_name() -> LockName {
    LockName::new("orders/7").expect("valid")
}

/// The owner of the pinned messages below.
fn pinned_owner() -> OwnerId {
    OwnerId {
        member: MemberId::new(1, "n", SocketAddr::from(([192, 0, 2, 1], 7800))).expect("valid"),
        local: 3,
    }
}

/// PINNED WIRE FORMAT: a request that does not ask to be quiet encodes exactly as before the
/// `quiet` field existed, so members that predate it decode it; one that asks carries the field,
/// and bytes without it decode as not quiet.
#[test]
fn golden_lock_message_and_its_quiet_flag() {
    const GOLDEN: &str = "a1644c6f636ba1644c6f636ba66772657175657374182a646e616d65686f72646572732f37656f776e6572a2666d656d626572a36b696e6361726e6174696f6e01646e616d65616e6461646472a1625634828418c0000201191e78656c6f63616c03646d6f6465694578636c75736976656477616974f5657374616d7009";
    let lock = |quiet| {
        Message::Lock(LockMessage::Lock {
            request: RequestId(42),
            name: pinned_name(),
            owner: pinned_owner(),
            mode: LockMode::Exclusive,
            wait: true,
            stamp: 9,
            lease_ms: None,
            quiet,
            passes: false,
        })
    };
    let (loud, quiet) = flag_on_the_wire(lock, "quiet");
    assert_eq!(hex(&loud), GOLDEN, "the wire format changed");

    // A member built before the flag existed: its `Lock` had every field but `quiet`. It
    // reads a quiet request as an ordinary one (serde skips the field it does not know).
    #[derive(serde::Deserialize, Debug, PartialEq)]
    enum OldMessage {
        Lock(OldLockMessage),
    }
    #[derive(serde::Deserialize, Debug, PartialEq)]
    enum OldLockMessage {
        Lock {
            request: RequestId,
            name: LockName,
            owner: OwnerId,
            mode: LockMode,
            wait: bool,
            #[serde(default)]
            stamp: u64,
            #[serde(default)]
            lease_ms: Option<u64>,
        },
    }
    let old: OldMessage =
        ciborium::from_reader(quiet.as_slice()).expect("an older member decodes it");
    let OldMessage::Lock(OldLockMessage::Lock {
        request,
        wait,
        stamp,
        ..
    }) = old;
    assert_eq!((request, wait, stamp), (RequestId(42), true, 9));
}

/// PINNED WIRE FORMAT: a request that does not say it takes one-hop handoffs encodes exactly
/// as before the `passes` field existed, and one that does carries the field, which a member
/// that predates it skips (it reads an ordinary request).
#[test]
fn golden_lock_message_and_its_passes_flag() {
    const GOLDEN: &str = "a1644c6f636ba1644c6f636ba66772657175657374182a646e616d65686f72646572732f37656f776e6572a2666d656d626572a36b696e6361726e6174696f6e01646e616d65616e6461646472a1625634828418c0000201191e78656c6f63616c03646d6f6465694578636c75736976656477616974f5657374616d7009";
    let lock = |passes| {
        Message::Lock(LockMessage::Lock {
            request: RequestId(42),
            name: pinned_name(),
            owner: pinned_owner(),
            mode: LockMode::Exclusive,
            wait: true,
            stamp: 9,
            lease_ms: None,
            quiet: false,
            passes,
        })
    };
    let (plain, passes) = flag_on_the_wire(lock, "passes");
    assert_eq!(hex(&plain), GOLDEN, "the wire format changed");

    // A member built before the flag existed decodes a request that carries it.
    #[derive(serde::Deserialize, Debug, PartialEq)]
    enum OldMessage {
        Lock(OldLockMessage),
    }
    #[derive(serde::Deserialize, Debug, PartialEq)]
    enum OldLockMessage {
        Lock {
            request: RequestId,
            name: LockName,
            owner: OwnerId,
            mode: LockMode,
            wait: bool,
            #[serde(default)]
            stamp: u64,
            #[serde(default)]
            lease_ms: Option<u64>,
            #[serde(default)]
            quiet: bool,
        },
    }
    let old: OldMessage =
        ciborium::from_reader(passes.as_slice()).expect("an older member decodes it");
    let OldMessage::Lock(OldLockMessage::Lock {
        request,
        wait,
        quiet,
        ..
    }) = old;
    assert_eq!((request, wait, quiet), (RequestId(42), true, false));
}

/// Encodes `message(false)` and `message(true)`: the field `flag` is on the wire only in the
/// second, and both decode to what was encoded. Returns both encodings.
fn flag_on_the_wire(message: impl Fn(bool) -> Message, flag: &str) -> (Vec<u8>, Vec<u8>) {
    let without = wire::encode_message(&message(false)).expect("encodes");
    let with = wire::encode_message(&message(true)).expect("encodes");
    assert!(
        !hex(&without).contains(&hex(flag.as_bytes())),
        "{flag}: no field when false"
    );
    assert!(
        hex(&with).contains(&hex(flag.as_bytes())),
        "{flag}: the field is on the wire"
    );
    assert_eq!(wire::decode_message(&without), Ok(message(false)));
    assert_eq!(wire::decode_message(&with), Ok(message(true)));
    (without, with)
}

/// PINNED WIRE FORMAT: a release that is not lazy encodes exactly as before the `lazy` field
/// existed (no field), so members that predate it decode every release; a lazy one carries the
/// field, and a member that predates it reads it as an ordinary release (and answers at once).
#[test]
fn unlock_message_and_its_lazy_flag() {
    let unlock = |lazy| {
        Message::Lock(LockMessage::Unlock {
            request: RequestId(42),
            name: pinned_name(),
            owner: pinned_owner(),
            token: FencingToken::new(2, 5),
            lazy,
            passed_to: None,
        })
    };
    let (eager, lazy) = flag_on_the_wire(unlock, "lazy");

    // A member built before the flag existed: its `Unlock` had every field but `lazy`.
    #[derive(serde::Deserialize, Debug, PartialEq)]
    enum OldMessage {
        Lock(OldLockMessage),
    }
    #[derive(serde::Deserialize, Debug, PartialEq)]
    enum OldLockMessage {
        Unlock {
            request: RequestId,
            name: LockName,
            owner: OwnerId,
            token: FencingToken,
        },
    }
    for bytes in [&eager, &lazy] {
        let old: OldMessage =
            ciborium::from_reader(bytes.as_slice()).expect("an older member decodes it");
        let OldMessage::Lock(OldLockMessage::Unlock { request, token, .. }) = old;
        assert_eq!((request, token), (RequestId(42), FencingToken::new(2, 5)));
    }
}
