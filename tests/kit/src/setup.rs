//! One test's world on the shared services: its own database, its own names on the broker,
//! and their cleanup.

use sqlx::PgPool;

use crate::broker::{TopologyGuard, amqp_url, unique};

/// Installs a test tracing subscriber once (`RUST_LOG` controls it; warnings by default),
/// writing where the test harness captures output.
pub fn init_tracing() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        let _ = tracing_subscriber::fmt()
            .with_env_filter(
                tracing_subscriber::EnvFilter::try_from_default_env()
                    .unwrap_or_else(|_| "warn".into()),
            )
            .with_test_writer()
            .try_init();
    });
}

/// The URL of the database behind a `#[sqlx::test]` pool.
pub fn database_url(pool: &PgPool) -> String {
    let options = pool.connect_options();
    format!(
        "postgres://postgres@{}:{}/{}",
        options.get_host(),
        options.get_port(),
        options
            .get_database()
            .expect("sqlx::test pools name their database")
    )
}

/// One test's setup: the database `#[sqlx::test]` made and migrated for it, a queue prefix and an executor group of its own, and a guard that deletes every
/// exchange and queue under the prefix when the test ends, passed or failed.
///
/// Tests in one binary run in parallel on the shared PostgreSQL and RabbitMQ; with their own
/// database and prefix they never see each other's runs or messages.
#[derive(Debug)]
pub struct Setup {
    /// A pool on the test's own database.
    pub pool: PgPool,
    /// That database's URL, for schedulers and workers that connect themselves.
    pub database_url: String,
    /// The RabbitMQ URL ([`amqp_url`]).
    pub amqp_url: String,
    /// The test's queue prefix.
    pub prefix: String,
    /// The test's executor group.
    pub group: String,
    /// Deletes the topology of the prefix's groups when dropped ([`Setup::finish`] does it
    /// earlier and fails the test if the broker refuses).
    pub guard: TopologyGuard,
}

impl Setup {
    /// A setup on the test's database with a fresh prefix and group; installs the test tracing
    /// subscriber ([`init_tracing`]).
    pub fn new(pool: &PgPool) -> Setup {
        init_tracing();
        let amqp_url = amqp_url();
        let prefix = unique("t");
        let group = unique("g");
        let guard = TopologyGuard::new(&amqp_url, &prefix, &[&group]);
        Setup {
            database_url: database_url(pool),
            pool: pool.clone(),
            amqp_url,
            prefix,
            group,
            guard,
        }
    }

    /// Deletes the topology of these groups under the prefix at the end too: for tests that
    /// name their groups themselves (`"ticks"`; unique enough under the test's own prefix).
    pub fn with_groups(self, groups: &[&str]) -> Setup {
        for group in groups {
            self.guard.add_group(group);
        }
        self
    }

    /// Deletes the test's exchanges and queues now; fails the test if the broker refuses.
    pub async fn finish(self) {
        // Workers' own queues outlive them (a day, `x-expires`): delete those of every worker
        // that registered in the test's database.
        let workers: Vec<(String, String)> =
            sqlx::query_as("SELECT group_name, id FROM chime_workers")
                .fetch_all(&self.pool)
                .await
                .unwrap_or_default();
        for (group, id) in &workers {
            self.guard.add_worker_queue(group, id);
        }
        self.guard.delete().await
    }
}
