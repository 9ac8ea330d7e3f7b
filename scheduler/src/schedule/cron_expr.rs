//! Cron expression parsing: three dialects and the macros, normalised into explicit field sets.
//!
//! Parsing is ours, not the `cron` crate's, for two reasons: the crate numbers Sunday as 1 and
//! needs seconds (so Unix expressions would be misread), and its errors do not say which dialect
//! was assumed or how to fix the expression. We parse every dialect into [`Fields`] (plain
//! bitmasks with Sunday = 0), then hand the crate only explicit, unambiguous number lists
//! (see [`Fields::crate_expressions`]).

use chrono::{Datelike, NaiveDateTime, Timelike, Weekday};

/// Which cron dialect an expression was read in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum CronDialect {
    /// Unix crontab, 5 fields `minute hour day-of-month month day-of-week`; Sunday is 0 or 7.
    Unix,
    /// 6 fields with seconds first, `second minute hour day-of-month month day-of-week`; Unix
    /// weekday numbering (Sunday is 0 or 7).
    UnixWithSeconds,
    /// Quartz: 7 fields `second minute hour day-of-month month day-of-week year`, or 6 fields
    /// containing `?`. Quartz weekday numbering: 1 is Sunday, 7 is Saturday.
    Quartz,
    /// A macro such as `@daily`, read as its 5-field Unix equivalent.
    Macro,
}

/// What a dialect reads the day-of-week numbers as.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Weekdays {
    /// 0-7, 0 and 7 are Sunday.
    Unix,
    /// 1-7, 1 is Sunday.
    Quartz,
}

/// A parsed expression: the field sets plus the facts the DST rule and Vixie's day rule need.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Fields {
    /// Bit `s` set: fires at second `s` (0-59).
    pub(crate) seconds: u64,
    /// Bit `m` set: minute `m` (0-59).
    pub(crate) minutes: u64,
    /// Bit `h` set: hour `h` (0-23).
    pub(crate) hours: u64,
    /// Bit `d` set: day of month `d` (1-31).
    pub(crate) days_of_month: u64,
    /// Bit `m` set: month `m` (1-12).
    pub(crate) months: u64,
    /// Bit `d` set: weekday `d`, 0 = Sunday … 6 = Saturday, whatever the dialect wrote.
    pub(crate) days_of_week: u64,
    /// Allowed years (Quartz only); `None` = every year.
    pub(crate) years: Option<Vec<u32>>,
    /// The day-of-month field was written starting with `*` or `?` (Vixie's `DOM_STAR`).
    pub(crate) dom_star: bool,
    /// The day-of-week field was written starting with `*` or `?` (Vixie's `DOW_STAR`).
    pub(crate) dow_star: bool,
    /// None of the second, minute and hour fields starts with `*`: a fixed local time of day.
    pub(crate) fixed_time: bool,
}

/// The result of parsing: dialect plus fields.
#[derive(Debug, Clone)]
pub(crate) struct Parsed {
    pub(crate) dialect: CronDialect,
    pub(crate) fields: Fields,
}

const FIELD_COUNT_HELP: &str = "write 5 fields (minute hour day-of-month month day-of-week), \
6 (second minute hour day-of-month month day-of-week), 7 (Quartz: second minute hour \
day-of-month month day-of-week year), or a macro such as @daily";

const MACROS: &[(&str, &str)] = &[
    ("@yearly", "0 0 1 1 *"),
    ("@annually", "0 0 1 1 *"),
    ("@monthly", "0 0 1 * *"),
    ("@weekly", "0 0 * * 0"),
    ("@daily", "0 0 * * *"),
    ("@midnight", "0 0 * * *"),
    ("@hourly", "0 * * * *"),
];

const MONTH_NAMES: [&str; 12] = [
    "JAN", "FEB", "MAR", "APR", "MAY", "JUN", "JUL", "AUG", "SEP", "OCT", "NOV", "DEC",
];
const DAY_NAMES: [&str; 7] = ["SUN", "MON", "TUE", "WED", "THU", "FRI", "SAT"];

