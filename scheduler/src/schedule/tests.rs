//! Schedule tests: dialect and DST tables on real transition days, and property tests against a
//! brute-force oracle that applies the DST rule in instant space.

use super::*;
use chrono::{Datelike, LocalResult, Offset as _, TimeDelta, TimeZone, Timelike, Weekday};
use proptest::prelude::*;
use std::sync::OnceLock;

fn utc(s: &str) -> DateTime<Utc> {
    DateTime::parse_from_rfc3339(s)
        .unwrap_or_else(|e| panic!("{s}: {e}"))
        .to_utc()
}

fn zone(name: &str) -> Tz {
    name.parse().unwrap_or_else(|e| panic!("{name}: {e}"))
}

fn cron(expr: &str, tz: &str) -> Schedule {
    Schedule::cron(expr, zone(tz)).unwrap_or_else(|e| panic!("{e}"))
}

/// Asserts the next `expected.len()` fires of `expr` in `tz` after `after`.
fn assert_upcoming(expr: &str, tz: &str, after: &str, expected: &[&str]) {
    let got = cron(expr, tz).upcoming(utc(after), expected.len());
    let want: Vec<DateTime<Utc>> = expected.iter().map(|s| utc(s)).collect();
    assert_eq!(got, want, "{expr:?} in {tz} after {after}");
}

#[test]
fn unix_weekdays_1_to_5_fire_monday_to_friday_at_nine_only() {
    for tz in ["UTC", "Europe/Berlin", "America/New_York"] {
        for expr in [
            "0 9 * * 1-5",
            "0 9 * * MON-FRI",
            "0 0 9 * * 1-5",
            "0 0 9 ? * 2-6",
            "0 0 9 ? * MON-FRI *",
        ] {
            let fires = cron(expr, tz).upcoming(utc("2026-01-01T00:00:00Z"), 8 * 5);
            let mut per_day = [0; 7];
            for f in &fires {
                let local = f.with_timezone(&zone(tz));
                assert_eq!(
                    (local.hour(), local.minute(), local.second()),
                    (9, 0, 0),
                    "{expr} {tz} {f}"
                );
                per_day[local.weekday().num_days_from_monday() as usize] += 1;
            }
            // 8 weeks: each of Monday..Friday exactly 8 times, never Saturday or Sunday.
            assert_eq!(per_day, [8, 8, 8, 8, 8, 0, 0], "{expr} in {tz}");
        }
    }
}

#[test]
fn unix_weekday_0_and_7_are_sunday() {
    for expr in [
        "0 9 * * 0",
        "0 9 * * 7",
        "0 9 * * SUN",
        "0 0 9 * * 0",
        "0 0 9 * * 7",
        "0 0 9 ? * 1",
        "0 0 9 ? * SUN",
    ] {
        let fires = cron(expr, "UTC").upcoming(utc("2026-06-01T00:00:00Z"), 10);
        assert_eq!(fires.len(), 10);
        assert!(
            fires
                .iter()
                .all(|f| f.weekday() == Weekday::Sun && f.hour() == 9),
            "{expr}: {fires:?}"
        );
        assert_eq!(fires[0], utc("2026-06-07T09:00:00Z"), "{expr}");
    }
}

