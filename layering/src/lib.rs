//! Source checks of a crate's layering, run as ordinary tests: which files may name a
//! dependency ([`mentions_outside`]), and no import cycle between the crate's top-level modules
//! ([`module_cycles`]).
//!
//! The checks parse the crate's `src` folder with `syn` (macro bodies are read as tokens); they
//! need no compiler run and no network, so a crate's test can call them with
//! `env!("CARGO_MANIFEST_DIR")`:
//!
//! ```no_run
//! let src = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
//! chime_layering::assert_only_in(&src, "lapin", &["amqp.rs", "amqp/"]);
//! chime_layering::assert_no_module_cycles(&src);
//! ```
//!
//! **What counts.** A *mention* of a word is the word as a whole identifier in code or in a
//! string literal, test code included; comments do not count. A *reference* from module `a` to
//! module `b` is a path `crate::b`, `crate::{…, b, …}` or a `super::` chain that climbs to the
//! crate root and names `b`, in a file of `a` (its `a.rs`, `a/mod.rs` and every file below
//! `a/`), outside test code. Test code is an item under `#[cfg(test)]`, `#[test]` or a
//! `…::test` attribute, and every file such an item's `mod name;` declares: tests may reach
//! anywhere. The crate roots (`lib.rs`, `main.rs`) are not modules of the graph.

use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};
use std::fmt;
use std::path::{Path, PathBuf};

use proc_macro2::{Ident, Span, TokenStream, TokenTree};
use syn::visit::{self, Visit};
use syn::{Attribute, Item, ItemUse, Meta, UseTree};

/// Where a file outside the allow-list names the word.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mention {
    /// The file, relative to the source folder, with `/` separators.
    pub path: String,
    /// 1-based line.
    pub line: usize,
    /// The line, trimmed.
    pub text: String,
}

impl fmt::Display for Mention {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}: {}", self.path, self.line, self.text)
    }
}

/// An import cycle between top-level modules: `modules[0]` uses `modules[1]`, …, and the last
/// uses `modules[0]`; `sites[i]` is where `modules[i]` first names the next one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Cycle {
    /// The modules around the cycle, starting from the alphabetically first.
    pub modules: Vec<String>,
    /// For each step, the first `file:line` that makes it.
    pub sites: Vec<String>,
}

impl fmt::Display for Cycle {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, (module, site)) in self.modules.iter().zip(&self.sites).enumerate() {
            let next = &self.modules[(i + 1) % self.modules.len()];
            if i > 0 {
                write!(f, "; ")?;
            }
            write!(f, "{module} -> {next} ({site})")?;
        }
        Ok(())
    }
}

/// Every line of a file under `src` that mentions `word`, except in the files `allowed` names:
/// a path relative to `src` (`"amqp.rs"`), or a folder ending in `/` (`"amqp/"`) for every file
/// below it.
///
/// # Panics
/// If `src` cannot be read.
pub fn mentions_outside(src: &Path, word: &str, allowed: &[&str]) -> Vec<Mention> {
    let mut found = Vec::new();
    for file in read_sources(src) {
        let is_allowed = allowed
            .iter()
            .any(|a| file.path == *a || (a.ends_with('/') && file.path.starts_with(a)));
        if is_allowed {
            continue;
        }
        let depth = module_path(&file.path).len();
        let scan = Scan::new(&file.path, &file.text, depth, Some(word));
        for line in scan.mentions {
            found.push(Mention {
                path: file.path.clone(),
                line,
                text: file
                    .text
                    .lines()
                    .nth(line - 1)
                    .unwrap_or("")
                    .trim()
                    .to_owned(),
            });
        }
    }
    found
}

/// Panics naming every line outside `allowed` that mentions `word` ([`mentions_outside`]).
pub fn assert_only_in(src: &Path, word: &str, allowed: &[&str]) {
    let found = mentions_outside(src, word, allowed);
    assert!(
        found.is_empty(),
        "`{word}` is named outside {allowed:?}; go through those modules instead:\n{}",
        found
            .iter()
            .map(ToString::to_string)
            .collect::<Vec<_>>()
            .join("\n")
    );
}

