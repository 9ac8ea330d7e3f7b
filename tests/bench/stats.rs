//! The benchmark's arithmetic, pure and unit-tested: nearest-rank percentiles, lateness
//! summaries, and the per-(job, scheduled instant) tally that turns the handler executions a
//! worker saw into expected, delivered, missed and duplicate counts.

use std::collections::HashMap;
use std::ops::Range;

use serde::Serialize;

/// One handler execution as the worker saw it. Times are Unix microseconds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Execution {
    /// Index of the job (the `i` of the job name `<scenario>-<i>`).
    pub job: u32,
    /// The run.
    pub run_id: i64,
    /// The attempt, 1-based.
    pub attempt: u32,
    /// The instant the run was scheduled for.
    pub scheduled_us: i64,
    /// When the handler started, on the worker's wall clock.
    pub started_us: i64,
}

/// Nearest-rank percentile (`p` in 0–100) of ascending `sorted` values: the smallest value with
/// at least `p` % of all values at or below it. `None` for no values.
pub fn percentile(sorted: &[f64], p: f64) -> Option<f64> {
    let n = sorted.len();
    if n == 0 {
        return None;
    }
    let rank = (p / 100.0 * n as f64).ceil() as usize;
    Some(sorted[rank.clamp(1, n) - 1])
}

/// p50, p99 and max of a set of durations in milliseconds. An infinite value stands for
/// something that never happened (a run never delivered); a statistic that lands on one is
/// `None` ("not reached").
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct Summary {
    /// How many values.
    pub count: usize,
    /// Median.
    pub p50_ms: Option<f64>,
    /// 99th percentile (nearest rank).
    pub p99_ms: Option<f64>,
    /// Largest value.
    pub max_ms: Option<f64>,
}

impl Summary {
    /// Summarises `values` (any order).
    pub fn of(mut values: Vec<f64>) -> Summary {
        values.sort_by(f64::total_cmp);
        let finite = |v: Option<f64>| v.filter(|v| v.is_finite());
        Summary {
            count: values.len(),
            p50_ms: finite(percentile(&values, 50.0)),
            p99_ms: finite(percentile(&values, 99.0)),
            max_ms: finite(values.last().copied()),
        }
    }
}

/// Scheduled instants `k × period` since the epoch (how `every` schedules fire) within
/// `[start, end)`, in Unix microseconds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Window {
    /// First microsecond of the window.
    pub start_us: i64,
    /// First microsecond after the window.
    pub end_us: i64,
    /// The schedules' period.
    pub period_us: i64,
}

impl Window {
    /// How many instants of the schedule fall inside the window.
    pub fn instants(&self) -> u64 {
        let first = self.start_us.div_euclid(self.period_us)
            + i64::from(self.start_us.rem_euclid(self.period_us) != 0);
        let first = first * self.period_us;
        if first >= self.end_us {
            0
        } else {
            ((self.end_us - 1 - first) / self.period_us + 1) as u64
        }
    }

    /// Whether `t` is inside the window.
    pub fn contains(&self, t: i64) -> bool {
        (self.start_us..self.end_us).contains(&t)
    }

    /// Length of the window in seconds.
    pub fn seconds(&self) -> f64 {
        (self.end_us - self.start_us) as f64 / 1e6
    }
}

/// Executions counted per (job, scheduled instant) over a window.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct Tally {
    /// Jobs counted.
    pub jobs: u32,
    /// Scheduled instants per job in the window.
    pub instants_per_job: u64,
    /// `jobs × instants_per_job`.
    pub expected: u64,
    /// Distinct (job, instant) pairs of the window that were executed at least once.
    pub delivered: u64,
    /// `expected − delivered`.
    pub missed: u64,
    /// Executions beyond the first of each (job, instant).
    pub duplicates: u64,
    /// Executions in the window at an instant the schedule does not have (should be 0).
    pub unexpected: u64,
    /// Scheduled instant → first handler start, over the delivered pairs.
    pub lateness: Summary,
    /// The lateness of every delivered pair, in milliseconds (not serialised).
    #[serde(skip)]
    pub lateness_ms: Vec<f64>,
}

