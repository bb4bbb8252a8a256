//! The byte format of the `endpoint_input` target: a script of inputs to one `Endpoint`.
//!
//! A script is a sequence of steps, each an opcode byte followed by its fields. Reading past
//! the end gives zeros, so every byte string is a script; it ends where its bytes do. Most
//! steps are datagrams built from fuzzed fields with the wire encoder, so the fuzzer spends
//! its time in the protocol rather than in front of the header and the CBOR; raw datagrams
//! cover the rest.
//!
//! Encodings:
//! - a number is one byte below 250, or a byte of 250 or more and 8 bytes little-endian (so
//!   small values are cheap and overflow edges reachable);
//! - a member is a byte: 0 is the endpoint itself, 1 to 4 the peers of [`member`], 5 to 7 a
//!   restart of peer 1 to 3 (same name and address) with the incarnation that follows (a
//!   number); anything else is taken modulo 8;
//! - a lock name is a byte, `l0` to `l7`; a vector is a length byte (modulo 4) and its items;
//!   an option a byte (odd is `Some`) and the value; bytes are a little-endian `u16` length and
//!   the bytes (cut to what is left).
//!
//! [`Writer`] writes the same format, so the corpus generator can write scripts; it writes
//! every value [`Reader`] produces, with the canonical opcode of each step.

use std::net::SocketAddr;

use conclave_lock_api::wire::{
    self, Ack, Discovery, Frame, GmsMessage, GrantView, LeaseBeat, LockMessage, Message, Packet,
    Payload, PendingRelease, PendingRequest, Probe, ReportedHold, Segment, SharedSetting,
    StreamAck, TableHolder, TableLock, TableWaiter,
};
use conclave_lock_api::{
    FencingToken, LockMode, LockName, MemberId, OwnerId, RequestId, ServiceName, View,
};

/// A shared setting of the script's cast: name and value.
struct CastSetting(&'static str, &'static str);

impl CastSetting {
    fn setting(&self) -> SharedSetting {
        SharedSetting {
            name: self.0.to_owned(),
            value: self.1.to_owned(),
        }
    }
}

/// The shared settings a script names: the endpoint's own (`Available`, the local lease) and
/// others that differ.
const SETTINGS: [CastSetting; 4] = [
    CastSetting("partition_policy", "Available"),
    CastSetting("partition_policy", "Majority { cluster_size: 3 }"),
    CastSetting("lease", "1.2s"),
    CastSetting("lease", "8s"),
];

/// The number of peers a script names besides the endpoint.
pub const PEERS: usize = 4;

/// Member `index` of the script's cast: 0 is the endpoint under test, 1 to [`PEERS`] its peers.
///
/// # Panics
/// Above [`PEERS`].
pub fn member(index: usize) -> MemberId {
    assert!(index <= PEERS);
    let addr = SocketAddr::from(([127, 0, 0, 1], 7800 + index as u16));
    let incarnation = (0x00c0_ffee_u128 << 96) | (index as u128 + 1);
    MemberId::new(incarnation, &format!("m{index}"), addr).expect("a valid name")
}

/// A restart of peer `index`: same name and address, another incarnation.
fn restart(index: usize, incarnation: u128) -> MemberId {
    let peer = member(index);
    MemberId::new(incarnation, peer.name(), peer.addr()).expect("a valid name")
}

/// One input to the endpoint.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Step {
    /// Advance the clock by this many milliseconds, firing the timers that fall due.
    Advance(u16),
    /// A datagram of these bytes.
    Raw(Vec<u8>),
    /// A datagram encoding this packet.
    Packet(Packet),
    /// A local lock request.
    Lock {
        /// The owner number on the endpoint.
        owner: u64,
        /// The lock.
        name: LockName,
        /// The mode.
        mode: LockMode,
        /// Queue (`lock`) or not (`try_lock`).
        wait: bool,
        /// A timeout, in milliseconds.
        timeout_ms: Option<u16>,
        /// Ask not to be told that the request was queued (`lock_quiet`).
        quiet: bool,
    },
    /// Unlock the request made so far with index `pick % 128` (modulo their number); with
    /// `pick` 128 or more, as a dropped guard does (`unlock_lazy`).
    Unlock(u8),
    /// Cancel the request made so far with this index (modulo their number).
    Cancel(u8),
    /// Ask the grantor for its lock table.
    QueryTable,
    /// Leave the cluster.
    Leave,
}

