//! README.md's quick-start worker is `examples/quickstart.rs`, byte for byte: the text a reader
//! copies is the code that cargo compiles (and that the e2e suite runs against the services).

const README: &str = include_str!("../../README.md");
const EXAMPLE: &str = include_str!("../examples/quickstart.rs");

/// The body of the ```rust block between `<!-- quickstart:start -->` and `<!-- quickstart:end -->`.
fn quickstart_block(readme: &str) -> &str {
    let start = "<!-- quickstart:start -->\n```rust\n";
    let end = "```\n<!-- quickstart:end -->";
    let from = readme
        .find(start)
        .expect("README.md has the quickstart:start marker")
        + start.len();
    let to = from
        + readme[from..]
            .find(end)
            .expect("README.md has the quickstart:end marker");
    &readme[from..to]
}

#[test]
fn the_readme_worker_is_the_compiled_quickstart_example() {
    assert_eq!(
        quickstart_block(README),
        EXAMPLE,
        "README.md's quickstart block differs from worker-sdk/examples/quickstart.rs: \
         change both together"
    );
}

#[test]
fn the_readme_names_the_dependencies_the_example_uses() {
    for dependency in ["chime-worker", "serde", "tokio", "tracing-subscriber"] {
        assert!(
            README.contains(&format!("\n{dependency} = ")),
            "README.md's [dependencies] lacks {dependency}"
        );
    }
    for variable in ["CHIME_DATABASE_URL", "CHIME_AMQP_URL", "CHIME_QUEUE_PREFIX"] {
        assert!(
            README.contains(variable),
            "README.md does not name {variable}"
        );
    }
}

#[test]
fn the_block_is_found_between_the_markers() {
    let text =
        "a\n<!-- quickstart:start -->\n```rust\nfn main() {}\n```\n<!-- quickstart:end -->\n";
    assert_eq!(quickstart_block(text), "fn main() {}\n");
}