/// How one field is read.
#[derive(Debug, Clone, Copy)]
struct FieldKind {
    /// Name used in messages ("day-of-week").
    name: &'static str,
    min: u32,
    max: u32,
    /// What `*` expands to (differs from `min..=max` only for Unix weekdays, where 7 = 0).
    star_max: u32,
    /// Names accepted in place of numbers, with the number of the first one.
    names: Option<(&'static [&'static str], u32)>,
    /// Appended to an out-of-range message.
    range_hint: &'static str,
    /// Whether `?` is accepted (Quartz day fields).
    question_mark: bool,
    /// Whether Quartz's `L`, `W`, `#` could be meant (day fields), for a precise message.
    day_field: bool,
}

const SECOND: FieldKind = FieldKind::plain("second", 0, 59);
const MINUTE: FieldKind = FieldKind::plain("minute", 0, 59);
const HOUR: FieldKind = FieldKind::plain("hour", 0, 23);
const YEAR: FieldKind = FieldKind::plain("year", 1970, 2099);
const MONTH: FieldKind = FieldKind {
    names: Some((&MONTH_NAMES, 1)),
    range_hint: " (or JAN-DEC)",
    ..FieldKind::plain("month", 1, 12)
};

impl FieldKind {
    const fn plain(name: &'static str, min: u32, max: u32) -> FieldKind {
        FieldKind {
            name,
            min,
            max,
            star_max: max,
            names: None,
            range_hint: "",
            question_mark: false,
            day_field: false,
        }
    }

    fn day_of_month(quartz: bool) -> FieldKind {
        FieldKind {
            question_mark: quartz,
            day_field: true,
            ..FieldKind::plain("day-of-month", 1, 31)
        }
    }

    fn day_of_week(weekdays: Weekdays) -> FieldKind {
        match weekdays {
            Weekdays::Unix => FieldKind {
                star_max: 6,
                names: Some((&DAY_NAMES, 0)),
                range_hint: " (0 and 7 are Sunday)",
                day_field: true,
                ..FieldKind::plain("day-of-week", 0, 7)
            },
            Weekdays::Quartz => FieldKind {
                names: Some((&DAY_NAMES, 1)),
                range_hint: " (Quartz numbering: 1 is Sunday, 7 is Saturday)",
                question_mark: true,
                day_field: true,
                ..FieldKind::plain("day-of-week", 1, 7)
            },
        }
    }
}

/// One parsed field: the values in the dialect's own numbering, and whether it began with `*`/`?`.
struct FieldValues {
    values: Vec<u32>,
    star: bool,
}

/// Parses `expr` in whichever dialect its shape says; the error is the reason text only.
pub(crate) fn parse(expr: &str) -> Result<Parsed, String> {
    let trimmed = expr.trim();
    if trimmed.is_empty() {
        return Err(format!("it is empty; {FIELD_COUNT_HELP}"));
    }
    if trimmed.starts_with('@') {
        return parse_macro(trimmed);
    }
    let parts: Vec<&str> = trimmed.split_whitespace().collect();
    let has_question = parts.iter().any(|p| p.contains('?'));
    match parts.len() {
        5 => {
            if has_question {
                return Err("\"?\" is Quartz syntax and needs the seconds field; \
                            in a 5-field crontab write \"*\" instead"
                    .to_string());
            }
            let [m, h, dom, mon, dow] = [parts[0], parts[1], parts[2], parts[3], parts[4]];
            let fields = build("0", m, h, dom, mon, dow, None, Weekdays::Unix)?;
            Ok(Parsed {
                dialect: CronDialect::Unix,
                fields,
            })
        }
        6 if !has_question => {
            let [s, m, h, dom, mon, dow] =
                [parts[0], parts[1], parts[2], parts[3], parts[4], parts[5]];
            let fields = build(s, m, h, dom, mon, dow, None, Weekdays::Unix)?;
            Ok(Parsed {
                dialect: CronDialect::UnixWithSeconds,
                fields,
            })
        }
        6 | 7 => {
            let [s, m, h, dom, mon, dow] =
                [parts[0], parts[1], parts[2], parts[3], parts[4], parts[5]];
            let year = parts.get(6).copied();
            let fields = build(s, m, h, dom, mon, dow, year, Weekdays::Quartz)?;
            if !fields.dom_star && !fields.dow_star {
                return Err(format!(
                    "day-of-month {dom:?} and day-of-week {dow:?} are both set; Quartz \
                     expressions set one and write \"?\" in the other, such as \
                     \"0 0 9 ? * MON-FRI\" or \"0 0 9 15 * ?\""
                ));
            }
            Ok(Parsed {
                dialect: CronDialect::Quartz,
                fields,
            })
        }
        n => Err(format!(
            "it has {n} field{}; {FIELD_COUNT_HELP}",
            if n == 1 { "" } else { "s" }
        )),
    }
}