/// Reads a script's steps.
#[derive(Debug)]
pub struct Reader<'a> {
    bytes: &'a [u8],
}

impl<'a> Reader<'a> {
    /// A reader of the script `bytes`.
    pub fn new(bytes: &'a [u8]) -> Self {
        Self { bytes }
    }

    /// The next step, or `None` at the end of the script.
    pub fn next_step(&mut self) -> Option<Step> {
        if self.bytes.is_empty() {
            return None;
        }
        Some(match self.u8() % 16 {
            0..=2 => Step::Advance(self.u16()),
            3 => Step::Raw(self.bytes()),
            9 => Step::Lock {
                owner: self.num(),
                name: self.name(),
                mode: self.mode(),
                wait: self.flag(),
                timeout_ms: self.flag().then(|| self.u16()),
                quiet: self.flag(),
            },
            10 => Step::Unlock(self.u8()),
            11 => Step::Cancel(self.u8()),
            12 => Step::QueryTable,
            13 => Step::Leave,
            _ => Step::Packet(Packet {
                sender: self.member(),
                frame: self.frame(),
            }),
        })
    }

    fn u8(&mut self) -> u8 {
        match self.bytes.split_first() {
            Some((&b, rest)) => {
                self.bytes = rest;
                b
            }
            None => 0,
        }
    }

    fn u16(&mut self) -> u16 {
        u16::from_le_bytes([self.u8(), self.u8()])
    }

    fn num(&mut self) -> u64 {
        let tag = self.u8();
        if tag < 250 {
            return u64::from(tag);
        }
        let mut bytes = [0; 8];
        for b in &mut bytes {
            *b = self.u8();
        }
        u64::from_le_bytes(bytes)
    }

    fn flag(&mut self) -> bool {
        self.u8() % 2 == 1
    }

    fn bytes(&mut self) -> Vec<u8> {
        let len = usize::from(self.u16()).min(self.bytes.len());
        let (head, rest) = self.bytes.split_at(len);
        self.bytes = rest;
        head.to_vec()
    }

    fn vec<T>(&mut self, mut item: impl FnMut(&mut Self) -> T) -> Vec<T> {
        let len = self.u8() % 4;
        (0..len).map(|_| item(self)).collect()
    }

    fn option<T>(&mut self, item: impl FnOnce(&mut Self) -> T) -> Option<T> {
        self.flag().then(|| item(self))
    }

    fn held_lock(&mut self) -> ReportedHold {
        ReportedHold {
            request: self.request(),
            name: self.name(),
            owner: self.owner(),
            mode: self.mode(),
            token: self.token(),
            lease_ms: self.option(Self::num),
        }
    }

    fn pending_request(&mut self) -> PendingRequest {
        PendingRequest {
            request: self.request(),
            name: self.name(),
            owner: self.owner(),
            mode: self.mode(),
            wait: self.flag(),
            lease_ms: self.option(Self::num),
        }
    }

    fn member(&mut self) -> MemberId {
        match usize::from(self.u8() % 8) {
            index @ 0..=PEERS => member(index),
            pick => restart(pick - PEERS, u128::from(self.num())),
        }
    }

    fn incarnation(&mut self) -> u128 {
        self.member().incarnation()
    }

    fn name(&mut self) -> LockName {
        LockName::new(format!("l{}", self.u8() % 8)).expect("a valid name")
    }

    fn setting(&mut self) -> SharedSetting {
        SETTINGS[usize::from(self.u8()) % SETTINGS.len()].setting()
    }

