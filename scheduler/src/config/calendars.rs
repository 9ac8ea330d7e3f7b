//! Calendars in job files and job definitions: `[calendars.NAME]` tables of a job file, a job's
//! `calendar` (a declared calendar's name, or a calendar written out as a table), and the
//! resolution of names into [`CalendarDef`] trees (unknown names and cycles named, with fixes).
//! What a calendar means is `crate::schedule::calendar`'s.

use chime_protocol::limits::MAX_CALENDAR_FILE_BYTES;
use chrono_tz::Tz;
use serde_json::{Map, Value};
use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};

use super::suggest::closest;
use super::{ConfigError, FieldError, identifier_problem, render};
use crate::schedule::CalendarDef;

/// Every field of a calendar table, in the order the docs list them.
pub const CALENDAR_FIELDS: &[&str] = &[
    "timezone", "weekdays", "dates", "yearly", "times", "file", "include", "except",
];

/// The rule lists of a calendar table, each a list of strings.
const RULE_LISTS: [&str; 4] = ["weekdays", "dates", "yearly", "times"];

/// A calendar declared in a job file, its own rules checked, its references by name not yet
/// resolved.
pub(super) struct Declared {
    origin: String,
    /// Its own rules, and the calendars written out as tables in `include` and `except`.
    def: CalendarDef,
    /// `include` entries that name declared calendars.
    include: Vec<String>,
    /// `except` entries that name declared calendars.
    except: Vec<String>,
    /// Its table has mistakes (reported where they are): jobs and calendars naming it get no
    /// message of their own.
    broken: bool,
}

/// Where a calendar table is, for messages and for the files it names.
struct Place<'a> {
    /// Dotted field path up to the calendar (`calendars.cn-workdays.` or `calendar.`).
    prefix: String,
    /// The directory relative `file` paths are read from; `None` when files cannot be read
    /// (a definition sent to the API).
    base: Option<&'a Path>,
    /// Whether `include` and `except` may name declared calendars (job files' `[calendars]`).
    names_allowed: bool,
}

/// Reads the `calendars` table of a job file: each calendar's own rules are checked, its
/// references collected. Mistakes are returned with the file as origin.
pub(super) fn read_declared(
    origin: &str,
    value: &Value,
    into: &mut BTreeMap<String, Declared>,
    errors: &mut Vec<ConfigError>,
) {
    let Value::Object(tables) = value else {
        errors.push(ConfigError::key(
            origin,
            "calendars",
            Some(render(value)),
            "expected a table of calendars, one [calendars.NAME] section each, such as \
             [calendars.workdays] with weekdays = [\"mon-fri\"]",
        ));
        return;
    };
    let base = Path::new(origin).parent();
    for (name, table) in tables {
        let prefix = format!("calendars.{name}");
        if let Some(problem) = identifier_problem(name) {
            errors.push(ConfigError::key(
                origin,
                &prefix,
                None,
                format!("invalid calendar name: {problem}"),
            ));
            continue;
        }
        if let Some(first) = into.get(name) {
            errors.push(ConfigError::key(
                origin,
                &prefix,
                None,
                format!(
                    "duplicate calendar name, first declared in {}; calendar names are unique \
                     across all job files, so rename one of them",
                    first.origin
                ),
            ));
            continue;
        }
        let place = Place {
            prefix: format!("{prefix}."),
            base,
            names_allowed: true,
        };
        let mut problems = Vec::new();
        let (def, include, except) = read_table(name, table, &place, &mut problems);
        into.insert(
            name.clone(),
            Declared {
                origin: origin.to_owned(),
                def,
                include,
                except,
                broken: !problems.is_empty(),
            },
        );
        errors.extend(problems.into_iter().map(|problem| {
            ConfigError::key(
                origin,
                problem.field.unwrap_or_else(|| prefix.clone()),
                problem.value,
                problem.message,
            )
        }));
    }
}

/// Resolves every declared calendar's references into whole trees; unknown names and cycles
/// are mistakes of the calendar that makes them.
pub(super) fn resolve_declared(
    declared: &BTreeMap<String, Declared>,
    errors: &mut Vec<ConfigError>,
) -> HashMap<String, CalendarDef> {
    let mut done = HashMap::new();
    let mut failed = Vec::new();
    for name in declared.keys() {
        let mut path = Vec::new();
        resolve(name, declared, &mut path, &mut done, &mut failed, errors);
    }
    done
}

