//! Tests of calendar rules and searches: membership tables (DST days included), every mistake's
//! message, the limits, and property tests of the searches against a minute-by-minute scan.

use super::*;
use crate::schedule::tests::{utc, zone};
use proptest::prelude::*;

fn strings(items: &[&str]) -> Vec<String> {
    items.iter().map(|s| (*s).to_owned()).collect()
}

fn named(name: &str) -> CalendarDef {
    CalendarDef {
        name: name.into(),
        ..CalendarDef::default()
    }
}

fn clock(def: &CalendarDef, tz: &str) -> CalendarClock {
    def.compile(zone(tz))
        .unwrap_or_else(|problems| panic!("{problems:?}"))
}

/// Asserts membership of each `(instant, expected)`.
fn assert_members(clock: &CalendarClock, table: &[(&str, bool)]) {
    for &(at, expected) in table {
        assert_eq!(clock.contains(utc(at)), expected, "{at}");
    }
}

#[test]
fn business_hours_hold_weekdays_nine_to_six_local_time() {
    let def = CalendarDef {
        weekdays: strings(&["mon-fri"]),
        times: strings(&["09:00-18:00"]),
        ..named("office")
    };
    // Berlin is UTC+1 in January: 09:00 local is 08:00Z. 2027-01-04 is a Monday.
    assert_members(
        &clock(&def, "Europe/Berlin"),
        &[
            ("2027-01-04T07:59:59Z", false),
            ("2027-01-04T08:00:00Z", true),
            ("2027-01-04T16:59:59Z", true),
            ("2027-01-04T17:00:00Z", false),
            ("2027-01-08T12:00:00Z", true),
            ("2027-01-09T12:00:00Z", false),
            ("2027-01-10T12:00:00Z", false),
        ],
    );
}

#[test]
fn weekday_ranges_wrap_and_take_full_names() {
    let def = CalendarDef {
        weekdays: strings(&["fri-mon", "Wednesday"]),
        ..named("long weekend")
    };
    let clock = clock(&def, "UTC");
    // 2027-01-04 is a Monday.
    let days: Vec<bool> = (4..11)
        .map(|day| clock.contains(utc(&format!("2027-01-{day:02}T12:00:00Z"))))
        .collect();
    assert_eq!(days, [true, false, true, false, true, true, true]);
}

#[test]
fn a_window_crossing_midnight_holds_both_ends_and_excludes_its_end() {
    let def = CalendarDef {
        times: strings(&["22:00-06:00", "12:00:30-12:00:45"]),
        ..named("night")
    };
    assert_members(
        &clock(&def, "UTC"),
        &[
            ("2027-05-01T21:59:59Z", false),
            ("2027-05-01T22:00:00Z", true),
            ("2027-05-02T00:00:00Z", true),
            ("2027-05-02T05:59:59Z", true),
            ("2027-05-02T06:00:00Z", false),
            ("2027-05-02T12:00:29Z", false),
            ("2027-05-02T12:00:30Z", true),
            ("2027-05-02T12:00:44Z", true),
            ("2027-05-02T12:00:45Z", false),
        ],
    );
}

#[test]
fn dates_and_yearly_ranges_include_both_ends_and_yearly_wraps_the_year() {
    let def = CalendarDef {
        dates: strings(&["2027-02-10..2027-02-12", "2027-06-01"]),
        yearly: strings(&["12-24..01-02", "07-04"]),
        ..named("holidays")
    };
    assert_members(
        &clock(&def, "UTC"),
        &[
            ("2027-02-09T23:59:59Z", false),
            ("2027-02-10T00:00:00Z", true),
            ("2027-02-12T23:59:59Z", true),
            ("2027-02-13T00:00:00Z", false),
            ("2027-06-01T10:00:00Z", true),
            ("2028-06-01T10:00:00Z", false),
            ("2027-07-04T10:00:00Z", true),
            ("2031-07-04T10:00:00Z", true),
            ("2027-12-23T23:59:59Z", false),
            ("2027-12-24T00:00:00Z", true),
            ("2027-12-31T12:00:00Z", true),
            ("2028-01-02T23:59:59Z", true),
            ("2028-01-03T00:00:00Z", false),
        ],
    );
}