    fn mode(&mut self) -> LockMode {
        if self.flag() {
            LockMode::Shared
        } else {
            LockMode::Exclusive
        }
    }

    fn owner(&mut self) -> OwnerId {
        OwnerId {
            member: self.member(),
            local: self.num(),
        }
    }

    fn request(&mut self) -> RequestId {
        RequestId(self.num())
    }

    fn token(&mut self) -> FencingToken {
        FencingToken(self.num())
    }

    fn view(&mut self) -> View {
        let epoch = self.num();
        let len = self.u8() % 6;
        let members: Vec<MemberId> = (0..len).map(|_| self.member()).collect();
        // An empty view or one naming a member twice cannot be encoded: fall back to a view
        // of the first peer.
        View::new(epoch, members)
            .unwrap_or_else(|_| View::new(epoch, vec![member(1)]).expect("a view of one member"))
    }

    fn probe(&mut self) -> Probe {
        Probe {
            term: self.num(),
            seq: self.num(),
        }
    }

    fn frame(&mut self) -> Frame {
        match self.u8() % 5 {
            0 => Frame::Discovery(if self.flag() {
                Discovery::Announce {
                    view: self.view(),
                    heard: self.vec(Self::incarnation),
                    settings: self.vec(Self::setting),
                }
            } else {
                Discovery::Ping
            }),
            1 => Frame::Heartbeat {
                epoch: self.num(),
                view_epoch: self.num(),
                coordinator: self.incarnation(),
                lease: self.option(|r| LeaseBeat {
                    max_term: r.num(),
                    probe: r.option(Self::probe),
                    echo: r.option(Self::probe),
                    refused: r.option(Self::num),
                }),
            },
            2 => Frame::Data(self.segment()),
            3 => {
                // Up to a few past the limit, so oversized bundles are tried too.
                let len = self.u8() % (wire::MAX_BUNDLE as u8 + 4);
                Frame::Bundle((0..len).map(|_| self.segment()).collect())
            }
            _ => Frame::Ack(Ack {
                to: self.incarnation(),
                stream: self.num(),
                next_expected: self.num(),
            }),
        }
    }

    fn segment(&mut self) -> Segment {
        Segment {
            to: self.incarnation(),
            stream: self.num(),
            base: self.num(),
            seq: self.num(),
            fragment: self.num() as u32,
            fragments: self.num() as u32,
            payload: Payload(if self.flag() {
                self.bytes()
            } else {
                wire::encode_message(&self.message()).expect("a small message encodes")
            }),
            ack: self.option(|r| StreamAck {
                stream: r.num(),
                next_expected: r.num(),
            }),
        }
    }

    fn message(&mut self) -> Message {
        let kind = self.u8() % 32;
        if kind == 30 {
            return Message::Gms(GmsMessage::Join {
                settings: self.vec(Self::setting),
            });
        }
        if kind == 31 {
            let setting = self.setting();
            return Message::Gms(GmsMessage::JoinRefused {
                setting: setting.name,
                coordinator_value: setting.value,
                joiner_value: self.setting().value,
            });
        }
        if kind == 28 {
            return Message::Gms(GmsMessage::InstallViewDelta {
                epoch: self.num(),
                base_epoch: self.num(),
                base_digest: self.num(),
                left: self.vec(Self::incarnation),
                joined: self.vec(Self::member),
                digest: self.num(),
            });
        }
        if kind == 29 {
            return Message::Gms(GmsMessage::ViewRequest { epoch: self.num() });
        }
        if kind == 27 {
            // A named service's message: the service, then a lock message of its own kind.
            let service = self.service();
            let inner = self.u8() % 27;
            let message = self.lock_message(inner.max(5));
            return Message::Service { service, message };
        }
        if kind < 5 {
            return Message::Gms(match kind {
                0 => GmsMessage::JoinRequest,
                1 => GmsMessage::NotCoordinator,
                2 => GmsMessage::LeaveRequest,
                3 => GmsMessage::InstallView { view: self.view() },
                _ => GmsMessage::LeaveAccepted { epoch: self.num() },
            });
        }
        Message::Lock(self.lock_message(kind))
    }

