//! A 3-node RabbitMQ cluster under load, TLS on to both services: `chime scheduler` and worker
//! processes are given every node's address (each starting at a different node), 100 jobs fire
//! every second, and the chaos suite stops the node that leads the group's work queue, starts
//! it again, then SIGKILLs the node that leads the queue next. Every fire of the window is then
//! reconciled: none lost, none triggered twice, a handler run twice only on a killed worker
//! (none is killed here). docs/operations.md ("RabbitMQ cluster") has the numbers.

use std::time::Duration;

use chime_e2e::chaos::{self, ChaosPlan, Fault};

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_work_queue_leader_node_stopped_then_the_next_one_killed_loses_and_doubles_no_fire() {
    chime_e2e::init_tracing();
    let plan = ChaosPlan::rabbit_cluster_ci();
    let jobs = plan.jobs;
    let report = chaos::run(plan).await.expect("chaos run on a cluster");
    println!("{}", report.table());
    report.check().expect("guarantees held");

    assert_eq!(report.duplicate_executions_after_crash, 0, "no worker died");
    let skipped: usize = report.skipped.values().sum();
    let failed: usize = report.failed.values().sum();
    assert_eq!(report.run + skipped + failed, report.expected);
    assert!(
        report.expected >= jobs * 20,
        "{} fires expected",
        report.expected
    );
    assert!(
        report.run > report.expected / 2,
        "most fires ran: {}",
        report.table()
    );
    let struck: Vec<_> = Fault::CLUSTER
        .iter()
        .map(|&fault| {
            report
                .faults
                .iter()
                .find(|r| r.fault == fault)
                .unwrap_or_else(|| panic!("{fault:?} struck"))
        })
        .collect();
    assert_ne!(
        struck[0].node, struck[1].node,
        "the second fault strikes another node than the first"
    );
    for fault in struck {
        assert!(fault.node.is_some(), "{fault:?}");
        let recovered = fault.recovered.expect("recovered");
        assert!(
            recovered < Duration::from_secs(30),
            "{}: recovered after {recovered:?}",
            fault.fault.name()
        );
    }
}