#[test]
fn include_and_except_combine_as_documented() {
    let weekdays = CalendarDef {
        weekdays: strings(&["mon-fri"]),
        ..named("weekdays")
    };
    let holidays = CalendarDef {
        dates: strings(&["2027-01-06"]),
        ..named("holidays")
    };
    let saturday = CalendarDef {
        dates: strings(&["2027-01-09"]),
        ..named("working saturday")
    };
    // 2027-01-04 Monday .. 2027-01-10 Sunday, at noon.
    let week = |def: &CalendarDef| -> Vec<bool> {
        let clock = clock(def, "UTC");
        (4..11)
            .map(|day| clock.contains(utc(&format!("2027-01-{day:02}T12:00:00Z"))))
            .collect()
    };
    assert_eq!(week(&named("all")), [true; 7], "no rules: every instant");
    let business = CalendarDef {
        include: vec![saturday.clone()],
        except: vec![holidays.clone()],
        ..weekdays.clone()
    };
    assert_eq!(
        week(&business),
        [true, true, false, true, true, true, false],
        "own rules, plus include, less except"
    );
    let everything_but = CalendarDef {
        except: vec![holidays.clone()],
        ..named("not holidays")
    };
    assert_eq!(
        week(&everything_but),
        [true, true, false, true, true, true, true],
        "except alone: everything but"
    );
    let union = CalendarDef {
        include: vec![holidays.clone(), saturday.clone()],
        ..named("union")
    };
    assert_eq!(
        week(&union),
        [false, false, true, false, false, true, false],
        "include alone: the union"
    );
    let holiday_anyway = CalendarDef {
        include: vec![holidays.clone()],
        except: vec![holidays],
        ..weekdays
    };
    assert_eq!(
        week(&holiday_anyway),
        [true, true, false, true, true, false, false],
        "except wins over include"
    );
}

#[test]
fn a_skipped_hour_holds_no_instant_and_a_repeated_hour_holds_both_passes() {
    let def = CalendarDef {
        times: strings(&["02:00-03:00"]),
        ..named("two o'clock")
    };
    let berlin = clock(&def, "Europe/Berlin");
    // 2027-03-28: 02:00 CET becomes 03:00 CEST at 01:00Z; 01:59:59Z is 03:59:59 local.
    assert_members(
        &berlin,
        &[
            ("2027-03-28T00:59:59Z", false),
            ("2027-03-28T01:00:00Z", false),
        ],
    );
    assert_eq!(
        berlin.first_at_or_after(utc("2027-03-28T00:00:00Z"), true),
        Some(utc("2027-03-29T00:00:00Z")),
        "the next 02:00 is the day after"
    );
    // 2027-10-31: 03:00 CEST becomes 02:00 CET at 01:00Z; 02:00-03:00 local is 00:00Z-02:00Z.
    assert_members(
        &berlin,
        &[
            ("2027-10-30T23:59:59Z", false),
            ("2027-10-31T00:00:00Z", true),
            ("2027-10-31T00:59:59Z", true),
            ("2027-10-31T01:00:00Z", true),
            ("2027-10-31T01:59:59Z", true),
            ("2027-10-31T02:00:00Z", false),
        ],
    );
    assert_eq!(
        berlin.first_at_or_after(utc("2027-10-31T00:30:00Z"), false),
        Some(utc("2027-10-31T02:00:00Z")),
        "the stretch runs through both passes"
    );
    assert_eq!(
        berlin.stretch_start(utc("2027-10-31T01:30:00Z"), false),
        utc("2027-10-31T00:00:00Z")
    );
}

#[test]
fn an_offset_change_in_the_small_hours_is_not_taken_for_the_days_midnight() {
    // Lord Howe goes from +11 to +10:30 at 02:00 local on 2027-04-04 (15:00Z): the Sunday
    // starts at its midnight, 13:00Z, not at the change (found by the property test below).
    let def = CalendarDef {
        dates: strings(&["2027-03-01"]),
        include: vec![CalendarDef {
            weekdays: strings(&["sun-mon"]),
            ..named("include")
        }],
        ..named("own")
    };
    let clock = clock(&def, "Australia/Lord_Howe");
    assert_eq!(
        clock.first_at_or_after(utc("2027-03-29T13:00:00Z"), true),
        Some(utc("2027-04-03T13:00:00Z"))
    );
}

#[test]
fn one_zone_reads_every_calendar_of_a_tree() {
    let holidays = CalendarDef {
        timezone: Some(zone("America/New_York")),
        dates: strings(&["2027-01-06"]),
        ..named("holidays")
    };
    let def = CalendarDef {
        except: vec![holidays],
        ..named("not holidays")
    };
    let clock = clock(&def, "Asia/Tokyo");
    assert_eq!(clock.zone(), zone("America/New_York"));
    // Midnight in New York on 2027-01-06 is 05:00Z.
    assert!(clock.contains(utc("2027-01-06T04:59:59Z")));
    assert!(!clock.contains(utc("2027-01-06T05:00:00Z")));
}