#[test]
fn dialect_tables() {
    // (expression, zone, after, next fires)
    let cases: &[(&str, &str, &str, &[&str])] = &[
        // 5-field Unix: 2026-06-06 is a Saturday.
        (
            "0 9 * * 1-5",
            "UTC",
            "2026-06-06T00:00:00Z",
            &[
                "2026-06-08T09:00:00Z",
                "2026-06-09T09:00:00Z",
                "2026-06-10T09:00:00Z",
                "2026-06-11T09:00:00Z",
                "2026-06-12T09:00:00Z",
                "2026-06-15T09:00:00Z",
            ][..],
        ),
        (
            "*/15 * * * *",
            "UTC",
            "2026-06-06T10:07:00Z",
            &[
                "2026-06-06T10:15:00Z",
                "2026-06-06T10:30:00Z",
                "2026-06-06T10:45:00Z",
                "2026-06-06T11:00:00Z",
            ],
        ),
        (
            "5/20 8-9 * * *",
            "UTC",
            "2026-06-06T00:00:00Z",
            &[
                "2026-06-06T08:05:00Z",
                "2026-06-06T08:25:00Z",
                "2026-06-06T08:45:00Z",
                "2026-06-06T09:05:00Z",
            ],
        ),
        (
            "0 0 1 JAN,jul *",
            "UTC",
            "2026-06-06T00:00:00Z",
            &["2026-07-01T00:00:00Z", "2027-01-01T00:00:00Z"],
        ),
        (
            "0 22 * * FRI-SUN",
            "UTC",
            "2026-06-04T00:00:00Z",
            &[
                "2026-06-05T22:00:00Z",
                "2026-06-06T22:00:00Z",
                "2026-06-07T22:00:00Z",
                "2026-06-12T22:00:00Z",
            ],
        ),
        (
            "0 9 * * 1",
            "Asia/Shanghai",
            "2026-06-01T00:00:00Z",
            &["2026-06-01T01:00:00Z", "2026-06-08T01:00:00Z"],
        ),
        // 6-field with seconds, Unix weekdays.
        (
            "30 0 9 * * 1-5",
            "UTC",
            "2026-06-06T00:00:00Z",
            &["2026-06-08T09:00:30Z", "2026-06-09T09:00:30Z"],
        ),
        (
            "*/20 * * * * *",
            "UTC",
            "2026-06-06T10:00:05.5Z",
            &[
                "2026-06-06T10:00:20Z",
                "2026-06-06T10:00:40Z",
                "2026-06-06T10:01:00Z",
            ],
        ),
        (
            "0 */2 * * * *",
            "Asia/Shanghai",
            "2026-06-06T10:01:00Z",
            &["2026-06-06T10:02:00Z", "2026-06-06T10:04:00Z"],
        ),
        // Quartz: 1 = Sunday, `?`, year.
        (
            "0 0 9 ? * 2-6",
            "UTC",
            "2026-06-06T00:00:00Z",
            &["2026-06-08T09:00:00Z", "2026-06-09T09:00:00Z"],
        ),
        (
            "0 0 9 ? * 7",
            "UTC",
            "2026-06-01T00:00:00Z",
            &["2026-06-06T09:00:00Z", "2026-06-13T09:00:00Z"],
        ),
        (
            "0 15 10 15 * ?",
            "UTC",
            "2026-06-01T00:00:00Z",
            &["2026-06-15T10:15:00Z", "2026-07-15T10:15:00Z"],
        ),
        (
            "0 0 12 1 1 ? 2027",
            "UTC",
            "2026-06-01T00:00:00Z",
            &["2027-01-01T12:00:00Z"],
        ),
        (
            "0 0/30 8 * * ?",
            "UTC",
            "2026-06-01T00:00:00Z",
            &[
                "2026-06-01T08:00:00Z",
                "2026-06-01T08:30:00Z",
                "2026-06-02T08:00:00Z",
            ],
        ),
        // Macros.
        (
            "@yearly",
            "UTC",
            "2026-06-06T00:00:00Z",
            &["2027-01-01T00:00:00Z", "2028-01-01T00:00:00Z"],
        ),
        (
            "@annually",
            "UTC",
            "2026-06-06T00:00:00Z",
            &["2027-01-01T00:00:00Z"],
        ),
        (
            "@monthly",
            "UTC",
            "2026-06-06T00:00:00Z",
            &["2026-07-01T00:00:00Z", "2026-08-01T00:00:00Z"],
        ),
        (
            "@weekly",
            "UTC",
            "2026-06-01T00:00:00Z",
            &["2026-06-07T00:00:00Z", "2026-06-14T00:00:00Z"],
        ),
        (
            "@daily",
            "Europe/Berlin",
            "2026-06-06T00:00:00Z",
            &["2026-06-06T22:00:00Z", "2026-06-07T22:00:00Z"],
        ),
        (
            "@midnight",
            "UTC",
            "2026-06-06T00:00:00Z",
            &["2026-06-07T00:00:00Z"],
        ),
        (
            "@hourly",
            "UTC",
            "2026-06-06T00:00:00Z",
            &["2026-06-06T01:00:00Z", "2026-06-06T02:00:00Z"],
        ),
        // Vixie: both day fields restricted = either matches (the 10th, or Mondays).
        (
            "0 9 10 * 1",
            "UTC",
            "2026-06-01T10:00:00Z",
            &[
                "2026-06-08T09:00:00Z",
                "2026-06-10T09:00:00Z",
                "2026-06-15T09:00:00Z",
                "2026-06-22T09:00:00Z",
                "2026-06-29T09:00:00Z",
                "2026-07-06T09:00:00Z",
                "2026-07-10T09:00:00Z",
                "2026-07-13T09:00:00Z",
            ],
        ),
        // Vixie: a field starting with `*` = both must match (odd days that are Mondays).
        (
            "0 9 */2 * 1",
            "UTC",
            "2026-06-01T10:00:00Z",
            &[
                "2026-06-15T09:00:00Z",
                "2026-06-29T09:00:00Z",
                "2026-07-13T09:00:00Z",
                "2026-07-27T09:00:00Z",
            ],
        ),
        (
            "0 9 13 * *",
            "UTC",
            "2026-06-01T00:00:00Z",
            &["2026-06-13T09:00:00Z", "2026-07-13T09:00:00Z"],
        ),
        (
            "0 0 29 2 *",
            "UTC",
            "2026-01-01T00:00:00Z",
            &["2028-02-29T00:00:00Z", "2032-02-29T00:00:00Z"],
        ),
    ];
    for (expr, tz, after, want) in cases {
        assert_upcoming(expr, tz, after, want);
    }
}

