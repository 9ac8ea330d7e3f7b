//! Worker grants (migration `worker_privilege`): the database role an executor group's workers
//! connect as, created and granted the group through `chime_grant_worker`, or withdrawn. Part
//! of [`crate::store`]; `chime workers grant --apply` and `revoke --apply` call these.

use anyhow::Context as _;

use super::Store;

impl Store {
    /// Creates `role` unless it exists (a login role with `password` when given, else a group
    /// role), then lets it act for executor group `group` (`chime_grant_worker`, recorded as by
    /// `granted_by`), in one transaction. `role` must be a checked plain identifier
    /// (`cli::grants::role_problem`); `password` is embedded as a literal. Returns whether the
    /// role was created and whether the grant is new.
    pub async fn grant_worker(
        &self,
        role: &str,
        group: &str,
        password: Option<&str>,
        granted_by: &str,
    ) -> anyhow::Result<(bool, bool)> {
        let mut tx = self.pool.begin().await?;
        let exists: bool =
            sqlx::query_scalar("SELECT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = $1)")
                .bind(role)
                .fetch_one(&mut *tx)
                .await
                .context("looking the role up")?;
        if !exists {
            // Utility statements take no parameters: format() quotes both parts.
            let create: String = sqlx::query_scalar(
                "SELECT CASE WHEN $2::text IS NULL THEN format('CREATE ROLE %I NOLOGIN', $1::text)
                             ELSE format('CREATE ROLE %I LOGIN PASSWORD %L', $1::text, $2::text)
                        END",
            )
            .bind(role)
            .bind(password)
            .fetch_one(&mut *tx)
            .await?;
            sqlx::raw_sql(sqlx::AssertSqlSafe(create))
                .execute(&mut *tx)
                .await
                .with_context(|| format!("creating role {role}"))?;
        }
        let fresh: bool = sqlx::query_scalar("SELECT chime_grant_worker($1, $2, $3)")
            .bind(role)
            .bind(group)
            .bind(granted_by)
            .fetch_one(&mut *tx)
            .await
            .with_context(|| format!("granting group {group} to role {role}"))?;
        tx.commit().await?;
        Ok((!exists, fresh))
    }

    /// Withdraws `role`'s grant of `group` (`chime_revoke_worker`); false if there was none.
    pub async fn revoke_worker(&self, role: &str, group: &str) -> anyhow::Result<bool> {
        sqlx::query_scalar("SELECT chime_revoke_worker($1, $2)")
            .bind(role)
            .bind(group)
            .fetch_one(&self.pool)
            .await
            .with_context(|| format!("revoking group {group} from role {role}"))
    }

    /// The groups `role` is granted, by name.
    pub async fn worker_grants(&self, role: &str) -> anyhow::Result<Vec<String>> {
        sqlx::query_scalar(
            "SELECT group_name FROM chime_worker_grants WHERE role = $1 ORDER BY group_name",
        )
        .bind(role)
        .fetch_all(&self.pool)
        .await
        .context("reading worker grants")
    }
}
