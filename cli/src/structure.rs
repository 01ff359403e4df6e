//! The workspace's shape as README.md and docs/design.md promise it: no crate has a module
//! circle (two files that each use the other, directly or around a loop), and a crate that
//! keeps its modules private does not grow a `pub mod`.
//!
//! Arrows are read from the source as text: `crate::a::b`, `super::x` and `self::x` paths
//! (brace groups expanded), and a module's own children named by path, each to the file of the
//! longest module prefix it names. A module's ancestors take no arrows from it (a child sees
//! its parents' items: that is the module tree, not a circle; the root is a facade), and a
//! re-export (`pub use`) is none; `tests` modules and `#[path]` benches are left out, as tests are
//! not part of the structure.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// Crates whose modules are private behind `lib.rs` (feature-gated bench modules aside).
const PRIVATE_MODULES: [&str; 3] = ["accountant", "coordinator", "registry"];

/// A crate's files by module path (`[]` is the root).
fn modules(src: &Path) -> BTreeMap<Vec<String>, PathBuf> {
    let mut found = BTreeMap::new();
    let mut stack = vec![src.to_owned()];
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir).unwrap().map(|e| e.unwrap().path()) {
            if entry.is_dir() {
                stack.push(entry);
                continue;
            }
            let Some(relative) = entry.strip_prefix(src).ok().and_then(|r| r.to_str()) else { continue };
            let Some(stem) = relative.strip_suffix(".rs") else { continue };
            let mut path: Vec<String> = stem.split('/').map(str::to_owned).collect();
            if matches!(path.last().map(String::as_str), Some("mod" | "lib" | "main")) {
                path.pop();
            }
            if path.iter().any(|segment| segment == "tests") {
                continue;
            }
            found.insert(path, entry);
        }
    }
    found
}

/// The code of a file without comments, string literals' contents (roughly: line comments
/// and `"…"` spans) and re-exports (`pub use …;`, `pub(crate) use …;`: a facade's, like the
/// root's), so that a path in a doc comment, a message or a re-export is no arrow.
fn code(text: &str) -> String {
    let mut out = String::new();
    let mut reexport = false;
    for line in text.lines() {
        let trimmed = line.trim_start();
        reexport |= trimmed.starts_with("pub use ") || trimmed.starts_with("pub(crate) use ");
        if reexport {
            reexport = !line.contains(';');
            out.push('\n');
            continue;
        }
        let line = line.split("//").next().unwrap_or_default();
        let mut quoted = false;
        for c in line.chars() {
            if c == '"' {
                quoted = !quoted;
            }
            out.push(if quoted { ' ' } else { c });
        }
        out.push('\n');
    }
    out
}

/// The paths `text` names after `prefix` (`crate::`, `super::`, `self::`), brace groups
/// expanded one level: `crate::{a::B, c}` names `a::B` and `c`.
fn named_after(text: &str, prefix: &str) -> Vec<Vec<String>> {
    let ident = |c: char| c.is_alphanumeric() || c == '_' || c == ':';
    let mut paths = Vec::new();
    for (at, _) in text.match_indices(prefix) {
        let before = text[..at].chars().next_back();
        if before.is_some_and(|c| c.is_alphanumeric() || c == '_' || c == ':') {
            continue;
        }
        let rest = &text[at + prefix.len()..];
        let head = rest.split(|c: char| !ident(c)).next().unwrap_or_default();
        match rest[head.len()..].strip_prefix('{') {
            Some(group) if head.is_empty() || head.ends_with("::") => {
                let inner = group.split('}').next().unwrap_or_default();
                for item in inner.split(',') {
                    let item = item.trim().split(|c: char| !ident(c)).next().unwrap_or_default();
                    paths.push([split(head), split(item)].concat());
                }
            }
            _ => paths.push(split(head)),
        }
    }
    paths
}

fn split(path: &str) -> Vec<String> {
    path.split("::").filter(|s| !s.is_empty()).map(str::to_owned).collect()
}

/// The file of the longest module prefix of `path` (none for the root or an unknown path).
fn target(modules: &BTreeMap<Vec<String>, PathBuf>, path: &[String]) -> Option<Vec<String>> {
    (1..=path.len()).rev().map(|n| path[..n].to_vec()).find(|prefix| modules.contains_key(prefix))
}

/// Each file's arrows to the other files of its crate.
fn arrows(modules: &BTreeMap<Vec<String>, PathBuf>) -> BTreeMap<Vec<String>, BTreeSet<Vec<String>>> {
    let mut graph = BTreeMap::new();
    for (module, file) in modules {
        let text = code(&std::fs::read_to_string(file).unwrap());
        let parent = &module[..module.len().saturating_sub(1)];
        let mut named: Vec<Vec<String>> = named_after(&text, "crate::");
        named.extend(named_after(&text, "super::").into_iter().map(|p| [parent, &p].concat()));
        named.extend(named_after(&text, "self::").into_iter().map(|p| [module.as_slice(), &p].concat()));
        // A module's children named by path (`engine::ClipEngine` in `clip/mod.rs`).
        for child in modules.keys().filter(|k| k.len() == module.len() + 1 && k.starts_with(module)) {
            let name = child.last().unwrap();
            if !named_after(&text, &format!("{name}::")).is_empty() {
                named.push(child.clone());
            }
        }
        let to: BTreeSet<Vec<String>> = named
            .iter()
            .filter_map(|p| target(modules, p))
            .filter(|t| !module.starts_with(t)) // itself, the root or an ancestor: the module tree
            .collect();
        graph.insert(module.clone(), to);
    }
    graph
}