fn resolve(
    name: &str,
    declared: &BTreeMap<String, Declared>,
    path: &mut Vec<String>,
    done: &mut HashMap<String, CalendarDef>,
    failed: &mut Vec<String>,
    errors: &mut Vec<ConfigError>,
) -> Option<CalendarDef> {
    if let Some(def) = done.get(name) {
        return Some(def.clone());
    }
    if failed.iter().any(|f| f == name) {
        return None;
    }
    let calendar = declared.get(name).filter(|calendar| !calendar.broken)?;
    path.push(name.to_owned());
    let mut def = calendar.def.clone();
    let mut ok = true;
    for (list, names) in [("include", &calendar.include), ("except", &calendar.except)] {
        for reference in names {
            let key = format!("calendars.{name}.{list}");
            if let Some(at) = path.iter().position(|p| p == reference) {
                let mut cycle = path[at..].to_vec();
                cycle.push(reference.clone());
                errors.push(ConfigError::key(
                    &calendar.origin,
                    key,
                    Some(render(&Value::String(reference.clone()))),
                    format!(
                        "calendars refer to each other in a cycle ({}); remove one of these \
                         references",
                        cycle.join(" -> ")
                    ),
                ));
                ok = false;
                continue;
            }
            if !declared.contains_key(reference) {
                let near = closest(reference, declared.keys().map(String::as_str))
                    .map(|near| format!(" did you mean {near:?}?"))
                    .unwrap_or_default();
                errors.push(ConfigError::key(
                    &calendar.origin,
                    key,
                    Some(render(&Value::String(reference.clone()))),
                    format!(
                        "no calendar of this name is declared in the job files;{near} declare \
                         it as [calendars.{reference}] or fix the name"
                    ),
                ));
                ok = false;
                continue;
            }
            match resolve(reference, declared, path, done, failed, errors) {
                Some(inner) if list == "include" => def.include.push(inner),
                Some(inner) => def.except.push(inner),
                None => ok = false,
            }
        }
    }
    path.pop();
    if ok && let Err(problems) = def.compile(Tz::UTC) {
        for problem in problems {
            errors.push(ConfigError::key(
                &calendar.origin,
                format!("calendars.{name}.{}", problem.field),
                problem.value.map(quoted),
                problem.message,
            ));
        }
        ok = false;
    }
    if ok {
        done.insert(name.to_owned(), def.clone());
        Some(def)
    } else {
        failed.push(name.to_owned());
        None
    }
}

/// The names of the declared calendars, for "did you mean".
pub(super) fn declared_names(declared: &HashMap<String, CalendarDef>) -> Vec<&str> {
    let mut names: Vec<&str> = declared.keys().map(String::as_str).collect();
    names.sort_unstable();
    names
}

/// A job's `calendar` written out as a table (inline in a job file, or in an API body): its
/// rules, and the tables of `include` and `except`. Its `name` is optional (default `inline`).
pub(super) fn read_inline(value: &Map<String, Value>) -> Result<CalendarDef, Vec<FieldError>> {
    let name = match value.get("name") {
        None | Some(Value::Null) => "inline".to_owned(),
        Some(Value::String(name)) if identifier_problem(name).is_none() => name.clone(),
        Some(other) => {
            return Err(vec![FieldError::new(
                "calendar.name",
                Some(render(other)),
                "a calendar's name is 1-63 letters, digits, '-', '_' or '.', such as \
                 \"cn-workdays\"",
            )]);
        }
    };
    let mut table = value.clone();
    table.remove("name");
    let place = Place {
        prefix: "calendar.".into(),
        base: None,
        names_allowed: false,
    };
    let mut problems = Vec::new();
    let (def, _, _) = read_table(&name, &Value::Object(table), &place, &mut problems);
    if !problems.is_empty() {
        return Err(problems);
    }
    def.compile(Tz::UTC).map_err(|problems| {
        problems
            .into_iter()
            .map(|p| {
                FieldError::new(
                    &format!("calendar.{}", p.field),
                    p.value.map(quoted),
                    p.message,
                )
            })
            .collect::<Vec<_>>()
    })?;
    Ok(def)
}

