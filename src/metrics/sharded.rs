//! Counters and histograms that each thread adds to in a slot of its own,
//! handed to the Prometheus exporter's series at every scrape and upkeep.
//!
//! The exporter keeps one set of atomics a series (two a counter: its value
//! and a generation; a histogram's bucket also takes the time). A login adds
//! to some twenty of them, and every HTTP worker adds to the same ones, so
//! under load each of those cache lines moves between cores at almost every
//! request, more the more cores serve. Here a thread adds to its own slot's
//! line, and the sums reach the exporter's series only when something reads
//! them: `Handle::render` and the upkeep (every 5 s) flush first, so a
//! scrape sees every count made before it.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use metrics::{
    Counter, CounterFn, Gauge, Histogram, HistogramFn, Key, KeyName, Metadata, Recorder,
    SharedString, Unit,
};
use metrics_exporter_prometheus::{PrometheusHandle, PrometheusRecorder};

/// Slots a series: the threads that count take them in turn, so up to this
/// many counting threads never share one.
const SLOTS: usize = 16;

/// The exporter's recorder, with counters and histograms sharded.
pub(super) struct ShardedRecorder {
    inner: PrometheusRecorder,
    series: Arc<Series>,
}

/// Every sharded series, by key: `counter!` registers at every call where
/// no handle is kept, and each call must find the same slots.
#[derive(Default)]
struct Series {
    counters: Mutex<HashMap<Key, Arc<ShardedCounter>>>,
    histograms: Mutex<HashMap<Key, Arc<ShardedHistogram>>>,
}

impl Series {
    fn flush(&self) {
        let counters: Vec<_> = lock(&self.counters).values().cloned().collect();
        counters.iter().for_each(|c| c.flush());
        let histograms: Vec<_> = lock(&self.histograms).values().cloned().collect();
        histograms.iter().for_each(|h| h.flush());
    }
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

/// What reads the series: renders them after handing every slot's sums
/// to the exporter.
#[derive(Clone)]
pub struct Handle {
    prometheus: PrometheusHandle,
    series: Arc<Series>,
}

impl Handle {
    /// The Prometheus text of every series, each count made before the
    /// call included.
    pub fn render(&self) -> String {
        self.series.flush();
        self.prometheus.render()
    }

    /// Hand the slots' sums over and let the exporter drain its histograms
    /// (called every few seconds, so that nothing piles up unscraped).
    pub(super) fn run_upkeep(&self) {
        self.series.flush();
        self.prometheus.run_upkeep();
    }
}

impl ShardedRecorder {
    pub(super) fn new(inner: PrometheusRecorder) -> (Self, Handle) {
        let series = Arc::new(Series::default());
        let handle = Handle {
            prometheus: inner.handle(),
            series: series.clone(),
        };
        (Self { inner, series }, handle)
    }
}

impl Recorder for ShardedRecorder {
    fn describe_counter(&self, key: KeyName, unit: Option<Unit>, description: SharedString) {
        self.inner.describe_counter(key, unit, description);
    }

    fn describe_gauge(&self, key: KeyName, unit: Option<Unit>, description: SharedString) {
        self.inner.describe_gauge(key, unit, description);
    }

    fn describe_histogram(&self, key: KeyName, unit: Option<Unit>, description: SharedString) {
        self.inner.describe_histogram(key, unit, description);
    }

    fn register_counter(&self, key: &Key, metadata: &Metadata<'_>) -> Counter {
        let mut counters = lock(&self.series.counters);
        let counter = counters.entry(key.clone()).or_insert_with(|| {
            Arc::new(ShardedCounter {
                target: self.inner.register_counter(key, metadata),
                slots: Default::default(),
            })
        });
        Counter::from_arc(counter.clone())
    }

    fn register_gauge(&self, key: &Key, metadata: &Metadata<'_>) -> Gauge {
        self.inner.register_gauge(key, metadata)
    }

    fn register_histogram(&self, key: &Key, metadata: &Metadata<'_>) -> Histogram {
        let mut histograms = lock(&self.series.histograms);
        let histogram = histograms.entry(key.clone()).or_insert_with(|| {
            Arc::new(ShardedHistogram {
                target: self.inner.register_histogram(key, metadata),
                slots: Default::default(),
            })
        });
        Histogram::from_arc(histogram.clone())
    }
}

/// This thread's slot, the same in every series.
fn slot() -> usize {
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    thread_local! {
        static SLOT: usize = NEXT.fetch_add(1, Ordering::Relaxed) % SLOTS;
    }
    SLOT.with(|slot| *slot)
}

/// A cache line of its own.
#[derive(Default)]
#[repr(align(64))]
struct Line<T>(T);

struct ShardedCounter {
    target: Counter,
    slots: [Line<AtomicU64>; SLOTS],
}

impl ShardedCounter {
    fn flush(&self) {
        let sum: u64 = self
            .slots
            .iter()
            .map(|slot| slot.0.swap(0, Ordering::Relaxed))
            .sum();
        if sum > 0 {
            self.target.increment(sum);
        }
    }
}

impl CounterFn for ShardedCounter {
    fn increment(&self, value: u64) {
        self.slots[slot()].0.fetch_add(value, Ordering::Relaxed);
    }

    fn absolute(&self, value: u64) {
        self.flush();
        self.target.absolute(value);
    }
}

struct ShardedHistogram {
    target: Histogram,
    slots: [Line<Mutex<Vec<f64>>>; SLOTS],
}

impl ShardedHistogram {
    fn flush(&self) {
        for slot in &self.slots {
            let values = std::mem::take(&mut *lock(&slot.0));
            values.into_iter().for_each(|v| self.target.record(v));
        }
    }
}

impl HistogramFn for ShardedHistogram {
    fn record(&self, value: f64) {
        lock(&self.slots[slot()].0).push(value);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use metrics_exporter_prometheus::PrometheusBuilder;

    fn series_value(text: &str, series: &str) -> Option<String> {
        text.lines()
            .find_map(|l| l.strip_prefix(series))
            .map(str::to_string)
    }

    /// Counts from many threads, through handles and through `counter!` at
    /// every call, all reach the rendered series, and a second scrape adds
    /// only what came after the first.
    #[test]
    fn every_count_from_every_thread_is_rendered_once() {
        let (recorder, handle) = ShardedRecorder::new(PrometheusBuilder::new().build_recorder());
        let recorder = &recorder;
        std::thread::scope(|s| {
            for t in 0..(SLOTS as u64 + 3) {
                s.spawn(move || {
                    metrics::with_local_recorder(recorder, || {
                        let kept = metrics::counter!("t_total", "k" => "a");
                        for _ in 0..1000 {
                            kept.increment(1);
                            metrics::counter!("t_total", "k" => "a").increment(t);
                            metrics::histogram!("t_seconds").record(0.001);
                        }
                    })
                });
            }
        });
        let n = SLOTS as u64 + 3;
        let expected = 1000 * n + 1000 * (n * (n - 1) / 2);
        let text = handle.render();
        assert_eq!(
            series_value(&text, "t_total{k=\"a\"} ").as_deref(),
            Some(expected.to_string().as_str()),
            "{text}"
        );
        assert!(
            text.lines()
                .any(|l| l == format!("t_seconds_count {}", 1000 * n)),
            "{text}"
        );
        metrics::with_local_recorder(recorder, || {
            metrics::counter!("t_total", "k" => "a").increment(5)
        });
        let text = handle.render();
        assert_eq!(
            series_value(&text, "t_total{k=\"a\"} ").as_deref(),
            Some((expected + 5).to_string().as_str())
        );
    }
}
