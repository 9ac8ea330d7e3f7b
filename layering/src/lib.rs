//! Source checks of a crate's layering, run as ordinary tests: which files may name a
//! dependency ([`mentions_outside`]), and no import cycle between the crate's top-level modules
//! ([`module_cycles`]).
//!
//! The checks read the crate's `src` folder as text, with a small lexer that knows comments,
//! string and character literals and test items; they need no compiler and no network, so a
//! crate's test can call them with `env!("CARGO_MANIFEST_DIR")`:
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
        let lexed = Lexed::new(&file.text);
        let mut lines = BTreeSet::new();
        for at in lexed.words(word) {
            lines.insert(lexed.line_of(at));
        }
        for line in lines {
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
        let lexed = Lexed::new(&file.text);
        let depth = module_path(&file.path).len();
        for (at, to) in lexed.crate_references(depth) {
            if to == from || !modules.contains(&to) {
                continue;
            }
            graph
                .entry(from.clone())
                .or_default()
                .entry(to)
                .or_insert_with(|| format!("{}:{}", file.path, lexed.line_of(at)));
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
        for name in Lexed::new(&file.text).test_module_declarations() {
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

/// A file's text with comments blanked out (newlines kept) and literals marked.
struct Lexed {
    code: Vec<u8>,
    literal: Vec<bool>,
    /// Byte ranges of test items.
    tests: Vec<(usize, usize)>,
    line_starts: Vec<usize>,
}

fn is_ident(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b == b'_' || b >= 0x80
}

impl Lexed {
    fn new(text: &str) -> Lexed {
        let bytes = text.as_bytes();
        let mut code = bytes.to_vec();
        let mut literal = vec![false; bytes.len()];
        let blank = |code: &mut Vec<u8>, from: usize, to: usize| {
            for b in &mut code[from..to] {
                if *b != b'\n' {
                    *b = b' ';
                }
            }
        };
        let mut i = 0;
        while i < bytes.len() {
            let b = bytes[i];
            let next = bytes.get(i + 1).copied();
            let prev_ident = i > 0 && is_ident(bytes[i - 1]);
            if b == b'/' && next == Some(b'/') {
                let end = bytes[i..]
                    .iter()
                    .position(|&c| c == b'\n')
                    .map_or(bytes.len(), |p| i + p);
                blank(&mut code, i, end);
                i = end;
            } else if b == b'/' && next == Some(b'*') {
                let (mut depth, mut j) = (1, i + 2);
                while j < bytes.len() && depth > 0 {
                    if bytes[j..].starts_with(b"/*") {
                        depth += 1;
                        j += 2;
                    } else if bytes[j..].starts_with(b"*/") {
                        depth -= 1;
                        j += 2;
                    } else {
                        j += 1;
                    }
                }
                blank(&mut code, i, j);
                i = j;
            } else if b == b'r'
                && (!prev_ident || (bytes[i - 1] == b'b' && (i < 2 || !is_ident(bytes[i - 2]))))
                && matches!(next, Some(b'"' | b'#'))
                && let Some(hashes) = bytes[i + 1..].iter().position(|&c| c != b'#')
                && bytes[i + 1 + hashes] == b'"'
            {
                let mut closing = vec![b'"'];
                closing.extend(std::iter::repeat_n(b'#', hashes));
                let body = i + 2 + hashes;
                let end = bytes[body..]
                    .windows(closing.len())
                    .position(|w| w == closing.as_slice())
                    .map_or(bytes.len(), |p| body + p + closing.len());
                literal[i..end].fill(true);
                i = end;
            } else if b == b'"' {
                let mut j = i + 1;
                while j < bytes.len() && bytes[j] != b'"' {
                    j += if bytes[j] == b'\\' { 2 } else { 1 };
                }
                let end = (j + 1).min(bytes.len());
                literal[i..end].fill(true);
                i = end;
            } else if b == b'\'' {
                // A character literal, or a lifetime (`'a`) which is code.
                let end = if next == Some(b'\\') {
                    bytes[i + 2..]
                        .iter()
                        .skip(1)
                        .position(|&c| c == b'\'')
                        .map(|p| i + 3 + p + 1)
                } else {
                    text[i + 1..].chars().next().and_then(|c| {
                        let after = i + 1 + c.len_utf8();
                        (bytes.get(after) == Some(&b'\'')).then_some(after + 1)
                    })
                };
                match end {
                    Some(end) => {
                        literal[i..end].fill(true);
                        i = end;
                    }
                    None => i += 1,
                }
            } else {
                i += 1;
            }
        }
        let line_starts = std::iter::once(0)
            .chain(
                bytes
                    .iter()
                    .enumerate()
                    .filter(|(_, b)| **b == b'\n')
                    .map(|(i, _)| i + 1),
            )
            .collect();
        let mut lexed = Lexed {
            code,
            literal,
            tests: Vec::new(),
            line_starts,
        };
        lexed.tests = lexed.find_test_items();
        lexed
    }

    fn line_of(&self, at: usize) -> usize {
        self.line_starts.partition_point(|&start| start <= at)
    }

    fn in_test(&self, at: usize) -> bool {
        self.tests.iter().any(|&(from, to)| from <= at && at < to)
    }

    fn skip_space(&self, mut at: usize) -> usize {
        while at < self.code.len() && !self.literal[at] && self.code[at].is_ascii_whitespace() {
            at += 1;
        }
        at
    }

    /// The identifier starting at `at`, if one does.
    fn ident_at(&self, at: usize) -> Option<&str> {
        if at >= self.code.len() || self.literal[at] || !is_ident(self.code[at]) {
            return None;
        }
        let end = (at..self.code.len())
            .find(|&j| self.literal[j] || !is_ident(self.code[j]))
            .unwrap_or(self.code.len());
        std::str::from_utf8(&self.code[at..end]).ok()
    }

    /// Starts of `word` as a whole identifier, in code and in literals.
    fn words(&self, word: &str) -> Vec<usize> {
        let w = word.as_bytes();
        let mut found = Vec::new();
        let mut at = 0;
        while let Some(p) = self.code[at..].windows(w.len()).position(|s| s == w) {
            let start = at + p;
            let end = start + w.len();
            let before = start == 0 || !is_ident(self.code[start - 1]);
            let after = end >= self.code.len() || !is_ident(self.code[end]);
            if before && after {
                found.push(start);
            }
            at = start + 1;
        }
        found
    }

    /// The end of the bracketed group opening at `open` (`(`, `[` or `{`), past its closer.
    fn matching(&self, open: usize) -> usize {
        let mut depth = 0usize;
        for j in open..self.code.len() {
            if self.literal[j] {
                continue;
            }
            match self.code[j] {
                b'(' | b'[' | b'{' => depth += 1,
                b')' | b']' | b'}' => {
                    depth = depth.saturating_sub(1);
                    if depth == 0 {
                        return j + 1;
                    }
                }
                _ => {}
            }
        }
        self.code.len()
    }

    /// The end of the item starting at `at`: past its first `;` outside brackets, or past the
    /// block of its first `{` outside parentheses and brackets.
    fn item_end(&self, at: usize) -> usize {
        let mut j = at;
        while j < self.code.len() {
            if self.literal[j] {
                j += 1;
                continue;
            }
            match self.code[j] {
                b';' => return j + 1,
                b'{' => return self.matching(j),
                b'(' | b'[' => j = self.matching(j),
                _ => j += 1,
            }
        }
        self.code.len()
    }

    fn find_test_items(&self) -> Vec<(usize, usize)> {
        let mut items = Vec::new();
        let mut j = 0;
        while j < self.code.len() {
            if self.literal[j] || self.code[j] != b'#' {
                j += 1;
                continue;
            }
            let inner = self.code.get(j + 1) == Some(&b'!');
            let open = self.skip_space(j + 1 + usize::from(inner));
            if self.code.get(open) != Some(&b'[') {
                j += 1;
                continue;
            }
            let close = self.matching(open);
            let attribute: String = String::from_utf8_lossy(&self.code[open + 1..close - 1])
                .chars()
                .filter(|c| !c.is_whitespace())
                .collect();
            let is_test = attribute == "cfg(test)"
                || attribute == "test"
                || attribute.ends_with("::test")
                || attribute.contains("::test(");
            if !is_test {
                j = close;
                continue;
            }
            if inner {
                items.push((0, self.code.len()));
                return items;
            }
            // Further attributes belong to the same item.
            let mut start = self.skip_space(close);
            while self.code.get(start) == Some(&b'#') {
                let open = self.skip_space(start + 1);
                if self.code.get(open) != Some(&b'[') {
                    break;
                }
                start = self.skip_space(self.matching(open));
            }
            let end = self.item_end(start);
            items.push((j, end));
            j = end;
        }
        items
    }

    /// Names of the modules test items declare as files (`#[cfg(test)] mod name;`).
    fn test_module_declarations(&self) -> Vec<String> {
        let mut names = Vec::new();
        for &(from, to) in &self.tests {
            let text = String::from_utf8_lossy(&self.code[from..to]);
            let Some(rest) = text.trim_end().strip_suffix(';') else {
                continue;
            };
            let mut words = rest
                .rsplit(|c: char| c.is_whitespace())
                .filter(|w| !w.is_empty());
            if let (Some(name), Some("mod")) = (words.next(), words.next()) {
                names.push(name.to_owned());
            }
        }
        names
    }

    /// The top-level modules that non-test code names at the crate root, with where: a
    /// `crate::` path, or a `super::` chain of `depth` steps (the file's module depth).
    fn crate_references(&self, depth: usize) -> Vec<(usize, String)> {
        let mut found = Vec::new();
        let mut j = 0;
        while j < self.code.len() {
            let Some(word) = self.ident_at(j) else {
                j += 1;
                continue;
            };
            let start = j;
            j += word.len();
            let preceded =
                start > 0 && (is_ident(self.code[start - 1]) || self.code[start - 1] == b'$');
            if preceded || self.in_test(start) {
                continue;
            }
            // After `crate`, or `depth` times `super`, comes the root's namespace.
            let mut at = start;
            let rooted = match word {
                "crate" => {
                    at = j;
                    true
                }
                "super" if depth > 0 => {
                    let mut steps = 0;
                    let mut k = start;
                    while self.ident_at(k) == Some("super") {
                        steps += 1;
                        let after = self.skip_space(k + "super".len());
                        at = after;
                        if !self.code[after..].starts_with(b"::") {
                            break;
                        }
                        let next = self.skip_space(after + 2);
                        if self.ident_at(next) != Some("super") {
                            break;
                        }
                        k = next;
                    }
                    j = at.max(j);
                    steps == depth
                }
                _ => false,
            };
            if !rooted {
                continue;
            }
            let at = self.skip_space(at);
            if !self.code[at..].starts_with(b"::") {
                continue;
            }
            let at = self.skip_space(at + 2);
            if let Some(name) = self.ident_at(at) {
                found.push((start, name.to_owned()));
            } else if self.code.get(at) == Some(&b'{') {
                found.extend(self.group_heads(at));
            }
        }
        found
    }

    /// The first identifier of each element of the `{…}` group opening at `open`, with where.
    fn group_heads(&self, open: usize) -> Vec<(usize, String)> {
        let close = self.matching(open);
        let mut heads = Vec::new();
        let mut at = open + 1;
        while at < close {
            at = self.skip_space(at);
            if let Some(name) = self.ident_at(at) {
                heads.push((at, name.to_owned()));
            }
            // To the next comma of this group.
            while at < close - 1 {
                match self.code[at] {
                    b'{' | b'(' | b'[' if !self.literal[at] => at = self.matching(at),
                    b',' if !self.literal[at] => break,
                    _ => at += 1,
                }
            }
            at += 1;
        }
        heads
    }
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
