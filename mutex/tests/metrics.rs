//! The `metrics` feature: a workload's grants, waits, holds and views reach the recorder the
//! application installed, under the documented names.

#![allow(clippy::unwrap_used)]

mod common;

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::{cluster, within, WAIT};
use conclave::memory::MemoryNetwork;
use metrics::{
    Counter, CounterFn, Gauge, GaugeFn, Histogram, HistogramFn, Key, KeyName, Metadata, Recorder,
    SharedString, Unit,
};

/// One metric's latest value (counters and gauges) or every sample (histograms).
#[derive(Debug, Default)]
struct Cell {
    value: Mutex<f64>,
    samples: Mutex<Vec<f64>>,
}

impl CounterFn for Cell {
    fn increment(&self, value: u64) {
        *self.value.lock().unwrap() += value as f64;
    }
    fn absolute(&self, value: u64) {
        let mut v = self.value.lock().unwrap();
        *v = v.max(value as f64);
    }
}

impl GaugeFn for Cell {
    fn increment(&self, value: f64) {
        *self.value.lock().unwrap() += value;
    }
    fn decrement(&self, value: f64) {
        *self.value.lock().unwrap() -= value;
    }
    fn set(&self, value: f64) {
        *self.value.lock().unwrap() = value;
    }
}

impl HistogramFn for Cell {
    fn record(&self, value: f64) {
        self.samples.lock().unwrap().push(value);
    }
}

/// A recorder that keeps every metric by `name{label=value,...}` (labels sorted).
#[derive(Debug, Default, Clone)]
struct Recorded(Arc<Mutex<BTreeMap<String, Arc<Cell>>>>);

impl Recorded {
    fn cell(&self, key: &Key) -> Arc<Cell> {
        let mut labels: Vec<String> = key
            .labels()
            .map(|l| format!("{}={}", l.key(), l.value()))
            .collect();
        labels.sort();
        let name = format!("{}{{{}}}", key.name(), labels.join(","));
        self.0.lock().unwrap().entry(name).or_default().clone()
    }

    fn value(&self, name: &str) -> f64 {
        self.0
            .lock()
            .unwrap()
            .get(name)
            .map_or(0.0, |c| *c.value.lock().unwrap())
    }

    fn samples(&self, name: &str) -> usize {
        self.0
            .lock()
            .unwrap()
            .get(name)
            .map_or(0, |c| c.samples.lock().unwrap().len())
    }
}

impl Recorder for Recorded {
    fn describe_counter(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
    fn describe_gauge(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
    fn describe_histogram(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
    fn register_counter(&self, key: &Key, _: &Metadata<'_>) -> Counter {
        Counter::from_arc(self.cell(key))
    }
    fn register_gauge(&self, key: &Key, _: &Metadata<'_>) -> Gauge {
        Gauge::from_arc(self.cell(key))
    }
    fn register_histogram(&self, key: &Key, _: &Metadata<'_>) -> Histogram {
        Histogram::from_arc(self.cell(key))
    }
}

/// Twenty locks and unlocks on one member: the grantor's grant counter, the member's wait and
/// hold histograms, the views and the view size reach the recorder.
#[test]
fn a_workload_moves_the_documented_metrics() {
    const ROUNDS: usize = 20;
    let recorded = Recorded::default();
    metrics::set_global_recorder(recorded.clone()).unwrap();
    smol::block_on(async {
        let network = MemoryNetwork::new();
        let nodes = cluster(&network, "metrics", 3).await;
        within(WAIT, "serving", nodes[2].wait_until_serving()).await;
        let mutex = nodes[2].mutex("m").unwrap();
        for _ in 0..ROUNDS {
            let guard = within(WAIT, "lock", mutex.lock()).await.unwrap();
            within(WAIT, "unlock", guard.unlock()).await.unwrap();
        }
        let rw = nodes[2].rw_lock("r").unwrap();
        drop(within(WAIT, "read", rw.read()).await.unwrap());

        let grantor = nodes[0].member_id().name().to_owned();
        let member = nodes[2].member_id().name().to_owned();
        let grants = format!("conclave_grants_total{{member={grantor}}}");
        // The counters are published at most once a second: wait for this workload's.
        within(WAIT, "the grants reach the recorder", async {
            while recorded.value(&grants) < (ROUNDS + 1) as f64 {
                async_io::Timer::after(Duration::from_millis(50)).await;
            }
        })
        .await;
        let waits = format!("conclave_lock_wait_seconds{{member={member},mode=exclusive}}");
        let holds = format!("conclave_lock_hold_seconds{{member={member},mode=exclusive}}");
        assert_eq!(recorded.samples(&waits), ROUNDS, "one wait per lock call");
        assert_eq!(recorded.samples(&holds), ROUNDS, "one hold per guard");
        let shared = format!("conclave_lock_hold_seconds{{member={member},mode=shared}}");
        assert_eq!(recorded.samples(&shared), 1);
        let views = format!("conclave_views_installed_total{{member={member}}}");
        let size = format!("conclave_view_members{{member={member}}}");
        within(WAIT, "the member's views and view size", async {
            while recorded.value(&views) < 1.0 || recorded.value(&size) != 3.0 {
                async_io::Timer::after(Duration::from_millis(50)).await;
            }
        })
        .await;
    });
}
