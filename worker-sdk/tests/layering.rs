//! The SDK's layering, checked on its source (ARCHITECTURE.md, "worker-sdk/"; `src/lib.rs`,
//! "Layers"): lapin only in the link, and modules in layers, `runtime` → `delivery` → `link` →
//! the leaves, each importing only layers below it, with no import cycle.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

fn src() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("src")
}

/// The layer of each top-level module, top first; the leaves share the last one.
const LAYERS: [(&str, usize); 13] = [
    ("runtime", 0),
    ("delivery", 1),
    ("link", 2),
    ("claims", 3),
    ("client", 3),
    ("context", 3),
    ("handler", 3),
    ("outcome", 3),
    ("recording", 3),
    ("store", 3),
    ("tasks", 3),
    ("testing", 3),
    ("verify", 3),
];

/// Only the link speaks AMQP: the delivery path and the runtime go through `crate::link`.
#[test]
fn only_the_link_names_lapin() {
    chime_layering::assert_only_in(&src(), "lapin", &["link/"]);
}

/// A new import cycle between top-level modules fails here, naming it.
#[test]
fn no_import_cycle_between_top_level_modules() {
    chime_layering::assert_no_module_cycles(&src());
}

/// Inside each layer's folder the submodules (which reach each other through `super::`) form
/// layers too: `delivery/mod.rs` calls claim, execute and settle, none of which calls back.
#[test]
fn no_import_cycle_inside_a_layer() {
    for layer in ["runtime", "delivery", "link"] {
        let cycles = chime_layering::module_cycles(&src().join(layer));
        assert!(
            cycles.is_empty(),
            "import cycles between the modules of src/{layer}/:\n{}",
            cycles
                .iter()
                .map(ToString::to_string)
                .collect::<Vec<_>>()
                .join("\n")
        );
    }
}

/// Every import points down: the link imports nothing of the crate, the delivery path never the
/// runtime, and a new top-level module must be given its layer here (and in `lib.rs`).
#[test]
fn every_import_points_to_a_lower_layer() {
    let layer: BTreeMap<&str, usize> = LAYERS.into_iter().collect();
    let leaves = layer.values().max().copied().unwrap_or_default();
    let graph = chime_layering::module_graph(&src());
    let mut upward = Vec::new();
    for (from, uses) in &graph {
        let Some(&from_layer) = layer.get(from.as_str()) else {
            panic!("module `{from}` has no layer: add it to LAYERS and to lib.rs's \"Layers\"");
        };
        for (to, site) in uses {
            let to_layer = layer.get(to.as_str()).copied().unwrap_or_default();
            let down = to_layer > from_layer || (from_layer == leaves && to_layer == leaves);
            if !down {
                upward.push(format!("{from} imports {to} at {site}"));
            }
        }
    }
    assert!(
        upward.is_empty(),
        "imports that do not point to a lower layer:\n{}",
        upward.join("\n")
    );
    let link = &graph["link"];
    assert!(
        link.is_empty(),
        "the link imports nothing of the crate: {link:?}"
    );
}
