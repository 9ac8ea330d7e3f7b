//! Tests of calendars in job files and API bodies: declared calendars resolved by name, inline
//! tables, calendar files, and each mistake with its exact message.

use std::path::PathBuf;

use serde_json::json;

use crate::config::{SourceFormat, load_job_files, parse_job_file, validate_job};
use crate::job::{CalendarMode, JobSpec};
use crate::schedule::OnExcluded;

fn toml_jobs(text: &str) -> Result<Vec<JobSpec>, Vec<String>> {
    parse_job_file("jobs.toml", text, SourceFormat::Toml).map_err(|errors| errors.lines())
}

fn toml_errors(text: &str) -> Vec<String> {
    toml_jobs(text).expect_err("the file has mistakes")
}

fn one_job(text: &str) -> JobSpec {
    let mut jobs = toml_jobs(text).unwrap_or_else(|errors| panic!("{errors:#?}"));
    assert_eq!(jobs.len(), 1);
    jobs.remove(0)
}

fn strings(items: &[&str]) -> Vec<String> {
    items.iter().map(|s| (*s).to_owned()).collect()
}

const DECLARED: &str = r#"
[calendars.cn-holidays]
dates = ["2027-02-10..2027-02-17", "2027-10-01..2027-10-07"]

[calendars.cn-extra-workdays]
dates = ["2027-02-20"]

[calendars.cn-workdays]
timezone = "Asia/Shanghai"
weekdays = ["mon-fri"]
include = ["cn-extra-workdays"]
except = ["cn-holidays"]

[[jobs]]
name = "settle"
group = "billing"
schedule = "0 2 * * *"
calendar = "cn-workdays"
"#;

#[test]
fn a_declared_calendar_is_resolved_into_its_whole_tree() {
    let job = one_job(DECLARED);
    let calendar = job.calendar.expect("resolved");
    assert_eq!(calendar.name, "cn-workdays");
    assert_eq!(calendar.timezone, Some("Asia/Shanghai".parse().unwrap()));
    assert_eq!(calendar.weekdays, strings(&["mon-fri"]));
    assert_eq!(calendar.include.len(), 1);
    assert_eq!(calendar.include[0].name, "cn-extra-workdays");
    assert_eq!(calendar.include[0].dates, strings(&["2027-02-20"]));
    assert_eq!(calendar.except[0].name, "cn-holidays");
    assert_eq!(calendar.except[0].dates.len(), 2);
    assert_eq!(job.calendar_mode, CalendarMode::Only);
    assert_eq!(job.on_excluded, OnExcluded::Skip);
    assert_eq!(job.calendar_ref, None);
}

#[test]
fn calendars_may_follow_the_jobs_and_yaml_reads_the_same() {
    let (head, jobs) = DECLARED.split_at(DECLARED.find("[[jobs]]").unwrap());
    let after = format!("{jobs}\n{head}");
    assert_eq!(one_job(&after), one_job(DECLARED));
    let yaml = r#"
calendars:
  cn-holidays:
    dates: ["2027-02-10..2027-02-17", "2027-10-01..2027-10-07"]
  cn-extra-workdays:
    dates: ["2027-02-20"]
  cn-workdays:
    timezone: Asia/Shanghai
    weekdays: [mon-fri]
    include: [cn-extra-workdays]
    except: [cn-holidays]
jobs:
  - name: settle
    group: billing
    schedule: "0 2 * * *"
    calendar: cn-workdays
"#;
    let jobs =
        parse_job_file("jobs.yaml", yaml, SourceFormat::Yaml).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(jobs, vec![one_job(DECLARED)]);
}

#[test]
fn an_inline_calendar_and_its_fields_are_kept() {
    let job = one_job(
        r#"
[[jobs]]
name = "night-batch"
group = "etl"
every = "10m"
calendar = { times = ["22:00-06:00"], except = [{ yearly = ["12-25"] }] }
calendar_mode = "except"
on_excluded = "next_allowed"
"#,
    );
    let calendar = job.calendar.expect("inline");
    assert_eq!(calendar.name, "inline");
    assert_eq!(calendar.times, strings(&["22:00-06:00"]));
    assert_eq!(calendar.except[0].yearly, strings(&["12-25"]));
    assert_eq!(calendar.except[0].name, "inline.except[0]");
    assert_eq!(job.calendar_mode, CalendarMode::Except);
    assert_eq!(job.on_excluded, OnExcluded::NextAllowed);
}