fn parse_macro(text: &str) -> Result<Parsed, String> {
    let lower = text.to_ascii_lowercase();
    if lower == "@reboot" {
        return Err(
            "@reboot is not supported: Chime has no boot event to run it on; \
                    use a schedule such as @daily, or trigger the job manually"
                .to_string(),
        );
    }
    let Some((_, unix)) = MACROS.iter().find(|(name, _)| *name == lower) else {
        let known: Vec<&str> = MACROS.iter().map(|(name, _)| *name).collect();
        return Err(format!(
            "unknown macro {text}; use one of {}, or write the fields out",
            known.join(", ")
        ));
    };
    let parts: Vec<&str> = unix.split_whitespace().collect();
    let fields = build(
        "0",
        parts[0],
        parts[1],
        parts[2],
        parts[3],
        parts[4],
        None,
        Weekdays::Unix,
    )?;
    Ok(Parsed {
        dialect: CronDialect::Macro,
        fields,
    })
}

#[allow(clippy::too_many_arguments)] // one argument per cron field reads better than a tuple
fn build(
    second: &str,
    minute: &str,
    hour: &str,
    dom: &str,
    month: &str,
    dow: &str,
    year: Option<&str>,
    weekdays: Weekdays,
) -> Result<Fields, String> {
    let quartz = weekdays == Weekdays::Quartz;
    let s = parse_field(second, SECOND)?;
    let m = parse_field(minute, MINUTE)?;
    let h = parse_field(hour, HOUR)?;
    let d = parse_field(dom, FieldKind::day_of_month(quartz))?;
    let mo = parse_field(month, MONTH)?;
    let w = parse_field(dow, FieldKind::day_of_week(weekdays))?;
    let years = match year {
        Some(text) => {
            let y = parse_field(text, YEAR)?;
            if y.star && y.values.len() == (YEAR.max - YEAR.min + 1) as usize {
                None
            } else {
                Some(y.values)
            }
        }
        None => None,
    };
    let days_of_week = w.values.iter().fold(0u64, |acc, &v| {
        let sunday_zero = match weekdays {
            Weekdays::Unix => v % 7,
            Weekdays::Quartz => v - 1,
        };
        acc | (1 << sunday_zero)
    });
    let fields = Fields {
        seconds: mask(&s.values),
        minutes: mask(&m.values),
        hours: mask(&h.values),
        days_of_month: mask(&d.values),
        months: mask(&mo.values),
        days_of_week,
        years,
        dom_star: d.star,
        dow_star: w.star,
        fixed_time: !(s.star || m.star || h.star),
    };
    fields.check_fires(dom, month)?;
    Ok(fields)
}

fn mask(values: &[u32]) -> u64 {
    values.iter().fold(0, |acc, &v| acc | (1 << v))
}

fn parse_field(text: &str, kind: FieldKind) -> Result<FieldValues, String> {
    let star = text.starts_with('*') || text.starts_with('?');
    if text.contains('?') {
        if !kind.question_mark {
            return Err(format!(
                "{} {text:?}: \"?\" is only allowed in day-of-month or day-of-week (Quartz)",
                kind.name
            ));
        }
        if text != "?" {
            return Err(format!(
                "{} {text:?}: \"?\" must stand alone in its field",
                kind.name
            ));
        }
        return Ok(FieldValues {
            values: (kind.min..=kind.star_max).collect(),
            star: true,
        });
    }
    let mut values = Vec::new();
    for item in text.split(',') {
        if item.is_empty() {
            return Err(format!(
                "{} {text:?} has an empty list item; separate values with single commas, such as \"1,15\"",
                kind.name
            ));
        }
        values.extend(parse_item(item, kind)?);
    }
    values.sort_unstable();
    values.dedup();
    Ok(FieldValues { values, star })
}