/// Reads one calendar table: its own rules (checked by compiling them alone), the tables of
/// `include` and `except` (read the same way), and the names in them.
fn read_table(
    name: &str,
    value: &Value,
    place: &Place<'_>,
    problems: &mut Vec<FieldError>,
) -> (CalendarDef, Vec<String>, Vec<String>) {
    let mut def = CalendarDef {
        name: name.to_owned(),
        ..CalendarDef::default()
    };
    let (mut include, mut except) = (Vec::new(), Vec::new());
    let prefix = &place.prefix;
    let Value::Object(table) = value else {
        problems.push(FieldError::new(
            prefix.trim_end_matches('.'),
            Some(render(value)),
            "expected a calendar table with weekdays, dates, yearly or times, such as \
             { weekdays = [\"mon-fri\"] }",
        ));
        return (def, include, except);
    };
    for key in table.keys() {
        if !CALENDAR_FIELDS.contains(&key.as_str()) {
            let near = closest(key, CALENDAR_FIELDS.iter().copied())
                .map(|near| format!("did you mean {near:?}? "))
                .unwrap_or_default();
            problems.push(FieldError::new(
                &format!("{prefix}{key}"),
                Some(render(&table[key])),
                format!(
                    "unknown calendar field; {near}a calendar has {}",
                    CALENDAR_FIELDS.join(", ")
                ),
            ));
        }
    }
    match table.get("timezone") {
        None | Some(Value::Null) => {}
        Some(Value::String(zone)) => match zone.parse::<Tz>() {
            Ok(zone) => def.timezone = Some(zone),
            Err(_) => problems.push(FieldError::new(
                &format!("{prefix}timezone"),
                Some(render(&table["timezone"])),
                "unknown time zone; use an IANA name such as \"Asia/Shanghai\", or leave it \
                 out to read the calendar in each job's zone",
            )),
        },
        Some(other) => problems.push(FieldError::new(
            &format!("{prefix}timezone"),
            Some(render(other)),
            "expected an IANA zone name as a string, such as \"Europe/Berlin\"",
        )),
    }
    for list in RULE_LISTS {
        let Some(items) = string_list(table, list, prefix, problems) else {
            continue;
        };
        let target = match list {
            "weekdays" => &mut def.weekdays,
            "dates" => &mut def.dates,
            "yearly" => &mut def.yearly,
            _ => &mut def.times,
        };
        target.extend(items);
    }
    if let Some(file) = table.get("file").filter(|v| !v.is_null()) {
        read_file(file, place, &mut def, problems);
    }
    for list in ["include", "except"] {
        let Some(entries) = table.get(list).filter(|v| !v.is_null()) else {
            continue;
        };
        let Value::Array(entries) = entries else {
            problems.push(FieldError::new(
                &format!("{prefix}{list}"),
                Some(render(entries)),
                "expected a list of calendars, such as [\"cn-holidays\"]",
            ));
            continue;
        };
        for (i, entry) in entries.iter().enumerate() {
            let field = format!("{prefix}{list}[{i}]");
            match entry {
                Value::String(reference) if place.names_allowed => {
                    if list == "include" {
                        include.push(reference.clone());
                    } else {
                        except.push(reference.clone());
                    }
                }
                Value::String(_) => problems.push(FieldError::new(
                    &field,
                    Some(render(entry)),
                    "a calendar written in a job definition includes and excepts calendars \
                     written out as tables; to refer to a calendar by name, declare it as \
                     [calendars.NAME] in a job file and set calendar = \"NAME\"",
                )),
                Value::Object(inner) => {
                    let inner_name = match inner.get("name") {
                        Some(Value::String(n)) => n.clone(),
                        _ => format!("{name}.{list}[{i}]"),
                    };
                    let mut inner = inner.clone();
                    inner.remove("name");
                    let inner_place = Place {
                        prefix: format!("{field}."),
                        base: place.base,
                        names_allowed: place.names_allowed,
                    };
                    let (inner_def, more_include, more_except) =
                        read_table(&inner_name, &Value::Object(inner), &inner_place, problems);
                    if !(more_include.is_empty() && more_except.is_empty()) {
                        problems.push(FieldError::new(
                            &field,
                            None,
                            "a calendar written out inside include or except refers to others \
                             by name; declare it as [calendars.NAME] instead",
                        ));
                    }
                    if list == "include" {
                        def.include.push(inner_def);
                    } else {
                        def.except.push(inner_def);
                    }
                }
                other => problems.push(FieldError::new(
                    &field,
                    Some(render(other)),
                    "expected a calendar's name or a calendar table",
                )),
            }
        }
    }
    // Each rule by itself, so a mistake is named where it is written.
    let own = CalendarDef {
        include: Vec::new(),
        except: Vec::new(),
        ..def.clone()
    };
    if let Err(found) = own.compile(Tz::UTC) {
        problems.extend(found.into_iter().map(|p| {
            FieldError::new(
                &format!("{prefix}{}", p.field),
                p.value.map(quoted),
                p.message,
            )
        }));
    }
    (def, include, except)
}

