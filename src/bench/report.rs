//! Latency recording and the report `ferrovol bench` prints: p50/p90/p99/max per RPC,
//! errors by gRPC code, throughput, as a table or as JSON.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::Mutex;
use std::time::Duration;

use serde::Serialize;

/// Latencies and errors of one kind of call (an RPC, or a whole iteration).
#[derive(Debug, Default)]
struct Samples {
    /// Latency of every successful call, in microseconds.
    micros: Vec<u64>,
    /// Failed calls by gRPC code name (or `CHECK` for a response that failed a check).
    errors: BTreeMap<String, u64>,
    /// The first few error messages, to show what went wrong.
    examples: Vec<String>,
}

/// How many error messages a report keeps per call kind.
const MAX_EXAMPLES: usize = 3;

/// Latencies and errors of every call of one run, shared by its workers.
#[derive(Debug, Default)]
pub struct Recorder {
    /// By call name, in first-seen order of names sorted alphabetically.
    calls: Mutex<BTreeMap<&'static str, Samples>>,
}

impl Recorder {
    fn calls(&self) -> std::sync::MutexGuard<'_, BTreeMap<&'static str, Samples>> {
        self.calls.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Records a successful call.
    pub fn ok(&self, call: &'static str, took: Duration) {
        let micros = u64::try_from(took.as_micros()).unwrap_or(u64::MAX);
        self.calls().entry(call).or_default().micros.push(micros);
    }

    /// Records a failed call.
    pub fn error(&self, call: &'static str, code: &str, message: &str) {
        let mut calls = self.calls();
        let samples = calls.entry(call).or_default();
        *samples.errors.entry(code.to_owned()).or_default() += 1;
        if samples.examples.len() < MAX_EXAMPLES {
            samples.examples.push(message.chars().take(300).collect());
        }
    }

    /// The total number of failed calls so far.
    pub fn error_count(&self) -> u64 {
        self.calls()
            .values()
            .map(|s| s.errors.values().sum::<u64>())
            .sum()
    }

    /// Percentiles of everything recorded.
    pub fn summary(&self) -> Vec<CallSummary> {
        self.calls()
            .iter()
            .map(|(name, samples)| CallSummary::of(name, samples))
            .collect()
    }
}

/// Latency figures of one call kind.
#[derive(Debug, Clone, Serialize)]
pub struct CallSummary {
    /// The RPC name (`CreateVolume`), or `cycle` for a whole iteration.
    pub call: String,
    /// Successful calls.
    pub count: u64,
    /// Failed calls.
    pub errors: u64,
    /// Failed calls by gRPC code.
    pub error_codes: BTreeMap<String, u64>,
    /// A few error messages.
    pub error_examples: Vec<String>,
    /// Median latency, milliseconds.
    pub p50_ms: f64,
    /// 90th percentile, milliseconds.
    pub p90_ms: f64,
    /// 99th percentile, milliseconds.
    pub p99_ms: f64,
    /// Slowest call, milliseconds.
    pub max_ms: f64,
    /// Mean latency, milliseconds.
    pub mean_ms: f64,
}

/// The nearest-rank percentile `p` (0..=100) of sorted samples.
pub fn percentile(sorted: &[u64], p: u32) -> u64 {
    if sorted.is_empty() {
        return 0;
    }
    let n = sorted.len();
    // Nearest rank: the smallest value with at least p% of the samples at or below it.
    let rank = (n * p as usize).div_ceil(100).clamp(1, n);
    sorted[rank - 1]
}

#[allow(clippy::cast_precision_loss)]
fn ms(micros: u64) -> f64 {
    micros as f64 / 1000.0
}

impl CallSummary {
    fn of(name: &str, samples: &Samples) -> Self {
        let mut sorted = samples.micros.clone();
        sorted.sort_unstable();
        let count = sorted.len() as u64;
        let total: u64 = sorted.iter().sum();
        CallSummary {
            call: name.to_owned(),
            count,
            errors: samples.errors.values().sum(),
            error_codes: samples.errors.clone(),
            error_examples: samples.examples.clone(),
            p50_ms: ms(percentile(&sorted, 50)),
            p90_ms: ms(percentile(&sorted, 90)),
            p99_ms: ms(percentile(&sorted, 99)),
            max_ms: ms(sorted.last().copied().unwrap_or(0)),
            mean_ms: ms(total.checked_div(count).unwrap_or(0)),
        }
    }
}

/// One measured run: a scenario with one set of parameters.
#[derive(Debug, Clone, Serialize)]
pub struct RunReport {
    /// `create-delete`, `node-cycle`, `snapshot` or `mixed`.
    pub scenario: String,
    /// What varies between runs of a scenario (`fs_type=ext4`, ...), empty when nothing.
    pub variant: String,
    /// Iterations asked for.
    pub iterations: u64,
    /// Iterations that ran to their end without an error.
    pub completed: u64,
    /// Workers running at once.
    pub concurrency: u64,
    /// Volumes that existed (made by the bench) while it measured.
    pub preexisting_volumes: u64,
    /// Wall time of the measured part, seconds.
    pub wall_seconds: f64,
    /// Completed iterations per second.
    pub iterations_per_second: f64,
    /// What one iteration is (`CreateVolume+DeleteVolume pair`, ...).
    pub iteration_unit: String,
    /// Failed calls in all.
    pub errors: u64,
    /// Per RPC, plus `cycle` for whole iterations.
    pub calls: Vec<CallSummary>,
}

/// Everything `ferrovol bench` measured.
#[derive(Debug, Clone, Serialize)]
pub struct Report {
    /// The endpoint measured.
    pub endpoint: String,
    /// The driver's name and version (GetPluginInfo).
    pub driver: String,
    /// The runs, in order.
    pub runs: Vec<RunReport>,
    /// Errors in all runs and in the clean-up.
    pub errors: u64,
    /// Whether the run was interrupted (Ctrl-C).
    pub interrupted: bool,
    /// What the clean-up could not remove (volumes, snapshots, mounts, directories).
    pub leftovers: Vec<String>,
}

impl Report {
    /// The report as aligned text.
    pub fn table(&self) -> String {
        let mut out = String::new();
        let _ = writeln!(out, "driver {} at {}", self.driver, self.endpoint);
        for run in &self.runs {
            let variant = if run.variant.is_empty() {
                String::new()
            } else {
                format!(" ({})", run.variant)
            };
            let _ = writeln!(
                out,
                "\n{}{variant}: {} of {} iterations in {:.3} s at concurrency {}, {} volumes present: \
                 {:.1} {}/s, {} errors",
                run.scenario,
                run.completed,
                run.iterations,
                run.wall_seconds,
                run.concurrency,
                run.preexisting_volumes,
                run.iterations_per_second,
                run.iteration_unit,
                run.errors
            );
            let _ = writeln!(
                out,
                "  {:<28} {:>7} {:>6} {:>9} {:>9} {:>9} {:>9}",
                "call", "count", "errors", "p50 ms", "p90 ms", "p99 ms", "max ms"
            );
            for c in &run.calls {
                let _ = writeln!(
                    out,
                    "  {:<28} {:>7} {:>6} {:>9.3} {:>9.3} {:>9.3} {:>9.3}",
                    c.call, c.count, c.errors, c.p50_ms, c.p90_ms, c.p99_ms, c.max_ms
                );
                for (code, n) in &c.error_codes {
                    let _ = writeln!(out, "    {n} x {code}");
                }
                for example in &c.error_examples {
                    let _ = writeln!(out, "    e.g. {example}");
                }
            }
        }
        if self.interrupted {
            let _ = writeln!(
                out,
                "\ninterrupted: the figures cover what ran before Ctrl-C"
            );
        }
        if self.leftovers.is_empty() {
            let _ = writeln!(out, "\ncleaned up: nothing left behind");
        } else {
            let _ = writeln!(out, "\nNOT cleaned up ({}):", self.leftovers.len());
            for l in &self.leftovers {
                let _ = writeln!(out, "  {l}");
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nearest_rank_percentiles() {
        let sorted: Vec<u64> = (1..=100).collect();
        assert_eq!(percentile(&sorted, 50), 50);
        assert_eq!(percentile(&sorted, 90), 90);
        assert_eq!(percentile(&sorted, 99), 99);
        assert_eq!(percentile(&sorted, 100), 100);
        assert_eq!(percentile(&[7], 50), 7);
        assert_eq!(percentile(&[1, 2], 50), 1);
        assert_eq!(percentile(&[1, 2], 99), 2);
        assert_eq!(percentile(&[], 50), 0);
    }

    #[test]
    fn recorder_counts_successes_and_errors_per_call() {
        let r = Recorder::default();
        r.ok("CreateVolume", Duration::from_micros(1500));
        r.ok("CreateVolume", Duration::from_micros(500));
        r.error("CreateVolume", "RESOURCE_EXHAUSTED", "full");
        r.ok("DeleteVolume", Duration::from_micros(250));
        assert_eq!(r.error_count(), 1);
        let s = r.summary();
        assert_eq!(s.len(), 2);
        assert_eq!(s[0].call, "CreateVolume");
        assert_eq!((s[0].count, s[0].errors), (2, 1));
        assert!((s[0].p50_ms - 0.5).abs() < 1e-9 && (s[0].max_ms - 1.5).abs() < 1e-9);
        assert_eq!(s[0].error_codes.get("RESOURCE_EXHAUSTED"), Some(&1));
        assert_eq!((s[1].count, s[1].errors), (1, 0));
    }
}
