//! A progress bar on stderr for long runs, drawn only when stderr is a terminal (so logs
//! and pipes stay clean).

use std::io::{IsTerminal, Write};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Runs shorter than this draw no bar.
const MIN_ITERATIONS: u64 = 20;
/// How often the bar is redrawn.
const TICK: Duration = Duration::from_millis(200);
/// Width of the bar in characters.
const WIDTH: u64 = 30;

/// Counts finished iterations and, on a terminal, draws them.
#[derive(Debug)]
pub struct Progress {
    /// Iterations finished (with or without error).
    done: Arc<AtomicU64>,
    /// Tells the drawing task to stop.
    stop: Arc<AtomicBool>,
    /// The drawing task, when there is one.
    task: Option<tokio::task::JoinHandle<()>>,
}

impl Progress {
    /// Starts counting towards `total`; draws `label` and a bar when stderr is a terminal.
    pub fn start(label: &str, total: u64) -> Self {
        let done = Arc::new(AtomicU64::new(0));
        let stop = Arc::new(AtomicBool::new(false));
        let task = (total >= MIN_ITERATIONS && std::io::stderr().is_terminal()).then(|| {
            let done = Arc::clone(&done);
            let stop = Arc::clone(&stop);
            let label = label.to_owned();
            tokio::spawn(async move {
                let started = Instant::now();
                while !stop.load(Ordering::Relaxed) {
                    draw(
                        &label,
                        done.load(Ordering::Relaxed),
                        total,
                        started.elapsed(),
                    );
                    tokio::time::sleep(TICK).await;
                }
                draw(
                    &label,
                    done.load(Ordering::Relaxed),
                    total,
                    started.elapsed(),
                );
                eprintln!();
            })
        });
        Progress { done, stop, task }
    }

    /// One more iteration finished.
    pub fn tick(&self) {
        self.done.fetch_add(1, Ordering::Relaxed);
    }

    /// Stops drawing (the last state stays on screen).
    pub async fn finish(mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(task) = self.task.take() {
            let _ = task.await;
        }
    }
}

fn draw(label: &str, done: u64, total: u64, elapsed: Duration) {
    let filled = (done.min(total) * WIDTH)
        .checked_div(total)
        .unwrap_or(WIDTH);
    let rate = if elapsed.as_secs_f64() > 0.0 {
        #[allow(clippy::cast_precision_loss)]
        let r = done as f64 / elapsed.as_secs_f64();
        r
    } else {
        0.0
    };
    let bar: String = (0..WIDTH)
        .map(|i| if i < filled { '#' } else { '.' })
        .collect();
    let mut err = std::io::stderr().lock();
    let _ = write!(err, "\r{label} [{bar}] {done}/{total} {rate:.0}/s ");
    let _ = err.flush();
}