#[test]
fn every_mistake_names_its_field_value_and_fix() {
    let table: &[(CalendarDef, &str, &str)] = &[
        (
            CalendarDef {
                weekdays: strings(&["mon", "moon"]),
                ..named("c")
            },
            "weekdays[1]",
            "write a day as mon",
        ),
        (
            CalendarDef {
                dates: strings(&["2027-02-30"]),
                ..named("c")
            },
            "dates[0]",
            "write YYYY-MM-DD",
        ),
        (
            CalendarDef {
                dates: strings(&["2027-02-17..2027-02-10"]),
                ..named("c")
            },
            "dates[0]",
            "write the earlier date first",
        ),
        (
            CalendarDef {
                yearly: strings(&["04-31"]),
                ..named("c")
            },
            "yearly[0]",
            "write MM-DD",
        ),
        (
            CalendarDef {
                times: strings(&["9:00-18:00"]),
                ..named("c")
            },
            "times[0]",
            "HH:MM-HH:MM",
        ),
        (
            CalendarDef {
                times: strings(&["09:00-09:00"]),
                ..named("c")
            },
            "times[0]",
            "starts where it ends",
        ),
        (
            CalendarDef {
                times: strings(&["24:00-01:00", "09:60-10:00"]),
                ..named("c")
            },
            "times[1]",
            "HH:MM-HH:MM",
        ),
        (
            CalendarDef {
                except: vec![CalendarDef {
                    dates: strings(&["2027-13-01"]),
                    ..named("inner")
                }],
                ..named("c")
            },
            "except[0].dates[0]",
            "write YYYY-MM-DD",
        ),
    ];
    for (def, field, fix) in table {
        let problems = def.compile(Tz::UTC).expect_err(field);
        assert_eq!(problems.len(), 1, "{problems:?}");
        assert_eq!(problems[0].field, *field);
        assert!(problems[0].message.contains(fix), "{}", problems[0]);
        assert!(problems[0].value.is_some(), "{}", problems[0]);
    }
}

#[test]
fn two_zones_in_one_tree_are_refused() {
    let def = CalendarDef {
        timezone: Some(zone("Europe/Berlin")),
        include: vec![CalendarDef {
            timezone: Some(zone("Asia/Tokyo")),
            ..named("tokyo")
        }],
        ..named("berlin")
    };
    let problems = def.compile(Tz::UTC).unwrap_err();
    assert_eq!(problems.len(), 1);
    assert_eq!(problems[0].field, "timezone");
    assert!(
        problems[0].message.contains("Europe/Berlin and Asia/Tokyo"),
        "{}",
        problems[0]
    );
}

#[test]
fn entries_and_depth_are_bounded() {
    let dates: Vec<String> = (0..=MAX_CALENDAR_ENTRIES)
        .map(|i| {
            let day = NaiveDate::from_ymd_opt(2000, 1, 1).unwrap() + TimeDelta::days(i as i64);
            day.to_string()
        })
        .collect();
    let many = CalendarDef {
        dates: dates[..MAX_CALENDAR_ENTRIES].to_vec(),
        ..named("many")
    };
    assert!(many.compile(Tz::UTC).is_ok(), "the limit itself is allowed");
    let too_many = CalendarDef {
        dates,
        ..named("too many")
    };
    let problems = too_many.compile(Tz::UTC).unwrap_err();
    assert!(
        problems[0].message.contains("at most 10000"),
        "{}",
        problems[0]
    );

    let nest = |depth: usize| {
        (0..depth).fold(named("leaf"), |inner, i| CalendarDef {
            include: vec![inner],
            ..named(&format!("level {i}"))
        })
    };
    assert!(nest(MAX_CALENDAR_DEPTH).compile(Tz::UTC).is_ok());
    let problems = nest(MAX_CALENDAR_DEPTH + 1).compile(Tz::UTC).unwrap_err();
    assert!(
        problems[0].message.contains("at most 8 levels"),
        "{}",
        problems[0]
    );
}

#[test]
fn searches_stop_after_a_leap_year() {
    let at = |date: &str| CalendarDef {
        dates: strings(&[date]),
        ..named("one day")
    };
    let from = utc("2027-01-01T00:00:00Z");
    assert_eq!(
        clock(&at("2027-12-01"), "UTC").first_at_or_after(from, true),
        Some(utc("2027-12-01T00:00:00Z"))
    );
    assert_eq!(
        clock(&at("2028-02-01"), "UTC").first_at_or_after(from, true),
        None
    );
    assert_eq!(
        clock(&at("2026-06-01"), "UTC").first_at_or_after(from, true),
        None,
        "a past date is never found"
    );
    // Looking back from inside a year-long stretch returns the bound.
    let past = clock(&at("2020-06-01"), "UTC");
    assert_eq!(past.stretch_start(from, true), from - TimeDelta::days(366));
}

// Property tests: random calendars with minute-grained rules in zones with DST changes (one of
// 30 minutes), against a scan minute by minute, where membership is constant within each minute.

