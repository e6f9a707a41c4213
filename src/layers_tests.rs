//! The crate's layers, checked: every top-level module has a rank, and a module may use
//! (`crate::...`) only modules of a lower rank. So the dependency graph has no cycle and
//! reads top-down; `docs/design.md` "Where things live" draws the same picture. A new
//! module must be given a rank here, which is the moment to decide where it belongs.
//!
//! The scan reads the sources as text, like `shared/tools/modgraph.py`: `crate::` paths
//! in code (comments and `#[cfg(test)]` modules left out; test files skipped).

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// Rank per top-level module: higher ranks build on lower ones.
const LAYERS: &[(&str, u32)] = &[
    // Leaves: plain data and small utilities, no crate dependencies beyond `core` (the
    // crate `posgate-core`, re-exported; the compiler keeps it free of IO).
    ("core", 0),
    ("api", 0),
    ("clock", 0),
    ("rate_log", 0),
    ("tls", 0),
    ("trace_context", 0),
    ("telemetry", 1),
    ("credentials", 1),
    ("status", 1),
    ("store", 1),
    // The one seam between ownership and delivery.
    ("serving", 2),
    ("metrics", 3),
    // The pod-to-pod protocol, then the two halves of a pod's work: connections to
    // terminals (whose planned moves call the peer protocol) and ownership.
    ("peer", 4),
    ("pos", 5),
    ("driver", 5),
    ("push", 6),
    ("http", 7),
    // Over the reconciler, the store and the push layer's routing rule and cache.
    ("sim", 7),
    // The edge: configuration parsed from flags, reloads, and the composition root.
    ("config", 8),
    ("reload", 9),
    ("pod", 10),
];

fn rank(module: &str) -> Option<u32> {
    LAYERS.iter().find(|(m, _)| *m == module).map(|(_, r)| *r)
}

/// `text` without `//` and `/* */` comments and without `#[cfg(test)] mod x { .. }`.
fn code_of(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(i) = rest.find("//").into_iter().chain(rest.find("/*")).min() {
        out.push_str(&rest[..i]);
        rest = if rest[i..].starts_with("//") {
            rest[i..].find('\n').map_or("", |j| &rest[i + j..])
        } else {
            rest[i..].find("*/").map_or("", |j| &rest[i + j + 2..])
        };
    }
    out.push_str(rest);
    let mut code = String::with_capacity(out.len());
    let mut rest = out.as_str();
    while let Some(i) = rest.find("#[cfg(test)]") {
        code.push_str(&rest[..i]);
        let after = &rest[i + "#[cfg(test)]".len()..];
        let trimmed = after.trim_start();
        let brace_first = match (trimmed.find('{'), trimmed.find(';')) {
            (Some(brace), semi) => semi.is_none_or(|semi| brace < semi),
            (None, _) => false,
        };
        if trimmed.starts_with("mod ") && brace_first {
            let open = after.find('{').expect("checked above");
            let mut depth = 0;
            let mut end = after.len();
            for (j, c) in after[open..].char_indices() {
                match c {
                    '{' => depth += 1,
                    '}' => {
                        depth -= 1;
                        if depth == 0 {
                            end = open + j + 1;
                            break;
                        }
                    }
                    _ => {}
                }
            }
            rest = &after[end..];
        } else {
            rest = after;
        }
    }
    code.push_str(rest);
    code
}

/// The top-level modules `code` refers to with `crate::x` or `crate::{x, y::z}`.
fn referenced(code: &str) -> BTreeSet<String> {
    let mut found = BTreeSet::new();
    let ident = |s: &str| -> String {
        s.chars()
            .take_while(|c| c.is_alphanumeric() || *c == '_')
            .collect()
    };
    for (i, _) in code.match_indices("crate::") {
        let before = code[..i].chars().last();
        if before.is_some_and(|c| c.is_alphanumeric() || c == '_') {
            continue; // e.g. `posgate_crate::`
        }
        let rest = &code[i + "crate::".len()..];
        if let Some(group) = rest.strip_prefix('{') {
            let mut depth = 1;
            let mut item_start = true;
            for (j, c) in group.char_indices() {
                match c {
                    '{' => depth += 1,
                    '}' => {
                        depth -= 1;
                        if depth == 0 {
                            break;
                        }
                    }
                    ',' if depth == 1 => item_start = true,
                    c if item_start && !c.is_whitespace() => {
                        item_start = false;
                        let name = ident(&group[j..]);
                        if !name.is_empty() && name != "self" {
                            found.insert(name);
                        }
                    }
                    _ => {}
                }
            }
        } else {
            let name = ident(rest);
            if !name.is_empty() {
                found.insert(name);
            }
        }
    }
    found
}

fn library_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        if path.is_dir() {
            // The binary is its own crate; test directories are not the library's code.
            if name != "bin" && name != "tests" {
                library_files(&path, out);
            }
        } else if name.ends_with(".rs") && name != "tests.rs" && !name.ends_with("_tests.rs") {
            out.push(path);
        }
    }
}

/// Edges between top-level modules: user -> used.
fn edges() -> BTreeMap<String, BTreeSet<String>> {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    library_files(&src, &mut files);
    let mut edges: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for file in files {
        let rel = file.strip_prefix(&src).unwrap();
        let top = rel
            .components()
            .next()
            .unwrap()
            .as_os_str()
            .to_string_lossy();
        let top = top.trim_end_matches(".rs").to_string();
        if top == "lib" {
            continue;
        }
        let code = code_of(&std::fs::read_to_string(&file).unwrap());
        for used in referenced(&code) {
            if used != top {
                edges.entry(top.clone()).or_default().insert(used);
            }
        }
    }
    edges
}

#[test]
fn every_module_uses_only_lower_layers() {
    let edges = edges();
    let mut unranked = BTreeSet::new();
    let mut upward = Vec::new();
    for (user, used) in &edges {
        let Some(from) = rank(user) else {
            unranked.insert(user.clone());
            continue;
        };
        for target in used {
            match rank(target) {
                None => {
                    unranked.insert(target.clone());
                }
                Some(to) if to >= from => {
                    upward.push(format!("{user} ({from}) -> {target} ({to})"))
                }
                Some(_) => {}
            }
        }
    }
    assert!(
        unranked.is_empty(),
        "modules without a layer in src/layers_tests.rs: {unranked:?}"
    );
    assert!(
        upward.is_empty(),
        "uses of a module that is not in a lower layer:\n{}",
        upward.join("\n")
    );
}

#[test]
fn the_scan_finds_paths_groups_and_skips_comments_and_test_modules() {
    let code = code_of(
        "use crate::core::Epoch;\nuse crate::{api, store::keys};\n// crate::pod\n\
         /* crate::http */\n#[cfg(test)]\nmod tests { use crate::sim; }\nfn f() { crate::clock::now(); }",
    );
    let found: Vec<String> = referenced(&code).into_iter().collect();
    assert_eq!(found, ["api", "clock", "core", "store"]);
}
