//! What a scenario hands back: its settings, typed results (for JSON and the smoke tests) and
//! the rows of the human-readable table, each with the §6 target it is judged against.

use comfy_table::presets::UTF8_FULL_CONDENSED;
use comfy_table::{Cell, Table};
use serde::Serialize;

use crate::stats::Summary;

/// One scenario's outcome.
#[derive(Debug, Serialize)]
pub struct Report {
    /// `precision`, `throughput`, `scale`, `failover` or `crash`.
    pub scenario: &'static str,
    /// The parameters it ran with.
    pub settings: serde_json::Value,
    /// Its measurements, scenario-specific (see docs/benchmarks.md).
    pub results: serde_json::Value,
    /// The table rows, also in JSON.
    pub table: Vec<Row>,
    /// Whether every correctness check (delivered, missed, duplicates, rerun) passed.
    pub correct: bool,
    /// How to read the numbers.
    pub notes: Vec<String>,
}

/// One line of a report's table.
#[derive(Debug, Clone, Serialize)]
pub struct Row {
    /// What is measured.
    pub metric: String,
    /// The measurement, with its unit.
    pub value: String,
    /// The target from PRODUCT.md §6, if there is one.
    pub target: Option<String>,
    /// Whether the target was met.
    pub met: Option<bool>,
}

impl Row {
    /// A row without a target.
    pub fn info(metric: impl Into<String>, value: impl Into<String>) -> Row {
        Row {
            metric: metric.into(),
            value: value.into(),
            target: None,
            met: None,
        }
    }

    /// A row judged against `target`.
    pub fn judged(
        metric: impl Into<String>,
        value: impl Into<String>,
        target: impl Into<String>,
        met: bool,
    ) -> Row {
        Row {
            metric: metric.into(),
            value: value.into(),
            target: Some(target.into()),
            met: Some(met),
        }
    }
}

impl Report {
    /// The report as a table with a title line, for a terminal.
    pub fn render(&self) -> String {
        let mut table = Table::new();
        table
            .load_style(UTF8_FULL_CONDENSED)
            .set_header(vec!["metric", "value", "target", "met"]);
        for row in &self.table {
            table.add_row(vec![
                Cell::new(&row.metric),
                Cell::new(&row.value),
                Cell::new(row.target.as_deref().unwrap_or("")),
                Cell::new(match row.met {
                    Some(true) => "yes",
                    Some(false) => "NO",
                    None => "",
                }),
            ]);
        }
        let mut out = format!("== {} {}\n{table}\n", self.scenario, self.settings);
        for note in &self.notes {
            out.push_str(&format!("  note: {note}\n"));
        }
        out
    }
}

/// `12.3 ms`, or `not reached` for a statistic that landed on a missing value.
pub fn ms(value: Option<f64>) -> String {
    match value {
        Some(v) if v.abs() >= 100.0 => format!("{v:.0} ms"),
        Some(v) => format!("{v:.1} ms"),
        None => "not reached".to_owned(),
    }
}

/// `p50 1.2 ms · p99 8.0 ms · max 12 ms`.
pub fn summary(s: &Summary) -> String {
    format!(
        "p50 {} · p99 {} · max {}",
        ms(s.p50_ms),
        ms(s.p99_ms),
        ms(s.max_ms)
    )
}

/// `12.5 %` of `part` in `whole`.
pub fn share(part: u64, whole: u64) -> String {
    if whole == 0 {
        return "n/a".to_owned();
    }
    format!("{:.2} %", part as f64 * 100.0 / whole as f64)
}