#[test]
fn cron_crate_receives_explicit_lists_in_its_own_numbering() {
    let Schedule::Cron(c) = cron("0 9 * * 1-5", "UTC") else {
        unreachable!()
    };
    assert_eq!(c.normalised(), ["0 0 9 * * 2,3,4,5,6 *"]);
    assert_eq!(c.dialect(), CronDialect::Unix);
    let Schedule::Cron(c) = cron("0 9 10 * 1", "UTC") else {
        unreachable!()
    };
    assert_eq!(c.normalised(), ["0 0 9 10 * * *", "0 0 9 * * 2 *"]);
}

#[test]
fn quartz_schedule_past_its_last_year_never_fires_again() {
    let s = cron("0 0 12 1 1 ? 2027", "UTC");
    assert_eq!(s.next_after(utc("2027-01-01T12:00:00Z")), None);
}

#[test]
fn cron_error_display_names_expression_problem_and_fix() {
    let err = Schedule::cron("0 9 * * 8", Tz::UTC).unwrap_err();
    assert_eq!(
        err.to_string(),
        "invalid cron expression \"0 9 * * 8\": day-of-week 8 is out of range 0-7 (0 and 7 are Sunday)"
    );
    let err = Schedule::cron("0 9 * *", Tz::UTC).unwrap_err();
    assert_eq!(
        err.to_string(),
        "invalid cron expression \"0 9 * *\": it has 4 fields; write 5 fields (minute hour \
         day-of-month month day-of-week), 6 (second minute hour day-of-month month day-of-week), \
         7 (Quartz: second minute hour day-of-month month day-of-week year), or a macro such as @daily"
    );
    assert!(matches!(err, ScheduleError::Cron { ref expr, .. } if expr == "0 9 * *"));
}