    fn service(&mut self) -> ServiceName {
        ServiceName::new(format!("s{}", self.u8() % 4)).expect("a valid service name")
    }

    fn lock_message(&mut self, kind: u8) -> LockMessage {
        match kind {
            5 => LockMessage::Lock {
                request: self.request(),
                name: self.name(),
                owner: self.owner(),
                mode: self.mode(),
                wait: self.flag(),
                stamp: self.num(),
                lease_ms: self.option(Self::num),
                quiet: self.flag(),
                passes: self.flag(),
            },
            6 => LockMessage::Renew {
                stamp: self.num(),
                held: self.vec(Self::request),
            },
            7 => LockMessage::Renewed {
                stamp: self.num(),
                held: self.vec(Self::request),
            },
            8 => LockMessage::Cancel {
                request: self.request(),
                name: self.name(),
            },
            9 => LockMessage::Unlock {
                request: self.request(),
                name: self.name(),
                owner: self.owner(),
                token: self.token(),
                lazy: self.flag(),
                passed_to: None,
            },
            10 => LockMessage::Granted {
                request: self.request(),
                name: self.name(),
                token: self.token(),
                stamp: self.num(),
                cached: self.flag(),
                lease_ms: self.option(Self::num),
                view: self.option(|r| GrantView {
                    epoch: r.num(),
                    coordinator: r.incarnation(),
                }),
            },
            11 => LockMessage::Queued {
                request: self.request(),
                position: self.num() as u32,
            },
            12 => LockMessage::Denied {
                request: self.request(),
                name: self.name(),
                unavailable: self.flag(),
            },
            13 => LockMessage::UnlockAck {
                request: self.request(),
            },
            14 => LockMessage::LockInfoRequest { epoch: self.num() },
            15 => LockMessage::LockInfoResponse {
                epoch: self.num(),
                held: self.vec(Self::held_lock),
                pending: self.vec(Self::pending_request),
                releases: self.vec(|r| PendingRelease {
                    request: r.request(),
                    name: r.name(),
                    owner: r.owner(),
                    token: r.token(),
                }),
            },
            16 => LockMessage::Serving { epoch: self.num() },
            17 => LockMessage::Holding {
                held: self.vec(Self::request),
                pending: self.vec(Self::request),
                upto: self.option(Self::request),
            },
            23 => LockMessage::TransferRequest {
                epoch: self.num(),
                coordinator: self.incarnation(),
            },
            24 => LockMessage::Handoff {
                epoch: self.num(),
                coordinator: self.incarnation(),
                token_epoch: self.num(),
                last_token: self.token(),
                held: self.vec(Self::held_lock),
                waiting: self.vec(Self::pending_request),
                generation: self.num(),
            },
            25 => LockMessage::Transferred {
                epoch: self.num(),
                coordinator: self.incarnation(),
                generation: self.num(),
            },
            26 => LockMessage::NotGrantor {
                epoch: self.num(),
                coordinator: self.incarnation(),
                grantor: self.member(),
                generation: self.num(),
            },
            18 => LockMessage::TableRequest { query: self.num() },
            19 => LockMessage::Table {
                query: self.num(),
                epoch: self.num(),
                unavailable: self.flag(),
                truncated: self.flag(),
                locks: self.vec(|r| TableLock {
                    name: r.name(),
                    holders: r.vec(|r| TableHolder {
                        owner: r.owner(),
                        mode: r.mode(),
                        token: r.token(),
                        lease_ms: r.option(Self::num),
                    }),
                    waiters: r.vec(|r| TableWaiter {
                        owner: r.owner(),
                        mode: r.mode(),
                    }),
                }),
            },
            22 => LockMessage::ExtendLease {
                request: self.request(),
                name: self.name(),
                lease_ms: self.num(),
                stamp: self.num(),
            },
            21 => LockMessage::Revoke {
                request: self.request(),
                name: self.name(),
                token: self.token(),
            },
            _ => LockMessage::DuplicateLock {
                name: self.name(),
                owner: self.owner(),
                token: self.token(),
            },
        }
    }
}