/// Which top-level modules each top-level module of the crate at `src` references outside test
/// code, with the first `file:line` of each reference.
///
/// # Panics
/// If `src` cannot be read.
pub fn module_graph(src: &Path) -> BTreeMap<String, BTreeMap<String, String>> {
    let files = read_sources(src);
    let modules: BTreeSet<String> = files.iter().filter_map(|f| top_module(&f.path)).collect();
    let tests = test_files(&files);
    let mut graph: BTreeMap<String, BTreeMap<String, String>> = BTreeMap::new();
    for file in &files {
        let Some(from) = top_module(&file.path) else {
            continue;
        };
        graph.entry(from.clone()).or_default();
        if tests.contains(&file.path) {
            continue;
        }
        let depth = module_path(&file.path).len();
        let scan = Scan::new(&file.path, &file.text, depth, None);
        for (line, to) in scan.references {
            if to == from || !modules.contains(&to) {
                continue;
            }
            graph
                .entry(from.clone())
                .or_default()
                .entry(to)
                .or_insert_with(|| format!("{}:{line}", file.path));
        }
    }
    graph
}

/// The import cycles between the top-level modules of the crate at `src`: one cycle for each
/// group of modules that reach each other ([`module_graph`]); empty when the modules form
/// layers.
///
/// # Panics
/// If `src` cannot be read.
pub fn module_cycles(src: &Path) -> Vec<Cycle> {
    let graph = module_graph(src);
    strongly_connected(&graph)
        .into_iter()
        .filter(|group| group.len() > 1)
        .map(|group| shortest_cycle(&graph, &group))
        .collect()
}

/// Panics naming every import cycle between top-level modules ([`module_cycles`]).
pub fn assert_no_module_cycles(src: &Path) {
    let cycles = module_cycles(src);
    assert!(
        cycles.is_empty(),
        "import cycles between top-level modules (move the shared piece down into a module both \
         use, or pass it in):\n{}",
        cycles
            .iter()
            .map(ToString::to_string)
            .collect::<Vec<_>>()
            .join("\n")
    );
}

struct SourceFile {
    /// Relative to `src`, `/`-separated.
    path: String,
    text: String,
}

fn read_sources(src: &Path) -> Vec<SourceFile> {
    fn walk(dir: &Path, out: &mut Vec<PathBuf>) {
        let entries =
            std::fs::read_dir(dir).unwrap_or_else(|e| panic!("cannot read {}: {e}", dir.display()));
        for entry in entries {
            let path = entry.expect("directory entry").path();
            if path.is_dir() {
                walk(&path, out);
            } else if path.extension().is_some_and(|e| e == "rs") {
                out.push(path);
            }
        }
    }
    let mut paths = Vec::new();
    walk(src, &mut paths);
    paths.sort();
    paths
        .into_iter()
        .map(|path| {
            let relative = path
                .strip_prefix(src)
                .expect("below src")
                .components()
                .map(|c| c.as_os_str().to_string_lossy().into_owned())
                .collect::<Vec<_>>()
                .join("/");
            let text = std::fs::read_to_string(&path)
                .unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()));
            SourceFile {
                path: relative,
                text,
            }
        })
        .collect()
}

/// The module path of a file: `a.rs` and `a/mod.rs` are `[a]`, `a/b.rs` is `[a, b]`; the crate
/// roots are `[]`.
fn module_path(path: &str) -> Vec<String> {
    let mut parts: Vec<String> = path.split('/').map(str::to_owned).collect();
    let last = parts.pop().unwrap_or_default();
    let stem = last.strip_suffix(".rs").unwrap_or(&last);
    if parts.is_empty() && (stem == "lib" || stem == "main") {
        return Vec::new();
    }
    if stem != "mod" {
        parts.push(stem.to_owned());
    }
    parts
}

fn top_module(path: &str) -> Option<String> {
    module_path(path).into_iter().next()
}

/// Files that are test code: declared by a test item's `mod name;`, or below such a file.
fn test_files(files: &[SourceFile]) -> BTreeSet<String> {
    let by_module: HashMap<Vec<String>, &SourceFile> =
        files.iter().map(|f| (module_path(&f.path), f)).collect();
    let mut declared_in_test: BTreeSet<Vec<String>> = BTreeSet::new();
    for file in files {
        let parent = module_path(&file.path);
        let scan = Scan::new(&file.path, &file.text, parent.len(), None);
        for name in scan.test_modules {
            let mut child = parent.clone();
            child.push(name);
            declared_in_test.insert(child);
        }
    }
    by_module
        .into_iter()
        .filter(|(module, _)| (1..=module.len()).any(|n| declared_in_test.contains(&module[..n])))
        .map(|(_, file)| file.path.clone())
        .collect()
}

