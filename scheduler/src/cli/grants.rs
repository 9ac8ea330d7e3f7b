//! `chime workers grant` and `chime workers revoke`: the database role an executor group's
//! workers connect as, which may act for that group only (migration `worker_privilege`,
//! docs/protocol.md section 11), and the RabbitMQ permissions that match it.
//!
//! Without `--apply` the commands print what an administrator runs; with it they run the SQL
//! themselves on the scheduler's own (owner) connection.

use std::fmt::Write as _;
use std::io::Write;

use super::{WorkersCommand, io};
use crate::auth::Caller;
use crate::config::{DEFAULT_QUEUE_PREFIX, identifier_problem};
use crate::ops::{FieldProblem, Operations, OpsError, OpsResult};

/// `chime workers grant` and `chime workers revoke`.
pub(super) async fn workers(
    ops: &Operations,
    caller: &Caller,
    command: WorkersCommand,
    out: &mut dyn Write,
) -> OpsResult<()> {
    let prefix = ops
        .broker_prefix()
        .unwrap_or(DEFAULT_QUEUE_PREFIX)
        .to_owned();
    match command {
        WorkersCommand::List => unreachable!("listed by the caller"),
        WorkersCommand::Grant {
            group,
            role,
            login,
            apply,
        } => {
            let (group, role) = checked(&group, role.as_deref()).map_err(OpsError::Invalid)?;
            if !apply {
                let sql = grant_sql(&role, &group, login, None, &caller.actor);
                write!(
                    out,
                    "-- As a PostgreSQL administrator, in the Chime database (or run this \
                     command with --apply):\n{sql}\n{}",
                    rabbitmq_advice(&prefix, &group, &role)
                )
                .map_err(io)?;
                return Ok(());
            }
            let password = if login {
                Some(crate::auth::new_secret()?)
            } else {
                None
            };
            let (created, fresh) = ops
                .store()
                .grant_worker(&role, &group, password.as_deref(), &caller.actor)
                .await?;
            match (&password, created) {
                (Some(password), true) => writeln!(
                    out,
                    "created login role {role}; its password (shown only this once): {password}"
                ),
                (None, true) => writeln!(
                    out,
                    "created group role {role}: GRANT {role} TO <each worker's login role>"
                ),
                (_, false) => writeln!(out, "role {role} exists; kept as it is"),
            }
            .map_err(io)?;
            let granted = if fresh {
                "may now act"
            } else {
                "already could act"
            };
            write!(
                out,
                "role {role} {granted} for executor group {group}\n\n{}",
                rabbitmq_advice(&prefix, &group, &role)
            )
            .map_err(io)?;
            Ok(())
        }
        WorkersCommand::Revoke { group, role, apply } => {
            let (group, role) = checked(&group, role.as_deref()).map_err(OpsError::Invalid)?;
            if !apply {
                write!(
                    out,
                    "-- As a PostgreSQL administrator, in the Chime database (or run this \
                     command with --apply):\n{}\n{}",
                    revoke_sql(&role, &group),
                    rabbitmq_revoke_advice(&role)
                )
                .map_err(io)?;
                return Ok(());
            }
            let had = ops.store().revoke_worker(&role, &group).await?;
            let left = ops.store().worker_grants(&role).await?;
            if had {
                writeln!(
                    out,
                    "role {role} may no longer act for executor group {group}"
                )
            } else {
                writeln!(out, "role {role} had no grant of executor group {group}")
            }
            .map_err(io)?;
            if left.is_empty() {
                writeln!(
                    out,
                    "it has no group left (and no Chime rights); drop it with DROP ROLE {role} \
                     when no worker uses it"
                )
            } else {
                writeln!(out, "it still acts for: {}", left.join(", "))
            }
            .map_err(io)?;
            Ok(())
        }
    }
}

/// Longest PostgreSQL role name (`NAMEDATALEN − 1`).
pub const MAX_ROLE_BYTES: usize = 63;

