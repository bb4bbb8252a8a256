//! Who a connection belongs to: a member reached under an alias keeps one connection, a live
//! connection is not displaced by a newcomer claiming the same member, and hellos must name a
//! usable address at the IP they come from. Every wait is bounded.

mod common;

use std::io::Write;
use std::net::{SocketAddr, TcpListener, TcpStream};

use conclave_tcp::TcpConfig;

use common::{
    eventually, frame, frames, hello, read_frames, read_until_closed, Forward, Pump, LIMIT,
};

/// Sends `bytes` from `from` to `to` (under the address `via`) and checks that `to` gets them
/// from `from`'s listen address.
fn delivered(from: &Pump, to: &Pump, via: SocketAddr, bytes: &[u8]) {
    from.send(via, bytes);
    let got = to.recv(LIMIT).expect("delivered");
    assert_eq!((got.from, &got.bytes[..]), (from.addr(), bytes));
}

#[test]
fn a_member_dialled_under_an_alias_keeps_one_connection() {
    let b = Pump::loopback(&[]);
    let alias = Forward::to(b.addr());
    let a = Pump::bind(&TcpConfig {
        seeds: vec![alias.addr()],
        ..TcpConfig::loopback()
    });

    // The first frame dials the alias; `b`'s answer comes back on that connection after `b`'s
    // hello, so from here on `a` knows that the alias is `b`.
    delivered(&a, &b, alias.addr(), b"via the alias");
    delivered(&b, &a, a.addr(), b"answer");
    for i in 0..10 {
        delivered(&a, &b, b.addr(), format!("direct {i}").as_bytes());
        delivered(&a, &b, alias.addr(), format!("alias {i}").as_bytes());
        delivered(&b, &a, a.addr(), format!("back {i}").as_bytes());
    }
    // Discovery reaches the seed (the alias) and the known member (`b`): one frame, as they
    // are one member.
    let before = a.stats().frames_sent;
    a.discover(b"discovery");
    assert_eq!(b.recv(LIMIT).expect("discovery").bytes, b"discovery");
    delivered(&a, &b, b.addr(), b"after discovery");
    assert_eq!(a.stats().frames_sent - before, 2, "{:?}", a.stats());

    let (sa, sb) = (a.stats(), b.stats());
    assert_eq!(sa.connect_attempts, 1, "one dial, no churn: {sa:?}");
    assert_eq!(alias.forwarded(), 1);
    assert_eq!((sa.connections, sb.connections), (1, 1), "{sa:?} {sb:?}");
    assert_eq!((sa.peers, sb.peers), (1, 1), "{sa:?} {sb:?}");
    assert_eq!(sb.replaced + sb.duplicates_resolved, 0, "{sb:?}");
}

#[test]
fn a_member_dialled_directly_then_under_an_alias_converges_to_one_connection() {
    let b = Pump::loopback(&[]);
    let alias = Forward::to(b.addr());
    let a = Pump::loopback(&[]);
    delivered(&a, &b, b.addr(), b"direct first");
    delivered(&b, &a, a.addr(), b"answer");
    // A second dial, under the alias: its hello names a member already connected, so the
    // established connection stays and the alias joins it.
    delivered(&a, &b, alias.addr(), b"then the alias");
    assert!(
        eventually(LIMIT, || {
            let (sa, sb) = (a.stats(), b.stats());
            sa.connections == 1 && sb.connections == 1
        }),
        "{:?} {:?}",
        a.stats(),
        b.stats()
    );
    for i in 0..5 {
        delivered(&a, &b, alias.addr(), format!("alias {i}").as_bytes());
        delivered(&a, &b, b.addr(), format!("direct {i}").as_bytes());
        delivered(&b, &a, a.addr(), format!("back {i}").as_bytes());
    }
    let (sa, sb) = (a.stats(), b.stats());
    assert_eq!(sa.connect_attempts, 2, "{sa:?}");
    assert_eq!((sa.connections, sb.connections), (1, 1), "{sa:?} {sb:?}");
    assert_eq!(sb.replaced, 0, "{sb:?}");
}

/// Connects to `mesh` as the member at `claimed` (instance `instance`), says hello and one
/// frame, and returns the stream once the mesh has received that frame.
fn greet_as(mesh: &Pump, claimed: SocketAddr, instance: u64, tag: &[u8]) -> TcpStream {
    let mut stream = TcpStream::connect(mesh.addr()).expect("connect");
    let mut bytes = hello(1, instance, claimed);
    bytes.extend_from_slice(&frame(tag));
    stream.write_all(&bytes).expect("write");
    let got = mesh.recv(LIMIT).expect("the frame after the hello");
    assert_eq!((got.from, &got.bytes[..]), (claimed, tag));
    stream
}

