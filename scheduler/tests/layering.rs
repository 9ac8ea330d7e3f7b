//! The scheduler's layering, checked on its source: AMQP only in the adapter, and no import
//! cycle between top-level modules (ARCHITECTURE.md, "Code map").

use std::path::{Path, PathBuf};

fn src() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("src")
}

/// Only the adapter speaks AMQP: every other module (tests included) goes through
/// `chime_scheduler::amqp`.
#[test]
fn only_the_amqp_adapter_names_lapin() {
    chime_layering::assert_only_in(&src(), "lapin", &["amqp.rs", "amqp/"]);
}

/// Modules form layers: a new import cycle between top-level modules fails here, naming it.
#[test]
fn no_import_cycle_between_top_level_modules() {
    chime_layering::assert_no_module_cycles(&src());
}