/// What `--role` may be: a lowercase SQL identifier of 1 to 63 bytes (`a-z`, `0-9`, `_`,
/// starting with a letter or `_`), not one of PostgreSQL's reserved `pg_` names. So it is the
/// same name quoted or not, and safe inside the statements printed.
pub fn role_problem(role: &str) -> Option<String> {
    let Some(first) = role.chars().next() else {
        return Some("it is empty".to_owned());
    };
    if role.len() > MAX_ROLE_BYTES {
        return Some(format!(
            "{} bytes is over PostgreSQL's limit of {MAX_ROLE_BYTES}",
            role.len()
        ));
    }
    if let Some(c) = role
        .chars()
        .find(|c| !(c.is_ascii_lowercase() || c.is_ascii_digit() || *c == '_'))
    {
        return Some(format!("{c:?} is not allowed"));
    }
    if !(first.is_ascii_lowercase() || first == '_') {
        return Some(format!("starts with {first:?}"));
    }
    if role.starts_with("pg_") {
        return Some("names starting with pg_ are reserved by PostgreSQL".to_owned());
    }
    None
}

/// The role of group `group`'s workers when `--role` is not given: `chime_worker_<group>`, with
/// the group's `.` and `-` as `_`, cut to 63 bytes.
pub fn default_role(group: &str) -> String {
    let mut role: String = format!("chime_worker_{group}")
        .chars()
        .map(|c| if c == '.' || c == '-' { '_' } else { c })
        .collect();
    role.truncate(MAX_ROLE_BYTES);
    role
}

/// The checked `--group` and `--role` (defaulted) of a grant or revoke, or the problems.
pub fn checked(group: &str, role: Option<&str>) -> Result<(String, String), Vec<FieldProblem>> {
    let mut problems = Vec::new();
    if let Some(problem) = identifier_problem(group) {
        problems.push(FieldProblem {
            field: Some("--group".into()),
            value: Some(format!("{group:?}")),
            message: format!(
                "invalid group name: {problem}; use the executor group's name (1 to 63 \
                 characters of a-z, 0-9, _ . -)"
            ),
        });
    }
    let role = role.map_or_else(|| default_role(group), str::to_owned);
    if let Some(problem) = role_problem(&role) {
        problems.push(FieldProblem {
            field: Some("--role".into()),
            value: Some(format!("{role:?}")),
            message: format!(
                "invalid role name: {problem}; use 1 to {MAX_ROLE_BYTES} bytes of a-z, 0-9 and _ \
                 starting with a letter, such as chime_worker_orders"
            ),
        });
    }
    if problems.is_empty() {
        Ok((group.to_owned(), role))
    } else {
        Err(problems)
    }
}

/// A string as an SQL literal.
fn literal(text: &str) -> String {
    format!("'{}'", text.replace('\'', "''"))
}

/// The statements that create `role` (with `password`, or the placeholder, when `login`) and
/// grant it group `group`, recorded as by `by`.
pub fn grant_sql(role: &str, group: &str, login: bool, password: Option<&str>, by: &str) -> String {
    let mut sql = String::new();
    if login {
        let password = password.map_or_else(|| "'<a password of its own>'".to_owned(), literal);
        let _ = writeln!(sql, "CREATE ROLE {role} LOGIN PASSWORD {password};");
    } else {
        let _ = writeln!(
            sql,
            "CREATE ROLE {role} NOLOGIN;  -- then GRANT {role} TO <each worker's login role>;"
        );
    }
    let _ = writeln!(
        sql,
        "SELECT chime_grant_worker({}, {}, {});",
        literal(role),
        literal(group),
        literal(by)
    );
    sql
}

/// The statement that withdraws `role`'s grant of `group`.
pub fn revoke_sql(role: &str, group: &str) -> String {
    format!(
        "SELECT chime_revoke_worker({}, {});\n",
        literal(role),
        literal(group)
    )
}

