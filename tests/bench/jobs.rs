//! The benchmark's job definitions: as `JobSpec`s for in-process schedulers and as TOML job
//! files for `chime scheduler --jobs`, including the mixed schedules of the scale scenario.

use anyhow::Context as _;
use chime_scheduler::job::JobSpec;

/// A job as the job file's fields (`name`, `group`, `every` or `schedule`, …), all strings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JobDef {
    /// `(field, value)` pairs in file order.
    pub fields: Vec<(&'static str, String)>,
}

impl JobDef {
    /// A job with a name and a group.
    pub fn new(name: &str, group: &str) -> JobDef {
        JobDef {
            fields: vec![("name", name.to_owned()), ("group", group.to_owned())],
        }
    }

    /// Adds a string field.
    pub fn with(mut self, field: &'static str, value: impl Into<String>) -> JobDef {
        self.fields.push((field, value.into()));
        self
    }

    /// The validated spec, as a config file would give it.
    pub fn spec(&self) -> anyhow::Result<JobSpec> {
        let object: serde_json::Map<String, serde_json::Value> = self
            .fields
            .iter()
            .map(|(k, v)| ((*k).to_owned(), serde_json::Value::String(v.clone())))
            .collect();
        let spec: JobSpec = serde_json::from_value(serde_json::Value::Object(object))
            .with_context(|| format!("bench job {:?} is not a valid job", self.fields))?;
        spec.schedule()
            .with_context(|| format!("bench job {:?} has an invalid schedule", self.fields))?;
        Ok(spec)
    }
}

/// Specs of `defs`, validated.
pub fn specs(defs: &[JobDef]) -> anyhow::Result<Vec<JobSpec>> {
    defs.iter().map(JobDef::spec).collect()
}

/// A TOML job file declaring `defs`.
pub fn toml(defs: &[JobDef]) -> String {
    let mut out = String::with_capacity(defs.len() * 96);
    for def in defs {
        out.push_str("[[jobs]]\n");
        for (field, value) in &def.fields {
            // A JSON string literal is a valid TOML basic string.
            let quoted = serde_json::to_string(value).expect("strings serialise");
            out.push_str(&format!("{field} = {quoted}\n"));
        }
        out.push('\n');
    }
    out
}

/// Job `i` of the scale scenario's mix, in one of `groups` groups. One job in a thousand fires
/// every second (the steady due load); the others spread over every dialect and several zones:
///
/// | share | schedule | fires |
/// |---|---|---|
/// | 1/7 | `S M/5 * * * *` (6-field) | every 5 min, seconds and minutes spread |
/// | 1/7 | `M * * * *` (5-field) | hourly, minutes spread |
/// | 1/7 | `M H * * 1-5` in America/New_York | weekdays |
/// | 1/7 | `0 M H ? * MON-FRI *` (Quartz) in Asia/Shanghai | weekdays |
/// | 1/7 | `@daily` / `@hourly` in Europe/Berlin | daily / hourly |
/// | 1/7 | `every` 1h … 1d | epoch-aligned |
/// | 1/7 | none (manual only) in Australia/Lord_Howe | never |
pub fn scale_job(i: usize, groups: usize) -> JobDef {
    let def = JobDef::new(&format!("scale-{i:06}"), &format!("g{:02}", i % groups));
    if i.is_multiple_of(1000) {
        return def.with("every", "1s");
    }
    let (s, m, h) = (i % 60, (i / 7) % 60, (i / 11) % 24);
    match i % 7 {
        0 => def.with("schedule", format!("{s} {}/5 * * * *", m % 5)),
        1 => def.with("schedule", format!("{m} * * * *")),
        2 => def
            .with("schedule", format!("{m} {h} * * 1-5"))
            .with("timezone", "America/New_York"),
        3 => def
            .with("schedule", format!("0 {m} {h} ? * MON-FRI *"))
            .with("timezone", "Asia/Shanghai"),
        4 => {
            let shorthand = if i.is_multiple_of(2) {
                "@daily"
            } else {
                "@hourly"
            };
            def.with("schedule", shorthand)
                .with("timezone", "Europe/Berlin")
        }
        5 => def.with("every", ["1h", "2h", "6h", "12h", "1d"][i % 5]),
        _ => def.with("timezone", "Australia/Lord_Howe"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_kind_of_scale_job_is_a_valid_job() {
        for i in 0..2_000 {
            scale_job(i, 10)
                .spec()
                .unwrap_or_else(|e| panic!("scale job {i}: {e:#}"));
        }
    }

    #[test]
    fn the_toml_file_quotes_values() {
        let file = toml(&[JobDef::new("a", "g").with("schedule", "0 9 * * 1-5")]);
        assert_eq!(
            file,
            "[[jobs]]\nname = \"a\"\ngroup = \"g\"\nschedule = \"0 9 * * 1-5\"\n\n"
        );
    }
}