/// DST: (expression, zone, after, next fires), on real 2026 transition days.
#[test]
fn dst_tables_on_real_transition_days() {
    let cases: &[(&str, &str, &str, &[&str])] = &[
        // New York, spring forward 2026-03-08: 02:00 EST -> 03:00 EDT at 07:00Z.
        (
            "30 2 * * *",
            "America/New_York",
            "2026-03-07T12:00:00Z",
            &["2026-03-08T07:00:00Z", "2026-03-09T06:30:00Z"][..],
        ),
        (
            "0 2 * * *",
            "America/New_York",
            "2026-03-07T12:00:00Z",
            &["2026-03-08T07:00:00Z", "2026-03-09T06:00:00Z"],
        ),
        (
            "0 2,3 * * *",
            "America/New_York",
            "2026-03-08T00:00:00Z",
            &[
                "2026-03-08T07:00:00Z",
                "2026-03-09T06:00:00Z",
                "2026-03-09T07:00:00Z",
            ],
        ),
        (
            "*/15 * * * *",
            "America/New_York",
            "2026-03-08T06:40:00Z",
            &[
                "2026-03-08T06:45:00Z",
                "2026-03-08T07:00:00Z",
                "2026-03-08T07:15:00Z",
                "2026-03-08T07:30:00Z",
            ],
        ),
        (
            "* * * * *",
            "America/New_York",
            "2026-03-08T06:58:00Z",
            &[
                "2026-03-08T06:59:00Z",
                "2026-03-08T07:00:00Z",
                "2026-03-08T07:01:00Z",
            ],
        ),
        (
            "*/20 * * * * *",
            "America/New_York",
            "2026-03-08T06:59:30Z",
            &[
                "2026-03-08T06:59:40Z",
                "2026-03-08T07:00:00Z",
                "2026-03-08T07:00:20Z",
            ],
        ),
        (
            "0 30 2 ? * SUN",
            "America/New_York",
            "2026-03-07T12:00:00Z",
            &["2026-03-08T07:00:00Z", "2026-03-15T06:30:00Z"],
        ),
        // New York, fall back 2026-11-01: 02:00 EDT -> 01:00 EST at 06:00Z; 01:00-02:00 twice.
        (
            "30 1 * * *",
            "America/New_York",
            "2026-10-31T12:00:00Z",
            &["2026-11-01T05:30:00Z", "2026-11-02T06:30:00Z"],
        ),
        (
            "0 30 1 ? * * *",
            "America/New_York",
            "2026-10-31T12:00:00Z",
            &["2026-11-01T05:30:00Z", "2026-11-02T06:30:00Z"],
        ),
        (
            "0 1 * * *",
            "America/New_York",
            "2026-11-01T04:30:00Z",
            &["2026-11-01T05:00:00Z", "2026-11-02T06:00:00Z"],
        ),
        (
            "0,30 1 * * *",
            "America/New_York",
            "2026-11-01T04:30:00Z",
            &[
                "2026-11-01T05:00:00Z",
                "2026-11-01T05:30:00Z",
                "2026-11-02T06:00:00Z",
                "2026-11-02T06:30:00Z",
            ],
        ),
        (
            "*/30 1 * * *",
            "America/New_York",
            "2026-11-01T04:30:00Z",
            &[
                "2026-11-01T05:00:00Z",
                "2026-11-01T05:30:00Z",
                "2026-11-01T06:00:00Z",
                "2026-11-01T06:30:00Z",
                "2026-11-02T06:00:00Z",
            ],
        ),
        (
            "*/15 * * * *",
            "America/New_York",
            "2026-11-01T05:40:00Z",
            &[
                "2026-11-01T05:45:00Z",
                "2026-11-01T06:00:00Z",
                "2026-11-01T06:15:00Z",
                "2026-11-01T06:30:00Z",
                "2026-11-01T06:45:00Z",
                "2026-11-01T07:00:00Z",
                "2026-11-01T07:15:00Z",
            ],
        ),
        (
            "0 * * * *",
            "America/New_York",
            "2026-11-01T03:30:00Z",
            &[
                "2026-11-01T04:00:00Z",
                "2026-11-01T05:00:00Z",
                "2026-11-01T06:00:00Z",
                "2026-11-01T07:00:00Z",
            ],
        ),
        (
            "@hourly",
            "America/New_York",
            "2026-11-01T03:30:00Z",
            &[
                "2026-11-01T04:00:00Z",
                "2026-11-01T05:00:00Z",
                "2026-11-01T06:00:00Z",
                "2026-11-01T07:00:00Z",
            ],
        ),
        (
            "0 59 1 * * *",
            "America/New_York",
            "2026-11-01T05:00:00Z",
            &["2026-11-01T05:59:00Z", "2026-11-02T06:59:00Z"],
        ),
        (
            "*/20 59 1 * * *",
            "America/New_York",
            "2026-11-01T05:58:00Z",
            &[
                "2026-11-01T05:59:00Z",
                "2026-11-01T05:59:20Z",
                "2026-11-01T05:59:40Z",
                "2026-11-01T06:59:00Z",
                "2026-11-01T06:59:20Z",
                "2026-11-01T06:59:40Z",
                "2026-11-02T06:59:00Z",
            ],
        ),
        // Berlin, spring 2026-03-29 (02:00 CET -> 03:00 CEST at 01:00Z), fall 2026-10-25
        // (03:00 CEST -> 02:00 CET at 01:00Z).
        (
            "30 2 * * *",
            "Europe/Berlin",
            "2026-03-28T12:00:00Z",
            &["2026-03-29T01:00:00Z", "2026-03-30T00:30:00Z"],
        ),
        (
            "0 0 2 ? * SUN *",
            "Europe/Berlin",
            "2026-03-28T00:00:00Z",
            &["2026-03-29T01:00:00Z", "2026-04-05T00:00:00Z"],
        ),
        (
            "30 2 * * *",
            "Europe/Berlin",
            "2026-10-24T12:00:00Z",
            &["2026-10-25T00:30:00Z", "2026-10-26T01:30:00Z"],
        ),
        (
            "*/30 * * * *",
            "Europe/Berlin",
            "2026-10-24T23:50:00Z",
            &[
                "2026-10-25T00:00:00Z",
                "2026-10-25T00:30:00Z",
                "2026-10-25T01:00:00Z",
                "2026-10-25T01:30:00Z",
                "2026-10-25T02:00:00Z",
            ],
        ),
        // Lord Howe, 30-minute shifts: 2026-04-05 02:00 +11 -> 01:30 +10:30 (15:00Z on the 4th);
        // 2026-10-04 02:00 +10:30 -> 02:30 +11 (15:30Z on the 3rd).
        (
            "45 1 * * *",
            "Australia/Lord_Howe",
            "2026-04-04T12:00:00Z",
            &["2026-04-04T14:45:00Z", "2026-04-05T15:15:00Z"],
        ),
        (
            "*/15 * * * *",
            "Australia/Lord_Howe",
            "2026-04-04T14:20:00Z",
            &[
                "2026-04-04T14:30:00Z",
                "2026-04-04T14:45:00Z",
                "2026-04-04T15:00:00Z",
                "2026-04-04T15:15:00Z",
                "2026-04-04T15:30:00Z",
            ],
        ),
        (
            "0 2 * * *",
            "Australia/Lord_Howe",
            "2026-04-04T12:00:00Z",
            &["2026-04-04T15:30:00Z"],
        ),
        (
            "15 2 * * *",
            "Australia/Lord_Howe",
            "2026-10-03T12:00:00Z",
            &["2026-10-03T15:30:00Z", "2026-10-04T15:15:00Z"],
        ),
        (
            "*/15 * * * *",
            "Australia/Lord_Howe",
            "2026-10-03T15:10:00Z",
            &[
                "2026-10-03T15:15:00Z",
                "2026-10-03T15:30:00Z",
                "2026-10-03T15:45:00Z",
            ],
        ),
        // Sydney (southern hemisphere): fall 2026-04-05 03:00 AEDT -> 02:00 AEST (16:00Z on the
        // 4th); spring 2026-10-04 02:00 AEST -> 03:00 AEDT (16:00Z on the 3rd).
        (
            "30 2 * * *",
            "Australia/Sydney",
            "2026-04-04T12:00:00Z",
            &["2026-04-04T15:30:00Z", "2026-04-05T16:30:00Z"],
        ),
        (
            "*/20 2 * * *",
            "Australia/Sydney",
            "2026-04-04T12:00:00Z",
            &[
                "2026-04-04T15:00:00Z",
                "2026-04-04T15:20:00Z",
                "2026-04-04T15:40:00Z",
                "2026-04-04T16:00:00Z",
                "2026-04-04T16:20:00Z",
                "2026-04-04T16:40:00Z",
                "2026-04-05T16:00:00Z",
            ],
        ),
        (
            "30 2 * * *",
            "Australia/Sydney",
            "2026-10-03T12:00:00Z",
            &["2026-10-03T16:00:00Z", "2026-10-04T15:30:00Z"],
        ),
        // Santiago: the clock moves at midnight. Spring 2026-09-06 00:00 -04 -> 01:00 -03 (04:00Z):
        // midnight does not exist, @daily fires at 01:00. Fall 2026-04-04 24:00 -03 -> 23:00 -04.
        (
            "@daily",
            "America/Santiago",
            "2026-09-05T12:00:00Z",
            &["2026-09-06T04:00:00Z", "2026-09-07T03:00:00Z"],
        ),
        (
            "30 23 * * *",
            "America/Santiago",
            "2026-04-04T12:00:00Z",
            &["2026-04-05T02:30:00Z", "2026-04-06T03:30:00Z"],
        ),
        // Havana: fall 2026-11-01 01:00 CDT -> 00:00 CST (05:00Z): midnight occurs twice.
        (
            "@daily",
            "America/Havana",
            "2026-10-31T12:00:00Z",
            &["2026-11-01T04:00:00Z", "2026-11-02T05:00:00Z"],
        ),
        // Apia skipped all of 2011-12-30: noon that day fires at the end of the gap.
        (
            "0 12 * * *",
            "Pacific/Apia",
            "2011-12-29T12:00:00Z",
            &[
                "2011-12-29T22:00:00Z",
                "2011-12-30T10:00:00Z",
                "2011-12-30T22:00:00Z",
            ],
        ),
    ];
    for (expr, tz, after, want) in cases {
        assert_upcoming(expr, tz, after, want);
    }
}

