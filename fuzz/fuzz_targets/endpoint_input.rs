//! A whole node fed a fuzzed script: one `Endpoint` that has joined, then time steps, raw
//! datagrams, datagrams built from fuzzed fields with the wire encoder (so most of them get
//! past the header and the CBOR), and local lock calls; after every step the driver drains
//! `poll_transmit` and `poll_event` as the driving contract says.
//!
//! It must never panic, and its memory must stay bounded:
//! - the protocol core exposes no size of its buffers, so the target counts the bytes live on
//!   the heap (a counting global allocator) and asserts they stay below a constant plus a
//!   multiple of the script's length;
//! - a step may produce at most `MAX_TRANSMITS` datagrams and `MAX_EVENTS` events;
//! - the sizes the endpoint does expose (the grantor's holds, local holds and pending
//!   requests, the view) stay within what the script could have created.
//!
//! Besides: every datagram the endpoint sends decodes and fits `MAX_DATAGRAM`, and
//! `handle_timeout(now)` moves the next deadline past `now` within a few calls (a driver
//! would spin otherwise).
//!
//! Input: a configuration byte (even: `Available`; odd: `Majority` of 1 to 5 members), then
//! the script (`conclave_fuzz::script`).

#![no_main]

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use conclave_fuzz::script::{self, Reader, Step};
use conclave_fuzz::CLUSTER;
use conclave_lock_api::wire::{self, ClusterId};
use conclave_lock_api::RequestId;
use conclave_protocol::locking::{LockRequest, PartitionPolicy};
use conclave_protocol::{Endpoint, EndpointConfig, Instant};
use libfuzzer_sys::fuzz_target;

/// The largest datagram of the endpoint's transport (a typical UDP payload on Ethernet).
const MAX_DATAGRAM: usize = 1400;
/// Steps read from one input; the rest is ignored (keeps each run short).
const MAX_STEPS: usize = 512;
/// Datagrams one step may make the endpoint send.
const MAX_TRANSMITS: usize = 4096;
/// Events one step may give.
const MAX_EVENTS: usize = 1024;
/// Timers fired by one time step before the clock jumps to its end.
const MAX_TIMERS: usize = 32;
/// Times in a row `handle_timeout(now)` may leave a deadline at or before `now` (a stale
/// timer fires harmlessly; a timer that never moves on would make a driver spin).
const MAX_AGAIN: usize = 8;
/// Heap the endpoint may hold whatever it was fed, and per byte of script.
const HEAP_BASE: usize = 1 << 20;
const HEAP_PER_BYTE: usize = 4 << 10;

/// Counts the bytes live on the heap.
struct Counting;

static LIVE: AtomicUsize = AtomicUsize::new(0);

// SAFETY: every call is passed on to `System` unchanged; only the counter is added.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let ptr = System.alloc(layout);
        if !ptr.is_null() {
            LIVE.fetch_add(layout.size(), Ordering::Relaxed);
        }
        ptr
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        let ptr = System.alloc_zeroed(layout);
        if !ptr.is_null() {
            LIVE.fetch_add(layout.size(), Ordering::Relaxed);
        }
        ptr
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        System.dealloc(ptr, layout);
        LIVE.fetch_sub(layout.size(), Ordering::Relaxed);
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        let new = System.realloc(ptr, layout, new_size);
        if !new.is_null() {
            LIVE.fetch_sub(layout.size(), Ordering::Relaxed);
            LIVE.fetch_add(new_size, Ordering::Relaxed);
        }
        new
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