fn parse_item(item: &str, kind: FieldKind) -> Result<Vec<u32>, String> {
    if kind.day_field && looks_like_quartz_modifier(item) {
        return Err(format!(
            "{} {item:?} uses Quartz's L, W or # modifier, which Chime does not support; \
             list the days explicitly",
            kind.name
        ));
    }
    let (base, step) = match item.split_once('/') {
        Some((base, step_text)) => {
            let step = step_text.parse::<u32>().map_err(|_| {
                format!(
                    "{} {item:?}: step {step_text:?} is not a whole number; write a step such as \"*/5\"",
                    kind.name
                )
            })?;
            if step == 0 {
                return Err(format!(
                    "{} {item:?}: a step of 0 never advances; use a step of 1 or more",
                    kind.name
                ));
            }
            (base, Some(step))
        }
        None => (item, None),
    };
    let (start, end) = if base == "*" {
        (kind.min, kind.star_max)
    } else if let Some((a, b)) = base.split_once('-') {
        let start = value(a, kind, false)?;
        let end = value(b, kind, true)?;
        if start > end {
            let (lo, hi) = (kind.min, kind.star_max);
            return Err(format!(
                "{} range {base:?} runs backwards; write it in two parts, such as \"{start}-{hi},{lo}-{end}\"",
                kind.name
            ));
        }
        (start, end)
    } else {
        let v = value(base, kind, false)?;
        // "5/15" means "5-max/15", as in cronie and Quartz.
        (v, if step.is_some() { kind.max } else { v })
    };
    let step = step.unwrap_or(1) as usize;
    Ok((start..=end).step_by(step).collect())
}

/// Quartz's `L` (last), `W` (weekday) and `#` (nth weekday) in a day field.
fn looks_like_quartz_modifier(item: &str) -> bool {
    let upper = item.to_ascii_uppercase();
    upper.contains('#')
        || upper == "L"
        || upper == "LW"
        || upper.starts_with("L-")
        || ((upper.ends_with('L') || upper.ends_with('W'))
            && upper[..upper.len() - 1].chars().all(|c| c.is_ascii_digit())
            && upper.len() > 1)
}

/// One number or name, checked against the field's range.
fn value(text: &str, kind: FieldKind, range_end: bool) -> Result<u32, String> {
    if text.is_empty() {
        return Err(format!(
            "{} has a range with a missing bound; write both ends, such as \"1-5\"",
            kind.name
        ));
    }
    if text.chars().all(|c| c.is_ascii_digit()) {
        let v = text.parse::<u32>().map_err(|_| {
            format!(
                "{} {text} is out of range {}-{}{}",
                kind.name, kind.min, kind.max, kind.range_hint
            )
        })?;
        if v < kind.min || v > kind.max {
            return Err(format!(
                "{} {v} is out of range {}-{}{}",
                kind.name, kind.min, kind.max, kind.range_hint
            ));
        }
        return Ok(v);
    }
    let Some((names, first)) = kind.names else {
        return Err(format!(
            "{} {text:?} is not a number; write a number from {} to {}",
            kind.name, kind.min, kind.max
        ));
    };
    let upper = text.to_ascii_uppercase();
    match names.iter().position(|n| *n == upper) {
        // Unix "FRI-SUN" means Friday to Sunday: Sunday at the end of a range is 7, not 0.
        Some(0) if range_end && kind.max == 7 && first == 0 => Ok(7),
        Some(i) => Ok(first + i as u32),
        None => Err(format!(
            "unknown {} name {text:?}; use {}",
            kind.name,
            names.join(", ")
        )),
    }
}

impl Fields {
    /// Whether the naive local time `t` matches, with Vixie's day rule: when both day fields are
    /// restricted (neither starts with `*` or `?`) a day matches if EITHER matches.
    pub(crate) fn matches(&self, t: NaiveDateTime) -> bool {
        bit(self.seconds, t.second())
            && bit(self.minutes, t.minute())
            && bit(self.hours, t.hour())
            && bit(self.months, t.month())
            && self.day_matches(t.date())
            && self
                .years
                .as_ref()
                .is_none_or(|ys| t.year() >= 0 && ys.binary_search(&(t.year() as u32)).is_ok())
    }

    fn day_matches(&self, date: chrono::NaiveDate) -> bool {
        let dom = bit(self.days_of_month, date.day());
        let dow = bit(self.days_of_week, weekday_sunday_zero(date.weekday()));
        if self.vixie_or() {
            dom || dow
        } else {
            dom && dow
        }
    }

    /// Vixie cron: if either day field starts with `*`, a day must match both; otherwise either.
    pub(crate) fn vixie_or(&self) -> bool {
        !self.dom_star && !self.dow_star
    }