/// `next_after` from instants inside both passes of a repeated hour.
#[test]
fn next_after_inside_a_repeated_hour_is_the_next_instant_in_absolute_time() {
    let ny = "America/New_York";
    // (expression, after, next)
    let cases = [
        // After 01:45 EDT the next */15 fire is 01:00 EST (06:00Z), not 02:00 EST.
        (
            "*/15 * * * *",
            "2026-11-01T05:45:00Z",
            "2026-11-01T06:00:00Z",
        ),
        (
            "*/15 * * * *",
            "2026-11-01T05:59:59.5Z",
            "2026-11-01T06:00:00Z",
        ),
        (
            "*/15 * * * *",
            "2026-11-01T05:10:00Z",
            "2026-11-01T05:15:00Z",
        ),
        (
            "*/15 * * * *",
            "2026-11-01T06:20:00Z",
            "2026-11-01T06:30:00Z",
        ),
        (
            "*/15 * * * *",
            "2026-11-01T06:50:00Z",
            "2026-11-01T07:00:00Z",
        ),
        // A fixed time already fired in the first pass does not fire in the second.
        ("30 1 * * *", "2026-11-01T05:30:00Z", "2026-11-02T06:30:00Z"),
        ("30 1 * * *", "2026-11-01T06:15:00Z", "2026-11-02T06:30:00Z"),
        ("30 1 * * *", "2026-11-01T05:10:00Z", "2026-11-01T05:30:00Z"),
        ("0 1 * * *", "2026-11-01T06:00:00Z", "2026-11-02T06:00:00Z"),
        ("30 2 * * *", "2026-11-01T06:15:00Z", "2026-11-01T07:30:00Z"),
        // Repeating job with no fire left in the second pass: next is after the overlap.
        (
            "*/20 0 * * *",
            "2026-11-01T05:10:00Z",
            "2026-11-02T05:00:00Z",
        ),
        // The last second of the repeated hour, in the second pass.
        (
            "* * * * * *",
            "2026-11-01T06:59:58Z",
            "2026-11-01T06:59:59Z",
        ),
        (
            "* * * * * *",
            "2026-11-01T06:59:59Z",
            "2026-11-01T07:00:00Z",
        ),
        (
            "59 59 1 * * *",
            "2026-11-01T06:30:00Z",
            "2026-11-02T06:59:59Z",
        ),
    ];
    for (expr, after, want) in cases {
        assert_eq!(
            cron(expr, ny).next_after(utc(after)),
            Some(utc(want)),
            "{expr} after {after}"
        );
    }
}

