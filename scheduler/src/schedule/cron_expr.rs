//! Cron expression parsing: three dialects and the macros, normalised into explicit field sets.
//!
//! Parsing is ours, not the `cron` crate's, for two reasons: the crate numbers Sunday as 1 and
//! needs seconds (so Unix expressions would be misread), and its errors do not say which dialect
//! was assumed or how to fix the expression. We parse every dialect into [`Fields`] (bitmasks
//! with Sunday = 0, plus Quartz's month-dependent day rules `L`, `W`, `nL` and `n#k`), then hand
//! the crate only the time-of-day, month and year fields as explicit number lists (see
//! [`Fields::crate_expression`]). Which days of a month match is decided here, in one place
//! ([`Fields::day_set`]), because Quartz's rules depend on the month's length and on the weekday
//! it starts on, which the crate's plain bitmasks cannot say.

use chrono::{Datelike, NaiveDate, NaiveDateTime, Timelike};

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
    /// The day-of-month field: days, or one of Quartz's `L`, `L-n`, `nW`, `LW`.
    pub(crate) days_of_month: MonthDays,
    /// Bit `m` set: month `m` (1-12).
    pub(crate) months: u64,
    /// The day-of-week field, 0 = Sunday … 6 = Saturday whatever the dialect wrote: weekdays,
    /// or one of Quartz's `nL`, `n#k`.
    pub(crate) days_of_week: WeekDays,
    /// Allowed years (Quartz only); `None` = every year.
    pub(crate) years: Option<Vec<u32>>,
    /// The day-of-month field was written starting with `*` or `?` (Vixie's `DOM_STAR`).
    pub(crate) dom_star: bool,
    /// The day-of-week field was written starting with `*` or `?` (Vixie's `DOW_STAR`).
    pub(crate) dow_star: bool,
    /// None of the second, minute and hour fields starts with `*`: a fixed local time of day.
    pub(crate) fixed_time: bool,
}

/// A day-of-month field.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum MonthDays {
    /// Bit `d` set: day `d` (1-31); a day the month does not have never matches.
    Days(u64),
    /// `L` (0) or `L-n`: the month's last day minus `n` (0-30); none if the month is shorter.
    Last(u32),
    /// `nW`: the weekday (Monday to Friday) nearest day `n` (1-31) within its month; none if
    /// the month has no day `n`.
    NearestWeekday(u32),
    /// `LW`: the month's last weekday (Monday to Friday).
    LastWeekday,
}

/// A day-of-week field, weekdays numbered 0 = Sunday … 6 = Saturday.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum WeekDays {
    /// Bit `w` set: every weekday `w`.
    Days(u64),
    /// `nL`: the month's last weekday `w`.
    Last(u32),
    /// `n#k`: the month's `k`-th (1-5) weekday `w`; none in a month without one.
    Nth {
        /// The weekday, 0 = Sunday.
        weekday: u32,
        /// Which one, 1-5.
        k: u32,
    },
}

/// What the day rules depend on: how long a month is and the weekday it starts on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct MonthShape {
    /// Days in the month, 28-31.
    len: u32,
    /// Weekday of the 1st, 0 = Sunday.
    first_weekday: u32,
}

impl MonthShape {
    /// The shape of `month` (1-12) of `year`, or `None` outside chrono's calendar.
    pub(crate) fn of(year: i32, month: u32) -> Option<MonthShape> {
        let first = NaiveDate::from_ymd_opt(year, month, 1)?;
        let next = if month == 12 {
            NaiveDate::from_ymd_opt(year.checked_add(1)?, 1, 1)?
        } else {
            NaiveDate::from_ymd_opt(year, month + 1, 1)?
        };
        Some(MonthShape {
            len: (next - first).num_days() as u32,
            first_weekday: first.weekday().num_days_from_sunday(),
        })
    }

    /// Days in the month.
    pub(crate) fn len(self) -> u32 {
        self.len
    }

    /// The weekday of `day` (1-based), 0 = Sunday.
    fn weekday(self, day: u32) -> u32 {
        (self.first_weekday + day - 1) % 7
    }

    /// Quartz's `W`: the weekday nearest day `n`, never leaving the month. A Saturday moves to
    /// the Friday before, unless it is the 1st (then Monday the 3rd); a Sunday moves to the
    /// Monday after, unless it is the last day (then the Friday before, two days back).
    fn nearest_weekday(self, n: u32) -> Option<u32> {
        if n == 0 || n > self.len {
            return None;
        }
        Some(match self.weekday(n) {
            6 if n == 1 => 3,
            6 => n - 1,
            0 if n == self.len => n - 2,
            0 => n + 1,
            _ => n,
        })
    }
}