#[test]
fn an_unknown_name_lists_the_declared_ones_and_the_nearest() {
    let text = DECLARED.replace("calendar = \"cn-workdays\"", "calendar = \"cn-workday\"");
    assert_eq!(
        toml_errors(&text),
        [
            r#"jobs.toml: job "settle": field "calendar" = "cn-workday": no calendar of this name (declared: cn-extra-workdays, cn-holidays, cn-workdays); did you mean "cn-workdays"? declare it as [calendars.cn-workday] in a job file or fix the name"#
        ]
    );
    let none = "[[jobs]]\nname = \"a\"\ngroup = \"g\"\nevery = \"1m\"\ncalendar = \"office\"\n";
    assert_eq!(
        toml_errors(none),
        [
            r#"jobs.toml: job "a": field "calendar" = "office": no calendar of this name (the job files declare no calendar); declare it as [calendars.office] in a job file or fix the name"#
        ]
    );
}

#[test]
fn a_cycle_and_an_unknown_reference_are_named_where_they_are_written() {
    let text = r#"
[calendars.a]
include = ["b"]

[calendars.b]
except = ["a", "holidayz"]

[calendars.holidays]
dates = ["2027-01-01"]
"#;
    assert_eq!(
        toml_errors(text),
        [
            r#"jobs.toml: key "calendars.b.except" = "a": calendars refer to each other in a cycle (a -> b -> a); remove one of these references"#,
            r#"jobs.toml: key "calendars.b.except" = "holidayz": no calendar of this name is declared in the job files; did you mean "holidays"? declare it as [calendars.holidayz] or fix the name"#,
        ]
    );
}

#[test]
fn a_rule_mistake_names_the_calendar_field_and_the_fix() {
    let text = r#"
[calendars.office]
weekdays = ["mon-fry"]
times = ["09:00-18:00", 9]
colour = "blue"
"#;
    assert_eq!(
        toml_errors(text),
        [
            r#"jobs.toml: key "calendars.office.colour" = "blue": unknown calendar field; a calendar has timezone, weekdays, dates, yearly, times, file, include, except"#,
            r#"jobs.toml: key "calendars.office.times[1]" = 9: expected a string, such as times = ["09:00-18:00"]"#,
            r#"jobs.toml: key "calendars.office.weekdays[0]" = "mon-fry": not a day of the week or a range of them; write a day as mon, tue, wed, thu, fri, sat or sun, or a range such as "mon-fri""#,
        ]
    );
}

#[test]
fn duplicate_calendar_names_across_files_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let a = dir.path().join("a.toml");
    let b = dir.path().join("b.toml");
    std::fs::write(&a, "[calendars.office]\nweekdays = [\"mon-fri\"]\n").unwrap();
    std::fs::write(&b, "[calendars.office]\nweekdays = [\"sat\"]\n").unwrap();
    let errors = load_job_files(&[a.clone(), b.clone()]).unwrap_err().lines();
    assert_eq!(errors.len(), 1, "{errors:#?}");
    assert!(
        errors[0].contains(r#"key "calendars.office": duplicate calendar name, first declared in"#),
        "{}",
        errors[0]
    );
    assert!(errors[0].contains("a.toml"), "{}", errors[0]);
}

/// A job file naming a calendar file next to it, in a directory of its own.
fn with_calendar_file(lines: &str) -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir(dir.path().join("holidays")).unwrap();
    std::fs::write(dir.path().join("holidays/cn-2027.txt"), lines).unwrap();
    let jobs = dir.path().join("jobs.toml");
    std::fs::write(
        &jobs,
        r#"
[calendars.cn-holidays]
file = "holidays/cn-2027.txt"
dates = ["2027-05-01"]

[[jobs]]
name = "settle"
group = "billing"
schedule = "0 2 * * *"
calendar = "cn-holidays"
calendar_mode = "except"
"#,
    )
    .unwrap();
    (dir, jobs)
}

#[test]
fn a_calendar_file_adds_its_dates_and_yearly_days() {
    let (_dir, jobs) = with_calendar_file(
        "# Spring festival\n2027-02-10..2027-02-17\n\n12-25   # every year\n2027-10-01\n",
    );
    let jobs = load_job_files(&[jobs]).unwrap_or_else(|e| panic!("{e}"));
    let calendar = jobs[0].calendar.as_ref().unwrap();
    assert_eq!(
        calendar.dates,
        strings(&["2027-05-01", "2027-02-10..2027-02-17", "2027-10-01"])
    );
    assert_eq!(calendar.yearly, strings(&["12-25"]));
}

#[test]
fn a_bad_line_of_a_calendar_file_is_named_by_its_number() {
    let (_dir, jobs) = with_calendar_file("2027-02-10\n2027-02-31\n");
    let errors = load_job_files(&[jobs]).unwrap_err().lines();
    assert_eq!(errors.len(), 1, "{errors:#?}");
    assert!(
        errors[0].ends_with(
            r#"key "calendars.cn-holidays.file line 2" = "2027-02-31": not a date or a range of dates; write YYYY-MM-DD, such as "2027-01-01", or a range such as "2027-02-10..2027-02-17" (both days included) (holidays/cn-2027.txt)"#
        ),
        "{}",
        errors[0]
    );
}