    /// The same schedule as one or two expressions in the `cron` crate's syntax (seconds first,
    /// Sunday = 1), using only `*` and explicit number lists so no crate convention can bite.
    /// Two expressions (day-of-month only, day-of-week only) express Vixie's OR, which the crate
    /// does not implement (it always requires both day fields to match).
    pub(crate) fn crate_expressions(&self) -> Vec<String> {
        let s = list(self.seconds, 0, 59, 0);
        let m = list(self.minutes, 0, 59, 0);
        let h = list(self.hours, 0, 23, 0);
        let dom = list(self.days_of_month, 1, 31, 0);
        let mon = list(self.months, 1, 12, 0);
        let dow = list(self.days_of_week, 0, 6, 1);
        let year = match &self.years {
            None => "*".to_string(),
            Some(ys) => ys.iter().map(u32::to_string).collect::<Vec<_>>().join(","),
        };
        if self.vixie_or() {
            vec![
                format!("{s} {m} {h} {dom} {mon} * {year}"),
                format!("{s} {m} {h} * {mon} {dow} {year}"),
            ]
        } else {
            vec![format!("{s} {m} {h} {dom} {mon} {dow} {year}")]
        }
    }

    /// Rejects expressions that can never fire, such as `0 0 30 2 *`.
    fn check_fires(&self, dom_text: &str, month_text: &str) -> Result<(), String> {
        if self.vixie_or() {
            return Ok(()); // the day-of-week part alone fires
        }
        const LONGEST: [u32; 13] = [0, 31, 29, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31];
        let possible = (1..=12u32).any(|month| {
            bit(self.months, month)
                && (1..=LONGEST[month as usize]).any(|d| bit(self.days_of_month, d))
        });
        if possible {
            Ok(())
        } else {
            Err(format!(
                "it would never fire: day-of-month {dom_text:?} does not occur in month {month_text:?}; \
                 check those two fields"
            ))
        }
    }
}

fn bit(mask: u64, v: u32) -> bool {
    mask & (1 << v) != 0
}

fn weekday_sunday_zero(w: Weekday) -> u32 {
    w.num_days_from_sunday()
}