impl MonthDays {
    /// Whether `day` of a month shaped `shape` matches.
    fn contains(self, day: u32, shape: MonthShape) -> bool {
        match self {
            MonthDays::Days(mask) => bit(mask, day),
            MonthDays::Last(n) => shape.len > n && day == shape.len - n,
            MonthDays::NearestWeekday(n) => shape.nearest_weekday(n) == Some(day),
            MonthDays::LastWeekday => shape.nearest_weekday(shape.len) == Some(day),
        }
    }
}

impl WeekDays {
    /// Whether `day` of a month shaped `shape` matches.
    fn contains(self, day: u32, shape: MonthShape) -> bool {
        let weekday = shape.weekday(day);
        match self {
            WeekDays::Days(mask) => bit(mask, weekday),
            WeekDays::Last(w) => weekday == w && day + 7 > shape.len,
            WeekDays::Nth { weekday: w, k } => weekday == w && (day - 1) / 7 + 1 == k,
        }
    }
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
        }
    }

    fn day_of_month(quartz: bool) -> FieldKind {
        FieldKind {
            question_mark: quartz,
            ..FieldKind::plain("day-of-month", 1, 31)
        }
    }

    fn day_of_week(weekdays: Weekdays) -> FieldKind {
        match weekdays {
            Weekdays::Unix => FieldKind {
                star_max: 6,
                names: Some((&DAY_NAMES, 0)),
                range_hint: " (0 and 7 are Sunday)",
                ..FieldKind::plain("day-of-week", 0, 7)
            },
            Weekdays::Quartz => FieldKind {
                names: Some((&DAY_NAMES, 1)),
                range_hint: " (Quartz numbering: 1 is Sunday, 7 is Saturday)",
                question_mark: true,
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
            if dom == "?" && dow == "?" {
                return Err(
                    "day-of-month and day-of-week are both \"?\"; Quartz uses \"?\" in one \
                     day field so that the other one says which days: write \"*\" in one of \
                     them for every day, such as \"0 0 9 * * ?\""
                        .to_string(),
                );
            }
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
    let (days_of_month, dom_star) = parse_day_of_month(dom, FieldKind::day_of_month(quartz))?;
    let mo = parse_field(month, MONTH)?;
    let (days_of_week, dow_star) = parse_day_of_week(dow, weekdays)?;
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
    let fields = Fields {
        seconds: mask(&s.values),
        minutes: mask(&m.values),
        hours: mask(&h.values),
        days_of_month,
        months: mask(&mo.values),
        days_of_week,
        years,
        dom_star,
        dow_star,
        fixed_time: !(s.star || m.star || h.star),
    };
    fields.check_fires(dom, dow, month, year)?;
    Ok(fields)
}

/// Quartz's day-of-month rules `L`, `L-n`, `LW`, `nW` (any case), or a plain field.
fn parse_day_of_month(text: &str, kind: FieldKind) -> Result<(MonthDays, bool), String> {
    let upper = text.to_ascii_uppercase();
    let name = kind.name;
    if upper == "L" {
        return Ok((MonthDays::Last(0), false));
    }
    if upper == "LW" {
        return Ok((MonthDays::LastWeekday, false));
    }
    if let Some(n) = upper.strip_prefix("L-") {
        if n.is_empty() || !n.chars().all(|c| c.is_ascii_digit()) {
            return Err(format!(
                "{name} {text:?}: write L-n with n a whole number from 0 to 30, such as \"L-3\" \
                 (three days before the last day of the month)"
            ));
        }
        return match n.parse::<u32>() {
            Ok(n @ 0..=30) => Ok((MonthDays::Last(n), false)),
            _ => Err(format!(
                "{name} {text:?}: L-{n} counts back more than 30 days from the last day; \
                 write L-n with n from 0 to 30 (L-30 is the 1st of a 31-day month)"
            )),
        };
    }
    if let Some(n) = upper.strip_suffix('W')
        && !n.is_empty()
        && n.chars().all(|c| c.is_ascii_digit())
    {
        return match n.parse::<u32>() {
            Ok(n @ 1..=31) => Ok((MonthDays::NearestWeekday(n), false)),
            _ => Err(format!(
                "{name} {text:?}: W's day {n} is out of range 1-31; write nW with n from 1 to 31, \
                 such as \"15W\" (the weekday nearest the 15th)"
            )),
        };
    }
    // Day-of-month has no names, so an L or W left over is a rule inside a list, range or step.
    if upper.contains(['L', 'W']) {
        return Err(format!(
            "{name} {text:?}: L, L-n, LW and nW must stand alone in {name} (not in a list, \
             range or step, as in Quartz); write the rule alone, such as \"L\" or \"15W\", \
             or list the days as numbers"
        ));
    }
    let f = parse_field(text, kind)?;
    Ok((MonthDays::Days(mask(&f.values)), f.star))
}

/// Quartz's day-of-week rules `nL` and `n#k` (numbers or names, the dialect's numbering), `L`
/// alone (Saturday, Quartz only), or a plain field.
fn parse_day_of_week(text: &str, weekdays: Weekdays) -> Result<(WeekDays, bool), String> {
    let kind = FieldKind::day_of_week(weekdays);
    let name = kind.name;
    let upper = text.to_ascii_uppercase();
    let sunday_zero = |v: u32| match weekdays {
        Weekdays::Unix => v % 7,
        Weekdays::Quartz => v - 1,
    };
    let example = match weekdays {
        Weekdays::Unix => "5L (the last Friday) or 5#3 (the third Friday)",
        Weekdays::Quartz => "6L (the last Friday) or 6#3 (the third Friday)",
    };
    let is_rule = |item: &str| item == "L" || item.contains('#') || item.ends_with('L');
    if upper.contains([',', '-', '/']) {
        if upper.split([',', '-', '/']).any(is_rule) {
            return Err(format!(
                "{name} {text:?}: nL and n#k must stand alone in {name} (not in a list, range \
                 or step, as in Quartz); write one rule alone, such as {example}"
            ));
        }
    } else if upper == "L" {
        return match weekdays {
            // Quartz: "L" alone in day-of-week is 7, Saturday.
            Weekdays::Quartz => Ok((WeekDays::Days(1 << 6), false)),
            Weekdays::Unix => Err(format!(
                "{name} \"L\" alone means Saturday in Quartz, which a Unix crontab would not \
                 read it as; write 6 or SAT for Saturday, or nL for the last weekday n of the \
                 month, such as {example}"
            )),
        };
    } else if let Some((day, k)) = upper.split_once('#') {
        if day.is_empty() {
            return Err(format!(
                "{name} {text:?}: a weekday must come before \"#\"; write n#k, such as {example}"
            ));
        }
        let weekday = sunday_zero(value(day, kind, false)?);
        return match k {
            "1" | "2" | "3" | "4" | "5" => Ok((
                WeekDays::Nth {
                    weekday,
                    k: u32::from(k.as_bytes()[0] - b'0'),
                },
                false,
            )),
            _ => Err(format!(
                "{name} {text:?}: the {k:?} after \"#\" says which one in the month, 1 to 5; \
                 write n#k with k from 1 to 5, such as {example}"
            )),
        };
    } else if let Some(day) = upper.strip_suffix('L') {
        let weekday = sunday_zero(value(day, kind, false)?);
        return Ok((WeekDays::Last(weekday), false));
    }
    let f = parse_field(text, kind)?;
    let days = f
        .values
        .iter()
        .fold(0u64, |acc, &v| acc | (1 << sunday_zero(v)));
    Ok((WeekDays::Days(days), f.star))
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
            && MonthShape::of(t.year(), t.month())
                .is_some_and(|shape| self.day_matches(t.day(), shape))
            && self.year_allowed(t.year())
    }

    fn year_allowed(&self, year: i32) -> bool {
        self.years
            .as_ref()
            .is_none_or(|ys| u32::try_from(year).is_ok_and(|y| ys.binary_search(&y).is_ok()))
    }

    /// The one home of the day rules: whether `day` of a month shaped `shape` matches both day
    /// fields under Vixie's rule.
    fn day_matches(&self, day: u32, shape: MonthShape) -> bool {
        let dom = self.days_of_month.contains(day, shape);
        let dow = self.days_of_week.contains(day, shape);
        if self.vixie_or() {
            dom || dow
        } else {
            dom && dow
        }
    }

    /// Bit `d` set: day `d` of `month` of `year` matches the day fields (months and years are
    /// not checked here). Empty outside chrono's calendar.
    pub(crate) fn day_set(&self, year: i32, month: u32) -> u64 {
        let Some(shape) = MonthShape::of(year, month) else {
            return 0;
        };
        (1..=shape.len())
            .filter(|&d| self.day_matches(d, shape))
            .fold(0, |acc, d| acc | (1 << d))
    }

    /// Vixie cron: if either day field starts with `*`, a day must match both; otherwise either.
    pub(crate) fn vixie_or(&self) -> bool {
        !self.dom_star && !self.dow_star
    }

    /// The time-of-day, month and year fields in the `cron` crate's syntax (seconds first),
    /// using only `*` and explicit number lists so no crate convention can bite. Both day fields
    /// are `*`: the caller filters the crate's candidates through [`Fields::day_set`], since
    /// Quartz's day rules and Vixie's OR of the two day fields are not bitmasks over days.
    pub(crate) fn crate_expression(&self) -> String {
        let s = list(self.seconds, 0, 59);
        let m = list(self.minutes, 0, 59);
        let h = list(self.hours, 0, 23);
        let mon = list(self.months, 1, 12);
        let year = match &self.years {
            None => "*".to_string(),
            Some(ys) => ys.iter().map(u32::to_string).collect::<Vec<_>>().join(","),
        };
        format!("{s} {m} {h} * {mon} * {year}")
    }

    /// Rejects expressions that can never fire, such as `0 0 30 2 *`, `0 0 0 L-30 2 ?` or
    /// `0 0 0 29 2 ? 2027`: no allowed month of an allowed year has a matching day. Without a
    /// year field, the 28 years 2000-2027 stand for all: they hold every kind of year (leap or
    /// not, starting on each weekday), so every month shape the rules can see.
    fn check_fires(
        &self,
        dom_text: &str,
        dow_text: &str,
        month_text: &str,
        year_text: Option<&str>,
    ) -> Result<(), String> {
        let years: Vec<i32> = match &self.years {
            Some(ys) => ys.iter().map(|&y| y as i32).collect(),
            None => (2000..2028).collect(),
        };
        let possible = years.iter().any(|&year| {
            (1..=12u32).any(|month| bit(self.months, month) && self.day_set(year, month) != 0)
        });
        if possible {
            return Ok(());
        }
        // Name the day fields that restrict at all (`*/10` does, `*` and `?` do not).
        let every = |text: &str| text == "*" || text == "?";
        let (days, day_fields) = match (every(dom_text), every(dow_text)) {
            (false, true) => (format!("day-of-month {dom_text:?}"), 1),
            (true, false) => (format!("day-of-week {dow_text:?}"), 1),
            _ if self.vixie_or() => (
                format!("day-of-month {dom_text:?} or day-of-week {dow_text:?}"),
                2,
            ),
            _ => (
                format!("day-of-month {dom_text:?} with day-of-week {dow_text:?}"),
                2,
            ),
        };
        let (year, year_fields) = match (&self.years, year_text) {
            (Some(_), Some(text)) => (format!(" of year {text:?}"), 1),
            _ => (String::new(), 0),
        };
        let count = ["two", "three", "four"][day_fields + year_fields - 1];
        Err(format!(
            "it would never fire: {days} does not occur in month {month_text:?}{year}; \
             check those {count} fields"
        ))
    }
}

fn bit(mask: u64, v: u32) -> bool {
    mask & (1 << v) != 0
}

/// `*` if every value in `lo..=hi` is set, else an explicit list.
fn list(mask: u64, lo: u32, hi: u32) -> String {
    if (lo..=hi).all(|v| bit(mask, v)) {
        return "*".to_string();
    }
    (lo..=hi)
        .filter(|&v| bit(mask, v))
        .map(|v| v.to_string())
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
            assert_eq!(fields(expr).days_of_week, WeekDays::Days(mask), "{expr}");
        }
    }

    #[test]
    fn fields_expand_ranges_lists_steps_and_names() {
        let f = fields("*/15 1-5/2,23 1,15 JAN,jun-Aug *");
        assert_eq!(f.minutes, (1 << 0) | (1 << 15) | (1 << 30) | (1 << 45));
        assert_eq!(f.hours, (1 << 1) | (1 << 3) | (1 << 5) | (1 << 23));
        assert_eq!(f.days_of_month, MonthDays::Days((1 << 1) | (1 << 15)));
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
    fn normalised_crate_expressions_are_explicit_and_leave_days_to_us() {
        let cases = [
            ("0 9 * * 1-5", "0 0 9 * * * *"),
            ("0 0 9 ? * 7", "0 0 9 * * * *"),
            ("*/30 * * * *", "0 0,30 * * * * *"),
            ("0 9 1 * 1", "0 0 9 * * * *"),
            ("0 0 0 1 1 ? 2026,2030", "0 0 0 * 1 * 2026,2030"),
            ("0 0 9 L 2,8 ?", "0 0 9 * 2,8 * *"),
        ];
        for (expr, want) in cases {
            assert_eq!(fields(expr).crate_expression(), want, "{expr}");
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
    fn day_rules_parse_in_each_dialect_with_its_weekday_numbering() {
        use MonthDays as D;
        use WeekDays as W;
        let any_day = D::Days(0xFFFF_FFFE); // days 1-31
        let any_weekday = W::Days(0b111_1111);
        // (expression, day-of-month, day-of-week)
        let cases = [
            ("0 0 9 L * ?", D::Last(0), any_weekday),
            ("0 0 9 l * ?", D::Last(0), any_weekday),
            ("0 0 9 L-3 * ?", D::Last(3), any_weekday),
            ("0 0 9 L-0 * ?", D::Last(0), any_weekday),
            ("0 0 9 L-30 * ?", D::Last(30), any_weekday),
            ("0 0 9 15W * ?", D::NearestWeekday(15), any_weekday),
            ("0 0 9 1w * ?", D::NearestWeekday(1), any_weekday),
            ("0 0 9 31W * ?", D::NearestWeekday(31), any_weekday),
            ("0 0 9 LW * ?", D::LastWeekday, any_weekday),
            ("0 0 9 lw * ?", D::LastWeekday, any_weekday),
            // Quartz weekdays: 1 = Sunday, so 6 is Friday and 2 Monday; L alone is Saturday.
            ("0 0 9 ? * 6L", any_day, W::Last(5)),
            ("0 0 9 ? * 1L", any_day, W::Last(0)),
            ("0 0 9 ? * FRIL", any_day, W::Last(5)),
            ("0 0 9 ? * 6#3", any_day, W::Nth { weekday: 5, k: 3 }),
            ("0 0 9 ? * FRI#3", any_day, W::Nth { weekday: 5, k: 3 }),
            ("0 0 9 ? * 2#5", any_day, W::Nth { weekday: 1, k: 5 }),
            ("0 0 9 ? * 7#1 2027", any_day, W::Nth { weekday: 6, k: 1 }),
            ("0 0 9 ? * L", any_day, W::Days(1 << 6)),
            // Unix weekdays: 0 and 7 = Sunday, 5 = Friday.
            ("0 9 L * *", D::Last(0), any_weekday),
            ("0 9 L-3 2 *", D::Last(3), any_weekday),
            ("0 9 15W * *", D::NearestWeekday(15), any_weekday),
            ("0 9 LW * *", D::LastWeekday, any_weekday),
            ("0 9 * * 5#3", any_day, W::Nth { weekday: 5, k: 3 }),
            ("0 9 * * fri#3", any_day, W::Nth { weekday: 5, k: 3 }),
            ("0 9 * * 0#2", any_day, W::Nth { weekday: 0, k: 2 }),
            ("0 9 * * 7#2", any_day, W::Nth { weekday: 0, k: 2 }),
            ("0 9 * * 5L", any_day, W::Last(5)),
            ("0 9 * * 7L", any_day, W::Last(0)),
            ("0 0 9 * * 1#1", any_day, W::Nth { weekday: 1, k: 1 }),
            ("0 0 9 L * 6", D::Last(0), W::Days(1 << 6)),
        ];
        for (expr, dom, dow) in cases {
            let f = fields(expr);
            assert_eq!((f.days_of_month, f.days_of_week), (dom, dow), "{expr}");
        }
        // A rule restricts its field for Vixie's rule; `*` and `?` do not.
        assert!(fields("0 9 L * 5#3").vixie_or());
        assert!(!fields("0 9 */2 * 5L").vixie_or());
        assert!(!fields("0 0 9 L * *").vixie_or());
    }

    /// The day each rule picks in real months. (expression, year, month, days it fires on.)
    #[test]
    fn day_rules_pick_these_days_in_these_months() {
        let cases: &[(&str, i32, u32, &[u32])] = &[
            // L: the last day, leap year or not.
            ("0 0 2 L * ?", 2028, 2, &[29]),
            ("0 0 2 L * ?", 2026, 2, &[28]),
            ("0 0 2 L * ?", 2100, 2, &[28]), // 2100 is not a leap year
            ("0 0 2 L * ?", 2000, 2, &[29]), // 2000 is
            ("0 0 2 L * ?", 2026, 4, &[30]),
            ("0 0 2 L * ?", 2026, 12, &[31]),
            // L-n counts back from the last day; a month too short has none.
            ("0 0 2 L-3 * ?", 2028, 2, &[26]),
            ("0 0 2 L-3 * ?", 2026, 2, &[25]),
            ("0 0 2 L-3 * ?", 2026, 3, &[28]),
            ("0 0 2 L-0 * ?", 2026, 3, &[31]),
            ("0 0 2 L-30 * ?", 2026, 1, &[1]),
            ("0 0 2 L-30 * ?", 2026, 4, &[]),
            ("0 0 2 L-30 * ?", 2028, 2, &[]),
            ("0 0 2 L-28 * ?", 2028, 2, &[1]),
            ("0 0 2 L-28 * ?", 2026, 2, &[]),
            // W: the nearest weekday, never leaving the month.
            ("0 0 2 15W * ?", 2026, 8, &[14]), // Saturday 15th -> Friday 14th
            ("0 0 2 15W * ?", 2026, 2, &[16]), // Sunday 15th -> Monday 16th
            ("0 0 2 15W * ?", 2026, 6, &[15]), // Monday 15th
            ("0 0 2 1W * ?", 2026, 8, &[3]),   // Saturday 1st -> Monday 3rd, not July 31st
            ("0 0 2 1W * ?", 2026, 2, &[2]),   // Sunday 1st -> Monday 2nd
            ("0 0 2 1W * ?", 2026, 1, &[1]),   // Thursday 1st
            ("0 0 2 31W * ?", 2026, 5, &[29]), // Sunday 31st -> Friday 29th, not June 1st
            ("0 0 2 31W * ?", 2026, 1, &[30]), // Saturday 31st -> Friday 30th
            ("0 0 2 31W * ?", 2026, 4, &[]),   // April has no 31st
            ("0 0 2 30W * ?", 2026, 11, &[30]), // Monday 30th
            ("0 0 2 28W * ?", 2026, 2, &[27]), // Saturday 28th, the last day -> Friday 27th
            ("0 0 2 29W * ?", 2026, 2, &[]),
            ("0 0 2 29W * ?", 2028, 2, &[29]),
            ("0 9 15W * *", 2026, 8, &[14]),
            // LW: the last weekday.
            ("0 0 2 LW * ?", 2026, 1, &[30]), // last day a Saturday
            ("0 0 2 LW * ?", 2026, 5, &[29]), // last day a Sunday
            ("0 0 2 LW * ?", 2026, 4, &[30]), // last day a Thursday
            ("0 0 2 LW * ?", 2026, 2, &[27]),
            ("0 9 LW * *", 2026, 5, &[29]),
            // n#k: the kth weekday n (Quartz 6 = Friday, 2 = Monday; Unix 5 = Friday).
            ("0 0 9 ? * 6#3", 2026, 3, &[20]),
            ("0 0 9 ? * 6#3", 2026, 1, &[16]),
            ("0 0 9 ? * 6#1", 2026, 5, &[1]),
            ("0 0 9 ? * 2#5", 2026, 6, &[29]), // Mondays 1, 8, 15, 22, 29
            ("0 0 9 ? * 2#5", 2026, 8, &[31]), // Mondays 3, ..., 31
            ("0 0 9 ? * 2#5", 2026, 7, &[]),   // Mondays 6, 13, 20, 27: no 5th
            ("0 0 9 ? * 2#5", 2026, 2, &[]),
            ("0 9 * * 5#3", 2026, 3, &[20]),
            ("0 9 * * 1#5", 2026, 6, &[29]),
            ("0 9 * * 0#2", 2026, 3, &[8]), // New York's spring-forward Sunday
            // nL: the last weekday n.
            ("0 0 9 ? * 6L", 2026, 7, &[31]), // the last day is a Friday
            ("0 0 9 ? * 6L", 2026, 2, &[27]),
            ("0 0 9 ? * 1L", 2026, 3, &[29]), // Berlin's spring-forward Sunday
            ("0 0 9 ? * 1L", 2026, 10, &[25]),
            ("0 9 * * 5L", 2026, 7, &[31]),
            ("0 9 * * 0L", 2026, 3, &[29]),
            // Quartz L alone in day-of-week: every Saturday.
            ("0 0 9 ? * L", 2026, 8, &[1, 8, 15, 22, 29]),
            // Unix, both day fields restricted: either (Vixie).
            ("0 9 L * 5#3", 2026, 3, &[20, 31]),
            ("0 9 15W * 0L", 2026, 2, &[16, 22]),
            // Unix, one field starting with `*`: both (odd days that are the last Friday).
            ("0 9 */2 * 5L", 2026, 7, &[31]),
            ("0 9 */2 * 5L", 2026, 1, &[]), // the last Friday is the 30th
            ("0 0 9 L * *", 2026, 6, &[30]),
            // Plain fields, for comparison.
            ("0 9 31 * *", 2026, 4, &[]),
            ("0 9 * * 1", 2026, 6, &[1, 8, 15, 22, 29]),
        ];
        for (expr, year, month, want) in cases {
            let set = fields(expr).day_set(*year, *month);
            let got: Vec<u32> = (1..=31).filter(|&d| bit(set, d)).collect();
            assert_eq!(got, *want, "{expr} in {year}-{month:02}");
        }
    }

    #[test]
    fn day_rule_mistakes_name_the_field_the_value_and_the_fix() {
        let cases = [
            (
                "0 0 9 ? * ?",
                "day-of-month and day-of-week are both \"?\"; Quartz uses \"?\" in one day field \
                 so that the other one says which days: write \"*\" in one of them for every day, \
                 such as \"0 0 9 * * ?\"",
            ),
            (
                "0 0 9 ? * ? 2027",
                "day-of-month and day-of-week are both \"?\"; Quartz uses \"?\" in one day field \
                 so that the other one says which days: write \"*\" in one of them for every day, \
                 such as \"0 0 9 * * ?\"",
            ),
            (
                "0 0 9 L-31 * ?",
                "day-of-month \"L-31\": L-31 counts back more than 30 days from the last day; \
                 write L-n with n from 0 to 30 (L-30 is the 1st of a 31-day month)",
            ),
            (
                "0 0 9 L-99999999999 * ?",
                "day-of-month \"L-99999999999\": L-99999999999 counts back more than 30 days from \
                 the last day; write L-n with n from 0 to 30 (L-30 is the 1st of a 31-day month)",
            ),
            (
                "0 0 9 L- * ?",
                "day-of-month \"L-\": write L-n with n a whole number from 0 to 30, such as \"L-3\" \
                 (three days before the last day of the month)",
            ),
            (
                "0 0 9 L-+3 * ?",
                "day-of-month \"L-+3\": write L-n with n a whole number from 0 to 30, such as \
                 \"L-3\" (three days before the last day of the month)",
            ),
            (
                "0 0 9 32W * ?",
                "day-of-month \"32W\": W's day 32 is out of range 1-31; write nW with n from 1 to \
                 31, such as \"15W\" (the weekday nearest the 15th)",
            ),
            (
                "0 0 9 0W * ?",
                "day-of-month \"0W\": W's day 0 is out of range 1-31; write nW with n from 1 to \
                 31, such as \"15W\" (the weekday nearest the 15th)",
            ),
            (
                "0 0 9 L,15 * ?",
                "day-of-month \"L,15\": L, L-n, LW and nW must stand alone in day-of-month (not in \
                 a list, range or step, as in Quartz); write the rule alone, such as \"L\" or \
                 \"15W\", or list the days as numbers",
            ),
            (
                "0 9 1-15W * *",
                "day-of-month \"1-15W\": L, L-n, LW and nW must stand alone in day-of-month (not \
                 in a list, range or step, as in Quartz); write the rule alone, such as \"L\" or \
                 \"15W\", or list the days as numbers",
            ),
            (
                "0 9 L/2 * *",
                "day-of-month \"L/2\": L, L-n, LW and nW must stand alone in day-of-month (not in \
                 a list, range or step, as in Quartz); write the rule alone, such as \"L\" or \
                 \"15W\", or list the days as numbers",
            ),
            (
                "0 0 9 L-3W * ?",
                "day-of-month \"L-3W\": write L-n with n a whole number from 0 to 30, such as \
                 \"L-3\" (three days before the last day of the month)",
            ),
            (
                "0 0 9 ? * 6#6",
                "day-of-week \"6#6\": the \"6\" after \"#\" says which one in the month, 1 to 5; \
                 write n#k with k from 1 to 5, such as 6L (the last Friday) or 6#3 (the third Friday)",
            ),
            (
                "0 0 9 ? * 6#0",
                "day-of-week \"6#0\": the \"0\" after \"#\" says which one in the month, 1 to 5; \
                 write n#k with k from 1 to 5, such as 6L (the last Friday) or 6#3 (the third Friday)",
            ),
            (
                "0 9 * * 5#",
                "day-of-week \"5#\": the \"\" after \"#\" says which one in the month, 1 to 5; \
                 write n#k with k from 1 to 5, such as 5L (the last Friday) or 5#3 (the third Friday)",
            ),
            (
                "0 9 * * #3",
                "day-of-week \"#3\": a weekday must come before \"#\"; write n#k, such as 5L (the \
                 last Friday) or 5#3 (the third Friday)",
            ),
            (
                "0 0 9 ? * 8#1",
                "day-of-week 8 is out of range 1-7 (Quartz numbering: 1 is Sunday, 7 is Saturday)",
            ),
            (
                "0 0 9 ? * 0L",
                "day-of-week 0 is out of range 1-7 (Quartz numbering: 1 is Sunday, 7 is Saturday)",
            ),
            (
                "0 9 * * 8L",
                "day-of-week 8 is out of range 0-7 (0 and 7 are Sunday)",
            ),
            (
                "0 9 * * XYZ#2",
                "unknown day-of-week name \"XYZ\"; use SUN, MON, TUE, WED, THU, FRI, SAT",
            ),
            (
                "0 0 9 ? * 6#3,2#1",
                "day-of-week \"6#3,2#1\": nL and n#k must stand alone in day-of-week (not in a \
                 list, range or step, as in Quartz); write one rule alone, such as 6L (the last \
                 Friday) or 6#3 (the third Friday)",
            ),
            (
                "0 9 * * 1-5L",
                "day-of-week \"1-5L\": nL and n#k must stand alone in day-of-week (not in a list, \
                 range or step, as in Quartz); write one rule alone, such as 5L (the last Friday) \
                 or 5#3 (the third Friday)",
            ),
            (
                "0 9 * * L",
                "day-of-week \"L\" alone means Saturday in Quartz, which a Unix crontab would not \
                 read it as; write 6 or SAT for Saturday, or nL for the last weekday n of the \
                 month, such as 5L (the last Friday) or 5#3 (the third Friday)",
            ),
            (
                "0 0 9 L * 6L *",
                "day-of-month \"L\" and day-of-week \"6L\" are both set; Quartz expressions set \
                 one and write \"?\" in the other, such as \"0 0 9 ? * MON-FRI\" or \"0 0 9 15 * ?\"",
            ),
            (
                "0 9 L * ?",
                "\"?\" is Quartz syntax and needs the seconds field; in a 5-field crontab write \"*\" instead",
            ),
        ];
        for (expr, want) in cases {
            assert_eq!(reason(expr), want, "{expr}");
        }
    }

    /// Never-firing rules are refused when parsed, so no search has to discover it.
    #[test]
    fn never_firing_day_rules_and_years_are_rejected() {
        let cases = [
            (
                "0 0 0 L-30 2 ?",
                "it would never fire: day-of-month \"L-30\" does not occur in month \"2\"; check \
                 those two fields",
            ),
            (
                "30 0 L-30 2 *",
                "it would never fire: day-of-month \"L-30\" does not occur in month \"2\"; check \
                 those two fields",
            ),
            (
                "0 0 0 L-30 4,6,9,11 ?",
                "it would never fire: day-of-month \"L-30\" does not occur in month \"4,6,9,11\"; \
                 check those two fields",
            ),
            (
                "0 0 0 30W 2 ?",
                "it would never fire: day-of-month \"30W\" does not occur in month \"2\"; check \
                 those two fields",
            ),
            (
                "0 0 0 29 2 ? 2027",
                "it would never fire: day-of-month \"29\" does not occur in month \"2\" of year \
                 \"2027\"; check those three fields",
            ),
            (
                "0 0 0 L-28 2 ? 2025-2027",
                "it would never fire: day-of-month \"L-28\" does not occur in month \"2\" of year \
                 \"2025-2027\"; check those three fields",
            ),
            (
                // February 2026 starts on a Sunday and has four of each weekday.
                "0 0 9 ? 2 2#5 2026",
                "it would never fire: day-of-week \"2#5\" does not occur in month \"2\" of year \
                 \"2026\"; check those three fields",
            ),
            (
                // A 5th Sunday in February is the 29th; */10 is the 1st, 11th, 21st and 31st.
                "0 9 */10 2 0#5",
                "it would never fire: day-of-month \"*/10\" with day-of-week \"0#5\" does not occur \
                 in month \"2\"; check those three fields",
            ),
        ];
        for (expr, want) in cases {
            assert_eq!(reason(expr), want, "{expr}");
        }
        // Rare but real: a 5th Monday in February needs a leap year starting on a Monday's
        // weekday (2016, 2044); the last day of February minus 28 needs a leap year.
        for expr in [
            "0 0 9 ? 2 2#5",
            "0 0 9 ? 2 2#5 2044",
            "0 0 0 L-28 2 ?",
            "0 0 0 L-28 2 ? 2028",
            "0 0 0 29 2 ? 2027,2028",
            "0 9 30 2 5#5", // Vixie OR: the 30th never, a 5th Friday sometimes
            "0 0 0 L-30 1 ?",
            "0 0 0 31W * ?",
        ] {
            assert!(parse(expr).is_ok(), "{expr}: {:?}", parse(expr).err());
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
