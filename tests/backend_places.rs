//! A backend is its crate plus a few lines elsewhere: this counts them.
//!
//! Every file of the workspace outside the backend crates (`store-*/`), the
//! build output (`target/`), `.git/`, the change log (`CHANGELOG.md`, which
//! tells history) and the lock file (`Cargo.lock`, which cargo writes) is
//! read, and each line that names one backend is a place that must change
//! when a backend comes or goes. A line names backend `<name>` (each name
//! the facade knows, from its scheme table, compiled in or not) when it
//! has
//!
//! * its crate or directory: `mcp-event-store-<name>`,
//!   `mcp_event_store_<name>`, `store-<name>`;
//! * its facade feature, forwarded or tested: `mcp-event-store/<name>`,
//!   `feature = "<name>"`;
//! * in a `Cargo.toml`, the quoted feature or dependency: `"<name>"`,
//!   `"<name>?/...`;
//! * in `src/lib.rs`, its entry in the `backends!` list.
//!
//! Each backend may be named in at most [`MAX_PLACES`] lines; the failure
//! lists every place. The places are documented in
//! `store-core/src/backend/mod.rs` ("The descriptor and the lists that name
//! backends"). Prose that names a database ("SQLite", "sled") is not
//! counted: it describes, it does not list.
//!
//! The README's table of crates is checked against the same list: one row
//! per backend, linking its crate's README.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// The most lines outside its crate that may name one backend.
const MAX_PLACES: usize = 6;

/// The workspace's root (the facade's own directory).
fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// Every backend name the facade knows (its features), compiled in or not.
fn known_backends() -> Vec<&'static str> {
    let mut names: Vec<&str> = mcp_event_store::KNOWN_SCHEMES
        .iter()
        .map(|(_, feature)| *feature)
        .filter(|feature| !feature.is_empty())
        .collect();
    names.dedup();
    names
}

/// The files to read, relative to the root, sorted.
fn files() -> Vec<PathBuf> {
    fn walk(root: &Path, dir: &Path, out: &mut Vec<PathBuf>) {
        let mut entries: Vec<_> = std::fs::read_dir(dir)
            .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
            .map(|entry| entry.expect("a directory entry").path())
            .collect();
        entries.sort();
        for path in entries {
            let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("");
            let top = path.parent() == Some(root);
            if path.is_dir() {
                let skipped =
                    name == "target" || name == ".git" || (top && name.starts_with("store-"));
                if !skipped {
                    walk(root, &path, out);
                }
            } else if !(top && (name == "CHANGELOG.md" || name == "Cargo.lock")) {
                out.push(path.strip_prefix(root).expect("under the root").to_owned());
            }
        }
    }
    let root = root();
    let mut out = Vec::new();
    walk(&root, &root, &mut out);
    out
}

/// Whether `text` holds `needle` not followed by a letter, digit, `_` or
/// `-` (so `store-ab` is not found in `store-abc`).
fn has_word(text: &str, needle: &str) -> bool {
    text.match_indices(needle).any(|(at, _)| {
        !text[at + needle.len()..]
            .chars()
            .next()
            .is_some_and(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
    })
}

/// Whether line `line` of the file `path` names the backend `name`.
/// `in_list`: the line is inside the facade's `backends!` list.
fn names(path: &Path, line: &str, name: &str, in_list: bool) -> bool {
    let crate_or_feature = [
        format!("mcp-event-store-{name}"),
        format!("mcp_event_store_{name}"),
        format!("store-{name}"),
        format!("mcp-event-store/{name}"),
    ]
    .iter()
    .any(|needle| has_word(line, needle))
        || line.contains(&format!("feature = \"{name}\""));
    let manifest = path.file_name().is_some_and(|n| n == "Cargo.toml")
        && (line.contains(&format!("\"{name}\"")) || line.contains(&format!("\"{name}?/")));
    let listed = in_list && line.trim_start().starts_with(&format!("{name},"));
    crate_or_feature || manifest || listed
}

/// Every line outside the backend crates that names each backend, as
/// `path:line: text`.
fn places() -> BTreeMap<&'static str, Vec<String>> {
    let backends = known_backends();
    let mut places: BTreeMap<&str, Vec<String>> =
        backends.iter().map(|name| (*name, Vec::new())).collect();
    for path in files() {
        let Ok(text) = std::fs::read_to_string(root().join(&path)) else {
            continue; // not text
        };
        let facade = path == Path::new("src/lib.rs");
        let mut in_list = false;
        for (n, line) in text.lines().enumerate() {
            if facade && line.starts_with("backends! {") {
                in_list = true;
            } else if in_list && line.starts_with('}') {
                in_list = false;
            }
            for name in &backends {
                if names(&path, line, name, in_list) {
                    places.get_mut(name).expect("a backend").push(format!(
                        "{}:{}: {}",
                        path.display(),
                        n + 1,
                        line.trim()
                    ));
                }
            }
        }
    }
    places
}

#[test]
fn each_backend_is_named_in_at_most_six_lines_outside_its_crate() {
    let places = places();
    let mut report = String::new();
    for (name, lines) in &places {
        report.push_str(&format!("{name}: {} lines\n", lines.len()));
        for line in lines {
            report.push_str(&format!("    {line}\n"));
        }
    }
    // Printed with `--nocapture`, or when it fails.
    eprintln!("{report}");
    for (name, lines) in &places {
        assert!(
            !lines.is_empty(),
            "{name}: named nowhere outside its crate, so this test reads the wrong files"
        );
        assert!(
            lines.len() <= MAX_PLACES,
            "{name} is named in {} lines outside its crate, more than {MAX_PLACES}; every \
             list of backends should come from the facade's (`backends()`, \
             `for_each_backend!`, `testing::visit_kit`):\n{report}",
            lines.len()
        );
    }
}

/// The README's table of crates has one row per backend the facade knows,
/// each linking its crate's README, and none for anything else.
#[test]
fn the_readme_lists_every_backend_crate() {
    let readme = std::fs::read_to_string(root().join("README.md")).expect("README.md");
    let mut rows: Vec<&str> = readme
        .lines()
        .filter(|line| line.starts_with("| [`mcp-event-store-"))
        .filter_map(|line| {
            let (_, link) = line.split_once("](store-")?;
            let (dir, _) = link.split_once("/README.md)")?;
            (dir != "core").then_some(dir)
        })
        .collect();
    rows.sort();
    let mut backends = known_backends();
    backends.sort();
    assert_eq!(
        rows, backends,
        "the README's crates table, against the facade's list"
    );
    for name in backends {
        let row = format!("| [`mcp-event-store-{name}`](store-{name}/README.md) |");
        assert!(readme.contains(&row), "README.md: no row {row}");
        assert!(
            root().join(format!("store-{name}/README.md")).is_file(),
            "store-{name}/README.md"
        );
    }
}