/// A rule's text as messages show values.
fn quoted(text: String) -> String {
    render(&Value::String(text))
}

/// A list of strings; a mistake otherwise.
fn string_list(
    table: &Map<String, Value>,
    list: &str,
    prefix: &str,
    problems: &mut Vec<FieldError>,
) -> Option<Vec<String>> {
    let value = table.get(list).filter(|v| !v.is_null())?;
    let example = match list {
        "weekdays" => "[\"mon-fri\"]",
        "dates" => "[\"2027-01-01\", \"2027-02-10..2027-02-17\"]",
        "yearly" => "[\"12-25\", \"12-31..01-01\"]",
        _ => "[\"09:00-18:00\"]",
    };
    let Value::Array(items) = value else {
        problems.push(FieldError::new(
            &format!("{prefix}{list}"),
            Some(render(value)),
            format!("expected a list of strings, such as {list} = {example}"),
        ));
        return None;
    };
    let mut texts = Vec::with_capacity(items.len());
    for (i, item) in items.iter().enumerate() {
        match item {
            Value::String(text) => texts.push(text.clone()),
            other => problems.push(FieldError::new(
                &format!("{prefix}{list}[{i}]"),
                Some(render(other)),
                format!("expected a string, such as {list} = {example}"),
            )),
        }
    }
    Some(texts)
}

/// `file`: a text file of one date (`2027-01-01`), date range (`2027-02-10..2027-02-17`) or
/// yearly month-day (`12-25`, `12-24..12-26`) per line; `#` starts a comment; blank lines are
/// ignored. Read relative to the job file's directory, at most [`MAX_CALENDAR_FILE_BYTES`].
fn read_file(
    file: &Value,
    place: &Place<'_>,
    def: &mut CalendarDef,
    problems: &mut Vec<FieldError>,
) {
    let field = format!("{}file", place.prefix);
    let Value::String(path) = file else {
        problems.push(FieldError::new(
            &field,
            Some(render(file)),
            "expected a file path as a string, such as \"holidays/cn-2027.txt\"",
        ));
        return;
    };
    let Some(base) = place.base else {
        problems.push(FieldError::new(
            &field,
            Some(render(file)),
            "a calendar file is read when job files are loaded; in a definition sent to the \
             API, list the dates in \"dates\" and \"yearly\" instead",
        ));
        return;
    };
    let full: PathBuf = base.join(path);
    let text = match std::fs::metadata(&full) {
        Ok(meta) if meta.len() > MAX_CALENDAR_FILE_BYTES => Err(format!(
            "is {} bytes; a calendar file is at most {MAX_CALENDAR_FILE_BYTES} bytes: merge \
             consecutive dates into ranges or split the calendar",
            meta.len()
        )),
        Ok(_) => std::fs::read_to_string(&full).map_err(|e| format!("cannot read: {e}")),
        Err(e) => Err(format!(
            "cannot read {}: {e}; a relative path is read from the job file's directory",
            full.display()
        )),
    };
    let text = match text {
        Ok(text) => text,
        Err(message) => {
            problems.push(FieldError::new(&field, Some(render(file)), message));
            return;
        }
    };
    for (n, line) in text.lines().enumerate() {
        let entry = line.split('#').next().unwrap_or("").trim();
        if entry.is_empty() {
            continue;
        }
        // A date starts with its four-digit year; a yearly entry with its two-digit month.
        let yearly = entry
            .split(['-', '.'])
            .next()
            .is_some_and(|first| first.len() == 2);
        let entries = vec![entry.to_owned()];
        let probe = if yearly {
            CalendarDef {
                name: def.name.clone(),
                yearly: entries,
                ..CalendarDef::default()
            }
        } else {
            CalendarDef {
                name: def.name.clone(),
                dates: entries,
                ..CalendarDef::default()
            }
        };
        if let Err(found) = probe.compile(Tz::UTC) {
            for problem in found {
                problems.push(FieldError::new(
                    &format!("{field} line {}", n + 1),
                    Some(render(&Value::String(entry.to_owned()))),
                    format!("{} ({path})", problem.message),
                ));
            }
            continue;
        }
        if yearly {
            def.yearly.push(entry.to_owned());
        } else {
            def.dates.push(entry.to_owned());
        }
    }
}

#[cfg(test)]
mod tests;