/// Tarjan's strongly connected components, iteratively.
fn strongly_connected(graph: &BTreeMap<String, BTreeMap<String, String>>) -> Vec<Vec<String>> {
    let names: Vec<&String> = graph.keys().collect();
    let index_of: HashMap<&String, usize> =
        names.iter().enumerate().map(|(i, n)| (*n, i)).collect();
    let edges: Vec<Vec<usize>> = names
        .iter()
        .map(|n| {
            graph[*n]
                .keys()
                .filter_map(|to| index_of.get(to).copied())
                .collect()
        })
        .collect();
    let n = names.len();
    let (mut index, mut low, mut on_stack) = (vec![usize::MAX; n], vec![0; n], vec![false; n]);
    let (mut stack, mut groups, mut next) = (Vec::new(), Vec::new(), 0);
    for root in 0..n {
        if index[root] != usize::MAX {
            continue;
        }
        let mut work = vec![(root, 0usize)];
        while let Some(&mut (v, ref mut edge)) = work.last_mut() {
            if *edge == 0 && index[v] == usize::MAX {
                index[v] = next;
                low[v] = next;
                next += 1;
                stack.push(v);
                on_stack[v] = true;
            }
            if let Some(&w) = edges[v].get(*edge) {
                *edge += 1;
                if index[w] == usize::MAX {
                    work.push((w, 0));
                } else if on_stack[w] {
                    low[v] = low[v].min(index[w]);
                }
                continue;
            }
            work.pop();
            if let Some(&(parent, _)) = work.last() {
                low[parent] = low[parent].min(low[v]);
            }
            if low[v] == index[v] {
                let mut group = Vec::new();
                while let Some(w) = stack.pop() {
                    on_stack[w] = false;
                    group.push(names[w].clone());
                    if w == v {
                        break;
                    }
                }
                group.sort();
                groups.push(group);
            }
        }
    }
    groups.sort();
    groups
}

/// The shortest cycle through the first module of `group`, inside `group`.
fn shortest_cycle(graph: &BTreeMap<String, BTreeMap<String, String>>, group: &[String]) -> Cycle {
    let start = &group[0];
    let inside: BTreeSet<&String> = group.iter().collect();
    let mut came_from: HashMap<&String, &String> = HashMap::new();
    let mut queue = VecDeque::from([start]);
    let mut last = None;
    'search: while let Some(v) = queue.pop_front() {
        for w in graph[v].keys() {
            if !inside.contains(w) {
                continue;
            }
            if w == start {
                last = Some(v);
                break 'search;
            }
            if !came_from.contains_key(w) {
                came_from.insert(w, v);
                queue.push_back(w);
            }
        }
    }
    let mut modules = vec![
        last.expect("a strongly connected group has a cycle")
            .clone(),
    ];
    while modules.last() != Some(start) {
        let previous = came_from[modules.last().expect("non-empty")];
        modules.push(previous.clone());
    }
    modules.reverse();
    let sites = modules
        .iter()
        .enumerate()
        .map(|(i, m)| graph[m][&modules[(i + 1) % modules.len()]].clone())
        .collect();
    Cycle { modules, sites }
}

/// What one file holds, as `syn` parses it: the lines that mention a word, the crate-level
/// modules its non-test code references, and the modules its test items declare.
#[derive(Default)]
struct Scan {
    /// Lines that name the word, test code included.
    mentions: BTreeSet<usize>,
    /// (line, top-level module) for every `crate::m` or root-reaching `super::…::m` outside
    /// test code.
    references: Vec<(usize, String)>,
    /// Modules declared (`mod name;`) by a test item.
    test_modules: Vec<String>,
}

impl Scan {
    /// Scans `text`, the file at module depth `depth` (`a.rs` is 1, `a/b.rs` 2), for `word`.
    ///
    /// # Panics
    /// If the file is not Rust that `syn` parses (the crate would not compile either).
    fn new(path: &str, text: &str, depth: usize, word: Option<&str>) -> Scan {
        let file =
            syn::parse_file(text).unwrap_or_else(|e| panic!("{path} does not parse as Rust: {e}"));
        let mut scan = Scanner {
            scan: Scan::default(),
            depth,
            word,
            in_test: false,
        };
        scan.visit_file(&file);
        scan.scan
    }
}

/// The visitor behind [`Scan`].
struct Scanner<'w> {
    scan: Scan,
    depth: usize,
    word: Option<&'w str>,
    /// Inside an item that is test code.
    in_test: bool,
}