#[test]
fn a_calendar_file_over_the_limit_is_refused_unread() {
    let line = "2027-02-10\n";
    let big =
        line.repeat((chime_protocol::limits::MAX_CALENDAR_FILE_BYTES as usize) / line.len() + 1);
    let (_dir, jobs) = with_calendar_file(&big);
    let errors = load_job_files(&[jobs]).unwrap_err().lines();
    assert_eq!(errors.len(), 1, "{errors:#?}");
    assert!(
        errors[0].contains("a calendar file is at most 1048576 bytes"),
        "{}",
        errors[0]
    );
}

#[test]
fn an_api_definition_writes_its_calendar_out() {
    let job = |calendar: serde_json::Value| {
        let body = json!({
            "name": "a", "group": "g", "every": "1m",
            "calendar": calendar,
        });
        validate_job(body.as_object().unwrap())
    };
    let errors = job(json!("cn-workdays")).unwrap_err();
    assert_eq!(errors[0].field.as_deref(), Some("calendar"));
    assert!(
        errors[0]
            .message
            .contains("which a definition sent to the API does not see"),
        "{}",
        errors[0].message
    );
    let errors = job(json!({"except": ["cn-holidays"]})).unwrap_err();
    assert_eq!(errors[0].field.as_deref(), Some("calendar.except[0]"));
    let errors = job(json!({"file": "holidays.txt"})).unwrap_err();
    assert_eq!(errors[0].field.as_deref(), Some("calendar.file"));
    assert!(
        errors[0].message.contains("list the dates"),
        "{}",
        errors[0].message
    );

    // The stored form (GET /api/jobs/{name}) is accepted back as it is.
    let stored = one_job(DECLARED);
    let sent = serde_json::to_value(&stored).unwrap();
    let again = validate_job(sent.as_object().unwrap()).unwrap_or_else(|e| panic!("{e:?}"));
    assert_eq!(again.calendar, stored.calendar);
}

#[test]
fn calendar_settings_without_a_calendar_or_on_a_manual_job_are_refused() {
    let errors = toml_errors(
        "[[jobs]]\nname = \"a\"\ngroup = \"g\"\nevery = \"1m\"\non_excluded = \"next_allowed\"\n",
    );
    assert_eq!(
        errors,
        [
            r#"jobs.toml: job "a": field "on_excluded" = "next_allowed": applies to the job's calendar, and the job has none; add calendar = "NAME" or remove it"#
        ]
    );
    let errors =
        toml_errors("[[jobs]]\nname = \"a\"\ngroup = \"g\"\ncalendar = { weekdays = [\"mon\"] }\n");
    assert_eq!(errors.len(), 1, "{errors:#?}");
    assert!(
        errors[0].starts_with(r#"jobs.toml: job "a": field "calendar" = {"weekdays":["mon"]}:"#),
        "{}",
        errors[0]
    );
    let errors = toml_errors(
        "[[jobs]]\nname = \"a\"\ngroup = \"g\"\nevery = \"1m\"\ncalendar = { weekdays = [\"mon\"] }\ncalendar_mode = \"never\"\n",
    );
    assert_eq!(errors.len(), 1, "{errors:#?}");
    assert!(
        errors[0].contains(r#"field "calendar_mode" = "never""#),
        "{}",
        errors[0]
    );
}

#[test]
fn a_calendar_that_allows_nothing_for_a_year_is_refused() {
    let past = r#"
[calendars.old]
dates = ["2020-01-01..2020-12-31"]

[[jobs]]
name = "a"
group = "g"
every = "1h"
calendar = "old"
"#;
    let errors = toml_errors(past);
    assert_eq!(errors.len(), 1, "{errors:#?}");
    assert!(
        errors[0].starts_with(
            r#"jobs.toml: job "a": field "calendar" = "old": with calendar_mode = "only", calendar old allows no instant in the next 366 days (from "#
        ),
        "{}",
        errors[0]
    );
    assert!(
        errors[0].ends_with(
            "add dates to come, or use calendar_mode = \"except\" to keep fires out of it"
        )
    );
    // The same dates kept out of the job's fires are fine.
    let except = format!("{past}calendar_mode = \"except\"\n");
    assert!(toml_jobs(&except).is_ok());
    // Everything excluded is refused the other way round.
    let everything = "[[jobs]]\nname = \"a\"\ngroup = \"g\"\nevery = \"1h\"\ncalendar = {}\ncalendar_mode = \"except\"\n";
    let errors = toml_errors(everything);
    assert!(errors[0].ends_with("narrow the calendar"), "{}", errors[0]);
}