/// Every circle of `graph`, each as the files of one strongly connected component (Tarjan).
fn circles(graph: &BTreeMap<Vec<String>, BTreeSet<Vec<String>>>) -> Vec<Vec<Vec<String>>> {
    struct Walk<'a> {
        graph: &'a BTreeMap<Vec<String>, BTreeSet<Vec<String>>>,
        index: BTreeMap<&'a Vec<String>, (usize, usize)>,
        stack: Vec<&'a Vec<String>>,
        found: Vec<Vec<Vec<String>>>,
    }
    impl<'a> Walk<'a> {
        fn visit(&mut self, node: &'a Vec<String>) {
            let n = self.index.len();
            self.index.insert(node, (n, n));
            self.stack.push(node);
            for next in self.graph.get(node).into_iter().flatten() {
                match self.index.get(next) {
                    None => {
                        self.visit(next);
                        let low = self.index[next].1.min(self.index[node].1);
                        self.index.get_mut(node).unwrap().1 = low;
                    }
                    Some(&(i, _)) if self.stack.contains(&next) => {
                        let low = i.min(self.index[node].1);
                        self.index.get_mut(node).unwrap().1 = low;
                    }
                    Some(_) => {}
                }
            }
            let (i, low) = self.index[node];
            if i == low {
                let at = self.stack.iter().position(|m| *m == node).unwrap();
                let component: Vec<Vec<String>> = self.stack.drain(at..).cloned().collect();
                if component.len() > 1 {
                    self.found.push(component);
                }
            }
        }
    }
    let mut walk = Walk { graph, index: BTreeMap::new(), stack: Vec::new(), found: Vec::new() };
    for node in graph.keys() {
        if !walk.index.contains_key(node) {
            walk.visit(node);
        }
    }
    walk.found
}

fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap().to_owned()
}

fn crates() -> Vec<PathBuf> {
    let root = workspace();
    let mut crates: Vec<PathBuf> =
        std::fs::read_dir(&root).unwrap().map(|e| e.unwrap().path()).filter(|p| p.join("src").is_dir()).collect();
    crates.sort();
    crates
}

#[test]
fn no_crate_has_a_module_circle() {
    let mut found = Vec::new();
    for krate in crates() {
        for circle in circles(&arrows(&modules(&krate.join("src")))) {
            let files: Vec<String> = circle.iter().map(|m| m.join("::")).collect();
            found.push(format!("{}: {}", krate.file_name().unwrap().to_string_lossy(), files.join(" <-> ")));
        }
    }
    assert!(found.is_empty(), "module circles (break each by moving what both use below both):\n{found:#?}");
}

#[test]
fn a_crate_that_keeps_its_modules_private_has_no_pub_mod() {
    for name in PRIVATE_MODULES {
        let lib = std::fs::read_to_string(workspace().join(name).join("src/lib.rs")).unwrap();
        let lines: Vec<&str> = lib.lines().collect();
        for (n, line) in lines.iter().enumerate() {
            let gated = n > 0 && lines[..n].iter().rev().take(3).any(|l| l.contains("#[cfg(feature = \"bench\")]"));
            assert!(
                !line.trim_start().starts_with("pub mod ") || gated,
                "{name}/src/lib.rs:{}: `{line}`: keep modules private and re-export what other crates use",
                n + 1
            );
        }
    }
}

#[test]
fn a_circle_between_two_files_is_found_and_the_root_takes_no_arrows() {
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path();
    std::fs::create_dir_all(src.join("clip")).unwrap();
    std::fs::write(src.join("lib.rs"), "mod clip;\npub use clip::Engine;\n").unwrap();
    std::fs::write(src.join("clip/mod.rs"), "mod engine;\nmod rounding;\npub use engine::Engine;\n").unwrap();
    std::fs::write(src.join("clip/engine.rs"), "use super::rounding::round;\npub const EPS: f32 = 1e-6;\n").unwrap();
    std::fs::write(src.join("clip/rounding.rs"), "use crate::clip::{engine::EPS};\n// crate::clip::mod\n").unwrap();
    let found = circles(&arrows(&modules(src)));
    let names: Vec<Vec<String>> = found.iter().map(|c| c.iter().map(|m| m.join("::")).collect()).collect();
    assert_eq!(names.len(), 1, "{names:?}");
    assert!(names[0].contains(&"clip::engine".to_owned()) && names[0].contains(&"clip::rounding".to_owned()));
    std::fs::write(src.join("clip/rounding.rs"), "pub fn round() {}\n").unwrap();
    assert!(circles(&arrows(&modules(src))).is_empty(), "one way only");
}
