//! A job's timing fields in job files and API bodies: `jitter`, `start_at`, `end_at` and
//! `max_runs`, each accepted form with the job it builds and each mistake with its message.

use std::time::Duration;

use chrono::DateTime;
use serde_json::json;

use super::tests_kinds::{job, mistakes, with};

#[test]
fn timing_fields_build_the_job_and_read_back_from_its_stored_form() {
    let spec = job(with(json!({
        "schedule": "0 0 * * *",
        "jitter": "5m",
        "start_at": "2027-01-01T00:00:00+08:00",
        "end_at": "2027-12-31T00:00:00Z",
        "max_runs": 10,
    })));
    assert_eq!(spec.jitter, Some(Duration::from_secs(300)));
    assert_eq!(
        spec.start_at,
        Some(DateTime::parse_from_rfc3339("2027-01-01T00:00:00+08:00").unwrap())
    );
    assert_eq!(spec.max_runs, Some(10));
    let stored = serde_json::to_value(&spec).unwrap();
    assert_eq!(stored["jitter"], "5m");
    assert_eq!(stored["max_runs"], 10);
    let read: crate::job::JobSpec = serde_json::from_value(stored).unwrap();
    assert_eq!(read, spec);
    // Without them nothing is stored, so definitions from before read and store as they did.
    let plain = serde_json::to_value(job(with(json!({"every": "1m"})))).unwrap();
    for field in ["jitter", "start_at", "end_at", "max_runs"] {
        assert!(plain.get(field).is_none(), "{field} stored: {plain}");
    }
}

#[test]
fn each_timing_mistake_names_the_field_the_value_and_the_fix() {
    let cases = [
        (
            json!({"schedule": "0 0 * * *", "jitter": "2h"}),
            "jitter = \"2h\": too long: jitter is at most 1h; write a duration up to \"1h\"",
        ),
        (
            json!({"schedule": "0 0 * * *", "jitter": "0s"}),
            "jitter = \"0s\": must be longer than 0s; remove the field for fires at their exact \
             instants",
        ),
        (
            json!({"every": "5m", "jitter": "10m"}),
            "is longer than the 5m between two fires",
        ),
        (
            json!({"schedule": "*/10 * * * *", "jitter": "11m"}),
            "is longer than the 10m between two fires",
        ),
        (
            json!({"jitter": "1m"}),
            "jitter = \"1m\": applies to scheduled fires, and a job without \"schedule\", \
             \"every\" or \"at\" has none; remove it, or give the job a schedule",
        ),
        (
            json!({"max_runs": 3}),
            "max_runs = 3: applies to scheduled fires",
        ),
        (
            json!({"every": "1m", "max_runs": 0}),
            "max_runs = 0: too small: the least is 1; use a whole number from 1 to 1000000000",
        ),
        (
            json!({"every": "1m", "start_at": "2027-01-02T00:00:00Z", "end_at": "2027-01-01T00:00:00Z"}),
            "end_at = \"2027-01-01T00:00:00Z\": is not after start_at (2027-01-02T00:00:00+00:00), \
             so the schedule would never fire; put end_at after start_at",
        ),
        (
            json!({"schedule": "0 0 1 * *", "start_at": "2027-01-02T00:00:00Z", "end_at": "2027-01-20T00:00:00Z"}),
            "end_at = \"2027-01-20T00:00:00Z\": leaves no fire of the schedule in the window",
        ),
        (
            json!({"every": "1m", "start_at": "2027-01-02"}),
            "start_at = \"2027-01-02\": a date alone is not an instant; add a time and a UTC \
             offset, such as \"2027-01-02T00:00:00Z\"",
        ),
        (
            json!({"every": "1m", "end_at": "2027-01-02T10:00:00"}),
            "end_at = \"2027-01-02T10:00:00\": no UTC offset, so the instant is ambiguous",
        ),
    ];
    for (fields, expected) in cases {
        let got = mistakes(with(fields.clone()));
        assert!(
            got.len() == 1 && got[0].contains(expected),
            "{fields}: expected one mistake containing {expected:?}, got {got:#?}"
        );
    }
}

#[test]
fn a_quartz_year_field_wholly_in_the_past_is_rejected_with_the_fix() {
    let got = mistakes(with(json!({"schedule": "0 0 9 * * ? 2020-2024"})));
    let year = chrono::Datelike::year(&chrono::Utc::now());
    assert_eq!(
        got,
        vec![format!(
            "schedule = \"0 0 9 * * ? 2020-2024\": invalid cron expression: its year field \
             allows no year from {year} on, so it would never fire again; widen the year field \
             (such as {year}-{}) or remove it",
            year + 4
        )]
    );
    // A year field reaching this year or later is fine.
    job(with(
        json!({"schedule": format!("0 0 9 * * ? 2020-{}", year + 1)}),
    ));
}

#[test]
fn a_window_that_ended_is_no_mistake_and_a_one_shot_takes_any_jitter() {
    // A schedule whose end_at has passed has ended; its job file stays loadable.
    let ended = job(with(
        json!({"every": "1m", "end_at": "2020-01-01T00:00:00Z"}),
    ));
    let timing = ended.timing().unwrap();
    assert_eq!(timing.next_after(chrono::Utc::now()), None);
    assert_eq!(
        ended.why_no_fires(&timing, chrono::Utc::now(), 0),
        "its end_at has passed"
    );
    // A one-shot has no next fire to stay before.
    job(with(json!({"at": "2030-01-01T00:00:00Z", "jitter": "1h"})));
    // Weekdays at 09:00: the shortest gap is a day, so 1h is fine.
    job(with(json!({"schedule": "0 9 * * 1-5", "jitter": "1h"})));
}

#[test]
fn max_runs_bounds_the_listed_fires_by_what_the_schedule_has_made() {
    let spec = job(with(json!({"every": "1h", "max_runs": 3})));
    let timing = spec.timing().unwrap();
    let now = chrono::Utc::now();
    assert_eq!(spec.upcoming(&timing, now, 5, 0).len(), 3);
    assert_eq!(spec.upcoming(&timing, now, 5, 2).len(), 1);
    assert!(spec.upcoming(&timing, now, 5, 3).is_empty());
    assert_eq!(
        spec.why_no_fires(&timing, now, 3),
        "its schedule has made its max_runs fires"
    );
}