/// Writes scripts that [`Reader`] reads back as the same steps.
#[derive(Debug, Default)]
pub struct Writer {
    out: Vec<u8>,
}

impl Writer {
    /// The script written so far.
    pub fn finish(self) -> Vec<u8> {
        self.out
    }

    /// Appends `step`.
    ///
    /// # Panics
    /// On a value outside the script's domain (a member not of the cast, a lock name other
    /// than `l0` to `l7`, a vector of more than 3 items, an invalid view).
    pub fn step(&mut self, step: &Step) -> &mut Self {
        match step {
            Step::Advance(millis) => {
                self.u8(0);
                self.u16(*millis);
            }
            Step::Raw(bytes) => {
                self.u8(3);
                self.bytes(bytes);
            }
            Step::Packet(packet) => {
                self.u8(4);
                self.member(&packet.sender);
                self.frame(&packet.frame);
            }
            Step::Lock {
                owner,
                name,
                mode,
                wait,
                timeout_ms,
                quiet,
            } => {
                self.u8(9);
                self.num(*owner);
                self.name(name);
                self.mode(*mode);
                self.flag(*wait);
                self.flag(timeout_ms.is_some());
                if let Some(ms) = timeout_ms {
                    self.u16(*ms);
                }
                self.flag(*quiet);
            }
            Step::Unlock(pick) => self.out.extend([10, *pick]),
            Step::Cancel(pick) => self.out.extend([11, *pick]),
            Step::QueryTable => self.u8(12),
            Step::Leave => self.u8(13),
        }
        self
    }

    fn u8(&mut self, v: u8) {
        self.out.push(v);
    }

    fn u16(&mut self, v: u16) {
        self.out.extend(v.to_le_bytes());
    }

    fn num(&mut self, v: u64) {
        match u8::try_from(v) {
            Ok(small) if small < 250 => self.u8(small),
            _ => {
                self.u8(255);
                self.out.extend(v.to_le_bytes());
            }
        }
    }

    fn flag(&mut self, v: bool) {
        self.u8(u8::from(v));
    }

    fn bytes(&mut self, bytes: &[u8]) {
        self.u16(u16::try_from(bytes.len()).expect("at most 64 KiB"));
        self.out.extend_from_slice(bytes);
    }

    fn vec<T>(&mut self, items: &[T], mut item: impl FnMut(&mut Self, &T)) {
        assert!(items.len() < 4, "at most 3 items");
        self.u8(items.len() as u8);
        for v in items {
            item(self, v);
        }
    }

    fn option<T>(&mut self, value: Option<&T>, item: impl FnOnce(&mut Self, &T)) {
        self.flag(value.is_some());
        if let Some(v) = value {
            item(self, v);
        }
    }

    fn held_lock(&mut self, h: &ReportedHold) {
        self.request(&h.request);
        self.name(&h.name);
        self.owner(&h.owner);
        self.mode(h.mode);
        self.token(&h.token);
        self.option(h.lease_ms.as_ref(), |w, v| w.num(*v));
    }

    fn pending_request(&mut self, p: &PendingRequest) {
        self.request(&p.request);
        self.name(&p.name);
        self.owner(&p.owner);
        self.mode(p.mode);
        self.flag(p.wait);
        self.option(p.lease_ms.as_ref(), |w, v| w.num(*v));
    }