#[test]
fn every_is_aligned_to_the_unix_epoch() {
    let s = |d: Duration| Schedule::every(d).unwrap();
    let cases = [
        (
            Duration::from_secs(30),
            "2026-01-01T00:00:10Z",
            "2026-01-01T00:00:30Z",
        ),
        (
            Duration::from_secs(30),
            "2026-01-01T00:00:30Z",
            "2026-01-01T00:01:00Z",
        ),
        (
            Duration::from_secs(30),
            "2026-01-01T00:00:29.999999999Z",
            "2026-01-01T00:00:30Z",
        ),
        (
            Duration::from_secs(7),
            "1970-01-01T00:00:00Z",
            "1970-01-01T00:00:07Z",
        ),
        (
            Duration::from_secs(30),
            "1969-12-31T23:59:59Z",
            "1970-01-01T00:00:00Z",
        ),
        (
            Duration::from_secs(30),
            "1969-12-31T23:59:00.5Z",
            "1969-12-31T23:59:30Z",
        ),
        (
            Duration::from_millis(1),
            "2026-01-01T00:00:00.0005Z",
            "2026-01-01T00:00:00.001Z",
        ),
        (
            Duration::from_secs(3600),
            "2026-03-08T06:30:00Z",
            "2026-03-08T07:00:00Z",
        ),
        (
            Duration::from_secs(86_400),
            "2026-03-08T06:30:00Z",
            "2026-03-09T00:00:00Z",
        ),
    ];
    for (period, after, want) in cases {
        assert_eq!(
            s(period).next_after(utc(after)),
            Some(utc(want)),
            "{period:?} after {after}"
        );
    }
    assert_eq!(
        s(Duration::from_secs(30)).upcoming(utc("2026-01-01T00:00:00Z"), 3),
        [
            utc("2026-01-01T00:00:30Z"),
            utc("2026-01-01T00:01:00Z"),
            utc("2026-01-01T00:01:30Z")
        ]
    );
}

#[test]
fn every_rejects_periods_under_one_millisecond() {
    let cases = [
        (
            Duration::ZERO,
            "invalid period \"0s\": use a duration of at least 1ms, such as \"30s\" or \"5m\"",
        ),
        (
            Duration::from_micros(999),
            "invalid period \"999us\": use a duration of at least 1ms, such as \"30s\" or \"5m\"",
        ),
    ];
    for (period, want) in cases {
        assert_eq!(Schedule::every(period).unwrap_err().to_string(), want);
    }
    assert!(Schedule::every(Duration::from_millis(1)).is_ok());
}

#[test]
fn every_far_in_the_future_ends_instead_of_overflowing() {
    let s = Schedule::every(Duration::from_secs(u64::MAX)).unwrap();
    assert_eq!(s.next_after(utc("2026-01-01T00:00:00Z")), None);
}

#[test]
fn at_fires_once_and_manual_never() {
    let at = Schedule::At(utc("2026-12-01T00:00:00Z"));
    assert_eq!(
        at.next_after(utc("2026-11-30T23:59:59Z")),
        Some(utc("2026-12-01T00:00:00Z"))
    );
    assert_eq!(at.next_after(utc("2026-12-01T00:00:00Z")), None);
    assert_eq!(
        at.upcoming(utc("2026-01-01T00:00:00Z"), 5),
        [utc("2026-12-01T00:00:00Z")]
    );
    assert_eq!(
        Schedule::Manual.next_after(utc("2026-01-01T00:00:00Z")),
        None
    );
    assert!(
        Schedule::Manual
            .upcoming(utc("2026-01-01T00:00:00Z"), 5)
            .is_empty()
    );
}

#[test]
fn describe_for_listings() {
    let cases = [
        (
            cron("0 9 * * 1-5", "Europe/Berlin"),
            "cron \"0 9 * * 1-5\" (Europe/Berlin)",
        ),
        (cron("  @daily ", "UTC"), "cron \"@daily\" (UTC)"),
        (
            Schedule::every(Duration::from_secs(30)).unwrap(),
            "every 30s",
        ),
        (
            Schedule::every(Duration::from_secs(90)).unwrap(),
            "every 1m 30s",
        ),
        (
            Schedule::At(utc("2026-12-01T00:00:00Z")),
            "at 2026-12-01T00:00:00Z",
        ),
        (
            Schedule::At(utc("2026-12-01T00:00:00.25Z")),
            "at 2026-12-01T00:00:00.250Z",
        ),
        (Schedule::Manual, "manual"),
    ];
    for (schedule, want) in cases {
        assert_eq!(schedule.describe(), want);
    }
}

#[test]
fn schedules_compare_by_text_and_zone() {
    assert_eq!(cron("0 9 * * 1-5", "UTC"), cron(" 0 9 * * 1-5", "UTC"));
    assert_ne!(
        cron("0 9 * * 1-5", "UTC"),
        cron("0 9 * * 1-5", "Europe/Berlin")
    );
    assert_ne!(cron("0 9 * * 1-5", "UTC"), cron("0 9 * * MON-FRI", "UTC"));
}

// ---------------------------------------------------------------------------------------------
// Property tests against a brute-force oracle.

