//! Schedule tests: dialect and DST tables on real transition days, and property tests against a
//! brute-force oracle that applies the DST rule in instant space.

use super::*;
use chrono::{
    Datelike, LocalResult, NaiveDate, NaiveDateTime, Offset as _, TimeDelta, TimeZone, Timelike,
    Weekday,
};
use proptest::prelude::*;
use std::cell::Cell;
use std::sync::OnceLock;

pub(super) fn utc(s: &str) -> DateTime<Utc> {
    DateTime::parse_from_rfc3339(s)
        .unwrap_or_else(|e| panic!("{s}: {e}"))
        .to_utc()
}

pub(super) fn zone(name: &str) -> Tz {
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
fn cron_crate_receives_the_time_fields_and_we_filter_the_days() {
    // The crate numbers Sunday 1 and cannot say Vixie's OR or Quartz's L/W/#: it gets `*` in
    // both day fields, and the days are ours.
    let cases = [
        ("0 9 * * 1-5", "0 0 9 * * * *", CronDialect::Unix),
        ("0 9 10 * 1", "0 0 9 * * * *", CronDialect::Unix),
        (
            "0 0 9 ? 3 6#3 2027",
            "0 0 9 * 3 * 2027",
            CronDialect::Quartz,
        ),
        ("*/10 8-9 L * *", "0 */10 8,9 * * * *", CronDialect::Unix),
    ];
    for (expr, want, dialect) in cases {
        let Schedule::Cron(c) = cron(expr, "UTC") else {
            unreachable!()
        };
        let want = want.replace("*/10", "0,10,20,30,40,50");
        assert_eq!((c.normalised(), c.dialect()), (want, dialect), "{expr}");
    }
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

/// Regression: a repeating job fired at the end of a spring-forward gap (`30 * * * *` in New
/// York on 2026-03-08 fired at 01:30 EST, 03:00 EDT and 03:30 EDT). The gap rule is for
/// fixed-time jobs; a repeating job has no fire at a local time that does not exist.
#[test]
fn repeating_job_has_no_fire_in_a_spring_forward_gap() {
    // (expression, zone, after, next fires)
    let cases: &[(&str, &str, &str, &[&str])] = &[
        // New York 2026-03-08: 02:00 EST -> 03:00 EDT at 07:00Z.
        (
            "30 * * * *",
            "America/New_York",
            "2026-03-08T05:00:00Z",
            &[
                "2026-03-08T05:30:00Z",
                "2026-03-08T06:30:00Z",
                "2026-03-08T07:30:00Z",
                "2026-03-08T08:30:00Z",
            ][..],
        ),
        (
            "0 30 * * * ?",
            "America/New_York",
            "2026-03-08T06:30:00Z",
            &["2026-03-08T07:30:00Z"],
        ),
        (
            "0 */2 * * *",
            "America/New_York",
            "2026-03-08T04:00:00Z",
            &[
                "2026-03-08T05:00:00Z",
                "2026-03-08T08:00:00Z",
                "2026-03-08T10:00:00Z",
            ],
        ),
        // Repeating within the skipped hour only: no fire that day at all.
        (
            "*/15 2 * * *",
            "America/New_York",
            "2026-03-07T12:00:00Z",
            &["2026-03-09T06:00:00Z", "2026-03-09T06:15:00Z"],
        ),
        (
            "0 */20 2 * * *",
            "America/New_York",
            "2026-03-07T12:00:00Z",
            &["2026-03-09T06:00:00Z"],
        ),
        (
            "* 2 * * *",
            "America/New_York",
            "2026-03-08T06:58:00Z",
            &["2026-03-09T06:00:00Z"],
        ),
        // A fixed time in the gap still fires at its end, once for several times.
        (
            "0,30 2 * * *",
            "America/New_York",
            "2026-03-07T12:00:00Z",
            &[
                "2026-03-08T07:00:00Z",
                "2026-03-09T06:00:00Z",
                "2026-03-09T06:30:00Z",
            ],
        ),
        // Berlin 2026-03-29: 02:00 CET -> 03:00 CEST at 01:00Z.
        (
            "30 * * * *",
            "Europe/Berlin",
            "2026-03-29T00:00:00Z",
            &[
                "2026-03-29T00:30:00Z",
                "2026-03-29T01:30:00Z",
                "2026-03-29T02:30:00Z",
            ],
        ),
        (
            "*/30 2 * * *",
            "Europe/Berlin",
            "2026-03-28T12:00:00Z",
            &["2026-03-30T00:00:00Z"],
        ),
        // Sydney 2026-10-04: 02:00 AEST -> 03:00 AEDT at 16:00Z on the 3rd.
        (
            "30 * * * *",
            "Australia/Sydney",
            "2026-10-03T15:00:00Z",
            &["2026-10-03T15:30:00Z", "2026-10-03T16:30:00Z"],
        ),
        // Lord Howe 2026-10-04: 02:00 +10:30 -> 02:30 +11 at 15:30Z on the 3rd (30 minutes).
        (
            "10 * * * *",
            "Australia/Lord_Howe",
            "2026-10-03T14:00:00Z",
            &[
                "2026-10-03T14:40:00Z",
                "2026-10-03T16:10:00Z",
                "2026-10-03T17:10:00Z",
            ],
        ),
        (
            "*/20 2 * * *",
            "Australia/Lord_Howe",
            "2026-10-03T14:00:00Z",
            &["2026-10-03T15:40:00Z", "2026-10-04T15:00:00Z"],
        ),
        (
            "10 2 * * *",
            "Australia/Lord_Howe",
            "2026-10-03T14:00:00Z",
            &["2026-10-03T15:30:00Z", "2026-10-04T15:10:00Z"],
        ),
        // Santiago 2026-09-06: 00:00 -04 -> 01:00 -03 at 04:00Z.
        (
            "30 * * * *",
            "America/Santiago",
            "2026-09-06T03:00:00Z",
            &["2026-09-06T03:30:00Z", "2026-09-06T04:30:00Z"],
        ),
        // Havana 2026-03-08: 00:00 CST -> 01:00 CDT at 05:00Z; midnight does not exist.
        (
            "*/30 0 * * *",
            "America/Havana",
            "2026-03-07T12:00:00Z",
            &["2026-03-09T04:00:00Z", "2026-03-09T04:30:00Z"],
        ),
        (
            "@daily",
            "America/Havana",
            "2026-03-07T12:00:00Z",
            &["2026-03-08T05:00:00Z", "2026-03-09T04:00:00Z"],
        ),
    ];
    for (expr, tz, after, want) in cases {
        assert_upcoming(expr, tz, after, want);
    }
}

/// Quartz's day rules on real calendars: (expression, zone, after, next fires).
#[test]
fn day_rules_fire_on_these_days() {
    let cases: &[(&str, &str, &str, &[&str])] = &[
        // L in February of a leap year and not.
        (
            "0 0 2 L * ?",
            "UTC",
            "2028-01-31T03:00:00Z",
            &[
                "2028-02-29T02:00:00Z",
                "2028-03-31T02:00:00Z",
                "2028-04-30T02:00:00Z",
            ][..],
        ),
        (
            "0 0 2 L * ?",
            "UTC",
            "2027-02-01T00:00:00Z",
            &["2027-02-28T02:00:00Z"],
        ),
        (
            "0 0 2 L 2 ?",
            "UTC",
            "2026-03-01T00:00:00Z",
            &[
                "2027-02-28T02:00:00Z",
                "2028-02-29T02:00:00Z",
                "2029-02-28T02:00:00Z",
            ],
        ),
        // L-3: February 26th in 2028 (leap), the 25th in 2029.
        (
            "0 0 9 L-3 2 ?",
            "UTC",
            "2027-03-01T00:00:00Z",
            &["2028-02-26T09:00:00Z", "2029-02-25T09:00:00Z"],
        ),
        // L-30: only 31-day months, on the 1st.
        (
            "0 0 9 L-30 * ?",
            "UTC",
            "2026-01-02T00:00:00Z",
            &[
                "2026-03-01T09:00:00Z",
                "2026-05-01T09:00:00Z",
                "2026-07-01T09:00:00Z",
                "2026-08-01T09:00:00Z",
            ],
        ),
        // 15W: Saturday 15th -> Friday 14th (Aug 2026), Sunday 15th -> Monday 16th (Feb, Mar).
        (
            "0 0 9 15W * ?",
            "UTC",
            "2026-08-01T00:00:00Z",
            &[
                "2026-08-14T09:00:00Z",
                "2026-09-15T09:00:00Z",
                "2026-10-15T09:00:00Z",
            ],
        ),
        (
            "0 0 9 15W * ?",
            "UTC",
            "2026-02-01T00:00:00Z",
            &[
                "2026-02-16T09:00:00Z",
                "2026-03-16T09:00:00Z",
                "2026-04-15T09:00:00Z",
            ],
        ),
        // 1W: Saturday 1st -> Monday 3rd, never back into the month before.
        (
            "0 0 9 1W * ?",
            "UTC",
            "2026-07-15T00:00:00Z",
            &["2026-08-03T09:00:00Z", "2026-09-01T09:00:00Z"],
        ),
        // 31W: Sunday 31st -> Friday 29th; 30-day months have none.
        (
            "0 0 9 31W * ?",
            "UTC",
            "2026-05-01T00:00:00Z",
            &[
                "2026-05-29T09:00:00Z",
                "2026-07-31T09:00:00Z",
                "2026-08-31T09:00:00Z",
                "2026-10-30T09:00:00Z",
            ],
        ),
        // LW: the last weekday.
        (
            "0 0 18 LW * ?",
            "UTC",
            "2026-01-01T00:00:00Z",
            &[
                "2026-01-30T18:00:00Z",
                "2026-02-27T18:00:00Z",
                "2026-03-31T18:00:00Z",
            ],
        ),
        (
            "0 9 LW * *",
            "UTC",
            "2026-05-01T00:00:00Z",
            &["2026-05-29T09:00:00Z", "2026-06-30T09:00:00Z"],
        ),
        // 6#3: the third Friday (Quartz 6 = Friday).
        (
            "0 0 9 ? * 6#3",
            "UTC",
            "2026-01-01T00:00:00Z",
            &[
                "2026-01-16T09:00:00Z",
                "2026-02-20T09:00:00Z",
                "2026-03-20T09:00:00Z",
            ],
        ),
        (
            "0 0 9 ? * FRI#3",
            "UTC",
            "2026-01-16T09:00:00Z",
            &["2026-02-20T09:00:00Z"],
        ),
        // 2#5: the fifth Monday; July to October 2026 have none.
        (
            "0 0 9 ? * 2#5",
            "UTC",
            "2026-06-01T00:00:00Z",
            &[
                "2026-06-29T09:00:00Z",
                "2026-08-31T09:00:00Z",
                "2026-11-30T09:00:00Z",
            ],
        ),
        // 6L: the last Friday.
        (
            "0 0 9 ? * 6L",
            "UTC",
            "2026-01-01T00:00:00Z",
            &[
                "2026-01-30T09:00:00Z",
                "2026-02-27T09:00:00Z",
                "2026-03-27T09:00:00Z",
            ],
        ),
        // Quartz L alone in day-of-week: Saturday.
        (
            "0 0 9 ? * L",
            "UTC",
            "2026-08-01T10:00:00Z",
            &["2026-08-08T09:00:00Z", "2026-08-15T09:00:00Z"],
        ),
        // Unix extensions, Unix weekday numbering (5 = Friday).
        (
            "0 9 L * *",
            "UTC",
            "2026-02-01T00:00:00Z",
            &["2026-02-28T09:00:00Z", "2026-03-31T09:00:00Z"],
        ),
        (
            "0 9 * * 5#3",
            "UTC",
            "2026-01-01T00:00:00Z",
            &["2026-01-16T09:00:00Z", "2026-02-20T09:00:00Z"],
        ),
        (
            "0 9 * * 5L",
            "UTC",
            "2026-07-01T00:00:00Z",
            &["2026-07-31T09:00:00Z", "2026-08-28T09:00:00Z"],
        ),
        (
            "30 0 9 * * 1#1",
            "UTC",
            "2026-06-01T10:00:00Z",
            &["2026-07-06T09:00:30Z"],
        ),
        // Unix, both day fields restricted: either (Vixie).
        (
            "0 9 L * 5#3",
            "UTC",
            "2026-03-01T00:00:00Z",
            &[
                "2026-03-20T09:00:00Z",
                "2026-03-31T09:00:00Z",
                "2026-04-17T09:00:00Z",
                "2026-04-30T09:00:00Z",
            ],
        ),
        // A fifth Monday in February needs a leap year whose February starts on a Monday.
        (
            "0 0 9 ? 2 2#5",
            "UTC",
            "2026-01-01T00:00:00Z",
            &["2044-02-29T09:00:00Z", "2072-02-29T09:00:00Z"],
        ),
        // Year field, and a zone.
        (
            "0 0 9 LW * ? 2027",
            "UTC",
            "2026-06-01T00:00:00Z",
            &["2027-01-29T09:00:00Z"],
        ),
        (
            "0 0 9 L * ?",
            "Asia/Shanghai",
            "2026-02-01T00:00:00Z",
            &["2026-02-28T01:00:00Z", "2026-03-31T01:00:00Z"],
        ),
        // Several times on the day, then the next month's day.
        (
            "0 */30 23 L * ?",
            "UTC",
            "2026-04-30T23:00:00Z",
            &["2026-04-30T23:30:00Z", "2026-05-31T23:00:00Z"],
        ),
    ];
    for (expr, tz, after, want) in cases {
        assert_upcoming(expr, tz, after, want);
    }
}

/// Day rules on the days the clocks change (many zones change on the last, first or second
/// Sunday): the DST rule applies to them as to any other day.
#[test]
fn day_rules_on_dst_transition_days() {
    let cases: &[(&str, &str, &str, &[&str])] = &[
        // Berlin changes on the last Sunday of March and October.
        (
            "0 30 2 ? 3 1L",
            "Europe/Berlin",
            "2026-03-01T00:00:00Z",
            &["2026-03-29T01:00:00Z", "2027-03-28T01:00:00Z"][..],
        ),
        (
            "0 30 2 ? 10 1L",
            "Europe/Berlin",
            "2026-10-01T00:00:00Z",
            &["2026-10-25T00:30:00Z", "2027-10-31T00:30:00Z"],
        ),
        (
            "0 30 * ? 3 1L",
            "Europe/Berlin",
            "2026-03-29T00:00:00Z",
            &[
                "2026-03-29T00:30:00Z",
                "2026-03-29T01:30:00Z",
                "2026-03-29T02:30:00Z",
            ],
        ),
        (
            "0 30 * ? 10 1L",
            "Europe/Berlin",
            "2026-10-24T23:00:00Z",
            &[
                "2026-10-24T23:30:00Z",
                "2026-10-25T00:30:00Z",
                "2026-10-25T01:30:00Z",
                "2026-10-25T02:30:00Z",
            ],
        ),
        // New York changes on the second Sunday of March and the first of November.
        (
            "0 30 2 ? 3 1#2",
            "America/New_York",
            "2026-03-01T00:00:00Z",
            &["2026-03-08T07:00:00Z", "2027-03-14T07:00:00Z"],
        ),
        (
            "30 * * 3 0#2",
            "America/New_York",
            "2026-03-08T05:00:00Z",
            &[
                "2026-03-08T05:30:00Z",
                "2026-03-08T06:30:00Z",
                "2026-03-08T07:30:00Z",
            ],
        ),
        (
            "30 1 * 11 0#1",
            "America/New_York",
            "2026-11-01T00:00:00Z",
            &["2026-11-01T05:30:00Z", "2027-11-07T05:30:00Z"],
        ),
        (
            "30 * * 11 SUN#1",
            "America/New_York",
            "2026-11-01T04:00:00Z",
            &[
                "2026-11-01T04:30:00Z",
                "2026-11-01T05:30:00Z",
                "2026-11-01T06:30:00Z",
                "2026-11-01T07:30:00Z",
            ],
        ),
        // Lord Howe (30-minute shifts) changes on the first Sunday of April and October.
        (
            "10 * * 10 0#1",
            "Australia/Lord_Howe",
            "2026-10-03T14:00:00Z",
            &[
                "2026-10-03T14:40:00Z",
                "2026-10-03T16:10:00Z",
                "2026-10-03T17:10:00Z",
            ],
        ),
        (
            "15 2 * 10 0#1",
            "Australia/Lord_Howe",
            "2026-10-01T00:00:00Z",
            &["2026-10-03T15:30:00Z"],
        ),
        (
            "0 45 * ? 4 1#1",
            "Australia/Lord_Howe",
            "2026-04-04T13:00:00Z",
            &[
                "2026-04-04T13:45:00Z",
                "2026-04-04T14:45:00Z",
                "2026-04-04T15:15:00Z",
                "2026-04-04T16:15:00Z",
            ],
        ),
        (
            "0 45 1 ? 4 1#1",
            "Australia/Lord_Howe",
            "2026-04-01T00:00:00Z",
            &["2026-04-04T14:45:00Z", "2027-04-03T14:45:00Z"],
        ),
        // Santiago falls back at 24:00 on 2026-04-04 (23:00-24:00 twice); L-26 of April is the
        // 4th: its first 23:30, then 2027's (no change that night).
        (
            "0 30 23 L-26 4 ?",
            "America/Santiago",
            "2026-04-01T00:00:00Z",
            &["2026-04-05T02:30:00Z", "2027-04-05T03:30:00Z"],
        ),
    ];
    for (expr, tz, after, want) in cases {
        assert_upcoming(expr, tz, after, want);
    }
}

/// A repeating job whose every match falls in a gap never fires; the search goes from gap to
/// gap and ends with `None` rather than running on.
#[test]
fn repeating_job_only_inside_gaps_never_fires_and_the_search_ends() {
    // Berlin's spring-forward gap is 02:00-03:00 on every last Sunday of March.
    let s = cron("0 */30 2 ? 3 1L 2026-2060", "Europe/Berlin");
    assert_eq!(s.next_after(utc("2026-01-01T00:00:00Z")), None);
    // Without a year field the search runs to the crate's last year, 2100, where chrono-tz's
    // compiled transitions have ended, so 02:00 exists again that year.
    let s = cron("0 */30 2 ? 3 1L", "Europe/Berlin");
    assert_eq!(
        s.next_after(utc("2026-01-01T00:00:00Z")),
        Some(utc("2100-03-28T01:00:00Z"))
    );
    // The same as a fixed time fires at the end of each gap.
    let s = cron("0 0 2 ? 3 1L", "Europe/Berlin");
    assert_eq!(
        s.upcoming(utc("2026-01-01T00:00:00Z"), 2),
        [utc("2026-03-29T01:00:00Z"), utc("2027-03-28T01:00:00Z")]
    );
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
/// (b) the job is fixed-time, the wall clock jumped forward at `u` (end of a gap) and a skipped
///     wall-clock time matches. A repeating job has no fire for skipped wall-clock times.
fn oracle_is_fire(c: &CronSchedule, u: DateTime<Utc>) -> bool {
    oracle_is_fire_with(|t| c.matches_local(t), c.is_fixed_time(), c.timezone(), u)
}

/// [`oracle_is_fire`] for any wall-clock matcher.
fn oracle_is_fire_with(
    matches: impl Fn(NaiveDateTime) -> bool,
    fixed_time: bool,
    tz: Tz,
    u: DateTime<Utc>,
) -> bool {
    let local = u.with_timezone(&tz).naive_local();
    if matches(local) {
        let first = match tz.from_local_datetime(&local) {
            LocalResult::Single(t) => t.to_utc(),
            LocalResult::Ambiguous(a, b) => a.to_utc().min(b.to_utc()),
            LocalResult::None => unreachable!("the local time of an instant exists"),
        };
        if first == u || !fixed_time {
            return true;
        }
    }
    if !fixed_time {
        return false;
    }
    let before = (u - TimeDelta::seconds(1)).with_timezone(&tz).naive_local();
    let mut skipped = before + TimeDelta::seconds(1);
    while skipped < local {
        if matches(skipped) {
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

// ---------------------------------------------------------------------------------------------
// Quartz's day rules against a naive restatement, and their next fires against brute force.

/// A day-of-month rule as the property tests generate it.
#[derive(Debug, Clone, Copy)]
enum DomRule {
    Day(u32),
    Last(u32),
    Nearest(u32),
    LastWeekday,
}

/// A day-of-week rule, weekday 0 = Sunday.
#[derive(Debug, Clone, Copy)]
enum DowRule {
    Weekday(u32),
    Last(u32),
    Nth(u32, u32),
}

/// The dates of `date`'s month.
fn month_of(date: NaiveDate) -> Vec<NaiveDate> {
    let first = date.with_day(1).unwrap();
    first
        .iter_days()
        .take_while(|d| d.month() == first.month())
        .collect()
}

fn is_weekday(d: &NaiveDate) -> bool {
    !matches!(d.weekday(), Weekday::Sat | Weekday::Sun)
}

fn sunday_zero(d: &NaiveDate) -> u32 {
    d.weekday().num_days_from_sunday()
}

/// The rules restated from Quartz's documentation, by enumerating the month, independently of
/// `cron_expr.rs`: `W` is the weekday of the same month closest to day n.
fn naive_dom(rule: DomRule, date: NaiveDate) -> bool {
    let month = month_of(date);
    match rule {
        DomRule::Day(d) => date.day() == d,
        DomRule::Last(n) => month.iter().rev().nth(n as usize) == Some(&date),
        DomRule::Nearest(n) => {
            n as usize <= month.len()
                && month
                    .iter()
                    .filter(|d| is_weekday(d))
                    .min_by_key(|d| (i64::from(d.day()) - i64::from(n)).abs())
                    == Some(&date)
        }
        DomRule::LastWeekday => month.iter().rev().find(|d| is_weekday(d)) == Some(&date),
    }
}

fn naive_dow(rule: DowRule, date: NaiveDate) -> bool {
    let month = month_of(date);
    let of = |w: u32| month.iter().filter(move |d| sunday_zero(d) == w);
    match rule {
        DowRule::Weekday(w) => sunday_zero(&date) == w,
        DowRule::Last(w) => of(w).next_back() == Some(&date),
        DowRule::Nth(w, k) => of(w).nth(k as usize - 1) == Some(&date),
    }
}

/// Vixie's rule over the naive rules: both restricted = either; one = that one.
fn naive_day(dom: Option<DomRule>, dow: Option<DowRule>, date: NaiveDate) -> bool {
    match (dom, dow) {
        (Some(a), Some(b)) => naive_dom(a, date) || naive_dow(b, date),
        (Some(a), None) => naive_dom(a, date),
        (None, Some(b)) => naive_dow(b, date),
        (None, None) => true,
    }
}

/// Which dialect a generated day-rule expression is written in.
#[derive(Debug, Clone, Copy)]
enum Dialect {
    Unix,
    UnixWithSeconds,
    Quartz6,
    Quartz7,
}

/// A generated expression with day rules, and everything the oracle needs to judge it
/// without the code under test's day logic.
#[derive(Debug, Clone)]
struct RuleCase {
    /// The expression under test.
    expr: String,
    /// The same with both day fields unrestricted: judges time of day, month and year.
    time_only: String,
    /// The months the month field allows.
    months: Vec<u32>,
    dom: Option<DomRule>,
    dow: Option<DowRule>,
}

fn render_dom(rule: Option<DomRule>, quartz: bool, dow_set: bool) -> String {
    match rule {
        None if quartz && !dow_set => "*".into(),
        None if quartz => "?".into(),
        None => "*".into(),
        Some(DomRule::Day(d)) => d.to_string(),
        Some(DomRule::Last(0)) => "L".into(),
        Some(DomRule::Last(n)) => format!("L-{n}"),
        Some(DomRule::Nearest(n)) => format!("{n}W"),
        Some(DomRule::LastWeekday) => "LW".into(),
    }
}

fn render_dow(rule: Option<DowRule>, quartz: bool, names: bool) -> String {
    const NAMES: [&str; 7] = ["SUN", "MON", "TUE", "WED", "THU", "FRI", "SAT"];
    let day = |w: u32| {
        if names {
            NAMES[w as usize].to_string()
        } else if quartz {
            (w + 1).to_string()
        } else if w == 0 {
            "7".to_string() // Unix: 7 is Sunday too
        } else {
            w.to_string()
        }
    };
    match rule {
        None if quartz => "?".into(),
        None => "*".into(),
        Some(DowRule::Weekday(w)) => day(w),
        Some(DowRule::Last(w)) => format!("{}L", day(w)),
        Some(DowRule::Nth(w, k)) => format!("{}#{k}", day(w)),
    }
}

fn dom_rule() -> impl Strategy<Value = DomRule> {
    prop_oneof![
        prop::sample::select(vec![0u32, 0, 1, 3, 27, 28, 29, 30]).prop_map(DomRule::Last),
        (0u32..=30).prop_map(DomRule::Last),
        prop::sample::select(vec![1u32, 2, 15, 28, 29, 30, 31]).prop_map(DomRule::Nearest),
        (1u32..=31).prop_map(DomRule::Nearest),
        Just(DomRule::LastWeekday),
        prop::sample::select(vec![1u32, 15, 31]).prop_map(DomRule::Day),
    ]
}

fn dow_rule() -> impl Strategy<Value = DowRule> {
    prop_oneof![
        (0u32..7).prop_map(DowRule::Last),
        (0u32..7, 1u32..=5).prop_map(|(w, k)| DowRule::Nth(w, k)),
        (0u32..7).prop_map(DowRule::Weekday),
    ]
}

/// Day-rule expressions in every dialect, time fields biased to DST-relevant hours.
fn rule_case() -> impl Strategy<Value = RuleCase> {
    let minute = prop::sample::select(vec!["0", "30", "*/15", "*", "45", "0,30", "10"]);
    let hour = prop::sample::select(vec!["2", "1", "*", "0-3", "*/2", "23", "0", "2,3"]);
    let month: BoxedStrategy<(&str, Vec<u32>)> = prop::sample::select(vec![
        ("*", (1..=12).collect::<Vec<u32>>()),
        ("*", (1..=12).collect()),
        ("3,4,9,10,11", vec![3, 4, 9, 10, 11]),
        ("2", vec![2]),
        ("*/2", vec![1, 3, 5, 7, 9, 11]),
        ("4,6", vec![4, 6]),
    ])
    .boxed();
    (
        prop::sample::select(vec![
            Dialect::Unix,
            Dialect::Unix,
            Dialect::UnixWithSeconds,
            Dialect::Quartz6,
            Dialect::Quartz7,
        ]),
        minute,
        hour,
        month,
        prop::option::weighted(0.7, dom_rule()),
        prop::option::weighted(0.6, dow_rule()),
        any::<bool>(),
    )
        .prop_map(|(dialect, m, h, (mon, months), dom, dow, names)| {
            let quartz = matches!(dialect, Dialect::Quartz6 | Dialect::Quartz7);
            // Quartz sets one day field; the other is "?".
            let (dom, dow) = if quartz && dom.is_some() {
                (dom, None)
            } else {
                (dom, dow)
            };
            let d = render_dom(dom, quartz, dow.is_some());
            let w = render_dow(dow, quartz, names);
            let (expr, time_only) = match dialect {
                Dialect::Unix => (
                    format!("{m} {h} {d} {mon} {w}"),
                    format!("{m} {h} * {mon} *"),
                ),
                Dialect::UnixWithSeconds => (
                    format!("0 {m} {h} {d} {mon} {w}"),
                    format!("0 {m} {h} * {mon} *"),
                ),
                Dialect::Quartz6 => (
                    format!("0 {m} {h} {d} {mon} {w}"),
                    format!("0 {m} {h} ? {mon} *"),
                ),
                Dialect::Quartz7 => (
                    format!("0 {m} {h} {d} {mon} {w} *"),
                    format!("0 {m} {h} ? {mon} * *"),
                ),
            };
            RuleCase {
                expr,
                time_only,
                months,
                dom,
                dow,
            }
        })
}

/// The brute-force matcher of a [`RuleCase`]: the time-only schedule for time of day and
/// month, the naive rules for the day (cached per month, as the walk asks minute by minute).
struct NaiveMatcher {
    time_only: CronSchedule,
    dom: Option<DomRule>,
    dow: Option<DowRule>,
    cache: Cell<Option<(i32, u32, u64)>>,
}

impl NaiveMatcher {
    fn new(case: &RuleCase, tz: Tz) -> NaiveMatcher {
        let Schedule::Cron(time_only) = Schedule::cron(&case.time_only, tz).unwrap() else {
            unreachable!()
        };
        NaiveMatcher {
            time_only,
            dom: case.dom,
            dow: case.dow,
            cache: Cell::new(None),
        }
    }

    fn day(&self, date: NaiveDate) -> bool {
        let key = (date.year(), date.month());
        let days = match self.cache.get() {
            Some((y, m, days)) if (y, m) == key => days,
            _ => {
                let days = month_of(date)
                    .into_iter()
                    .filter(|d| naive_day(self.dom, self.dow, *d))
                    .fold(0u64, |acc, d| acc | (1 << d.day()));
                self.cache.set(Some((key.0, key.1, days)));
                days
            }
        };
        days & (1 << date.day()) != 0
    }

    fn matches(&self, local: NaiveDateTime) -> bool {
        self.day(local.date()) && self.time_only.matches_local(local)
    }
}

/// Whether the naive rules give some day in 2000-2027 (every kind of year) in these months.
fn naive_ever_fires(case: &RuleCase) -> bool {
    (2000..2028).any(|y| {
        case.months.iter().any(|&m| {
            month_of(NaiveDate::from_ymd_opt(y, m, 1).unwrap())
                .into_iter()
                .any(|d| naive_day(case.dom, case.dow, d))
        })
    })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 2000, ..ProptestConfig::default() })]

    /// On every day of any month 1970-2099, the parsed rules match exactly the days the naive
    /// restatement does, in every dialect; and an expression is rejected as never firing
    /// exactly when the naive rules find no day in its months.
    #[test]
    fn day_rules_match_the_naive_restatement(
        case in rule_case(),
        months in 0i64..(130 * 12),
    ) {
        let parsed = Schedule::cron(&case.expr, Tz::UTC);
        prop_assert_eq!(parsed.is_ok(), naive_ever_fires(&case), "{} {:?}", case.expr, parsed.err());
        let Ok(Schedule::Cron(c)) = parsed else { return Ok(()) };
        let first = NaiveDate::from_ymd_opt(1970 + (months / 12) as i32, 1 + (months % 12) as u32, 1).unwrap();
        let naive = NaiveMatcher::new(&case, Tz::UTC);
        for date in month_of(first) {
            // Midnight, and the first time of day the time fields allow.
            let midnight = date.and_hms_opt(0, 0, 0).unwrap();
            let first_time = naive.time_only.next_after(midnight.and_utc() - TimeDelta::seconds(1));
            for local in [Some(midnight), first_time.map(|t| t.naive_utc())].into_iter().flatten() {
                prop_assert_eq!(
                    c.matches_local(local),
                    naive.matches(local),
                    "{} at {}", case.expr, local
                );
            }
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    /// The next fires of day-rule expressions, in zones with DST and from instants near their
    /// transitions, against a brute-force walk of every minute (skipping only most of a day
    /// the naive rules exclude) with the naive rules and the DST rule restated in instant space.
    #[test]
    fn day_rule_next_fires_equal_a_brute_force_walk(
        case in rule_case(),
        zone_index in 0..ZONES.len(),
        pick in any::<u64>(),
        near in any::<bool>(),
        nanos in prop_oneof![Just(0u32), 0..1_000_000_000u32],
    ) {
        let tz = zone(ZONES[zone_index]);
        let Ok(Schedule::Cron(c)) = Schedule::cron(&case.expr, tz) else { return Ok(()) };
        let naive = NaiveMatcher::new(&case, tz);
        let fixed = c.is_fixed_time();
        let is_fire = |u: DateTime<Utc>| oracle_is_fire_with(|t| naive.matches(t), fixed, tz, u);
        let mut after = instant_for(tz, pick, near, 6 * 3600, nanos);
        let horizon = TimeDelta::days(95);
        for _ in 0..3 {
            let next = c.next_after(after);
            let end = next.map_or(after + horizon, |n| n.min(after + horizon));
            if let Some(next) = next {
                prop_assert!(next > after);
                prop_assert!(is_fire(next), "{} in {}: {} is not a fire (after {})", case.expr, tz, next, after);
            }
            let mut u = DateTime::from_timestamp((after.timestamp() / 60 + 1) * 60, 0).unwrap();
            while u < end {
                prop_assert!(!is_fire(u), "{} in {}: skipped fire {} between {} and {:?}", case.expr, tz, u, after, next);
                let local = u.with_timezone(&tz).naive_local();
                let to_midnight = (local.date().succ_opt().unwrap().and_hms_opt(0, 0, 0).unwrap() - local).num_seconds();
                // A day the naive rules exclude has no fire until close to its end (3 h covers
                // any offset change); gap ends are checked as they come.
                u += if !naive.day(local.date()) && to_midnight > 4 * 3600 {
                    TimeDelta::seconds(to_midnight - 3 * 3600)
                } else {
                    TimeDelta::minutes(1)
                };
            }
            match next {
                Some(n) => after = n,
                None => break,
            }
        }
    }

    /// Every second of 90 minutes around a transition, for dense time fields with a day rule
    /// that holds on the transition's day (`L-n` and `n#k` computed from it), equals the
    /// brute-force enumeration.
    #[test]
    fn day_rules_on_transition_days_equal_brute_force_enumeration(
        time in prop::sample::select(vec!["* * *", "*/15 * *", "0 * *", "0 */7 *", "0 30 *", "0 0,30 1-3", "0 15 2", "0 0 0"]),
        rule in 0..3u8,
        zone_index in 1..ZONES.len(),
        pick in any::<u64>(),
    ) {
        let tz = zone(ZONES[zone_index]);
        let ts = transitions(tz);
        prop_assume!(!ts.is_empty());
        let t = ts[(pick as usize) % ts.len()];
        let date = (t - TimeDelta::seconds(1)).with_timezone(&tz).date_naive();
        let len = month_of(date).len() as u32;
        let weekday = sunday_zero(&date);
        let k = (date.day() - 1) / 7 + 1;
        let expr = match rule {
            0 => format!("{time} L-{} * ?", len - date.day()),
            1 => format!("{time} ? * {}#{k}", weekday + 1),
            _ => format!("{time} * * {weekday}#{k}"),
        };
        let Schedule::Cron(c) = Schedule::cron(&expr, tz).unwrap() else { unreachable!() };
        let start = t - TimeDelta::minutes(45);
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
}