/// `*` if every value in `lo..=hi` is set, else an explicit list, each value shifted by `shift`.
fn list(mask: u64, lo: u32, hi: u32, shift: u32) -> String {
    if (lo..=hi).all(|v| bit(mask, v)) {
        return "*".to_string();
    }
    (lo..=hi)
        .filter(|&v| bit(mask, v))
        .map(|v| (v + shift).to_string())
        .collect::<Vec<_>>()
        .join(",")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reason(expr: &str) -> String {
        parse(expr).expect_err(expr)
    }

    fn fields(expr: &str) -> Fields {
        parse(expr).unwrap_or_else(|e| panic!("{expr}: {e}")).fields
    }

    #[test]
    fn dialect_is_chosen_by_shape() {
        let cases = [
            ("0 9 * * 1-5", CronDialect::Unix),
            ("  0   9 * *\t1-5 ", CronDialect::Unix),
            ("0 0 9 * * 1-5", CronDialect::UnixWithSeconds),
            ("0 0 9 ? * 2-6", CronDialect::Quartz),
            ("0 0 9 * * ? ", CronDialect::Quartz),
            ("0 0 9 ? * MON-FRI 2026", CronDialect::Quartz),
            ("0 0 9 * * * *", CronDialect::Quartz),
            ("@daily", CronDialect::Macro),
            ("@HOURLY", CronDialect::Macro),
        ];
        for (expr, dialect) in cases {
            assert_eq!(parse(expr).unwrap().dialect, dialect, "{expr}");
        }
    }

    #[test]
    fn weekday_numbering_per_dialect_lands_on_sunday_zero() {
        // (expression, expected weekday mask with bit 0 = Sunday)
        let mon_fri = 0b0111110;
        let cases = [
            ("0 9 * * 1-5", mon_fri),
            ("0 9 * * mon-FRI", mon_fri),
            ("0 9 * * 0", 0b1),
            ("0 9 * * 7", 0b1),
            ("0 9 * * SUN", 0b1),
            ("0 9 * * 5-7", 0b1100001),
            ("0 9 * * FRI-SUN", 0b1100001),
            ("0 9 * * */2", 0b1010101),
            ("0 9 * * 1-5/2", 0b0101010),
            ("0 0 9 * * 1-5", mon_fri),
            ("0 0 9 * * 0,7", 0b1),
            ("0 0 9 ? * 2-6", mon_fri),
            ("0 0 9 ? * 1", 0b1),
            ("0 0 9 ? * 7", 0b1000000),
            ("0 0 9 ? * MON-FRI *", mon_fri),
            ("0 0 9 ? * SUN", 0b1),
        ];
        for (expr, mask) in cases {
            assert_eq!(fields(expr).days_of_week, mask, "{expr}");
        }
    }

    #[test]
    fn fields_expand_ranges_lists_steps_and_names() {
        let f = fields("*/15 1-5/2,23 1,15 JAN,jun-Aug *");
        assert_eq!(f.minutes, (1 << 0) | (1 << 15) | (1 << 30) | (1 << 45));
        assert_eq!(f.hours, (1 << 1) | (1 << 3) | (1 << 5) | (1 << 23));
        assert_eq!(f.days_of_month, (1 << 1) | (1 << 15));
        assert_eq!(f.months, (1 << 1) | (1 << 6) | (1 << 7) | (1 << 8));
        assert_eq!(f.seconds, 1);
        let f = fields("10/20 * * * * *");
        assert_eq!(f.seconds, (1 << 10) | (1 << 30) | (1 << 50));
    }

    #[test]
    fn macros_expand_to_their_unix_meaning() {
        let cases = [
            ("@yearly", "0 0 1 1 *"),
            ("@annually", "0 0 1 1 *"),
            ("@monthly", "0 0 1 * *"),
            ("@weekly", "0 0 * * 0"),
            ("@daily", "0 0 * * *"),
            ("@midnight", "0 0 * * *"),
            ("@hourly", "0 * * * *"),
        ];
        for (mac, unix) in cases {
            assert_eq!(fields(mac), fields(unix), "{mac}");
        }
    }

    #[test]
    fn vixie_star_flags_follow_the_first_character() {
        // (expression, day-of-month or day-of-week = OR?)
        let cases = [
            ("0 9 1 * 1", true),
            ("0 9 1-7 * 1-5", true),
            ("0 9 * * 1", false),
            ("0 9 1 * *", false),
            ("0 9 */2 * 1", false), // Vixie: "*/2" starts with "*", so both must match
            ("0 9 1 * */2", false),
            ("0 0 9 ? * 2", false),
            ("0 0 9 1 * ?", false),
        ];
        for (expr, or) in cases {
            assert_eq!(fields(expr).vixie_or(), or, "{expr}");
        }
    }

    #[test]
    fn fixed_time_means_no_star_in_second_minute_or_hour() {
        let cases = [
            ("30 1 * * *", true),
            ("0,30 1 * * *", true),
            ("0-59 1 * * *", true),
            ("*/15 1 * * *", false),
            ("0 * * * *", false),
            ("0 */2 * * *", false),
            ("* 1 * * *", false),
            ("0 30 1 * * *", true),
            ("*/10 30 1 * * *", false),
            ("0 30 1 ? * * *", true),
            ("@daily", true),
            ("@weekly", true),
            ("@hourly", false),
        ];
        for (expr, fixed) in cases {
            assert_eq!(fields(expr).fixed_time, fixed, "{expr}");
        }
    }

    #[test]
    fn normalised_crate_expressions_are_explicit() {
        let cases: [(&str, &[&str]); 6] = [
            ("0 9 * * 1-5", &["0 0 9 * * 2,3,4,5,6 *"]),
            ("0 9 * * 0", &["0 0 9 * * 1 *"]),
            ("0 0 9 ? * 7", &["0 0 9 * * 7 *"]),
            ("*/30 * * * *", &["0 0,30 * * * * *"]),
            ("0 9 1 * 1", &["0 0 9 1 * * *", "0 0 9 * * 2 *"]),
            ("0 0 0 1 1 ? 2026,2030", &["0 0 0 1 1 * 2026,2030"]),
        ];
        for (expr, want) in cases {
            assert_eq!(fields(expr).crate_expressions(), want, "{expr}");
        }
    }

    #[test]
    fn every_error_kind_has_its_exact_message() {
        let cases = [
            (
                "0 9 * * 8",
                "day-of-week 8 is out of range 0-7 (0 and 7 are Sunday)",
            ),
            (
                "0 0 9 ? * 0",
                "day-of-week 0 is out of range 1-7 (Quartz numbering: 1 is Sunday, 7 is Saturday)",
            ),
            ("60 * * * *", "minute 60 is out of range 0-59"),
            ("0 24 * * *", "hour 24 is out of range 0-23"),
            ("60 0 9 * * *", "second 60 is out of range 0-59"),
            ("0 9 0 * *", "day-of-month 0 is out of range 1-31"),
            ("0 9 * 13 *", "month 13 is out of range 1-12 (or JAN-DEC)"),
            ("0 0 9 ? * 2 1969", "year 1969 is out of range 1970-2099"),
            (
                "0 9 * *",
                "it has 4 fields; write 5 fields (minute hour day-of-month month day-of-week), \
                 6 (second minute hour day-of-month month day-of-week), 7 (Quartz: second minute \
                 hour day-of-month month day-of-week year), or a macro such as @daily",
            ),
            (
                "   ",
                "it is empty; write 5 fields (minute hour day-of-month month day-of-week), \
                 6 (second minute hour day-of-month month day-of-week), 7 (Quartz: second minute \
                 hour day-of-month month day-of-week year), or a macro such as @daily",
            ),
            (
                "@reboot",
                "@reboot is not supported: Chime has no boot event to run it on; use a schedule \
                 such as @daily, or trigger the job manually",
            ),
            (
                "@fortnightly",
                "unknown macro @fortnightly; use one of @yearly, @annually, @monthly, @weekly, \
                 @daily, @midnight, @hourly, or write the fields out",
            ),
            (
                "0 9 ? * MON",
                "\"?\" is Quartz syntax and needs the seconds field; in a 5-field crontab write \"*\" instead",
            ),
            (
                "0 ? 9 * * MON",
                "minute \"?\": \"?\" is only allowed in day-of-month or day-of-week (Quartz)",
            ),
            (
                "0 0 9 ?,1 * MON",
                "day-of-month \"?,1\": \"?\" must stand alone in its field",
            ),
            (
                "0 0 9 15 * MON *",
                "day-of-month \"15\" and day-of-week \"MON\" are both set; Quartz expressions set \
                 one and write \"?\" in the other, such as \"0 0 9 ? * MON-FRI\" or \"0 0 9 15 * ?\"",
            ),
            (
                "0 9 * * MOX",
                "unknown day-of-week name \"MOX\"; use SUN, MON, TUE, WED, THU, FRI, SAT",
            ),
            (
                "0 9 * JANUARY *",
                "unknown month name \"JANUARY\"; use JAN, FEB, MAR, APR, MAY, JUN, JUL, AUG, SEP, OCT, NOV, DEC",
            ),
            (
                "x 9 * * *",
                "minute \"x\" is not a number; write a number from 0 to 59",
            ),
            (
                "*/0 * * * *",
                "minute \"*/0\": a step of 0 never advances; use a step of 1 or more",
            ),
            (
                "*/x * * * *",
                "minute \"*/x\": step \"x\" is not a whole number; write a step such as \"*/5\"",
            ),
            (
                "0 22-2 * * *",
                "hour range \"22-2\" runs backwards; write it in two parts, such as \"22-23,0-2\"",
            ),
            (
                "0 9 * * 1-",
                "day-of-week has a range with a missing bound; write both ends, such as \"1-5\"",
            ),
            (
                "0,,5 9 * * *",
                "minute \"0,,5\" has an empty list item; separate values with single commas, such as \"1,15\"",
            ),
            (
                "0 0 9 L * ?",
                "day-of-month \"L\" uses Quartz's L, W or # modifier, which Chime does not support; \
                 list the days explicitly",
            ),
            (
                "0 0 9 ? * 6#3",
                "day-of-week \"6#3\" uses Quartz's L, W or # modifier, which Chime does not support; \
                 list the days explicitly",
            ),
            (
                "0 0 30 2 *",
                "it would never fire: day-of-month \"30\" does not occur in month \"2\"; check those two fields",
            ),
            (
                "0 9 99999999999 * *",
                "day-of-month 99999999999 is out of range 1-31",
            ),
        ];
        for (expr, want) in cases {
            assert_eq!(reason(expr), want, "{expr}");
        }
    }

    #[test]
    fn february_29th_and_vixie_or_are_not_never_firing() {
        assert!(parse("0 0 29 2 *").is_ok());
        assert!(parse("0 0 30 2 1").is_ok()); // OR: every Monday in February
        assert!(parse("0 0 31 4,6 *").is_err());
        assert!(parse("0 0 31 4,7 *").is_ok());
    }
}