    fn member(&mut self, m: &MemberId) {
        if let Some(index) = (0..=PEERS).find(|&i| member(i) == *m) {
            return self.u8(index as u8);
        }
        let peer = (1..PEERS)
            .find(|&i| restart(i, m.incarnation()) == *m)
            .expect("a member of the cast or a restart of peer 1 to 3");
        self.u8((PEERS + peer) as u8);
        self.num(u64::try_from(m.incarnation()).expect("a restart's incarnation fits 64 bits"));
    }

    fn incarnation(&mut self, incarnation: u128) {
        let index = (0..=PEERS)
            .find(|&i| member(i).incarnation() == incarnation)
            .expect("an incarnation of the cast");
        self.u8(index as u8);
    }

    fn setting(&mut self, setting: &SharedSetting) {
        let index = SETTINGS
            .iter()
            .position(|s| s.setting() == *setting)
            .or_else(|| SETTINGS.iter().position(|s| s.1 == setting.value))
            .expect("a setting of the cast");
        self.u8(index as u8);
    }

    fn name(&mut self, name: &LockName) {
        let index = (0..8u8)
            .find(|i| name.as_str() == format!("l{i}"))
            .expect("a lock name l0 to l7");
        self.u8(index);
    }

    fn mode(&mut self, mode: LockMode) {
        self.flag(mode == LockMode::Shared);
    }

    fn owner(&mut self, owner: &OwnerId) {
        self.member(&owner.member);
        self.num(owner.local);
    }

    fn request(&mut self, request: &RequestId) {
        self.num(request.0);
    }

    fn token(&mut self, token: &FencingToken) {
        self.num(token.0);
    }

    fn view(&mut self, view: &View) {
        self.num(view.epoch());
        assert!(view.len() < 6, "at most 5 members");
        self.u8(view.len() as u8);
        for m in view.members() {
            self.member(m);
        }
    }

    fn probe(&mut self, probe: &Probe) {
        self.num(probe.term);
        self.num(probe.seq);
    }

    fn frame(&mut self, frame: &Frame) {
        match frame {
            Frame::Discovery(Discovery::Ping) => self.out.extend([0, 0]),
            Frame::Discovery(Discovery::Announce {
                view,
                heard,
                settings,
            }) => {
                self.out.extend([0, 1]);
                self.view(view);
                self.vec(heard, |w, incarnation| w.incarnation(*incarnation));
                self.vec(settings, Self::setting);
            }
            Frame::Heartbeat {
                epoch,
                view_epoch,
                coordinator,
                lease,
            } => {
                self.u8(1);
                self.num(*epoch);
                self.num(*view_epoch);
                self.incarnation(*coordinator);
                self.option(lease.as_ref(), |w, beat| {
                    w.num(beat.max_term);
                    w.option(beat.probe.as_ref(), Self::probe);
                    w.option(beat.echo.as_ref(), Self::probe);
                    w.option(beat.refused.as_ref(), |w, term| w.num(*term));
                });
            }
            Frame::Data(segment) => {
                self.u8(2);
                self.segment(segment);
            }
            Frame::Bundle(segments) => {
                self.u8(3);
                self.u8(u8::try_from(segments.len()).expect("a bundle of at most 67"));
                for segment in segments {
                    self.segment(segment);
                }
            }
            Frame::Ack(ack) => {
                self.u8(4);
                self.incarnation(ack.to);
                self.num(ack.stream);
                self.num(ack.next_expected);
            }
        }
    }

    fn segment(&mut self, segment: &Segment) {
        self.incarnation(segment.to);
        self.num(segment.stream);
        self.num(segment.base);
        self.num(segment.seq);
        self.num(u64::from(segment.fragment));
        self.num(u64::from(segment.fragments));
        // A payload that is the encoding of a message is written as the message.
        let bytes = &segment.payload.0;
        match wire::decode_message(bytes) {
            Ok(message) if wire::encode_message(&message).as_ref() == Ok(bytes) => {
                self.flag(false);
                self.message(&message);
            }
            _ => {
                self.flag(true);
                self.bytes(bytes);
            }
        }
        self.option(segment.ack.as_ref(), |w, ack| {
            w.num(ack.stream);
            w.num(ack.next_expected);
        });
    }

