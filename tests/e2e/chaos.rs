//! The chaos suite at CI size: `chime scheduler` and worker processes against a private
//! PostgreSQL and RabbitMQ, every fault once under 20 fires/s (about 100 s), then every fire
//! reconciled.

use std::time::Duration;

use chime_e2e::chaos::{self, ChaosPlan, Fault};

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn under_every_fault_each_fire_runs_once_or_is_skipped_with_a_reason() {
    chime_e2e::init_tracing();
    let report = chaos::run(ChaosPlan::ci()).await.expect("chaos run");
    println!("{}", report.table());
    report.check().expect("guarantees held");

    assert!(
        report.expected >= 20 * 30,
        "{} fires expected",
        report.expected
    );
    let skipped: usize = report.skipped.values().sum();
    let failed: usize = report.failed.values().sum();
    assert_eq!(report.run + skipped + failed, report.expected);
    // Only `skip` jobs (a third) and `fire_once` jobs skip, and only fires missed in an outage.
    assert!(
        report.run > report.expected / 2,
        "most fires ran: {}",
        report.table()
    );
    assert!(
        report
            .skipped
            .keys()
            .all(|reason| reason.contains("misfire policy")),
        "every skip is the misfire policy's: {:?}",
        report.skipped
    );
    let fault = |f: Fault| {
        report
            .faults
            .iter()
            .find(|r| r.fault == f)
            .expect("every fault struck")
    };
    let killed = fault(Fault::KillLeader)
        .next_fire
        .expect("a fire after the kill");
    assert!(
        killed < Duration::from_secs(5),
        "next fire {killed:?} after SIGKILL"
    );
    let stopped = fault(Fault::StopLeader).takeover.expect("a takeover");
    assert!(
        stopped < Duration::from_secs(1),
        "hand-over took {stopped:?}"
    );
    assert_eq!(fault(Fault::FreezeLeader).fenced_writes, Some(0));
}
