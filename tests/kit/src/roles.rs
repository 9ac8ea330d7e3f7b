//! Database roles of a test: PostgreSQL roles belong to the whole cluster while each test has a
//! database of its own, so a test that needs a role (a worker's least-privilege login) makes
//! one with a unique name and a [`RoleGuard`] drops it when the test ends, passed or failed.

use std::time::Duration;

use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use sqlx::{Connection as _, PgConnection, PgPool};

use crate::broker::unique;

/// How long dropping a role may take before the guard gives up (a dead database).
const DROP_TIMEOUT: Duration = Duration::from_secs(15);

/// A login role of the test's database, dropped (with everything it owns or was granted in
/// that database) when the guard drops.
#[derive(Debug)]
pub struct RoleGuard {
    /// The role's name (`<prefix>_<unique suffix>`, lowercase).
    pub name: String,
    options: PgConnectOptions,
}

impl RoleGuard {
    /// Creates a login role named after `prefix` (a lowercase SQL identifier) on `pool`'s
    /// server, with no privileges.
    pub async fn create(pool: &PgPool, prefix: &str) -> RoleGuard {
        let name = unique(prefix).replace(['-', '.'], "_").to_lowercase();
        sqlx::query(sqlx::AssertSqlSafe(format!("CREATE ROLE \"{name}\" LOGIN")))
            .execute(pool)
            .await
            .expect("creating a test role");
        RoleGuard {
            name,
            options: (*pool.connect_options()).clone(),
        }
    }

    /// A guard for role `name`, which the code under test creates (or not): dropped, if it
    /// exists, when the guard drops.
    pub fn adopt(pool: &PgPool, name: &str) -> RoleGuard {
        RoleGuard {
            name: name.to_owned(),
            options: (*pool.connect_options()).clone(),
        }
    }

    /// A pool on the test's database that logs in as this role (the server trusts local
    /// connections, as the test setup does).
    pub async fn connect(&self, max_connections: u32) -> PgPool {
        PgPoolOptions::new()
            .max_connections(max_connections)
            .connect_with(self.options.clone().username(&self.name))
            .await
            .expect("connecting as the test role")
    }
}

/// Drops `name` after revoking and reassigning what it has in the test's database.
async fn drop_role(options: PgConnectOptions, name: &str) -> Result<(), sqlx::Error> {
    let mut conn = PgConnection::connect_with(&options).await?;
    let exists: bool =
        sqlx::query_scalar("SELECT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = $1)")
            .bind(name)
            .fetch_one(&mut conn)
            .await?;
    if !exists {
        return conn.close().await;
    }
    // Its sessions first: a role with live connections may be dropped, but they would stay.
    sqlx::query("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = $1")
        .bind(name)
        .execute(&mut conn)
        .await?;
    for statement in [
        format!("REASSIGN OWNED BY \"{name}\" TO CURRENT_USER"),
        format!("DROP OWNED BY \"{name}\""),
        format!("DROP ROLE IF EXISTS \"{name}\""),
    ] {
        sqlx::raw_sql(sqlx::AssertSqlSafe(statement))
            .execute(&mut conn)
            .await?;
    }
    conn.close().await
}

impl Drop for RoleGuard {
    /// Drops the role on a thread of its own with its own runtime (the test's runtime may be
    /// single-threaded and is blocked here). It never panics: it may run while the test is
    /// unwinding.
    fn drop(&mut self) {
        let name = std::mem::take(&mut self.name);
        let options = self.options.clone();
        let dropped = std::thread::spawn(move || {
            let runtime = match tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
            {
                Ok(runtime) => runtime,
                Err(e) => return eprintln!("RoleGuard: no runtime: {e}"),
            };
            runtime.block_on(async {
                match tokio::time::timeout(DROP_TIMEOUT, drop_role(options, &name)).await {
                    Ok(Ok(())) => {}
                    Ok(Err(e)) => eprintln!("RoleGuard: dropping role {name}: {e}"),
                    Err(_) => eprintln!("RoleGuard: dropping role {name} timed out"),
                }
            });
        });
        let _ = dropped.join();
    }
}