#[test]
fn a_second_connection_from_a_live_member_does_not_replace_the_first() {
    let a = Pump::loopback(&[]);
    // The member's address, held so that nobody else takes it; the mesh never dials it here.
    let member = TcpListener::bind("127.0.0.1:0").expect("bind");
    let m = member.local_addr().expect("addr");
    let mut first = greet_as(&a, m, 7, b"on the first");
    // The same member (same instance) opens a second connection while the first is live.
    let mut second = greet_as(&a, m, 7, b"on the second");

    a.send(m, b"to the member");
    let got = read_frames(&mut first, 2, LIMIT).expect("frames on the first connection");
    assert_eq!(&got[0][..5], b"CNCL\x01");
    assert_eq!(
        got[1], b"to the member",
        "the first connection still carries frames"
    );
    let bytes = read_until_closed(&mut second, LIMIT).expect("the newcomer is wound down");
    let got = frames(&bytes);
    assert_eq!(got.len(), 1, "only the mesh's hello: {got:?}");
    assert_eq!(a.stats().replaced, 0, "{:?}", a.stats());

    // Once the first is gone (its FIN is in, even if the mesh has not read it yet), a new
    // connection takes over.
    drop(first);
    let mut third = greet_as(&a, m, 7, b"on the third");
    a.send(m, b"to the member again");
    let got = read_frames(&mut third, 2, LIMIT).expect("frames on the third connection");
    assert_eq!(got[1], b"to the member again");
}

#[test]
fn a_spoofed_hello_does_not_take_over_a_live_member() {
    let a = Pump::loopback(&[]);
    let b = Pump::loopback(&[]);
    b.send(a.addr(), b"hello from b");
    assert_eq!(a.recv(LIMIT).expect("b reached a").from, b.addr());

    // Another process on the same host claims to be `b`, with another instance id.
    let mut attacker = TcpStream::connect(a.addr()).expect("connect");
    let mut bytes = hello(1, 777, b.addr());
    bytes.extend_from_slice(&frame(b"forged"));
    attacker.write_all(&bytes).expect("write");
    let heard = read_until_closed(&mut attacker, LIMIT).expect("the impostor is closed");
    assert_eq!(frames(&heard).len(), 1, "it heard nothing but the hello");

    a.send(b.addr(), b"secret for b");
    let got = b.recv(LIMIT).expect("b still gets its frames");
    assert_eq!((got.from, &got.bytes[..]), (a.addr(), &b"secret for b"[..]));
    b.send(a.addr(), b"ack");
    let got = a.recv(LIMIT).expect("b's answer");
    assert_eq!(
        (got.from, &got.bytes[..]),
        (b.addr(), &b"ack"[..]),
        "the impostor's frame was not delivered"
    );
    assert_eq!(a.stats().replaced, 0, "{:?}", a.stats());
}

#[test]
fn a_hello_must_claim_the_ip_it_comes_from() {
    let a = Pump::loopback(&[]);
    // From 127.0.0.1, claiming another address.
    for claimed in ["127.0.0.2:7800", "10.1.2.3:7800"] {
        let mut stream = TcpStream::connect(a.addr()).expect("connect");
        let mut bytes = hello(1, 5, claimed.parse().unwrap());
        bytes.extend_from_slice(&frame(b"from afar"));
        stream.write_all(&bytes).expect("write");
        assert!(
            read_until_closed(&mut stream, LIMIT).is_some(),
            "a hello claiming {claimed} from 127.0.0.1 is refused"
        );
    }
    assert!(
        eventually(LIMIT, || a.stats().violations == 2),
        "{:?}",
        a.stats()
    );
    assert_eq!(a.stats().frames_received, 0);
}

#[test]
fn hellos_naming_unusable_addresses_are_refused() {
    let a = Pump::loopback(&[]);
    for claimed in ["127.0.0.1:0", "0.0.0.0:7800", "224.0.0.1:7800", "[::]:7800"] {
        let mut stream = TcpStream::connect(a.addr()).expect("connect");
        let mut bytes = hello(1, 6, claimed.parse().unwrap());
        bytes.extend_from_slice(&frame(b"x"));
        stream.write_all(&bytes).expect("write");
        assert!(
            read_until_closed(&mut stream, LIMIT).is_some(),
            "a hello naming {claimed} is refused"
        );
    }
    assert!(
        eventually(LIMIT, || a.stats().violations == 4),
        "{:?}",
        a.stats()
    );
    assert_eq!(a.stats().frames_received, 0);
}

/// The IP check holds for meshes on a multi-homed host: a mesh dials from its listen IP.
#[cfg(target_os = "linux")]
#[test]
fn a_mesh_on_another_local_ip_is_accepted() {
    let Ok(x) = conclave_tcp::TcpMesh::bind(&TcpConfig {
        bind: "127.0.0.2:0".parse().unwrap(),
        ..TcpConfig::loopback()
    }) else {
        eprintln!("127.0.0.2 not available; skipped");
        return;
    };
    let x = Pump::new(x);
    let y = Pump::loopback(&[]);
    delivered(&x, &y, y.addr(), b"from 127.0.0.2");
    delivered(&y, &x, x.addr(), b"back to 127.0.0.2");
    let z = Pump::loopback(&[]);
    delivered(&z, &x, x.addr(), b"from 127.0.0.1");
    delivered(&x, &z, z.addr(), b"back to 127.0.0.1");
    assert_eq!(
        x.stats().violations + y.stats().violations + z.stats().violations,
        0
    );
}