impl Scanner<'_> {
    /// Notes a path of the crate (`crate::a::…`, `super::…`) as a reference to its top-level
    /// module, unless it stays inside the file's own one.
    fn reference(&mut self, line: usize, segments: &[String]) {
        if self.in_test {
            return;
        }
        let target = match segments.first().map(String::as_str) {
            Some("crate") => segments.get(1),
            Some("super") => {
                let climbs = segments.iter().take_while(|s| *s == "super").count();
                // A file at depth d reaches the crate root after d climbs; fewer stay inside
                // its own top-level module.
                if climbs == self.depth {
                    segments.get(climbs)
                } else {
                    None
                }
            }
            _ => None,
        };
        if let Some(target) = target {
            self.scan.references.push((line, target.clone()));
        }
    }

    fn mention_ident(&mut self, ident: &Ident) {
        if self.word.is_some_and(|w| ident == w) {
            self.scan.mentions.insert(ident.span().start().line);
        }
    }

    fn mention_text(&mut self, text: &str, span: Span) {
        if let Some(word) = self.word
            && names_word(text, word)
        {
            self.scan.mentions.insert(span.start().line);
        }
    }

    /// The use tree below `prefix`, leaf by leaf.
    fn use_tree(&mut self, tree: &UseTree, prefix: &mut Vec<String>) {
        match tree {
            UseTree::Path(p) => {
                prefix.push(p.ident.to_string());
                self.use_tree(&p.tree, prefix);
                prefix.pop();
            }
            UseTree::Name(n) => {
                prefix.push(n.ident.to_string());
                self.reference(n.ident.span().start().line, prefix);
                prefix.pop();
            }
            UseTree::Rename(r) => {
                prefix.push(r.ident.to_string());
                self.reference(r.ident.span().start().line, prefix);
                prefix.pop();
            }
            UseTree::Glob(g) => self.reference(g.star_token.spans[0].start().line, prefix),
            UseTree::Group(g) => {
                for tree in &g.items {
                    self.use_tree(tree, prefix);
                }
            }
        }
    }

    /// A macro's tokens, which `syn` leaves unparsed: identifiers, string literals and paths
    /// `crate :: m` / `super :: …` in them.
    fn tokens(&mut self, tokens: TokenStream) {
        let tokens: Vec<TokenTree> = tokens.into_iter().collect();
        for (i, token) in tokens.iter().enumerate() {
            match token {
                TokenTree::Group(g) => self.tokens(g.stream()),
                TokenTree::Ident(ident) => {
                    self.mention_ident(ident);
                    let starts_path = (ident == "crate" || ident == "super")
                        && !(i >= 2 && is_path_separator(&tokens[i - 2], &tokens[i - 1]));
                    if starts_path {
                        let segments = path_in_tokens(&tokens[i..]);
                        self.reference(ident.span().start().line, &segments);
                    }
                }
                TokenTree::Literal(literal) => {
                    if let Ok(syn::Lit::Str(s)) = syn::parse_str::<syn::Lit>(&literal.to_string()) {
                        self.mention_text(&s.value(), literal.span());
                    }
                }
                TokenTree::Punct(_) => {}
            }
        }
    }
}

impl<'ast> Visit<'ast> for Scanner<'_> {
    fn visit_item(&mut self, item: &'ast Item) {
        let attrs: &[Attribute] = match item {
            Item::Const(i) => &i.attrs,
            Item::Enum(i) => &i.attrs,
            Item::ExternCrate(i) => &i.attrs,
            Item::Fn(i) => &i.attrs,
            Item::ForeignMod(i) => &i.attrs,
            Item::Impl(i) => &i.attrs,
            Item::Macro(i) => &i.attrs,
            Item::Mod(i) => &i.attrs,
            Item::Static(i) => &i.attrs,
            Item::Struct(i) => &i.attrs,
            Item::Trait(i) => &i.attrs,
            Item::TraitAlias(i) => &i.attrs,
            Item::Type(i) => &i.attrs,
            Item::Union(i) => &i.attrs,
            Item::Use(i) => &i.attrs,
            _ => &[],
        };
        let test = attrs.iter().any(is_test_attribute);
        if test
            && let Item::Mod(m) = item
            && m.content.is_none()
        {
            self.scan.test_modules.push(m.ident.to_string());
        }
        let outer = self.in_test;
        self.in_test = outer || test;
        visit::visit_item(self, item);
        self.in_test = outer;
    }

    fn visit_item_use(&mut self, item: &'ast ItemUse) {
        self.use_tree(&item.tree, &mut Vec::new());
        visit::visit_item_use(self, item);
    }

    fn visit_path(&mut self, path: &'ast syn::Path) {
        if path.leading_colon.is_none() {
            let segments: Vec<String> = path.segments.iter().map(|s| s.ident.to_string()).collect();
            let line = path.segments[0].ident.span().start().line;
            self.reference(line, &segments);
        }
        visit::visit_path(self, path);
    }

    fn visit_ident(&mut self, ident: &'ast Ident) {
        self.mention_ident(ident);
    }

    fn visit_lit_str(&mut self, lit: &'ast syn::LitStr) {
        self.mention_text(&lit.value(), lit.span());
    }

    fn visit_attribute(&mut self, attr: &'ast Attribute) {
        // Doc comments are comments: they neither mention nor reference.
        if !attr.path().is_ident("doc") {
            visit::visit_attribute(self, attr);
        }
    }

    fn visit_macro(&mut self, mac: &'ast syn::Macro) {
        visit::visit_path(self, &mac.path);
        self.tokens(mac.tokens.clone());
    }
}