fuzz_target!(|data: &[u8]| {
    let Some((&config_byte, script)) = data.split_first() else {
        return;
    };
    let baseline = LIVE.load(Ordering::Relaxed);
    let heap_bound = HEAP_BASE + HEAP_PER_BYTE * data.len();

    let mut config = EndpointConfig::local();
    if config_byte % 2 == 1 {
        config.locks.policy = PartitionPolicy::Majority {
            cluster_size: 1 + usize::from(config_byte / 2) % 5,
        };
    }
    let cluster = ClusterId::from_name(CLUSTER);
    let mut endpoint = Endpoint::new(CLUSTER, script::member(0), config, MAX_DATAGRAM);
    let mut now = Instant::ZERO;
    endpoint.join(now);
    drain(&mut endpoint, cluster);

    let mut requests: Vec<RequestId> = Vec::new();
    let mut reader = Reader::new(script);
    for _ in 0..MAX_STEPS {
        let Some(step) = reader.next_step() else {
            break;
        };
        match step {
            Step::Advance(millis) => {
                let target = now + Duration::from_millis(u64::from(millis));
                // Firings in a row that left a deadline at or before `now`.
                let mut again = 0;
                for _ in 0..MAX_TIMERS {
                    match endpoint.poll_timeout() {
                        Some(deadline) if deadline <= target => {
                            now = now.max(deadline);
                            endpoint.handle_timeout(now);
                            drain(&mut endpoint, cluster);
                            if endpoint.poll_timeout().is_some_and(|next| next <= now) {
                                again += 1;
                                assert!(
                                    again <= MAX_AGAIN,
                                    "timers due again and again at {now:?}"
                                );
                            } else {
                                again = 0;
                            }
                        }
                        _ => break,
                    }
                }
                now = target;
                endpoint.handle_timeout(now);
            }
            Step::Raw(bytes) => endpoint.handle_datagram(now, &bytes),
            Step::Packet(packet) => {
                let bytes =
                    wire::encode_packet(cluster, &packet).expect("a script's packet encodes");
                endpoint.handle_datagram(now, &bytes);
            }
            Step::Lock {
                owner,
                name,
                mode,
                wait,
                timeout_ms,
                quiet,
            } => {
                let request = LockRequest {
                    owner,
                    name,
                    mode,
                    wait,
                    timeout: timeout_ms.map(|ms| Duration::from_millis(u64::from(ms))),
                    // A third of the timeouts double as leases of the hold.
                    lease: timeout_ms
                        .filter(|ms| ms % 3 == 0)
                        .map(|ms| Duration::from_millis(u64::from(ms))),
                };
                if quiet {
                    if let Ok(id) = endpoint.lock_quiet(now, None, request) {
                        requests.push(id);
                    }
                } else {
                    requests.push(endpoint.lock(now, request));
                }
            }
            Step::Unlock(pick) => {
                if let Some(&request) = pick_one(&requests, pick % 128) {
                    // Not held (yet, or any more) is an answer, not a failure.
                    let _ = if pick >= 128 {
                        endpoint.unlock_lazy(now, request)
                    } else {
                        endpoint.unlock(now, request)
                    };
                }
            }
            Step::Cancel(pick) => {
                if let Some(&request) = pick_one(&requests, pick) {
                    endpoint.cancel(now, request);
                }
            }
            Step::QueryTable => {
                let _ = endpoint.query_table(now);
            }
            Step::Leave => endpoint.leave(now),
        }
        drain(&mut endpoint, cluster);

        let holds = endpoint.locks().grantor_holds().len();
        assert!(
            holds <= script.len(),
            "{holds} holds in the grantor's table from {} bytes",
            script.len()
        );
        assert!(endpoint.holds(now).len() <= requests.len());
        assert!(endpoint.locks().pending_requests().len() <= requests.len());
        let members = endpoint.view().map_or(0, |v| v.len());
        assert!(members <= 1 + script.len(), "a view of {members} members");
        let live = LIVE.load(Ordering::Relaxed).saturating_sub(baseline);
        assert!(
            live <= heap_bound,
            "{live} bytes live on the heap, above {heap_bound}"
        );
    }
});

/// Drains the endpoint's outputs as a driver does, checking each datagram.
fn drain(endpoint: &mut Endpoint, cluster: ClusterId) {
    let mut transmits = 0;
    while let Some(transmit) = endpoint.poll_transmit() {
        transmits += 1;
        assert!(
            transmits <= MAX_TRANSMITS,
            "more than {MAX_TRANSMITS} datagrams from one step"
        );
        assert!(
            transmit.bytes.len() <= MAX_DATAGRAM,
            "a datagram of {} bytes, above {MAX_DATAGRAM}",
            transmit.bytes.len()
        );
        if let Err(error) = wire::decode_packet(cluster, &transmit.bytes) {
            panic!("the endpoint sent an undecodable datagram: {error}");
        }
    }
    let mut events = 0;
    while endpoint.poll_event().is_some() {
        events += 1;
        assert!(
            events <= MAX_EVENTS,
            "more than {MAX_EVENTS} events from one step"
        );
    }
    let _ = endpoint.poll_durable_term();
}

fn pick_one<T>(items: &[T], pick: u8) -> Option<&T> {
    if items.is_empty() {
        None
    } else {
        items.get(usize::from(pick) % items.len())
    }
}