/// `text` as a regular expression matching itself.
fn regex_escape(text: &str) -> String {
    text.chars().fold(String::new(), |mut out, c| {
        if ".+*?()[]{}|^$\\".contains(c) {
            out.push('\\');
        }
        out.push(c);
        out
    })
}

/// The RabbitMQ user and permissions of group `group`'s workers under prefix `prefix`: they
/// declare, bind, publish to and consume exactly the objects of docs/protocol.md section 1 (the
/// group's exchange, work queue, parking lot and delay tiers; the control exchange and their
/// own control queues), nothing of another group.
pub fn rabbitmq_advice(prefix: &str, group: &str, user: &str) -> String {
    let p = regex_escape(prefix);
    let g = regex_escape(group);
    let group_objects = format!(r"{p}\.{g}(\.(work|parking|retry\.[0-9]+(ms|s|m|h)|worker\..+))?");
    let control_queues = format!(r"{p}\.control\..+");
    let configure = format!("^({group_objects}|{p}\\.control|{control_queues})$");
    let write = format!("^({group_objects}|{control_queues})$");
    let read = format!("^({group_objects}|{p}\\.control|{control_queues})$");
    format!(
        "# RabbitMQ: a user of its own for the workers of group {group} (vhost /: use -p for \
         another)\n\
         rabbitmqctl add_user {user} '<a password of its own>'\n\
         rabbitmqctl set_permissions -p / {user} '{configure}' '{write}' '{read}'\n"
    )
}