/// Counts `executions` of the jobs in `jobs` scheduled inside `window`.
pub fn tally(executions: &[Execution], jobs: Range<u32>, window: &Window) -> Tally {
    let mut first_start: HashMap<(u32, i64), (i64, u64)> = HashMap::new();
    let mut unexpected = 0;
    for e in executions {
        if !jobs.contains(&e.job) || !window.contains(e.scheduled_us) {
            continue;
        }
        if e.scheduled_us.rem_euclid(window.period_us) != 0 {
            unexpected += 1;
            continue;
        }
        let slot = first_start
            .entry((e.job, e.scheduled_us))
            .or_insert((e.started_us, 0));
        slot.0 = slot.0.min(e.started_us);
        slot.1 += 1;
    }
    let instants_per_job = window.instants();
    let job_count = jobs.end.saturating_sub(jobs.start);
    let expected = u64::from(job_count) * instants_per_job;
    let delivered = first_start.len() as u64;
    let duplicates = first_start.values().map(|(_, n)| n - 1).sum();
    let lateness_ms: Vec<f64> = first_start
        .iter()
        .map(|((_, scheduled), (started, _))| (started - scheduled) as f64 / 1000.0)
        .collect();
    Tally {
        jobs: job_count,
        instants_per_job,
        expected,
        delivered,
        missed: expected.saturating_sub(delivered),
        duplicates,
        unexpected,
        lateness: Summary::of(lateness_ms.clone()),
        lateness_ms,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: i64 = 1_000_000;

    fn exec(job: u32, scheduled_s: i64, late_ms: i64) -> Execution {
        Execution {
            job,
            run_id: 0,
            attempt: 1,
            scheduled_us: scheduled_s * S,
            started_us: scheduled_s * S + late_ms * 1000,
        }
    }

    #[test]
    fn percentiles_use_the_nearest_rank() {
        let values: Vec<f64> = (1..=100).map(f64::from).collect();
        assert_eq!(percentile(&values, 50.0), Some(50.0));
        assert_eq!(percentile(&values, 99.0), Some(99.0));
        assert_eq!(percentile(&values, 100.0), Some(100.0));
        assert_eq!(percentile(&values, 0.0), Some(1.0));
        assert_eq!(percentile(&[7.0], 99.0), Some(7.0));
        assert_eq!(percentile(&[], 50.0), None);
        // Ten values: the 99th percentile is the largest (rank ⌈9.9⌉ = 10), not an average.
        let ten: Vec<f64> = (1..=10).map(f64::from).collect();
        assert_eq!(percentile(&ten, 99.0), Some(10.0));
        assert_eq!(percentile(&ten, 50.0), Some(5.0));
    }

    #[test]
    fn a_summary_reports_unreached_percentiles_as_none() {
        let mut values = vec![1.0; 98];
        values.extend([f64::INFINITY, f64::INFINITY]);
        let summary = Summary::of(values);
        assert_eq!(summary.count, 100);
        assert_eq!(summary.p50_ms, Some(1.0));
        assert_eq!(summary.p99_ms, None, "the 99th value was never delivered");
        assert_eq!(summary.max_ms, None);
        assert_eq!(Summary::of(vec![]).p50_ms, None);
    }

    #[test]
    fn windows_count_the_instants_inside_them() {
        let w = |start, end, period| Window {
            start_us: start,
            end_us: end,
            period_us: period,
        };
        assert_eq!(w(10 * S, 20 * S, S).instants(), 10, "10, 11, …, 19");
        assert_eq!(w(10 * S + 1, 20 * S, S).instants(), 9, "11, …, 19");
        assert_eq!(w(10 * S, 20 * S + 1, S).instants(), 11, "10, …, 20");
        assert_eq!(w(10 * S, 10 * S, S).instants(), 0);
        assert_eq!(w(0, S, 10_000).instants(), 100, "every 10 ms for a second");
    }

    #[test]
    fn the_tally_counts_delivered_missed_and_duplicates_per_job_and_instant() {
        let window = Window {
            start_us: 100 * S,
            end_us: 103 * S,
            period_us: S,
        };
        let executions = vec![
            exec(0, 99, 1),  // before the window
            exec(0, 100, 3), // job 0: 100, 101 (twice), 102
            exec(0, 101, 5),
            exec(0, 101, 9),
            exec(0, 102, 2),
            exec(1, 100, 4), // job 1: 100 only; 101 and 102 missed
            exec(1, 103, 1), // after the window
            exec(2, 100, 1), // not a counted job
        ];
        let t = tally(&executions, 0..2, &window);
        assert_eq!(t.instants_per_job, 3);
        assert_eq!(t.expected, 6);
        assert_eq!(t.delivered, 4);
        assert_eq!(t.missed, 2);
        assert_eq!(t.duplicates, 1);
        assert_eq!(t.unexpected, 0);
        assert_eq!(t.lateness.count, 4);
        assert_eq!(
            t.lateness.max_ms,
            Some(5.0),
            "a duplicate's later start is not lateness"
        );
        assert_eq!(t.lateness.p50_ms, Some(3.0));
    }

    #[test]
    fn an_execution_off_the_schedule_is_counted_apart() {
        let window = Window {
            start_us: 0,
            end_us: 2 * S,
            period_us: S,
        };
        let mut odd = exec(0, 1, 0);
        odd.scheduled_us += 500_000;
        let t = tally(&[exec(0, 0, 1), exec(0, 1, 1), odd], 0..1, &window);
        assert_eq!((t.delivered, t.missed, t.unexpected), (2, 0, 1));
    }
}