    fn message(&mut self, message: &Message) {
        match message {
            Message::Gms(GmsMessage::JoinRequest) => self.u8(0),
            Message::Gms(GmsMessage::NotCoordinator) => self.u8(1),
            Message::Gms(GmsMessage::LeaveRequest) => self.u8(2),
            Message::Gms(GmsMessage::InstallView { view }) => {
                self.u8(3);
                self.view(view);
            }
            Message::Gms(GmsMessage::LeaveAccepted { epoch }) => {
                self.u8(4);
                self.num(*epoch);
            }
            Message::Gms(GmsMessage::InstallViewDelta {
                epoch,
                base_epoch,
                base_digest,
                left,
                joined,
                digest,
            }) => {
                self.u8(28);
                self.num(*epoch);
                self.num(*base_epoch);
                self.num(*base_digest);
                self.vec(left, |w, i| w.incarnation(*i));
                self.vec(joined, Self::member);
                self.num(*digest);
            }
            Message::Gms(GmsMessage::ViewRequest { epoch }) => {
                self.u8(29);
                self.num(*epoch);
            }
            Message::Gms(GmsMessage::Join { settings }) => {
                self.u8(30);
                self.vec(settings, Self::setting);
            }
            Message::Gms(GmsMessage::JoinRefused {
                setting,
                coordinator_value,
                joiner_value,
            }) => {
                self.u8(31);
                self.setting(&SharedSetting {
                    name: setting.clone(),
                    value: coordinator_value.clone(),
                });
                self.setting(&SharedSetting {
                    name: setting.clone(),
                    value: joiner_value.clone(),
                });
            }
            Message::Lock(lock) => self.lock_message(lock),
            Message::Service { service, message } => {
                self.u8(27);
                let index = (0..4u8)
                    .find(|i| service.as_str() == format!("s{i}"))
                    .expect("a service name s0 to s3");
                self.u8(index);
                self.lock_message(message);
            }
        }
    }