const ZONES: [&str; 5] = [
    "UTC",
    "Europe/Berlin",
    "America/New_York",
    "Australia/Lord_Howe",
    "Asia/Kathmandu",
];

fn minute_text(minute: u32) -> String {
    format!("{:02}:{:02}", minute / 60, minute % 60)
}

fn arb_rules(name: &'static str) -> impl Strategy<Value = CalendarDef> {
    let weekdays = proptest::collection::vec((0..7usize, 0..7usize), 0..3);
    let dates = proptest::collection::vec((0..40i64, 0..4i64), 0..3);
    let times = proptest::collection::vec((0..1440u32, 1..1439u32), 0..3);
    (weekdays, dates, times).prop_map(move |(weekdays, dates, times)| {
        let first = NaiveDate::from_ymd_opt(2027, 3, 1).unwrap();
        CalendarDef {
            weekdays: weekdays
                .into_iter()
                .map(|(a, b)| format!("{}-{}", WEEKDAYS[a], WEEKDAYS[b]))
                .collect(),
            dates: dates
                .into_iter()
                .map(|(start, len)| {
                    let from = first + TimeDelta::days(start);
                    format!("{from}..{}", from + TimeDelta::days(len))
                })
                .collect(),
            times: times
                .into_iter()
                .map(|(from, len)| {
                    format!("{}-{}", minute_text(from), minute_text((from + len) % 1440))
                })
                .collect(),
            ..named(name)
        }
    })
}

fn arb_calendar() -> impl Strategy<Value = (CalendarDef, &'static str)> {
    let tree = (
        arb_rules("own"),
        proptest::option::of(arb_rules("include")),
        proptest::option::of(arb_rules("except")),
    )
        .prop_map(|(own, include, except)| CalendarDef {
            include: include.into_iter().collect(),
            except: except.into_iter().collect(),
            ..own
        });
    (tree, proptest::sample::select(&ZONES[..]))
}

/// Start instants around the DST changes of March 2027 (Berlin 28th, New York 14th, Lord Howe
/// in April) with any second.
fn arb_instant() -> impl Strategy<Value = DateTime<Utc>> {
    (0..50 * 86_400i64).prop_map(|secs| utc("2027-03-05T00:00:00Z") + TimeDelta::seconds(secs))
}

const SCAN_MINUTES: i64 = 6 * 1440;

fn floor_minute(t: DateTime<Utc>) -> DateTime<Utc> {
    DateTime::from_timestamp(t.timestamp().div_euclid(60) * 60, 0).unwrap()
}

/// The first instant at or after `t` of membership `wanted`, within [`SCAN_MINUTES`].
fn scan_forward(clock: &CalendarClock, t: DateTime<Utc>, wanted: bool) -> Option<DateTime<Utc>> {
    if clock.contains(t) == wanted {
        return Some(t);
    }
    let start = floor_minute(t);
    (1..=SCAN_MINUTES)
        .map(|m| start + TimeDelta::minutes(m))
        .find(|&at| clock.contains(at) == wanted)
}

/// Where the stretch of membership `!wanted` holding `t` began, within [`SCAN_MINUTES`].
fn scan_back(clock: &CalendarClock, t: DateTime<Utc>, wanted: bool) -> Option<DateTime<Utc>> {
    let mut start = floor_minute(t);
    for _ in 0..SCAN_MINUTES {
        let before = start - TimeDelta::minutes(1);
        if clock.contains(before) == wanted {
            return Some(start);
        }
        start = before;
    }
    None
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn first_at_or_after_finds_what_a_scan_finds(
        (def, tz) in arb_calendar(),
        t in arb_instant(),
        wanted in any::<bool>(),
    ) {
        let clock = clock(&def, tz);
        let found = clock.first_at_or_after(t, wanted);
        match scan_forward(&clock, t, wanted) {
            Some(expected) => prop_assert_eq!(found, Some(expected)),
            None => {
                // Beyond the scan: whatever is found must be later and of the right membership.
                if let Some(found) = found {
                    prop_assert!(found > t + TimeDelta::minutes(SCAN_MINUTES));
                    prop_assert_eq!(clock.contains(found), wanted);
                }
            }
        }
    }

    #[test]
    fn stretch_start_finds_what_a_scan_finds(
        (def, tz) in arb_calendar(),
        t in arb_instant(),
        wanted in any::<bool>(),
    ) {
        let clock = clock(&def, tz);
        prop_assume!(clock.contains(t) != wanted);
        let start = clock.stretch_start(t, wanted);
        match scan_back(&clock, t, wanted) {
            Some(expected) => prop_assert_eq!(start, expected),
            None => prop_assert!(start < t - TimeDelta::minutes(SCAN_MINUTES)),
        }
    }
}
