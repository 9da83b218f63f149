//! Medians of samples and the figures' text: milliseconds, MiB, ratios.

use std::time::Duration;

pub(crate) fn median(mut samples: Vec<Duration>) -> Duration {
    samples.sort_unstable();
    samples.get(samples.len() / 2).copied().unwrap_or_default()
}

pub(crate) fn ms(duration: Duration) -> String {
    format!("{:.3} ms", duration.as_secs_f64() * 1000.0)
}

pub(crate) fn mib(kib: u64) -> String {
    format!("{:.2} MiB", kib as f64 / 1024.0)
}

pub(crate) fn ratio_text(measured: Duration, baseline: Duration) -> String {
    format!("{:.2}×", measured.as_secs_f64() / baseline.as_secs_f64())
}