    fn lock_message(&mut self, message: &LockMessage) {
        match message {
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
            } => {
                self.u8(5);
                self.request(request);
                self.name(name);
                self.owner(owner);
                self.mode(*mode);
                self.flag(*wait);
                self.num(*stamp);
                self.option(lease_ms.as_ref(), |w, v| w.num(*v));
                self.flag(*quiet);
                self.flag(*passes);
            }
            LockMessage::ExtendLease {
                request,
                name,
                lease_ms,
                stamp,
            } => {
                self.u8(22);
                self.request(request);
                self.name(name);
                self.num(*lease_ms);
                self.num(*stamp);
            }
            LockMessage::Renew { stamp, held } | LockMessage::Renewed { stamp, held } => {
                self.u8(if matches!(message, LockMessage::Renew { .. }) {
                    6
                } else {
                    7
                });
                self.num(*stamp);
                self.vec(held, Self::request);
            }
            LockMessage::Cancel { request, name } => {
                self.u8(8);
                self.request(request);
                self.name(name);
            }
            LockMessage::Unlock {
                request,
                name,
                owner,
                token,
                lazy,
                ..
            } => {
                self.u8(9);
                self.request(request);
                self.name(name);
                self.owner(owner);
                self.token(token);
                self.flag(*lazy);
            }
            LockMessage::Granted {
                request,
                name,
                token,
                stamp,
                cached,
                lease_ms,
                view,
            } => {
                self.u8(10);
                self.request(request);
                self.name(name);
                self.token(token);
                self.num(*stamp);
                self.flag(*cached);
                self.option(lease_ms.as_ref(), |w, v| w.num(*v));
                self.option(view.as_ref(), |w, v| {
                    w.num(v.epoch);
                    w.incarnation(v.coordinator);
                });
            }
            LockMessage::Revoke {
                request,
                name,
                token,
            } => {
                self.u8(21);
                self.request(request);
                self.name(name);
                self.token(token);
            }
            LockMessage::Queued { request, position } => {
                self.u8(11);
                self.request(request);
                self.num(u64::from(*position));
            }
            LockMessage::Denied {
                request,
                name,
                unavailable,
            } => {
                self.u8(12);
                self.request(request);
                self.name(name);
                self.flag(*unavailable);
            }
            LockMessage::UnlockAck { request } => {
                self.u8(13);
                self.request(request);
            }
            LockMessage::LockInfoRequest { epoch } => {
                self.u8(14);
                self.num(*epoch);
            }
            LockMessage::LockInfoResponse {
                epoch,
                held,
                pending,
                releases,
            } => {
                self.u8(15);
                self.num(*epoch);
                self.vec(held, Self::held_lock);
                self.vec(pending, Self::pending_request);
                self.vec(releases, |w, r| {
                    w.request(&r.request);
                    w.name(&r.name);
                    w.owner(&r.owner);
                    w.token(&r.token);
                });
            }
            LockMessage::Serving { epoch } => {
                self.u8(16);
                self.num(*epoch);
            }
            LockMessage::Holding {
                held,
                pending,
                upto,
            } => {
                self.u8(17);
                self.vec(held, Self::request);
                self.vec(pending, Self::request);
                self.option(upto.as_ref(), Self::request);
            }
            LockMessage::TransferRequest { epoch, coordinator } => {
                self.u8(23);
                self.num(*epoch);
                self.incarnation(*coordinator);
            }
            LockMessage::Handoff {
                epoch,
                coordinator,
                token_epoch,
                last_token,
                held,
                waiting,
                generation,
            } => {
                self.u8(24);
                self.num(*epoch);
                self.incarnation(*coordinator);
                self.num(*token_epoch);
                self.token(last_token);
                self.vec(held, Self::held_lock);
                self.vec(waiting, Self::pending_request);
                self.num(*generation);
            }
            LockMessage::Transferred {
                epoch,
                coordinator,
                generation,
            } => {
                self.u8(25);
                self.num(*epoch);
                self.incarnation(*coordinator);
                self.num(*generation);
            }
            LockMessage::NotGrantor {
                epoch,
                coordinator,
                grantor,
                generation,
            } => {
                self.u8(26);
                self.num(*epoch);
                self.incarnation(*coordinator);
                self.member(grantor);
                self.num(*generation);
            }
            LockMessage::TableRequest { query } => {
                self.u8(18);
                self.num(*query);
            }
            LockMessage::Table {
                query,
                epoch,
                unavailable,
                truncated,
                locks,
            } => {
                self.u8(19);
                self.num(*query);
                self.num(*epoch);
                self.flag(*unavailable);
                self.flag(*truncated);
                self.vec(locks, |w, lock| {
                    w.name(&lock.name);
                    w.vec(&lock.holders, |w, h| {
                        w.owner(&h.owner);
                        w.mode(h.mode);
                        w.token(&h.token);
                        w.option(h.lease_ms.as_ref(), |w, v| w.num(*v));
                    });
                    w.vec(&lock.waiters, |w, h| {
                        w.owner(&h.owner);
                        w.mode(h.mode);
                    });
                });
            }
            LockMessage::DuplicateLock { name, owner, token } => {
                self.u8(20);
                self.name(name);
                self.owner(owner);
                self.token(token);
            }
            // The one-hop handoff's messages are not scripted yet: written as an
            // UNLOCK-ACK of the same request (a script never holds them).
            LockMessage::Designate { request, .. } => {
                self.u8(13);
                self.request(request);
            }
            LockMessage::Passed { grant, .. } => {
                self.u8(13);
                self.request(&grant.request);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_byte_string_is_a_script() {
        for bytes in [&b""[..], b"\x00", b"\xff\xff\xff", b"\x04\x07\xff"] {
            let mut reader = Reader::new(bytes);
            while reader.next_step().is_some() {}
        }
    }
}