/// The RabbitMQ advice when a group's workers lose their grant.
pub fn rabbitmq_revoke_advice(user: &str) -> String {
    format!(
        "# RabbitMQ: withdraw the workers' user too, if no group needs it any more\n\
         rabbitmqctl clear_permissions -p / {user}\n"
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn role_names_are_plain_sql_identifiers_within_postgres_limit() {
        assert_eq!(role_problem("chime_worker_orders"), None);
        assert_eq!(role_problem("_w1"), None);
        assert_eq!(role_problem(&"r".repeat(63)), None);
        for bad in ["", "Orders", "1st", "a-b", "a;drop", "pg_monitor", "x\"y"] {
            assert!(role_problem(bad).is_some(), "{bad:?}");
        }
        assert!(role_problem(&"r".repeat(64)).unwrap().contains("64 bytes"));
    }

    #[test]
    fn the_default_role_names_the_group_as_an_identifier() {
        assert_eq!(default_role("orders"), "chime_worker_orders");
        assert_eq!(default_role("eu.orders-v2"), "chime_worker_eu_orders_v2");
        let long = default_role(&"g".repeat(63));
        assert_eq!(long.len(), 63);
        assert_eq!(role_problem(&long), None);
        assert!(checked("Bad Group", None).is_err());
        assert_eq!(
            checked("orders", Some("w")).unwrap(),
            ("orders".into(), "w".into())
        );
    }

    #[test]
    fn the_printed_sql_creates_the_role_and_grants_one_group() {
        let sql = grant_sql("chime_worker_orders", "orders", true, None, "cli:o'neil");
        assert!(sql.contains("CREATE ROLE chime_worker_orders LOGIN PASSWORD '<"));
        assert!(sql.contains(
            "SELECT chime_grant_worker('chime_worker_orders', 'orders', 'cli:o''neil');"
        ));
        assert!(grant_sql("r", "g", false, None, "me").contains("NOLOGIN"));
        assert_eq!(
            revoke_sql("r", "g"),
            "SELECT chime_revoke_worker('r', 'g');\n"
        );
    }

    /// The permissions match the group's objects of docs/protocol.md section 1 and nothing of
    /// another group, even one whose name starts with this group's.
    #[test]
    fn rabbitmq_permissions_cover_the_groups_objects_only() {
        let advice = rabbitmq_advice("chime", "orders", "w");
        let line = advice
            .lines()
            .find(|l| l.starts_with("rabbitmqctl set_permissions"))
            .unwrap();
        let patterns: Vec<&str> = line.split('\'').skip(1).step_by(2).collect();
        assert_eq!(patterns.len(), 3, "{line}");
        // RabbitMQ matches permissions as regular expressions (not anchored by itself).
        let [configure, write, read] = [patterns[0], patterns[1], patterns[2]].map(|p| {
            let regex = regex_automata::meta::Regex::new(p).expect(p);
            move |name: &str| regex.is_match(name)
        });
        for name in [
            "chime.orders",
            "chime.orders.work",
            "chime.orders.parking",
            "chime.orders.retry.250ms",
            "chime.orders.retry.1h",
            "chime.control.w-1.0",
        ] {
            assert!(configure(name) && write(name) && read(name), "{name}");
        }
        assert!(configure("chime.control") && read("chime.control"));
        assert!(
            !write("chime.control"),
            "workers never publish control messages"
        );
        for name in [
            "chime.billing.work",
            "chime.orders.eu.work",
            "chime.ordersx",
            "other.orders.work",
        ] {
            assert!(!configure(name) && !write(name) && !read(name), "{name}");
        }
    }

    /// `--apply` creates the login role, grants it the group (it may then act for it, and log
    /// in with the password printed once), and `revoke --apply` takes it all back.
    #[sqlx::test(migrations = "../migrations")]
    async fn grant_and_revoke_apply_create_grant_and_withdraw(pool: sqlx::PgPool) {
        use crate::cli::{Cli, Output, control};
        use clap::Parser as _;

        let store = crate::store::Store::from_pool(pool.clone());
        let role = chime_test_kit::unique("chime_test_cli_").to_lowercase();
        let _guard = chime_test_kit::RoleGuard::adopt(&pool, &role);
        let run = async |args: &[&str]| -> String {
            let cli = Cli::try_parse_from(args).unwrap();
            let mut out = Vec::new();
            let code = control(&store, Output::Table, cli.command, &mut out)
                .await
                .unwrap();
            assert_eq!(code, std::process::ExitCode::SUCCESS);
            String::from_utf8(out).unwrap()
        };
        let printed = run(&[
            "chime", "workers", "grant", "--group", "orders", "--role", &role, "--login",
        ])
        .await;
        assert!(
            printed.contains(&format!("CREATE ROLE {role} LOGIN PASSWORD")),
            "{printed}"
        );
        assert!(printed.contains("rabbitmqctl set_permissions"), "{printed}");
        let exists = async || -> bool {
            sqlx::query_scalar("SELECT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = $1)")
                .bind(&role)
                .fetch_one(&pool)
                .await
                .unwrap()
        };
        assert!(!exists().await, "printing changes nothing");

        let applied = run(&[
            "chime", "workers", "grant", "--group", "orders", "--role", &role, "--login", "--apply",
        ])
        .await;
        assert!(exists().await);
        let password = applied
            .lines()
            .find_map(|l| l.split_once("(shown only this once): "))
            .map(|(_, p)| p.to_owned())
            .expect(&applied);
        let options = (*pool.connect_options())
            .clone()
            .username(&role)
            .password(&password);
        let as_worker = sqlx::PgPool::connect_with(options).await.unwrap();
        let may: (bool, bool) =
            sqlx::query_as("SELECT chime_may_act_for('orders'), chime_may_act_for('billing')")
                .fetch_one(&as_worker)
                .await
                .unwrap();
        assert_eq!(may, (true, false));
        as_worker.close().await;

        let again = run(&[
            "chime", "workers", "grant", "--group", "orders", "--role", &role, "--apply",
        ])
        .await;
        assert!(again.contains("already could act"), "{again}");
        let revoked = run(&[
            "chime", "workers", "revoke", "--group", "orders", "--role", &role, "--apply",
        ])
        .await;
        assert!(revoked.contains("may no longer act"), "{revoked}");
        let executable: bool = sqlx::query_scalar(
            "SELECT has_function_privilege($1, 'chime_heartbeat(text)', 'EXECUTE')",
        )
        .bind(&role)
        .fetch_one(&pool)
        .await
        .unwrap();
        assert!(!executable);
    }
}