/// The DST rule restated in instant space, independently of `zoned.rs`'s local-time search:
/// `u` (a whole second) is a fire iff
/// (a) its wall-clock time matches and it is that wall-clock time's first occurrence, or the job
///     repeats; or
/// (b) the wall clock jumped forward at `u` (end of a gap) and a skipped wall-clock time matches.
fn oracle_is_fire(c: &CronSchedule, u: DateTime<Utc>) -> bool {
    let tz = c.timezone();
    let local = u.with_timezone(&tz).naive_local();
    if c.matches_local(local) {
        let first = match tz.from_local_datetime(&local) {
            LocalResult::Single(t) => t.to_utc(),
            LocalResult::Ambiguous(a, b) => a.to_utc().min(b.to_utc()),
            LocalResult::None => unreachable!("the local time of an instant exists"),
        };
        if first == u || !c.is_fixed_time() {
            return true;
        }
    }
    let before = (u - TimeDelta::seconds(1)).with_timezone(&tz).naive_local();
    let mut skipped = before + TimeDelta::seconds(1);
    while skipped < local {
        if c.matches_local(skipped) {
            return true;
        }
        skipped += TimeDelta::seconds(1);
    }
    false
}

/// Zones with DST quirks: 30- and 45-minute offsets, midnight transitions, southern hemisphere.
const ZONES: &[&str] = &[
    "UTC",
    "America/New_York",
    "Europe/Berlin",
    "Australia/Lord_Howe",
    "Australia/Sydney",
    "America/Santiago",
    "America/Havana",
    "Pacific/Chatham",
    "Asia/Kolkata",
    "America/St_Johns",
];

/// Offset transitions of each zone in 2026, found by scanning (cached).
fn transitions(tz: Tz) -> Vec<DateTime<Utc>> {
    static CACHE: OnceLock<Vec<(Tz, Vec<DateTime<Utc>>)>> = OnceLock::new();
    let all = CACHE.get_or_init(|| {
        ZONES
            .iter()
            .map(|name| {
                let tz = zone(name);
                let offset = |t: DateTime<Utc>| t.with_timezone(&tz).offset().fix();
                let mut t = utc("2026-01-01T00:00:00Z");
                let mut found = Vec::new();
                while t < utc("2027-01-01T00:00:00Z") {
                    let next = t + TimeDelta::minutes(15);
                    if offset(next) != offset(t) {
                        found.push(next);
                    }
                    t = next;
                }
                (tz, found)
            })
            .collect()
    });
    all.iter()
        .find(|(z, _)| *z == tz)
        .map(|(_, t)| t.clone())
        .unwrap_or_default()
}

/// Field choices biased to DST-relevant hours; mixed dialects.
fn expression() -> impl Strategy<Value = String> {
    let second = prop::sample::select(vec!["0", "0", "*/15", "30", "0,20,40", "5-10", "*"]);
    let minute = prop::sample::select(vec![
        "*", "*/15", "0", "30", "0,30", "*/7", "10-20/5", "45", "59",
    ]);
    let hour = prop::sample::select(vec!["*", "1", "2", "0-3", "*/2", "1,2,3", "23", "0", "*"]);
    let dom = prop::sample::select(vec!["*", "*", "*", "1", "*/2", "13", "1-7"]);
    let month = prop::sample::select(vec!["*", "*", "*", "3,4,9,10,11", "*/2"]);
    let unix_dow = prop::sample::select(vec!["*", "*", "*", "1-5", "0", "MON", "SAT,SUN", "7"]);
    let quartz_dow = prop::sample::select(vec!["2-6", "1", "MON", "7,1"]);
    let mac = prop::sample::select(vec!["@hourly", "@daily", "@weekly", "@monthly"]);
    (
        0..10u8,
        second,
        minute,
        hour,
        dom,
        month,
        unix_dow,
        quartz_dow,
        mac,
    )
        .prop_map(|(kind, s, m, h, dom, mon, dow, qdow, mac)| match kind {
            0..=3 => format!("{m} {h} {dom} {mon} {dow}"),
            4..=6 => format!("{s} {m} {h} {dom} {mon} {dow}"),
            7 => format!("{s} {m} {h} ? {mon} {qdow} *"),
            8 => format!("{s} {m} {h} {dom} {mon} ?"),
            _ => mac.to_string(),
        })
}

/// An instant near one of the zone's 2026 transitions (or anywhere in 2026), with sub-second
/// noise half of the time.
fn instant_for(tz: Tz, pick: u64, near: bool, spread_secs: i64, nanos: u32) -> DateTime<Utc> {
    let ts = transitions(tz);
    let base = if near && !ts.is_empty() {
        ts[(pick as usize) % ts.len()] - TimeDelta::seconds(spread_secs / 2)
    } else {
        utc("2026-01-01T00:00:00Z") + TimeDelta::seconds((pick % (365 * 86_400)) as i64)
    };
    base + TimeDelta::seconds(((pick >> 20) as i64).rem_euclid(spread_secs.max(1)))
        + TimeDelta::nanoseconds(i64::from(nanos))
}