/// Whether an attribute makes its item test code: `#[cfg(test)]`, `#[test]`, or a test
/// framework's `#[….::test]` / `#[….::test(…)]`.
fn is_test_attribute(attr: &Attribute) -> bool {
    let path = attr.path();
    if path.is_ident("cfg") {
        return matches!(&attr.meta, Meta::List(list) if list.tokens.to_string() == "test");
    }
    path.segments.last().is_some_and(|s| s.ident == "test")
}

/// Whether `a b` is the path separator `::`.
fn is_path_separator(a: &TokenTree, b: &TokenTree) -> bool {
    matches!((a, b), (TokenTree::Punct(x), TokenTree::Punct(y)) if x.as_char() == ':' && y.as_char() == ':')
}

/// The segments of the path that starts `tokens`: `ident (:: ident)*`.
fn path_in_tokens(tokens: &[TokenTree]) -> Vec<String> {
    let mut segments = Vec::new();
    let mut at = 0;
    while let Some(TokenTree::Ident(ident)) = tokens.get(at) {
        segments.push(ident.to_string());
        match (tokens.get(at + 1), tokens.get(at + 2)) {
            (Some(a), Some(b)) if is_path_separator(a, b) => at += 3,
            _ => break,
        }
    }
    segments
}

/// Whether `text` holds `word` as a whole identifier (`"info,lapin=warn"` names `lapin`,
/// `"lapin_like"` does not).
fn names_word(text: &str, word: &str) -> bool {
    let is_ident = |c: char| c.is_alphanumeric() || c == '_';
    text.match_indices(word).any(|(at, _)| {
        let before = text[..at].chars().next_back();
        let after = text[at + word.len()..].chars().next();
        !before.is_some_and(is_ident) && !after.is_some_and(is_ident)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A source folder of its own for one test, with `files` written.
    struct Folder(PathBuf);

    impl Folder {
        fn new(name: &str, files: &[(&str, &str)]) -> Folder {
            let root =
                std::env::temp_dir().join(format!("chime-layering-{}-{name}", std::process::id()));
            let _ = std::fs::remove_dir_all(&root);
            for (path, text) in files {
                let path = root.join(path);
                std::fs::create_dir_all(path.parent().expect("parent")).expect("folder");
                std::fs::write(path, text).expect("written");
            }
            Folder(root)
        }
    }

    impl Drop for Folder {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    #[test]
    fn finds_a_cycle_through_use_groups_paths_and_super() {
        let src = Folder::new(
            "cycle",
            &[
                ("lib.rs", "pub mod a; pub mod b; pub mod c; pub mod d;"),
                ("a.rs", "use crate::{\n    b::X,\n    d,\n};\n"),
                ("b.rs", "fn f() { crate :: c::g(); }\n"),
                ("c/mod.rs", "mod inner;\n"),
                ("c/inner.rs", "use super::super::a::Y;\nuse super::Z;\n"),
                (
                    "d.rs",
                    "// crate::a is only a comment\nconst S: &str = \"crate::a\";\n",
                ),
            ],
        );
        let cycles = module_cycles(&src.0);
        assert_eq!(cycles.len(), 1, "{cycles:?}");
        assert_eq!(cycles[0].modules, ["a", "b", "c"]);
        assert_eq!(cycles[0].sites, ["a.rs:2", "b.rs:1", "c/inner.rs:1"]);
        assert_eq!(
            cycles[0].to_string(),
            "a -> b (a.rs:2); b -> c (b.rs:1); c -> a (c/inner.rs:1)"
        );
        let graph = module_graph(&src.0);
        assert!(
            graph["d"].is_empty(),
            "comments and strings are no references"
        );
        assert!(!graph["c"].contains_key("c"));
    }

    /// `syn` leaves macro bodies as tokens: paths in them count, as in code.
    #[test]
    fn references_inside_macro_bodies_count() {
        let src = Folder::new(
            "macros",
            &[
                ("lib.rs", "pub mod a; pub mod b;"),
                ("a.rs", "use crate::b;\n"),
                (
                    "b.rs",
                    "fn f() {\n    tokio::select! {\n        _ = crate::a::g() => {}\n    }\n}\n",
                ),
            ],
        );
        assert_eq!(module_graph(&src.0)["b"]["a"], "b.rs:3");
        assert_eq!(module_cycles(&src.0).len(), 1);
    }

    /// `#[cfg(not(test))]` is code that ships.
    #[test]
    fn cfg_not_test_is_not_test_code() {
        let src = Folder::new(
            "cfg-not-test",
            &[
                ("lib.rs", "pub mod a; pub mod b;"),
                ("a.rs", "use crate::b;\n"),
                ("b.rs", "#[cfg(not(test))]\nuse crate::a;\n"),
            ],
        );
        assert_eq!(module_cycles(&src.0).len(), 1);
    }

    #[test]
    fn test_code_may_reach_anywhere() {
        let src = Folder::new(
            "tests",
            &[
                ("lib.rs", "pub mod a; pub mod b;"),
                ("a.rs", "use crate::b;\n"),
                (
                    "b.rs",
                    "#[cfg(test)]\nmod tests_x;\n#[cfg(test)]\n#[allow(unused)]\nmod tests {\n    \
                     use crate::a;\n    fn f() { let c = '{'; }\n}\n\
                     #[tokio::test(start_paused = true)]\nasync fn t() { crate::a::f(); }\n\
                     pub fn real() {}\n",
                ),
                ("b/tests_x.rs", "use crate::a;\n"),
                ("b/tests_x/deeper.rs", "use crate::a;\n"),
            ],
        );
        assert!(module_cycles(&src.0).is_empty());
        assert_eq!(module_graph(&src.0)["a"]["b"], "a.rs:1");
        // Without the attribute the same code closes a cycle.
        let src = Folder::new(
            "not-tests",
            &[
                ("lib.rs", "pub mod a; pub mod b;"),
                ("a.rs", "use crate::b;\n"),
                (
                    "b.rs",
                    "#[allow(unused)]\nmod tests {\n    use crate::a;\n}\n",
                ),
            ],
        );
        assert_eq!(module_cycles(&src.0).len(), 1);
    }

    #[test]
    fn mentions_count_code_and_strings_not_comments_and_respect_the_allow_list() {
        let src = Folder::new(
            "mentions",
            &[
                (
                    "lib.rs",
                    "pub mod amqp; pub mod publish; pub mod main_like;",
                ),
                ("amqp.rs", "pub use lapin::Channel;\n"),
                ("amqp/confirm.rs", "use lapin::Confirmation;\n"),
                (
                    "publish.rs",
                    "//! With lapin a return is an ack.\n/* lapin */\nuse lapin::options::X;\n\
                     fn f() -> lapin_like::Y { r#\"lapin\"# }\n",
                ),
                (
                    "main_like.rs",
                    "const FILTER: &str = \"info,lapin=warn\";\n",
                ),
            ],
        );
        let found = mentions_outside(&src.0, "lapin", &["amqp.rs", "amqp/"]);
        let lines: Vec<String> = found.iter().map(ToString::to_string).collect();
        assert_eq!(
            lines,
            [
                "main_like.rs:1: const FILTER: &str = \"info,lapin=warn\";",
                "publish.rs:3: use lapin::options::X;",
                "publish.rs:4: fn f() -> lapin_like::Y { r#\"lapin\"# }",
            ]
        );
        assert!(
            mentions_outside(
                &src.0,
                "lapin",
                &["amqp.rs", "amqp/", "publish.rs", "main_like.rs"]
            )
            .is_empty()
        );
    }
}