/// Checks that `next` is `c`'s first fire after `after`: it is a fire, and no instant in between
/// (sampled at the expression's granularity, up to `horizon`) is one.
fn check_no_fire_skipped(
    c: &CronSchedule,
    after: DateTime<Utc>,
    next: DateTime<Utc>,
    horizon: TimeDelta,
) -> Result<(), TestCaseError> {
    prop_assert!(
        next > after,
        "{} next_after({after}) = {next} is not later",
        c.expr()
    );
    prop_assert_eq!(next.timestamp_subsec_nanos(), 0);
    prop_assert!(
        oracle_is_fire(c, next),
        "{} in {}: {next} is not a fire (after {after})",
        c.expr(),
        c.timezone()
    );
    // Whole minutes suffice when the expression fires on second 0 only: every zone here has
    // whole-minute offsets, so gap ends and local minutes fall on UTC minutes.
    let step = if second_zero_only(c) { 60 } else { 1 };
    let mut u = DateTime::from_timestamp(after.timestamp() + 1, 0).unwrap();
    if step == 60 {
        u = DateTime::from_timestamp((after.timestamp() / 60 + 1) * 60, 0).unwrap();
    }
    let end = next.min(after + horizon);
    while u < end {
        prop_assert!(
            !oracle_is_fire(c, u),
            "{} in {}: skipped fire {u} between {after} and {next}",
            c.expr(),
            c.timezone()
        );
        u += TimeDelta::seconds(step);
    }
    Ok(())
}

/// Whether the expression fires on second 0 only (5-field and macros always do; for 6- and
/// 7-field forms the first field is the second).
fn second_zero_only(c: &CronSchedule) -> bool {
    match c.dialect() {
        CronDialect::Unix | CronDialect::Macro => true,
        _ => c.expr().split_whitespace().next() == Some("0"),
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 400, ..ProptestConfig::default() })]

    /// For random expressions, zones and instants (half of them within hours of a DST
    /// transition), a chain of `next_after` calls is strictly increasing and skips no fire.
    #[test]
    fn next_after_is_strictly_increasing_and_skips_no_fire(
        expr in expression(),
        zone_index in 0..ZONES.len(),
        pick in any::<u64>(),
        near in any::<bool>(),
        nanos in prop_oneof![Just(0u32), 0..1_000_000_000u32],
    ) {
        let tz = zone(ZONES[zone_index]);
        let Schedule::Cron(c) = Schedule::cron(&expr, tz).unwrap() else { unreachable!() };
        let mut after = instant_for(tz, pick, near, 6 * 3600, nanos);
        let seconds_level = !second_zero_only(&c);
        let (links, horizon) = if seconds_level { (12, TimeDelta::hours(2)) } else { (6, TimeDelta::days(2)) };
        for _ in 0..links {
            let Some(next) = c.next_after(after) else { break };
            check_no_fire_skipped(&c, after, next, horizon)?;
            after = next;
        }
    }

    /// For every-minute-or-finer patterns, the fires over a window around a transition equal the
    /// brute-force enumeration of the oracle, one by one.
    #[test]
    fn dense_patterns_equal_brute_force_enumeration(
        expr in prop::sample::select(vec!["* * * * *", "*/15 * * * * *", "* * * * * *", "0 * * * * ?", "*/2 * * * *", "* 1-3 * * *"]),
        zone_index in 0..ZONES.len(),
        pick in any::<u64>(),
    ) {
        let tz = zone(ZONES[zone_index]);
        let Schedule::Cron(c) = Schedule::cron(expr, tz).unwrap() else { unreachable!() };
        let start = DateTime::from_timestamp(instant_for(tz, pick, true, 4 * 3600, 0).timestamp(), 0).unwrap();
        let window = TimeDelta::minutes(90);
        let mut expected = Vec::new();
        let mut u = start + TimeDelta::seconds(1);
        while u <= start + window {
            if oracle_is_fire(&c, u) {
                expected.push(u);
            }
            u += TimeDelta::seconds(1);
        }
        let got: Vec<_> = Schedule::Cron(c.clone())
            .upcoming(start, expected.len() + 1)
            .into_iter()
            .filter(|t| *t <= start + window)
            .collect();
        prop_assert_eq!(got, expected, "{} in {} from {}", expr, tz, start);
    }

    /// `every` is the smallest multiple of the period after `after`.
    #[test]
    fn every_is_the_smallest_multiple_after(
        period_ms in 1u64..10_000_000,
        secs in -2_000_000_000i64..4_000_000_000,
        nanos in 0u32..1_000_000_000,
    ) {
        let period = Duration::from_millis(period_ms);
        let after = DateTime::from_timestamp(secs, nanos).unwrap();
        let next = Schedule::every(period).unwrap().next_after(after).unwrap();
        let p = i128::from(period_ms) * 1_000_000;
        prop_assert!(next > after);
        prop_assert_eq!(epoch_nanos(next).rem_euclid(p), 0);
        prop_assert!(epoch_nanos(next) - p <= epoch_nanos(after));
    }
}
